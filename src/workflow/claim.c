/*-------------------------------------------------------------------------
 *
 * claim.c
 *		Workers' side of run queues: idem_run_claim(), which leases due
 *		runs, idem_run_extend() (the heartbeat) and idem_run_release().
 *
 * A claim takes a queue's runs that are due (new, retry time reached,
 * signal arrived, wait or sleep over, or the last holder's lease ran out),
 * oldest due first, from the partial index of unfinished queued runs.  It
 * takes each run's lock without waiting (a run another claim, a step or a
 * verb holds is left for the next claim) and re-reads the run, as every
 * step does, before it leases it: a new token, due_at moved to the lease's
 * end (so leased runs leave the head of the index scan, and an expired
 * lease is simply due again), and a row of idem.run_attempts; it gives the
 * lock back once the run is written (its uncommitted version keeps the run
 * until the claim commits).  A claim that takes over an
 * expired lease counts it as a failed attempt; on the last attempt the
 * run fails instead.
 *
 * A queue's concurrency cap is kept by one claim at a time: the claim
 * takes the queue's cap lock and counts the leases that hold, in a
 * statement of its own after the lock, and so in READ COMMITTED sees every
 * lease an earlier claim committed.  A claim that leased nothing gives the
 * lock back before it waits.  A claim commits on its own: its lease and its
 * attempt's record must be durable before the worker acts on them.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/claim.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/jsonb.h"
#include "utils/resowner.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/wait_event.h"

#include "compat.h"
#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_run_claim);
PG_FUNCTION_INFO_V1(idem_run_extend);
PG_FUNCTION_INFO_V1(idem_run_release);

/* Most runs one claim may lease. */
#define CLAIM_MAX_RUNS		1000
/* Longest worker label, in bytes. */
#define CLAIM_MAX_WORKER_BYTES	255

#define CLAIM_COLS	11

/*
 * The roles with due runs in a queue (a skip scan of runs_owner_due_idx,
 * one probe per role), with their leases that hold and their oldest due
 * run; sorted here, not by a Sort node, whose memory every claim would
 * allocate and return to the system.
 */
static IdemQuery q_owners = {
	"WITH RECURSIVE o(owner) AS ("
	"  (SELECT r.owner FROM idem.runs r"
	"    WHERE r.queue OPERATOR(pg_catalog.=) $1 AND r.queue_state IS NOT NULL"
	"    ORDER BY r.owner LIMIT 1)"
	"  UNION ALL"
	"  SELECT (SELECT r.owner FROM idem.runs r"
	"           WHERE r.queue OPERATOR(pg_catalog.=) $1 AND r.queue_state IS NOT NULL"
	"             AND r.owner OPERATOR(pg_catalog.>) o.owner"
	"           ORDER BY r.owner LIMIT 1)"
	"    FROM o WHERE o.owner IS NOT NULL)"
	" SELECT o.owner, h.due,"
	"        (SELECT pg_catalog.count(*) FROM idem.runs r"
	"          WHERE r.queue OPERATOR(pg_catalog.=) $1 AND r.owner OPERATOR(pg_catalog.=) o.owner"
	"            AND r.queue_state IS NOT NULL AND r.due_at OPERATOR(pg_catalog.>) $2"
	"            AND r.queue_state OPERATOR(pg_catalog.=) 'leased') AS leased"
	"   FROM o CROSS JOIN LATERAL"
	"        (SELECT r.due_at AS due FROM idem.runs r"
	"          WHERE r.queue OPERATOR(pg_catalog.=) $1 AND r.owner OPERATOR(pg_catalog.=) o.owner"
	"            AND r.queue_state IS NOT NULL AND r.due_at OPERATOR(pg_catalog.<=) $2"
	"          ORDER BY r.due_at LIMIT 1) h"
	"  WHERE o.owner IS NOT NULL",
	2, {TEXTOID, TIMESTAMPTZOID},
	CURSOR_OPT_GENERIC_PLAN
};

/*
 * One role's oldest due runs, locked without waiting for those another
 * claim holds.
 */
