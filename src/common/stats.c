/*-------------------------------------------------------------------------
 *
 * stats.c
 *		idem's counters in shared memory: the idem_stats view,
 *		idem_stats_reset(), and idem_note_outcome(), the hook every
 *		outcome of a call goes through.
 *
 * One slot per database, up to idem.stats_max_databases, and one per
 * database and role, up to idem.stats_max_roles; what finds its table full
 * counts in that table's overflow slot (database and role InvalidOid,
 * shown as NULL).  A call counts for its role (the key's owner), other
 * work for the role doing it; the purge worker's counts go to its
 * database's row only.  A slot is claimed under the lock once per
 * backend and database and remembered; from then on counting is one
 * atomic add, so counts are exact under concurrency and a call never
 * waits for another.  A reset zeroes the counters but keeps the slots.
 *
 * The slots of dropped databases and roles are reclaimed when a table is
 * full and a backend needs a slot, as pgstat frees a dropped object's
 * entry: only once no backend holds it.  A backend that remembers a slot
 * pins it (a reference count, as pgstat's shared entries have), and
 * unpins it when it counts elsewhere or exits; reclaiming takes a slot
 * whose database (or role) is gone from the catalogs and that nobody
 * pins, so no remembered slot ever changes owner and the count path
 * stays one atomic add.  A session of a dropped role keeps counting in
 * its pair's row until it ends.  A reclaimed slot's counts are dropped
 * with it, as pg_stat_database drops a dropped database's row: they are
 * not carried into the overflow slot.  The catalogs are read for this by
 * idem_stats_count() and the view only, inside a transaction that is not
 * unwinding an error and holding no LWLock; elsewhere (the launcher, the
 * purge worker between its transactions, error cleanup, counts for
 * another process's work) a full table gives the overflow slot, which is
 * then not remembered, so that a later count looks again.
 *
 * Counters live in shared memory only: a restart or crash starts them from
 * zero (as pg_stat_statements' do without its file).  Without
 * shared_preload_libraries there is no shared memory to count in: the
 * view answers zeros for the current database and says so once per
 * session.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_authid.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/inval.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "common/common.h"

typedef struct IdemStatsSlot
{
	Oid			dbid;			/* InvalidOid: free, or an overflow slot */
	Oid			roleid;			/* InvalidOid in the database table */
	bool		used;
	pg_atomic_uint32 pins;		/* backends that remember the slot */
	pg_atomic_uint64 stats_reset;	/* TimestampTz of the last reset */
	pg_atomic_uint64 counters[IDEM_STAT_NCOUNTERS];
} IdemStatsSlot;

typedef enum StatsTable
{
	DB_TABLE,
	ROLE_TABLE
} StatsTable;

/*
 * Two tables in one array: the databases' in slots [0, ndbs), the roles'
 * (per database and role) in [ndbs, ndbs + nroles); the first slot of
 * each is its overflow slot.  A slot's owner (dbid, roleid, used) changes
 * under the exclusive lock only; pins change under the shared lock or
 * without it, downwards.
 */
typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* claims and reclaims slots */
	int			ndbs;
	int			nroles;
	int			claimed_end[2]; /* per table: no slot from here on is used */
	IdemStatsSlot slots[FLEXIBLE_ARRAY_MEMBER];
} IdemStatsShared;

int			idem_stats_max_databases = 64;
int			idem_stats_max_roles = 256;

static IdemStatsShared *stats_shared = NULL;

/* this backend's pinned slots for MyDatabaseId, and for it and my_role_id */
static IdemStatsSlot *my_slot = NULL;
static Oid	my_slot_db = InvalidOid;
static IdemStatsSlot *my_role_slot = NULL;
static Oid	my_role_db = InvalidOid;
static Oid	my_role_id = InvalidOid;

/* set once this process has unpinned its slots on its way out */
static bool unpinned_for_exit = false;

static bool told_not_collecting = false;

/* false in the purge worker, which counts in its database's row only */
static bool count_by_role = true;

PG_FUNCTION_INFO_V1(idem_stats_1_1);
PG_FUNCTION_INFO_V1(idem_stats_reset_1_1);

Size
idem_stats_shmem_size(void)
{
	return add_size(offsetof(IdemStatsShared, slots),
					mul_size(idem_stats_max_databases + 1 + idem_stats_max_roles + 1,
							 sizeof(IdemStatsSlot)));
}

