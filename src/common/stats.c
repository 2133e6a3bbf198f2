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
 * waits for another.  A reset zeroes the counters but keeps the slots, so
 * no backend's remembered slot ever changes owner.
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
#include "utils/timestamp.h"

#include "compat.h"
#include "common/common.h"

typedef struct IdemStatsSlot
{
	Oid			dbid;			/* InvalidOid: free, or an overflow slot */
	Oid			roleid;			/* InvalidOid in the database table */
	bool		used;
	pg_atomic_uint64 stats_reset;	/* TimestampTz of the last reset */
	pg_atomic_uint64 counters[IDEM_STAT_NCOUNTERS];
} IdemStatsSlot;

/*
 * Two tables in one array: the databases' in slots [0, ndbs), the roles'
 * (per database and role) in [ndbs, ndbs + nroles); the first slot of
 * each is its overflow slot.
 */
typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* claims slots */
	int			ndbs;
	int			nroles;
	IdemStatsSlot slots[FLEXIBLE_ARRAY_MEMBER];
} IdemStatsShared;

typedef enum StatsTable
{
	DB_TABLE,
	ROLE_TABLE
} StatsTable;

int			idem_stats_max_databases = 64;
int			idem_stats_max_roles = 256;

static IdemStatsShared *stats_shared = NULL;

/* this backend's slots for MyDatabaseId, and for it and my_role_id */
static IdemStatsSlot *my_slot = NULL;
static Oid	my_slot_db = InvalidOid;
static IdemStatsSlot *my_role_slot = NULL;
static Oid	my_role_db = InvalidOid;
static Oid	my_role_id = InvalidOid;

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
		for (int i = 0; i < stats_shared->ndbs + stats_shared->nroles; i++)
		{
			IdemStatsSlot *slot = &stats_shared->slots[i];

			slot->dbid = InvalidOid;
			slot->roleid = InvalidOid;
			slot->used = (i == 0 || i == stats_shared->ndbs);
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
 * The slot of (dbid, roleid) in a table, claimed if it has none; the
 * table's overflow slot if it is full.  Found under the shared lock, so
 * backends that switch roles do not queue for the exclusive one.
 */
static IdemStatsSlot *
find_slot(StatsTable table, Oid dbid, Oid roleid)
{
	int			first;
	int			end;

	table_bounds(table, &first, &end);
	for (int pass = 0; pass < 2; pass++)
	{
		LWLockAcquire(stats_shared->lock, pass == 0 ? LW_SHARED : LW_EXCLUSIVE);
		for (int i = first + 1; i < end; i++)
		{
			IdemStatsSlot *s = &stats_shared->slots[i];

			if (s->used && s->dbid == dbid && s->roleid == roleid)
			{
				LWLockRelease(stats_shared->lock);
				return s;
			}
			if (!s->used)
			{
				if (pass == 0)
					break;		/* slots are claimed in order: none further */
				s->dbid = dbid;
				s->roleid = roleid;
				pg_atomic_write_u64(&s->stats_reset, (uint64) GetCurrentTimestamp());
				for (int c = 0; c < IDEM_STAT_NCOUNTERS; c++)
					pg_atomic_write_u64(&s->counters[c], 0);
				/* the atomics are written before the slot becomes findable */
				pg_write_barrier();
				s->used = true;
				LWLockRelease(stats_shared->lock);
				return s;
			}
		}
		LWLockRelease(stats_shared->lock);
	}
	return &stats_shared->slots[first];
}

/*
 * idem_stats_count_db
 *		Add n to a counter of the given database (the purge worker's
 *		counts for the databases it visits): its row only, no role's.
 */
void
idem_stats_count_db(Oid dbid, IdemStatCounter counter, uint64 n)
{
	IdemStatsSlot *slot;

	if (stats_shared == NULL || n == 0)
		return;
	if (dbid == MyDatabaseId && my_slot != NULL && my_slot_db == dbid)
		slot = my_slot;
	else
	{
		slot = find_slot(DB_TABLE, dbid, InvalidOid);
		if (dbid == MyDatabaseId)
		{
			my_slot = slot;
			my_slot_db = dbid;
		}
	}
	pg_atomic_fetch_add_u64(&slot->counters[counter], n);
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

/*
 * idem_stats_count
 *		Add n to a counter of the current database and of the current role
 *		in it.
 */
void
idem_stats_count(IdemStatCounter counter, uint64 n)
{
	Oid			role;

	if (stats_shared == NULL || n == 0)
		return;
	if (likely(my_slot != NULL && my_slot_db == MyDatabaseId))
		pg_atomic_fetch_add_u64(&my_slot->counters[counter], n);
	else
		idem_stats_count_db(MyDatabaseId, counter, n);
	if (!count_by_role)
		return;

	role = GetUserId();
	if (unlikely(my_role_slot == NULL || my_role_db != MyDatabaseId ||
				 my_role_id != role))
	{
		my_role_slot = find_slot(ROLE_TABLE, MyDatabaseId, role);
		my_role_db = MyDatabaseId;
		my_role_id = role;
	}
	pg_atomic_fetch_add_u64(&my_role_slot->counters[counter], n);
}

/*
 * idem_stats_count_for
 *		Add n to a counter of the given database and of a role in it: work
 *		done for that role by another process (its audit entries the queue
 *		or the worker lost).
 */
void
idem_stats_count_for(Oid dbid, Oid roleid, IdemStatCounter counter, uint64 n)
{
	IdemStatsSlot *slot;

	if (stats_shared == NULL || n == 0)
		return;
	idem_stats_count_db(dbid, counter, n);
	if (my_role_slot != NULL && my_role_db == dbid && my_role_id == roleid)
		slot = my_role_slot;
	else
		slot = find_slot(ROLE_TABLE, dbid, roleid);
	pg_atomic_fetch_add_u64(&slot->counters[counter], n);
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
	(void) find_slot(table, MyDatabaseId, role);

	see_all = table == DB_TABLE ||
		has_privs_of_role(role, ROLE_PG_READ_ALL_STATS);
	table_bounds(table, &first, &end);
	LWLockAcquire(stats_shared->lock, LW_SHARED);
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