static IdemQuery q_due_owner = {
	"SELECT owner, run_id FROM idem.runs"
	" WHERE queue OPERATOR(pg_catalog.=) $1"
	"   AND owner OPERATOR(pg_catalog.=) $4"
	"   AND queue_state IS NOT NULL"
	"   AND due_at OPERATOR(pg_catalog.<=) $2"
	" ORDER BY due_at"
	" LIMIT $3"
	" FOR UPDATE SKIP LOCKED",
	4, {TEXTOID, TIMESTAMPTZOID, INT4OID, REGROLEOID},
	CURSOR_OPT_GENERIC_PLAN
};


/* A completed step's result, for results_so_far() */
typedef struct StepResult
{
	char	   *step;
	int			ordinal;
	Jsonb	   *result;
} StepResult;

/* jsonb's order of keys, a later completion of a step after an earlier */
static int
step_result_cmp(const void *a, const void *b)
{
	const StepResult *ra = a;
	const StepResult *rb = b;
	int			c = idem_jsonb_key_cmp(&ra->step, &rb->step);

	if (c != 0)
		return c;
	return (ra->ordinal > rb->ordinal) - (ra->ordinal < rb->ordinal);
}

/*
 * The results of the run's completed steps, as one object by step name;
 * NULL if they are more than one jsonb value holds (each step's is within
 * idem.max_response_size, but a thousand of them need not be).  Each
 * result is copied into the object whole (src/common/jsonbwrite.c).
 */
static Jsonb *
results_so_far(IdemRunRow *run)
{
	Datum	   *names;
	int			n;
	StepResult *found;
	int			nfound = 0;
	int			nkeys = 0;
	Size		total = 0;
	StringInfoData buf;
	IdemJsonbWriter object;

	deconstruct_array(run->done_steps, TEXTOID, -1, false, TYPALIGN_INT,
					  &names, NULL, &n);
	found = palloc(sizeof(StepResult) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		char	   *step = TextDatumGetCString(names[i]);
		IdemRecord	rec;

		CHECK_FOR_INTERRUPTS();
		if (!idem_lookup_key(run->owner, idem_run_step_key(run->run_id, step),
							 &rec) || !rec.visible)
			continue;
		/* the key, the value with its padding (within its header), entries */
		total += VARSIZE(rec.response) + strlen(step) + 2 * sizeof(JEntry);
		if (total > JENTRY_OFFLENMASK)
			return NULL;
		found[nfound].step = step;
		found[nfound].ordinal = nfound;
		found[nfound].result = rec.response;
		nfound++;
	}

	/* a step listed twice keeps its later result, as an object would */
	qsort(found, nfound, sizeof(StepResult), step_result_cmp);
	for (int i = 0; i < nfound; i++)
	{
		if (nkeys > 0 && strcmp(found[nkeys - 1].step, found[i].step) == 0)
			nkeys--;
		found[nkeys++] = found[i];
	}

	idem_jsonb_begin(&buf, total + 64);
	idem_jsonb_open(&object, &buf, true, nkeys);
	for (int i = 0; i < nkeys; i++)
		idem_jsonb_add_string(&object, found[i].step, strlen(found[i].step));
	for (int i = 0; i < nkeys; i++)
	{
		CHECK_FOR_INTERRUPTS();
		idem_jsonb_add_jsonb(&object, found[i].result);
	}
	idem_jsonb_close(&object, NULL);
	return idem_jsonb_end(&buf);
}

/* Runs the current pass of a claim failed: a change even when it leased nothing. */
static int	claim_failed_runs = 0;

/* A run the claim fails instead of leasing it, off its queue for good. */
static void
fail_at_claim(IdemRunRow *run, Oid owner, TimestampTz now, const char *error)
{
	claim_failed_runs++;
	run->status = "failed";
	run->finished = true;
	run->finished_at = now;
	run->last_error = (char *) error;
	run->queue_state = NULL;
	run->due_at = DT_NOEND;
	idem_update_run(run);
	idem_stats_count_for(MyDatabaseId, owner, IDEM_STAT_RUNS_FAILED, 1);
}

/*
 * Lease one due run found by the scan (at tid, if known), whose lock the
 * claim holds, if it still is due; put it into store.  Returns whether it
 * was leased.
 */