/* Caller holds AddinShmemInitLock. */
void
idem_stats_shmem_init(void)
{
	bool		found;

	stats_shared = ShmemInitStruct("idem stats", idem_stats_shmem_size(), &found);
	if (!found)
	{
		TimestampTz now = GetCurrentTimestamp();

		stats_shared->lock = &(GetNamedLWLockTranche("idem stats"))->lock;
		stats_shared->ndbs = idem_stats_max_databases + 1;
		stats_shared->nroles = idem_stats_max_roles + 1;
		stats_shared->claimed_end[DB_TABLE] = 1;
		stats_shared->claimed_end[ROLE_TABLE] = stats_shared->ndbs + 1;
		for (int i = 0; i < stats_shared->ndbs + stats_shared->nroles; i++)
		{
			IdemStatsSlot *slot = &stats_shared->slots[i];

			slot->dbid = InvalidOid;
			slot->roleid = InvalidOid;
			slot->used = (i == 0 || i == stats_shared->ndbs);
			pg_atomic_init_u32(&slot->pins, 0);
			pg_atomic_init_u64(&slot->stats_reset, (uint64) now);
			for (int c = 0; c < IDEM_STAT_NCOUNTERS; c++)
				pg_atomic_init_u64(&slot->counters[c], 0);
		}
	}
}

bool
idem_stats_active(void)
{
	return stats_shared != NULL;
}

static void
table_bounds(StatsTable table, int *first, int *end)
{
	*first = table == DB_TABLE ? 0 : stats_shared->ndbs;
	*end = table == DB_TABLE ? stats_shared->ndbs :
		stats_shared->ndbs + stats_shared->nroles;
}

/*
 * Whether this process may read the catalogs to reclaim slots now: inside
 * a transaction, holding no LWLock (LWLockAcquire holds off interrupts),
 * outside a critical section.  The launcher counts outside any
 * transaction, the purge worker also between its transactions.
 */
static bool
may_reclaim(void)
{
	return IsTransactionState() && OidIsValid(MyDatabaseId) &&
		InterruptHoldoffCount == 0 && CritSectionCount == 0;
}

typedef struct ReclaimCandidate
{
	int			index;
	Oid			dbid;
	Oid			roleid;
} ReclaimCandidate;

/*
 * Free the slots of a table whose database, or (in the roles' table)
 * role, no longer exists and that no backend pins.  The owners are
 * collected under the shared lock and looked up without it (a catalog
 * read may wait for I/O); a slot is freed only if, under the exclusive
 * lock, it still has the owner that was looked up and no pin.  A pin is
 * only taken under the lock, on a slot found by its owner, so no backend
 * can come to hold a slot once it is freed.
 */
static void
reclaim_slots(StatsTable table)
{
	int			first;
	int			end;
	int			n = 0;
	int			ngone = 0;
	ReclaimCandidate *cand;

	table_bounds(table, &first, &end);
	cand = palloc(sizeof(ReclaimCandidate) * (end - first));
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	for (int i = first + 1; i < stats_shared->claimed_end[table]; i++)
	{
		IdemStatsSlot *s = &stats_shared->slots[i];

		if (s->used && pg_atomic_read_u32(&s->pins) == 0)
		{
			cand[n].index = i;
			cand[n].dbid = s->dbid;
			cand[n].roleid = s->roleid;
			n++;
		}
	}
	LWLockRelease(stats_shared->lock);

	/* see the DROPs committed until now, not only until the last lock */
	AcceptInvalidationMessages();
	for (int k = 0; k < n; k++)
	{
		if (!SearchSysCacheExists1(DATABASEOID, ObjectIdGetDatum(cand[k].dbid)) ||
			(table == ROLE_TABLE &&
			 !SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(cand[k].roleid))))
			cand[ngone++] = cand[k];
	}

	if (ngone > 0)
	{
		LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
		for (int k = 0; k < ngone; k++)
		{
			IdemStatsSlot *s = &stats_shared->slots[cand[k].index];

			if (s->used && s->dbid == cand[k].dbid &&
				s->roleid == cand[k].roleid &&
				pg_atomic_read_u32(&s->pins) == 0)
				s->used = false;
		}
		while (stats_shared->claimed_end[table] > first + 1 &&
			   !stats_shared->slots[stats_shared->claimed_end[table] - 1].used)
			stats_shared->claimed_end[table]--;
		LWLockRelease(stats_shared->lock);
	}
	pfree(cand);
}

