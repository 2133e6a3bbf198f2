/*-------------------------------------------------------------------------
 *
 * stats.c
 *		idem's counters in shared memory: the idem_stats view,
 *		idem_stats_reset(), and idem_note_outcome(), the hook every
 *		outcome of a call goes through.
 *
 * One slot per database, up to idem.stats_max_databases; a database that
 * finds the table full counts in the overflow slot (database InvalidOid,
 * shown with datname NULL).  A slot is claimed under the lock once per
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
 *	  src/stats.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idem.h"

typedef struct IdemDbStats
{
	Oid			dbid;			/* InvalidOid: free, or the overflow slot */
	bool		used;
	pg_atomic_uint64 stats_reset;	/* TimestampTz of the last reset */
	pg_atomic_uint64 counters[IDEM_STAT_NCOUNTERS];
} IdemDbStats;

typedef struct IdemStatsShared
{
	LWLock	   *lock;			/* claims slots */
	int			nslots;			/* slot 0 is the overflow slot */
	IdemDbStats slots[FLEXIBLE_ARRAY_MEMBER];
} IdemStatsShared;

int			idem_stats_max_databases = 64;

static IdemStatsShared *stats_shared = NULL;

/* this backend's slot for MyDatabaseId */
static IdemDbStats *my_slot = NULL;
static Oid	my_slot_db = InvalidOid;

static bool told_not_collecting = false;

PG_FUNCTION_INFO_V1(idem_stats_1_1);
PG_FUNCTION_INFO_V1(idem_stats_reset_1_1);