static bool
lease_locked_run(Oid owner, const char *run_id, ItemPointer tid, IdemQueue *q,
				 int64 lease_us, Oid caller, const char *worker,
				 Tuplestorestate *store, TupleDesc tupdesc)
{
	TimestampTz now = GetCurrentTimestamp();
	IdemRunRow	run;
	Datum		values[CLAIM_COLS];
	bool		nulls[CLAIM_COLS] = {0};
	char	   *next;
	int			max_attempts;
	Jsonb	   *results;

	if (!idem_lookup_run_at(owner, run_id, tid, &run) ||
		run.queue == NULL || strcmp(run.queue, q->queue) != 0 ||
		run.queue_state == NULL || strcmp(run.status, "running") != 0 ||
		TIMESTAMP_IS_NOEND(run.due_at) || run.due_at > now)
		return false;

	if (strcmp(run.queue_state, "leased") == 0)
	{
		/* the holder's lease ran out: its attempt failed */
		idem_run_end_lease_expired(&run, now);
		max_attempts = run.max_attempts > 0 ? run.max_attempts : q->max_attempts;
		if (run.attempt >= max_attempts)
		{
			fail_at_claim(&run, owner, now, "lease expired on the last attempt");
			return false;
		}
		run.attempt++;
	}

	/*
	 * Its steps would write records and events for a role that no longer
	 * exists, which a role created later with the same OID would own, and
	 * idem_run_purge() removes such a run, running or not.
	 */
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(owner)))
	{
		fail_at_claim(&run, owner, now, "its owner role was dropped");
		return false;
	}

	results = results_so_far(&run);
	if (results == NULL)
	{
		/*
		 * No claim could ever return this run: failing it keeps it from
		 * failing every claim that reaches it, other roles' too.
		 */
		fail_at_claim(&run, owner, now,
					  "the results of its completed steps exceed the 256 MB of the one jsonb value a claim returns them in");
		return false;
	}

	run.queue_state = "leased";
	run.due_at = now + lease_us;
	run.has_token = true;
	memcpy(&run.lease_token, DatumGetUUIDP(idem_random_uuid()), UUID_LEN);
	run.leased_by = caller;
	run.lease_holder = (char *) worker;
	run.claims++;
	idem_update_run(&run);
	idem_run_token_owner_note(&run.lease_token, run.run_id, owner, run.queue);
	next = idem_run_next_step(&run);
	idem_run_attempt_begin(&run, next, now);
	idem_stats_count_for(MyDatabaseId, owner, IDEM_STAT_RUNS_CLAIMED, 1);

	values[0] = CStringGetTextDatum(run.run_id);
	values[1] = ObjectIdGetDatum(owner);
	nulls[2] = run.input == NULL;
	values[2] = run.input ? JsonbPGetDatum(run.input) : (Datum) 0;
	nulls[3] = run.steps == NULL;
	values[3] = PointerGetDatum(run.steps);
	nulls[4] = next == NULL;
	values[4] = next ? CStringGetTextDatum(next) : (Datum) 0;
	values[5] = Int32GetDatum(run.attempt);
	values[6] = UUIDPGetDatum(&run.lease_token);
	values[7] = TimestampTzGetDatum(run.due_at);
	values[8] = JsonbPGetDatum(results);
	nulls[9] = nulls[10] = run.started_step == NULL;
	values[9] = run.started_step ? CStringGetTextDatum(run.started_step) : (Datum) 0;
	values[10] = Int32GetDatum(run.started_count);
	tuplestore_putvalues(store, tupdesc, values, nulls);
	return true;
}

/*
 * Lease one due run found by the scan (at tid, if known), if it still is
 * due once its lock is taken; put it into store.  Returns whether it was
 * leased.
 *
 * The run's lock is given back at once, whether the run was leased,
 * failed or left.  The scan of one role's runs goes on until it has
 * leased enough, and fails on its way every run that can never be worked
 * (a lease that ran out on the last attempt, an owner dropped), and a
 * claim leases up to CLAIM_MAX_RUNS: held to commit, the lock of each
 * would take a slot of the shared lock table, and a backlog of dead runs,
 * or a claim of many runs, larger than the table would fail every claim of
 * the queue (53200).  A run the claim leased or failed is kept by its
 * version not yet committed instead (idem_lock_and_lookup_run()).
 */