/*
 * The slot of (dbid, roleid) in a table, claimed if it has none; if the
 * table is full, after reclaiming the slots of dropped databases and roles
 * when reclaim is true, the table's overflow slot.  Returns with the lock
 * held (shared or exclusive), so that the slot keeps its owner until the
 * caller has pinned it or counted in it.  Found under the shared lock, so
 * backends that switch roles do not queue for the exclusive one.
 */
static IdemStatsSlot *
find_slot_locked(StatsTable table, Oid dbid, Oid roleid, bool reclaim)
{
	int			first;
	int			end;
	bool		full = true;

	table_bounds(table, &first, &end);
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	for (int i = first + 1; i < stats_shared->claimed_end[table]; i++)
	{
		IdemStatsSlot *s = &stats_shared->slots[i];

		if (s->used && s->dbid == dbid && s->roleid == roleid)
			return s;
		if (!s->used)
			full = false;
	}
	if (full && stats_shared->claimed_end[table] == end && !reclaim)
		return &stats_shared->slots[first];
	LWLockRelease(stats_shared->lock);

	for (;;)
	{
		IdemStatsSlot *free_slot = NULL;

		LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
		for (int i = first + 1; i < stats_shared->claimed_end[table]; i++)
		{
			IdemStatsSlot *s = &stats_shared->slots[i];

			if (s->used && s->dbid == dbid && s->roleid == roleid)
				return s;
			if (!s->used && free_slot == NULL)
				free_slot = s;
		}
		if (free_slot == NULL && stats_shared->claimed_end[table] < end)
			free_slot = &stats_shared->slots[stats_shared->claimed_end[table]++];
		if (free_slot != NULL)
		{
			IdemStatsSlot *s = free_slot;

			s->dbid = dbid;
			s->roleid = roleid;
			pg_atomic_write_u64(&s->stats_reset, (uint64) GetCurrentTimestamp());
			for (int c = 0; c < IDEM_STAT_NCOUNTERS; c++)
				pg_atomic_write_u64(&s->counters[c], 0);
			/* the atomics are written before the slot becomes findable */
			pg_write_barrier();
			s->used = true;
			return s;
		}
		if (!reclaim)
			return &stats_shared->slots[first];
		LWLockRelease(stats_shared->lock);
		reclaim_slots(table);
		reclaim = false;
	}
}

static bool
is_overflow(const IdemStatsSlot *slot)
{
	return slot == &stats_shared->slots[0] ||
		slot == &stats_shared->slots[stats_shared->ndbs];
}

/* Add n to a counter of (dbid, roleid)'s slot, without remembering it. */
static void
count_in(StatsTable table, Oid dbid, Oid roleid, IdemStatCounter counter,
		 uint64 n)
{
	IdemStatsSlot *slot = find_slot_locked(table, dbid, roleid, false);

	pg_atomic_fetch_add_u64(&slot->counters[counter], n);
	LWLockRelease(stats_shared->lock);
}

static void
unpin_slots(int code, Datum arg)
{
	if (my_slot != NULL)
		pg_atomic_fetch_sub_u32(&my_slot->pins, 1);
	if (my_role_slot != NULL)
		pg_atomic_fetch_sub_u32(&my_role_slot->pins, 1);
	my_slot = NULL;
	my_role_slot = NULL;
	unpinned_for_exit = true;
}

/*
 * Remember (dbid, roleid)'s slot in *remembered, pinned, in place of the
 * one remembered there before, and count n in it.  allow_reclaim: the
 * caller is not cleaning up after an error, so the catalogs may be read
 * if may_reclaim() says so too.  The overflow slot found without
 * reclaiming is not remembered (*remembered is left NULL): a later count,
 * where the catalogs can be read, may find a slot of its own.
 */
static pg_noinline void
remember_and_count(StatsTable table, Oid dbid, Oid roleid, bool allow_reclaim,
				   IdemStatsSlot **remembered, IdemStatCounter counter,
				   uint64 n)
{
	static bool exit_callback = false;
	bool		reclaim = allow_reclaim && !unpinned_for_exit && may_reclaim();
	IdemStatsSlot *slot;

	if (*remembered != NULL)
	{
		pg_atomic_fetch_sub_u32(&(*remembered)->pins, 1);
		*remembered = NULL;
	}
	slot = find_slot_locked(table, dbid, roleid, reclaim);
	pg_atomic_fetch_add_u64(&slot->counters[counter], n);
	if (unpinned_for_exit || (!reclaim && is_overflow(slot)))
	{
		LWLockRelease(stats_shared->lock);
		return;
	}
	pg_atomic_fetch_add_u32(&slot->pins, 1);
	LWLockRelease(stats_shared->lock);
	*remembered = slot;
	if (!exit_callback)
	{
		before_shmem_exit(unpin_slots, (Datum) 0);
		exit_callback = true;
	}
}