Size
idem_stats_shmem_size(void)
{
	return add_size(offsetof(IdemStatsShared, slots),
					mul_size(idem_stats_max_databases + 1, sizeof(IdemDbStats)));
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
		stats_shared->nslots = idem_stats_max_databases + 1;
		for (int i = 0; i < stats_shared->nslots; i++)
		{
			IdemDbStats *slot = &stats_shared->slots[i];

			slot->dbid = InvalidOid;
			slot->used = (i == 0);
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

/* The database's slot, claimed if it has none; the overflow slot if full. */
static IdemDbStats *
find_slot(Oid dbid)
{
	IdemDbStats *slot = NULL;

	LWLockAcquire(stats_shared->lock, LW_EXCLUSIVE);
	for (int i = 1; i < stats_shared->nslots; i++)
	{
		IdemDbStats *s = &stats_shared->slots[i];

		if (s->used && s->dbid == dbid)
		{
			slot = s;
			break;
		}
		if (!s->used)
		{
			s->dbid = dbid;
			pg_atomic_write_u64(&s->stats_reset, (uint64) GetCurrentTimestamp());
			for (int c = 0; c < IDEM_STAT_NCOUNTERS; c++)
				pg_atomic_write_u64(&s->counters[c], 0);
			/* the atomics are written before the slot becomes findable */
			pg_write_barrier();
			s->used = true;
			slot = s;
			break;
		}
	}
	LWLockRelease(stats_shared->lock);
	if (slot == NULL)
		slot = &stats_shared->slots[0];
	return slot;
}

/*
 * idem_stats_count_db
 *		Add n to a counter of the given database.
 */
void
idem_stats_count_db(Oid dbid, IdemStatCounter counter, uint64 n)
{
	IdemDbStats *slot;

	if (stats_shared == NULL || n == 0)
		return;
	if (dbid == MyDatabaseId && my_slot != NULL && my_slot_db == dbid)
		slot = my_slot;
	else
	{
		slot = find_slot(dbid);
		if (dbid == MyDatabaseId)
		{
			my_slot = slot;
			my_slot_db = dbid;
		}
	}
	pg_atomic_fetch_add_u64(&slot->counters[counter], n);
}

/*
 * idem_stats_count
 *		Add n to a counter of the current database.
 */
void
idem_stats_count(IdemStatCounter counter, uint64 n)
{
	if (stats_shared == NULL)
		return;
	if (likely(my_slot != NULL && my_slot_db == MyDatabaseId))
		pg_atomic_fetch_add_u64(&my_slot->counters[counter], n);
	else
		idem_stats_count_db(MyDatabaseId, counter, n);
}

static const IdemStatCounter outcome_counter[] = {
	[IDEM_OUTCOME_EXECUTED] = IDEM_STAT_EXECUTIONS,
	[IDEM_OUTCOME_REPLAYED] = IDEM_STAT_REPLAYS,
	[IDEM_OUTCOME_MISMATCH] = IDEM_STAT_MISMATCHES,
	[IDEM_OUTCOME_IN_PROGRESS] = IDEM_STAT_IN_PROGRESS,
	[IDEM_OUTCOME_CONFLICT] = IDEM_STAT_CONFLICTS,
	[IDEM_OUTCOME_SEQUENCING] = IDEM_STAT_SEQUENCING,
	[IDEM_OUTCOME_ERROR] = IDEM_STAT_ERRORS,
};

/*
 * idem_error_outcome
 *		What a call's error means: executing says whether the business
 *		statement had started.  Its errors are the business statement's
 *		own (even an ID422 of a nested call), except conflicts, which mean
 *		"retry" wherever they arise.
 */
IdemOutcome
idem_error_outcome(int sqlerrcode, bool executing)
{
	if (ERRCODE_TO_CATEGORY(sqlerrcode) == ERRCODE_TRANSACTION_ROLLBACK)
		return IDEM_OUTCOME_CONFLICT;
	if (executing)
		return IDEM_OUTCOME_ERROR;
	if (sqlerrcode == ERRCODE_IDEM_KEY_REUSED)
		return IDEM_OUTCOME_MISMATCH;
	if (sqlerrcode == ERRCODE_IDEM_IN_PROGRESS)
		return IDEM_OUTCOME_IN_PROGRESS;
	if (sqlerrcode == ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE ||
		sqlerrcode == ERRCODE_IDEM_STEP_UNDECLARED ||
		sqlerrcode == ERRCODE_IDEM_RUN_NOT_RUNNING ||
		sqlerrcode == ERRCODE_IDEM_RUN_NOT_FOUND)
		return IDEM_OUTCOME_SEQUENCING;
	return IDEM_OUTCOME_ERROR;
}

/*
 * idem_note_outcome
 *		Count one call's outcome, and audit it at the level idem.audit asks.
 */
void
idem_note_outcome(IdemOutcome outcome, const IdemRequest *req,
				  const uint8 *fingerprint, const char *run_id,
				  const char *step, int sqlerrcode)
{
	idem_stats_count(outcome_counter[outcome], 1);
	if (idem_audit_level != IDEM_AUDIT_OFF)
		idem_audit_note(outcome, req, fingerprint, run_id, step, sqlerrcode);
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

#define STATS_COLS (IDEM_STAT_NCOUNTERS + 2)

static void
emit_row(Tuplestorestate *ts, TupleDesc desc, Oid dbid, IdemDbStats *slot)
{
	Datum		values[STATS_COLS];
	bool		nulls[STATS_COLS] = {0};
	int			col = 0;

	if (OidIsValid(dbid))
		values[col++] = ObjectIdGetDatum(dbid);
	else
		nulls[col++] = true;
	for (int c = 0; c < IDEM_STAT_NCOUNTERS; c++)
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
 * idem_stats() returns setof record: one row per database that counted
 * something, plus the overflow row if it did.
 */
Datum
idem_stats_1_1(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != STATS_COLS)
		elog(ERROR, "idem_stats() must return %d columns", STATS_COLS);

	if (stats_shared == NULL)
	{
		tell_not_collecting();
		emit_row(rsinfo->setResult, rsinfo->setDesc, MyDatabaseId, NULL);
		PG_RETURN_VOID();
	}

	/* the current database always has its row, zeros until it counts */
	(void) find_slot(MyDatabaseId);

	LWLockAcquire(stats_shared->lock, LW_SHARED);
	for (int i = 0; i < stats_shared->nslots; i++)
	{
		IdemDbStats *slot = &stats_shared->slots[i];
		bool		any = false;

		if (!slot->used)
			continue;
		if (i == 0)
		{
			for (int c = 0; c < IDEM_STAT_NCOUNTERS && !any; c++)
				any = pg_atomic_read_u64(&slot->counters[c]) != 0;
			if (!any)
				continue;
		}
		emit_row(rsinfo->setResult, rsinfo->setDesc, slot->dbid, slot);
	}
	LWLockRelease(stats_shared->lock);
	PG_RETURN_VOID();
}

/*
 * idem_stats_reset() returns void: zero every database's counters.
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
	for (int i = 0; i < stats_shared->nslots; i++)
	{
		IdemDbStats *slot = &stats_shared->slots[i];

		if (!slot->used)
			continue;
		for (int c = 0; c < IDEM_STAT_NCOUNTERS; c++)
			pg_atomic_write_u64(&slot->counters[c], 0);
		pg_atomic_write_u64(&slot->stats_reset, (uint64) now);
	}
	LWLockRelease(stats_shared->lock);
	PG_RETURN_VOID();
}