static bool
lease_run(Oid owner, const char *run_id, ItemPointer tid, IdemQueue *q,
		  int64 lease_us, Oid caller, const char *worker,
		  Tuplestorestate *store, TupleDesc tupdesc)
{
	char	   *lockkey = idem_run_lock_key(run_id);
	int			keylen = strlen(lockkey);
	bool		leased;

	/* a run whose step or verb is running now is the next claim's */
	if (!idem_try_lock_key(owner, lockkey, keylen))
		return false;
	leased = lease_locked_run(owner, run_id, tid, q, lease_us, caller, worker,
							  store, tupdesc);
	idem_unlock_key(owner, lockkey, keylen);
	return leased;
}

/* A role with due runs, as q_owners finds it. */
typedef struct DueRole
{
	Oid			owner;
	TimestampTz oldest;
	int64		leased;
} DueRole;

/* The fewest leases first, then the oldest due run. */
static int
due_role_cmp(const void *a, const void *b)
{
	const DueRole *x = a;
	const DueRole *y = b;

	if (x->leased != y->leased)
		return x->leased < y->leased ? -1 : 1;
	if (x->oldest != y->oldest)
		return x->oldest < y->oldest ? -1 : 1;
	return 0;
}

/*
 * The most roles a claim shares among: the first in the share's order, all
 * roles with due runs sorted, not the first found (lowest OIDs), which the
 * next claim would find first again.  The others come first in later
 * claims, once the roles this one served hold its leases.
 */
#define CLAIM_MAX_OWNERS	1000

/*
 * Due runs for a claim, in the order to try them: owners[i], run_ids[i].
 * Inside the caller's SPI connection; the arrays in its context.
 */
static uint64
collect_due(IdemQuery *q, Datum *values, char *nulls, IdemOwnerSPI *spi,
			Oid **owners, char ***run_ids, uint64 have)
{
	uint64		n;

	idem_query_run(q, values, nulls, 0);
	n = SPI_processed;
	*owners = have == 0 ?
		MemoryContextAlloc(spi->callercxt, sizeof(Oid) * Max(n, 1)) :
		repalloc(*owners, sizeof(Oid) * (have + Max(n, 1)));
	*run_ids = have == 0 ?
		MemoryContextAlloc(spi->callercxt, sizeof(char *) * Max(n, 1)) :
		repalloc(*run_ids, sizeof(char *) * (have + Max(n, 1)));
	for (uint64 i = 0; i < n; i++)
	{
		bool		isnull;

		(*owners)[have + i] = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[i],
															 SPI_tuptable->tupdesc,
															 1, &isnull));
		(*run_ids)[have + i] = MemoryContextStrdup(spi->callercxt,
												   SPI_getvalue(SPI_tuptable->vals[i],
																SPI_tuptable->tupdesc, 2));
	}
	return have + n;
}

/* A claim in progress, for take_due_run() */
typedef struct ClaimState
{
	IdemQueue  *q;
	int64		lease_us;
	Oid			caller;
	const char *worker;
	Tuplestorestate *store;
	TupleDesc	tupdesc;
	int32		want;
	int32		leased;
	MemoryContext runcxt;
} ClaimState;

/*
 * lease_run() in a context of its own, emptied after each run: a run's
 * results may be up to 256 MB, read and built again for the claim's row,
 * and the row is in the tuplestore (spilled to disk past work_mem) once
 * lease_run() returns, so a claim of many runs needs the memory of one.
 */
static bool
lease_one(ClaimState *cs, Oid owner, const char *run_id, ItemPointer tid)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(cs->runcxt);
	bool		leased;

	leased = lease_run(owner, run_id, tid, cs->q, cs->lease_us, cs->caller,
					   cs->worker, cs->store, cs->tupdesc);
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(cs->runcxt);
	return leased;
}

/* Lease a due run the index scan offers; false once the claim has enough. */
static bool
take_due_run(Oid owner, const char *run_id, ItemPointer tid, void *arg)
{
	ClaimState *cs = arg;

	if (lease_one(cs, owner, run_id, tid))
		cs->leased++;
	return cs->leased < cs->want;
}