/*
 * Count in this backend's slot of its database, finding it first if it
 * has none (remembered) yet.
 */
static inline void
count_my_db(IdemStatCounter counter, uint64 n, bool allow_reclaim)
{
	if (likely(my_slot != NULL && my_slot_db == MyDatabaseId))
		pg_atomic_fetch_add_u64(&my_slot->counters[counter], n);
	else
	{
		remember_and_count(DB_TABLE, MyDatabaseId, InvalidOid, allow_reclaim,
						   &my_slot, counter, n);
		my_slot_db = MyDatabaseId;
	}
}

/* Likewise for the slot of its database and role. */
static inline void
count_my_role(Oid role, IdemStatCounter counter, uint64 n, bool allow_reclaim)
{
	if (likely(my_role_slot != NULL && my_role_db == MyDatabaseId &&
			   my_role_id == role))
		pg_atomic_fetch_add_u64(&my_role_slot->counters[counter], n);
	else
	{
		remember_and_count(ROLE_TABLE, MyDatabaseId, role, allow_reclaim,
						   &my_role_slot, counter, n);
		my_role_db = MyDatabaseId;
		my_role_id = role;
	}
}

/*
 * idem_stats_count_db
 *		Add n to a counter of the given database (the purge worker's
 *		counts for the databases it visits): its row only, no role's.
 *		Reclaims no slot: see idem_stats_count_for().
 */
void
idem_stats_count_db(Oid dbid, IdemStatCounter counter, uint64 n)
{
	if (stats_shared == NULL || n == 0)
		return;
	if (dbid == MyDatabaseId)
		count_my_db(counter, n, false);
	else
		count_in(DB_TABLE, dbid, InvalidOid, counter, n);
}

/*
 * idem_stats_database_only
 *		Count this process's work from now on in its database's row only.
 *		The purge worker acts for no role: counted for the role it connects
 *		as (the bootstrap superuser), its purges would read as that role's
 *		work and take a pair of idem.stats_max_roles in every database it
 *		visits.
 */
void
idem_stats_database_only(void)
{
	count_by_role = false;
}

static inline void
count_mine(IdemStatCounter counter, uint64 n, bool allow_reclaim)
{
	if (stats_shared == NULL || n == 0)
		return;
	count_my_db(counter, n, allow_reclaim);
	if (count_by_role)
		count_my_role(GetUserId(), counter, n, allow_reclaim);
}

/*
 * idem_stats_count
 *		Add n to a counter of the current database and of the current role
 *		in it.
 */
void
idem_stats_count(IdemStatCounter counter, uint64 n)
{
	count_mine(counter, n, true);
}

/*
 * idem_stats_count_in_error
 *		idem_stats_count() for the cleanup of an error (a PG_CATCH block),
 *		where the catalogs must not be read: reclaims no slot.
 */
void
idem_stats_count_in_error(IdemStatCounter counter, uint64 n)
{
	count_mine(counter, n, false);
}

/*
 * idem_stats_count_for
 *		Add n to a counter of the given database and of a role in it: work
 *		done for that role by another process (its audit entries the queue
 *		or the worker lost).  Reclaims no slot: the launcher counts here
 *		outside any transaction, and the audit queue counts with its lock
 *		held.
 */
void
idem_stats_count_for(Oid dbid, Oid roleid, IdemStatCounter counter, uint64 n)
{
	if (stats_shared == NULL || n == 0)
		return;
	idem_stats_count_db(dbid, counter, n);
	if (my_role_slot != NULL && my_role_db == dbid && my_role_id == roleid)
		pg_atomic_fetch_add_u64(&my_role_slot->counters[counter], n);
	else
		count_in(ROLE_TABLE, dbid, roleid, counter, n);
}

static void
tell_not_collecting(void)
{
	if (told_not_collecting)
		return;
	told_not_collecting = true;
	ereport(NOTICE,
			(errmsg("idem is not collecting statistics"),
			 errdetail("Statistics are kept in shared memory, which idem has only when it is loaded at server start."),
			 errhint("Add idem to shared_preload_libraries and restart the server.")));
}