/*
 * One claim of queue into store; returns how many runs it leased.
 *
 * The roles whose runs are due share the claim: the role with the fewest
 * leases that hold goes first (then the one whose oldest due run is
 * oldest), one run each in turn, so that one role's backlog never holds
 * another role's runs back.  Within a role, oldest due first.  A queue
 * whose unfinished runs are all one role's is claimed in one scan of its
 * index, without a plan or a sort.
 */
static int32
claim_into(IdemQueue *q, int32 max_runs, int64 lease_us, Oid caller,
		   const char *worker, Tuplestorestate *store, TupleDesc tupdesc)
{
	IdemOwnerSPI spi;
	Datum		values[4];
	char		nulls[4] = {' ', ' ', ' ', ' '};
	TimestampTz now = GetCurrentTimestamp();
	int32		want = idem_queue_room(q, max_runs, now);
	ClaimState	cs = {q, lease_us, caller, worker, store, tupdesc, want, 0, NULL};
	int32		leased = 0;
	uint64		n = 0;
	int			nestlevel;
	Oid		   *owners = NULL;
	char	  **run_ids = NULL;
	DueRole    *roles;
	int			nroles;

	if (want == 0)
		return 0;
	cs.runcxt = AllocSetContextCreate(CurrentMemoryContext, "idem_run_claim run",
									  ALLOCSET_DEFAULT_SIZES);
	/* one role, or none: its oldest due runs, straight off the index */
	if (idem_scan_due_runs(q->queue, now, take_due_run, &cs))
		return cs.leased;
	values[0] = CStringGetTextDatum(q->queue);
	values[1] = TimestampTzGetDatum(now);

	/*
	 * The plans are made once per backend, perhaps while idem.runs is still
	 * empty, when a scan of the whole table looks as cheap as the index:
	 * they must be the index scans in due order whatever the table held.
	 */
	nestlevel = NewGUCNestLevel();
	(void) set_config_option("enable_seqscan", "off", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_sort", "off", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	(void) set_config_option("enable_bitmapscan", "off", PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run(&q_owners, values, nulls, 0);
	nroles = (int) SPI_processed;
	roles = MemoryContextAlloc(spi.callercxt, sizeof(DueRole) * Max(nroles, 1));
	for (int i = 0; i < nroles; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		roles[i].owner = DatumGetObjectId(SPI_getbinval(tup, desc, 1, &isnull));
		roles[i].oldest = DatumGetTimestampTz(SPI_getbinval(tup, desc, 2, &isnull));
		roles[i].leased = DatumGetInt64(SPI_getbinval(tup, desc, 3, &isnull));
	}
	if (nroles > 1)
		qsort(roles, nroles, sizeof(DueRole), due_role_cmp);
	nroles = Min(nroles, CLAIM_MAX_OWNERS);
	if (nroles > 0)
	{
		/*
		 * Each role's oldest due runs, as many as the rounds of one run per
		 * role that want may need, then taken in turn.
		 */
		int32		rounds = (want + nroles - 1) / nroles;
		uint64	   *start = palloc(sizeof(uint64) * (nroles + 1));
		Oid		   *all_owners = NULL;
		char	  **all_ids = NULL;
		uint64		total = 0;

		values[2] = Int32GetDatum(rounds);
		for (int i = 0; i < nroles; i++)
		{
			CHECK_FOR_INTERRUPTS();
			start[i] = total;
			values[3] = ObjectIdGetDatum(roles[i].owner);
			total = collect_due(&q_due_owner, values, nulls, &spi, &all_owners,
								&all_ids, total);
		}
		start[nroles] = total;
		owners = MemoryContextAlloc(spi.callercxt, sizeof(Oid) * Max(total, 1));
		run_ids = MemoryContextAlloc(spi.callercxt, sizeof(char *) * Max(total, 1));
		for (int32 r = 0; r < rounds; r++)
			for (int i = 0; i < nroles; i++)
				if (start[i] + r < start[i + 1])
				{
					owners[n] = all_owners[start[i] + r];
					run_ids[n] = all_ids[start[i] + r];
					n++;
				}
	}
	idem_owner_spi_end(&spi);
	AtEOXact_GUC(true, nestlevel);
	for (uint64 i = 0; i < n && leased < want; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (lease_one(&cs, owners[i], run_ids[i], NULL))
			leased++;
	}
	return leased;
}

/*
 * idem_run_claim(queue text, max_runs integer, lease interval,
 *		worker text, wait interval) returns table (run_id, owner, input,
 *		steps, next_step, attempt, lease_token, lease_until, results,
 *		started_step, started_attempts)
 *
 * With wait, a claim that finds nothing looks again when a run of the
 * queue is enqueued, signalled or released (with shared memory), and at
 * least every IDEM_CLAIM_POLL_MS for runs that became due by time, until it
 * leases some or wait has passed.
 */
Datum
idem_run_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			caller = GetUserId();
	char	   *queue;
	int32		max_runs;
	int64		lease_us;
	char	   *worker;
	long		wait_ms;
	IdemQueue	q;
	TimestampTz deadline;
	char		channel[300];
	MemoryContext scancxt;
	int			pass = 0;

	queue = idem_name_arg(fcinfo, 0, IDEM_NAME_QUEUE);
	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("max_runs and lease must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	max_runs = PG_GETARG_INT32(1);
	if (max_runs < 1 || max_runs > CLAIM_MAX_RUNS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_runs must be between 1 and %d", CLAIM_MAX_RUNS),
				 errdetail("max_runs is %d.", max_runs),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	lease_us = idem_lease_usecs(PG_GETARG_INTERVAL_P(2), idem_run_max_lease,
								"idem.run_max_lease");
	worker = PG_ARGISNULL(3) ? psprintf("pid %d", MyProcPid) :
		text_to_cstring(PG_GETARG_TEXT_PP(3));
	idem_check_name(IDEM_NAME_WORKER, worker, CLAIM_MAX_WORKER_BYTES, NULL);
	wait_ms = PG_ARGISNULL(4) ? 0 : idem_wait_ms(PG_GETARG_INTERVAL_P(4));
	idem_check_can_write("idem_run_claim()");
	if (IsolationUsesXactSnapshot())
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem_run_claim() needs READ COMMITTED"),
				 errdetail("The transaction's isolation level is %s.",
						   IsolationIsSerializable() ? "SERIALIZABLE" : "REPEATABLE READ"),
				 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, "Claim in a READ COMMITTED transaction of its own.")));
	idem_queue_check(queue, caller, QUEUE_WORK, &q);

	InitMaterializedSRF(fcinfo, 0);
	if (rsinfo->setDesc->natts != CLAIM_COLS)
		elog(ERROR, "idem_run_claim() must return %d columns", CLAIM_COLS);
	idem_queue_channel(queue, channel, sizeof(channel));
	deadline = GetCurrentTimestamp() + (int64) wait_ms * 1000;

	/*
	 * A waiting claim scans again and again, up to an hour, each time
	 * reading every due run it cannot lease (held by another transaction):
	 * what a scan allocated must go with it.  The leased runs are copied
	 * into the result's tuplestore.
	 */
	scancxt = AllocSetContextCreate(CurrentMemoryContext, "idem_run_claim scan",
									ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		TimestampTz now;
		long		left;
		MemoryContext oldcxt;
		int32		leased;
		bool		may_wait = wait_ms > 0;
		IdemSubxact sx;

		/*
		 * Every pass is checked as a call is: a worker whose work grant was
		 * revoked while it waited leases nothing more (42501), and the
		 * pass uses the queue's policy as it is now.  What the check
		 * allocates goes with the pass.
		 */
		if (pass++ > 0)
		{
			IdemQueue	latest;

			oldcxt = MemoryContextSwitchTo(scancxt);
			idem_queue_check(queue, caller, QUEUE_WORK, &latest);
			MemoryContextSwitchTo(oldcxt);
			latest.queue = q.queue;
			q = latest;
		}
		idem_wakeup_note_claim(channel);
		/*
		 * A pass of a claim that may wait is a subtransaction: one that
		 * leased nothing and changed nothing is rolled back before the wait,
		 * which lets go of the rows it locked (FOR UPDATE SKIP LOCKED) and
		 * of the runs whose lock it took and then did not lease.  Kept, a
		 * due run that a step or an operator's verb is working on (a lease
		 * that ran out, its holder still at work) would stay locked by the
		 * claim, and the step's write of the run would wait for the claim's
		 * wait to end.
		 */
		if (may_wait)
			idem_subxact_begin(&sx);
		claim_failed_runs = 0;
		oldcxt = MemoryContextSwitchTo(scancxt);
		PG_TRY();
		{
			leased = claim_into(&q, max_runs, lease_us, caller, worker,
								rsinfo->setResult, rsinfo->setDesc);
		}
		PG_CATCH();
		{
			/*
			 * The pass's own subtransaction ends with it: a caller that
			 * catches the error (a PL/pgSQL exception block) rolls back its
			 * own, the innermost one to it.
			 */
			if (may_wait)
				ReThrowError(idem_subxact_abort(&sx));
			PG_RE_THROW();
		}
		PG_END_TRY();
		MemoryContextSwitchTo(oldcxt);
		if (may_wait)
			idem_subxact_end(&sx, leased > 0 || claim_failed_runs > 0);
		MemoryContextReset(scancxt);
		if (leased > 0)
			break;
		/* the rollback let go of the cap lock too */
		if (!may_wait || claim_failed_runs > 0)
			idem_queue_room_release(&q);
		/* the runs it failed are written: commit them rather than wait */
		if (claim_failed_runs > 0)
			break;
		now = GetCurrentTimestamp();
		if (now >= deadline)
			break;
		left = (long) ((deadline - now) / 1000);
		idem_wakeup_sleep(channel, left);
	}
	MemoryContextDelete(scancxt);
	return (Datum) 0;
}