#define STATS_COLS (IDEM_STAT_NCOUNTERS + 3)

static void
emit_row(Tuplestorestate *ts, TupleDesc desc, Oid dbid, Oid roleid,
		 IdemStatsSlot *slot)
{
	Datum		values[STATS_COLS];
	bool		nulls[STATS_COLS] = {0};
	int			col = 0;

	/*
	 * The SQL definition before an update may list fewer counters: those it
	 * lists are the first ones.
	 */
	int			ncounters = desc->natts - 3;

	values[col] = ObjectIdGetDatum(dbid);
	nulls[col++] = !OidIsValid(dbid);
	values[col] = ObjectIdGetDatum(roleid);
	nulls[col++] = !OidIsValid(roleid);
	for (int c = 0; c < ncounters; c++)
	{
		uint64		v = slot ? pg_atomic_read_u64(&slot->counters[c]) : 0;

		if (c == IDEM_STAT_LOCK_WAIT_US)
			values[col++] = Float8GetDatum((double) v / 1000.0);
		else
			values[col++] = Int64GetDatum((int64) v);
	}
	if (slot)
		values[col++] = TimestampTzGetDatum((TimestampTz) pg_atomic_read_u64(&slot->stats_reset));
	else
		nulls[col++] = true;
	tuplestore_putvalues(ts, desc, values, nulls);
}

/*
 * idem_stats(by_role boolean) returns setof record: one row per database
 * (by_role: per database and role) that counted something, plus the
 * overflow row if it did.
 *
 * A role's counts say what it does (how often its keys replay or
 * mismatch), so by role, as pg_stat_statements does, only members of
 * pg_read_all_stats see every row; other roles see their own, in every
 * database, and not the overflow row, which mixes others' counts.
 */
Datum
idem_stats_1_1(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	StatsTable	table = PG_GETARG_BOOL(0) ? ROLE_TABLE : DB_TABLE;
	Oid			role = table == ROLE_TABLE ? GetUserId() : InvalidOid;
	bool		see_all;
	int			first;
	int			end;

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts > STATS_COLS || rsinfo->setDesc->natts < 3)
		elog(ERROR, "idem_stats() must return at most %d columns", STATS_COLS);

	if (stats_shared == NULL)
	{
		tell_not_collecting();
		emit_row(rsinfo->setResult, rsinfo->setDesc, MyDatabaseId, role, NULL);
		PG_RETURN_VOID();
	}

	/* the current database (and role) always has its row, zeros until it counts */
	(void) find_slot_locked(table, MyDatabaseId, role, may_reclaim());
	LWLockRelease(stats_shared->lock);

	see_all = table == DB_TABLE ||
		has_privs_of_role(role, ROLE_PG_READ_ALL_STATS);
	table_bounds(table, &first, &end);
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	end = stats_shared->claimed_end[table];
	for (int i = first; i < end; i++)
	{
		IdemStatsSlot *slot = &stats_shared->slots[i];
		bool		any = false;

		if (!slot->used)
			continue;
		if (!see_all && (i == first || slot->roleid != role))
			continue;
		if (i == first)
		{
			for (int c = 0; c < IDEM_STAT_NCOUNTERS && !any; c++)
				any = pg_atomic_read_u64(&slot->counters[c]) != 0;
			if (!any)
				continue;
		}
		emit_row(rsinfo->setResult, rsinfo->setDesc, slot->dbid, slot->roleid,
				 slot);
	}
	LWLockRelease(stats_shared->lock);
	PG_RETURN_VOID();
}

/*
 * idem_stats_reset() returns void: zero every database's and role's
 * counters.
 */
Datum
idem_stats_reset_1_1(PG_FUNCTION_ARGS)
{
	TimestampTz now = GetCurrentTimestamp();

	if (stats_shared == NULL)
	{
		tell_not_collecting();
		PG_RETURN_VOID();
	}
	LWLockAcquire(stats_shared->lock, LW_SHARED);
	for (int i = 0; i < stats_shared->ndbs + stats_shared->nroles; i++)
	{
		IdemStatsSlot *slot = &stats_shared->slots[i];

		if (!slot->used)
			continue;
		for (int c = 0; c < IDEM_STAT_NCOUNTERS; c++)
			pg_atomic_write_u64(&slot->counters[c], 0);
		pg_atomic_write_u64(&slot->stats_reset, (uint64) now);
	}
	LWLockRelease(stats_shared->lock);
	PG_RETURN_VOID();
}