/*
 * idem_run_extend(run_id text, lease_token uuid, lease interval)
 *		returns timestamptz
 *
 * The heartbeat: the lease runs on from now, fenced like a step (a lease
 * that ran out and was not taken over still extends).  Returns the new end
 * of the lease.
 */
Datum
idem_run_extend(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	const pg_uuid_t *token = idem_lease_token_arg(fcinfo, 1, true);
	int64		lease_us;
	IdemRunRow	run;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("lease must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	lease_us = idem_lease_usecs(PG_GETARG_INTERVAL_P(2), idem_run_max_lease,
								"idem.run_max_lease");
	idem_check_can_write("idem_run_extend()");
	idem_lock_run_leased(run_id, token, IDEM_ACT_RUN_EXTEND, &run);
	idem_run_check_room(&run);
	run.due_at = GetCurrentTimestamp() + lease_us;
	idem_update_run(&run);
	PG_RETURN_TIMESTAMPTZ(run.due_at);
}

/*
 * idem_run_release(run_id text, lease_token uuid, retry_after interval,
 *		reason text) returns void
 *
 * A worker hands back a run it will not work on, the attempt not counted:
 * it is stopping (due now, so another worker takes it at once), or it has
 * no code for the run's next step, as in a rolling deploy (due after
 * retry_after, so that a worker that has it takes the run rather than the
 * same one again).  The reason is the attempt's error and the run's last
 * error, for the operator who wonders why the run does not move.
 */
Datum
idem_run_release(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	const pg_uuid_t *token = idem_lease_token_arg(fcinfo, 1, true);
	int64		retry_after_us = 0;
	char	   *reason = NULL;
	IdemRunRow	run;
	TimestampTz now = GetCurrentTimestamp();

	if (!PG_ARGISNULL(2))
		retry_after_us = idem_retry_after_usecs(PG_GETARG_INTERVAL_P(2));
	if (!PG_ARGISNULL(3))
	{
		reason = text_to_cstring(PG_GETARG_TEXT_PP(3));
		idem_check_error_text(IDEM_TEXT_REASON, reason);
	}
	idem_check_can_write("idem_run_release()");
	idem_lock_run_leased(run_id, token, IDEM_ACT_RUN_RELEASE, &run);
	idem_run_end_lease(&run, "released", reason, now);
	if (reason != NULL)
		run.last_error = reason;
	run.queue_state = "ready";
	run.due_at = now + retry_after_us;
	idem_update_run(&run);
	if (retry_after_us == 0)
		idem_queue_wake(run.queue);
	PG_RETURN_VOID();
}
