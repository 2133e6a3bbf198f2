/*-------------------------------------------------------------------------
 *
 * run.c
 *		Workflow runs: idem_run_begin(), idem_step(), idem_step_complete(),
 *		idem_step_key(), the run verbs (fail, resume, complete) and the
 *		readers idem_run_status() and idem_run_steps().
 *
 * A run is a row of idem.runs, owned like a key by the role that began it.
 * A step is recorded as an ordinary key record in idem.keys, under the key
 * idem_step_key(run, step) and with no expiry, and by its name and attempt
 * count in the run's row; so a step replays exactly as idem_execute() does.
 * The key belongs to the run: idem_execute() and its siblings refuse it
 * (only the run's functions check its order and status), and a record under
 * it that the run does not list is never taken for the step.  The step's
 * business write, its record, the run's progress and its outbox event
 * commit in the caller's transaction, or not at all.
 *
 * Every call that changes a run takes the run's advisory lock (honouring
 * idem.wait) and reads the run's latest version, as key lookups do: the lock
 * serializes the run's steps, and a REPEATABLE READ or SERIALIZABLE caller
 * whose snapshot cannot see that version (another agent moved the run on)
 * fails with 40001 instead of acting on what it saw.  The run's row is
 * read and updated directly (tables.c), one HOT update per step.
 *
 * The sequencing reaches the run and its steps' records through a store
 * (IdemRunStore): idem.runs and idem.keys on this node here, and a tenant's
 * shards under Citus (tenant.c), so that one implementation of the rules
 * serves both.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/run.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_run_begin);
PG_FUNCTION_INFO_V1(idem_step);
PG_FUNCTION_INFO_V1(idem_step_complete);
PG_FUNCTION_INFO_V1(idem_step_key);
PG_FUNCTION_INFO_V1(idem_run_fail);
PG_FUNCTION_INFO_V1(idem_run_resume);
PG_FUNCTION_INFO_V1(idem_run_complete);
PG_FUNCTION_INFO_V1(idem_run_status);
PG_FUNCTION_INFO_V1(idem_run_steps);
PG_FUNCTION_INFO_V1(idem_run_try_lock);
PG_FUNCTION_INFO_V1(idem_step_start);
PG_FUNCTION_INFO_V1(idem_step_fail);
PG_FUNCTION_INFO_V1(idem_run_await);

/* Arguments of idem_step() before the statement's own: run, step, sql */
#define STEP_FIXED_ARGS 3

/* The longest wait of idem_run_await() and sleep of idem_run_sleep(). */
#define RUN_MAX_WAIT_DAYS	366

static int
run_nsteps(IdemRunRow *run)
{
	return run->steps == NULL ? 0 : ArrayGetNItems(ARR_NDIM(run->steps),
												   ARR_DIMS(run->steps));
}

static int
run_ndone(IdemRunRow *run)
{
	return ArrayGetNItems(ARR_NDIM(run->done_steps), ARR_DIMS(run->done_steps));
}

/* The name of declared step ordinal (1-based). */
static char *
declared_step(IdemRunRow *run, int ordinal)
{
	bool		isnull;
	Datum		d = array_get_element(PointerGetDatum(run->steps), 1, &ordinal,
									  -1, -1, false, TYPALIGN_INT, &isnull);

	return TextDatumGetCString(d);
}

/*
 * Where step is among the completed steps (1-based), or 0.  A run that
 * declared its steps completes them in that order, so its completed steps
 * are the first run_ndone() declared ones.
 */
static int
done_position(IdemRunRow *run, const char *step, int ordinal)
{
	if (run->steps != NULL)
		return ordinal <= run_ndone(run) ? ordinal : 0;
	return idem_run_name_position(run->done_steps, step);
}


/* Refuse a run of more than IDEM_MAX_RUN_STEPS steps. */
static void
check_step_count(int n, const char *run_id)
{
	if (n > IDEM_MAX_RUN_STEPS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("run \"%s\" would have too many steps", run_id),
				 errdetail_plural("It would have %d step; a run has at most %d.",
								  "It would have %d steps; a run has at most %d.",
								  n, n, IDEM_MAX_RUN_STEPS),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, "Split the work into several runs.")));
}

static void
report_not_running(IdemRunRow *run)
{
	if (strcmp(run->status, "failed") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
				 errmsg("run \"%s\" has failed", run->run_id),
				 errdetail("A failed run executes no new steps; completed steps still replay."),
				 idem_errhint(ERRCODE_IDEM_RUN_NOT_RUNNING, "Call idem_run_resume() to continue it.")));
	if (strcmp(run->status, "cancelled") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
				 errmsg("run \"%s\" was cancelled", run->run_id),
				 errdetail("A cancelled run executes no new steps; completed steps still replay."),
				 idem_errhint(ERRCODE_IDEM_RUN_NOT_RUNNING, "Begin a new run for new work.")));
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
			 errmsg("run \"%s\" is completed", run->run_id),
			 errdetail("A completed run executes no new steps; completed steps still replay."),
			 idem_errhint(ERRCODE_IDEM_RUN_NOT_RUNNING, "Begin a new run for new work.")));
}

/* A completed step must never run again, even if its record is gone. */
static void
report_lost_record(const IdemRunStore *store, IdemRunRow *run, const char *step)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("step \"%s\" of run \"%s\" is counted as completed but has no record",
					step, run->run_id),
			 errdetail("The key record %s was removed from %s.",
					   idem_run_step_key(run->run_id, step), store->keys_table),
			 idem_errhint(ERRCODE_DATA_CORRUPTED, NULL)));
}

/*
 * Whether a step that has no record may run now: the run must be running,
 * and when it declared its steps, every earlier one must have completed.
 */
static void
check_step_may_run(const IdemRunStore *store, IdemRunRow *run,
				   const char *step, int ordinal)
{
	int			ndone = run_ndone(run);

	if (strcmp(run->status, "running") != 0)
		report_not_running(run);
	if (ordinal == 0)
	{
		if (idem_run_name_position(run->done_steps, step) > 0)
			report_lost_record(store, run, step);
		check_step_count(ndone + 1, run->run_id);
		return;
	}
	if (ordinal > ndone + 1)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE),
				 errmsg("step \"%s\" of run \"%s\" cannot run yet", step,
						run->run_id),
				 errdetail("It is step %d; step %d (\"%s\") has not completed.",
						   ordinal, ndone + 1, declared_step(run, ndone + 1)),
				 idem_errhint(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE, "Run the steps in the order idem_run_begin() declared them; idem_run_status() names the next one.")));
	if (ordinal <= ndone)
		report_lost_record(store, run, step);
}

/*
 * Record a step that just completed: one more completed step, with one
 * attempt.  The last declared step completes the run in the same
 * transaction.
 */
static void
record_step(const IdemRunStore *store, IdemRunRow *run, const char *step,
			TimestampTz now)
{
	int			n;
	Datum	   *names;
	Datum	   *counts;
	int			ncounts;

	deconstruct_array(run->done_steps, TEXTOID, -1, false, TYPALIGN_INT,
					  &names, NULL, &n);
	deconstruct_array(run->attempts, INT4OID, 4, true, TYPALIGN_INT,
					  &counts, NULL, &ncounts);
	names = repalloc(names, (n + 1) * sizeof(Datum));
	counts = ncounts > 0 ? repalloc(counts, (n + 1) * sizeof(Datum))
		: palloc((n + 1) * sizeof(Datum));
	/* counts a hand edit left out read as 0, as idem_run_steps shows them */
	for (int i = ncounts; i < n; i++)
		counts[i] = Int32GetDatum(0);
	names[n] = CStringGetTextDatum(step);
	counts[n] = Int32GetDatum(1);
	run->done_steps = construct_array(names, n + 1, TEXTOID, -1, false,
									  TYPALIGN_INT);
	run->attempts = construct_array(counts, n + 1, INT4OID, 4, true,
									TYPALIGN_INT);
	if (run->queue != NULL)
	{
		/* the next step has its own attempts */
		run->attempt = 1;
		if (run->started_step != NULL && strcmp(run->started_step, step) == 0)
		{
			run->started_step = NULL;
			run->started_count = 0;
		}
		if (run->awaiting != NULL && strcmp(run->awaiting, step) == 0)
		{
			run->awaiting = NULL;
			run->wait_until = DT_NOEND;
		}
	}
	if (run->steps != NULL && n + 1 == run_nsteps(run))
	{
		run->status = "completed";
		run->finished = true;
		run->finished_at = now;
		/* a failure the run was resumed from is over */
		run->last_error = NULL;
		if (run->queue != NULL)
		{
			idem_run_end_lease(run, "completed", NULL, GetCurrentTimestamp());
			run->queue_state = NULL;
			run->due_at = DT_NOEND;
		}
	}
	store->update_run(store, run);
}

/* Count a replay of completed step number pos (1-based). */
static void
count_attempt(const IdemRunStore *store, IdemRunRow *run, int pos)
{
	Datum	   *counts;
	int			n;

	deconstruct_array(run->attempts, INT4OID, 4, true, TYPALIGN_INT,
					  &counts, NULL, &n);
	/* counts a hand edit left out read as 0, as idem_run_steps shows them */
	if (pos > n)
	{
		counts = n > 0 ? repalloc(counts, pos * sizeof(Datum))
			: palloc(pos * sizeof(Datum));
		for (int i = n; i < pos; i++)
			counts[i] = Int32GetDatum(0);
		n = pos;
	}
	counts[pos - 1] = Int32GetDatum(DatumGetInt32(counts[pos - 1]) + 1);
	run->attempts = construct_array(counts, n, INT4OID, 4, true, TYPALIGN_INT);
	store->update_run(store, run);
}

/*
 * The run's store on this node: idem.runs and idem.keys, written without
 * the executor (tables.c).
 */
static bool
local_lock_and_read(const IdemRunStore *store, Oid owner, const char *run_id,
					IdemRunRow *run)
{
	return idem_lock_and_lookup_run(owner, run_id, idem_run_lock_key(run_id),
									idem_wait, run);
}

static void
local_insert_run(const IdemRunStore *store, IdemRunRow *run)
{
	idem_insert_run(run);
}

static void
local_update_run(const IdemRunStore *store, IdemRunRow *run)
{
	idem_update_run(run);
}

static bool
local_find_record(const IdemRunStore *store, IdemStatement *stmt,
				  IdemRequest *req, const uint8 *fingerprint, TimestampTz now,
				  IdemRecord *rec)
{
	return idem_find_record(stmt, req, fingerprint, now, rec);
}

/* A step's record never expires: only its run's purge removes it. */
static void
local_insert_key(const IdemRunStore *store, IdemRequest *req,
				 const uint8 *fingerprint, Jsonb *response, TimestampTz now)
{
	TimestampTz never;

	TIMESTAMP_NOEND(never);
	idem_insert_key(req->key, req->owner, fingerprint, response, now, never);
}

static Jsonb *
local_execute(const IdemRunStore *store, IdemStatement *stmt,
			  IdemRequest *req)
{
	return idem_execute_statement(stmt, req);
}

static bool
local_read_record(const IdemRunStore *store, Oid owner, const char *key,
				  IdemRecord *rec)
{
	return idem_lookup_key(owner, key, rec) && rec->visible;
}

const IdemRunStore idem_local_runs = {
	local_lock_and_read, local_insert_run, local_update_run,
	local_find_record, local_insert_key, local_execute, local_read_record,
	"idem.keys", NULL
};

/* Lock and read owner's run in store: ID404 if none. */
static void
read_locked(const IdemRunStore *store, Oid owner, const char *run_id,
			IdemRunRow *run)
{
	if (!store->lock_and_read(store, owner, run_id, run))
		idem_report_run_not_found(run_id);
}

/*
 * idem_run_lock_in
 *		idem_lock_run() on the runs that store keeps: take the run's lock
 *		and read it, as the current snapshot may act on it.
 */
void
idem_run_lock_in(const IdemRunStore *store, Oid owner, const char *run_id,
				 IdemRunRow *run)
{
	read_locked(store, owner, run_id, run);
	idem_check_run_visible(run);
}

/*
 * Lock and read owner's run in store for an act of verb, fenced and checked
 * against the snapshot, unless held has it from an earlier act of the same
 * call: the lock is held to the transaction's end, and every write of the
 * run since went through held's row, so the row is the run's latest
 * version.  The fence and the snapshot check are made on it again all the
 * same, as each act would make them alone.
 */
static IdemRunRow *
lock_run_held(const IdemRunStore *store, IdemHeldRun *held, Oid owner,
			  const char *run_id, const pg_uuid_t *token, IdemLeaseAct act)
{
	if (!held->held || held->row.owner != owner ||
		strcmp(held->row.run_id, run_id) != 0)
	{
		read_locked(store, owner, run_id, &held->row);
		held->held = true;
	}
	idem_run_fence(&held->row, token, act);
	idem_check_run_visible(&held->row);
	return &held->row;
}

/*
 * After a step's statement that wrote a run's row (its own, or another
 * run's step nested in it): it must not have changed its own run (a
 * run function called from inside it: the holder's heartbeat or release,
 * a cancel, a claim), whose row the step is about to write from what it
 * read before.  ID508, as a call under its own key is.
 */
static void
check_run_unchanged(IdemRunRow *run, const char *step)
{
	IdemRunRow	now;

	if (idem_lookup_run(run->owner, run->run_id, &now) &&
		ItemPointerEquals(&now.tid, &run->tid))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_NESTED_KEY),
			 errmsg("the statement of step \"%s\" of run \"%s\" changed its run",
					step, run->run_id),
			 errdetail("A run function called from inside a step's statement changed the run (a heartbeat, a release, a cancel, a claim) while the step was running."),
			 idem_errhint(ERRCODE_IDEM_NESTED_KEY, "Call the run's functions before or after its step, not from the step's statement.")));
}

/*
 * One step of a run, as a statement (stmt) or as a result recorded from
 * outside (result).  req->key is the step's key; fingerprint identifies the
 * request.  Fills out.
 */
static void
run_step(const IdemRunStore *store, IdemHeldRun *held, IdemRequest *req,
		 IdemStatement *stmt, Jsonb *result, const char *run_id,
		 const char *step, const pg_uuid_t *token, const uint8 *fingerprint,
		 IdemResult *out, volatile bool *executing)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	IdemRunRow *run;
	IdemRecord	rec;
	int			ordinal;
	char	   *topic;
	Jsonb	   *response;
	uint64		writes;

	/* before anything executes or replays: a queued run's holder only */
	run = lock_run_held(store, held, req->owner, run_id, token,
						IDEM_ACT_RUN_WORK);
	ordinal = idem_run_step_ordinal(run, step);

	if (store->find_record(store, stmt, req, fingerprint, now, &rec))
	{
		int			pos = done_position(run, step, ordinal);

		/*
		 * A record the run does not list was written outside the run's
		 * functions (before they owned the key): it may expire or hold a
		 * cached error, which a step's record never does.
		 */
		if (pos == 0)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_REUSED),
					 errmsg("step \"%s\" of run \"%s\" has a record its run did not write",
							step, run->run_id),
					 errdetail("The key record %s was not written by the run's functions.",
							   req->key),
					 idem_errhint(ERRCODE_IDEM_KEY_REUSED, "Give the step another name, or remove the record once it has expired.")));
		/*
		 * A listed record that expires was adopted by idem 1.1 from an
		 * idem_execute() under the step's key, and the 1.2 update left it
		 * so because it holds a cached error: that step never took effect.
		 */
		if (rec.expires_at != DT_NOEND)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_REUSED),
					 errmsg("step \"%s\" of run \"%s\" holds a cached error instead of a result",
							step, run->run_id),
					 errdetail("The record %s, which idem 1.1 counted as the step's result, was written by idem_execute() with a cached error; a step never records an error.",
							   req->key),
					 idem_errhint(ERRCODE_IDEM_KEY_REUSED, "Cancel the run and begin it again under another id.")));
		count_attempt(store, run, pos);
		idem_replay_record(req, &rec, out);
		return;
	}

	check_step_may_run(store, run, step, ordinal);
	if (stmt != NULL)
		idem_run_check_room(run);
	topic = idem_current_topic(req->owner);
	/*
	 * A worker's step of another role's run writes the owner's event with
	 * the worker's privileges, as its statement runs: the worker must be
	 * a publisher too, or a queue's work grant would let it write events
	 * consumers take for the owner's.
	 */
	if (topic != NULL && token != NULL && req->owner != GetUserId())
		idem_outbox_check_publish(topic, GetUserId());
	*executing = true;
	writes = idem_run_writes;
	response = stmt != NULL ? store->execute(store, stmt, req) : result;
	if (idem_run_writes != writes && store == &idem_local_runs)
		check_run_unchanged(run, step);

	store->insert_key(store, req, fingerprint, response, now);
	record_step(store, run, step, now);
	/*
	 * The step's place among the run's completed steps orders its events:
	 * the run's lock makes that the order in which the steps committed.
	 */
	if (topic != NULL)
		idem_insert_outbox(req->key, req->owner, topic, response, now,
						   run_id, step, run_ndone(run), store->events);
	out->response = response;
	out->replayed = false;
	out->first_executed_at = now;
}

/*
 * A step's request: the step's key, and the caller's role, or with a lease
 * token the owner of the queued run it leases (a worker works other roles'
 * runs).
 */
void
idem_step_key_request(const char *run_id, const char *step,
					  const pg_uuid_t *token, IdemRequest *req)
{
	req->owner = token != NULL ? idem_leased_run_owner(run_id, token, IDEM_ACT_RUN_WORK) :
		idem_key_owner();
	req->ttl = 0;
	req->key = idem_run_step_key(run_id, step);
	req->keylen = strlen(req->key);
	req->nargs = 0;
}

/*
 * run_step(), with its outcome counted and audited (run id and step
 * included) whether it succeeds or fails.
 */
static void
run_step_noted(const IdemRunStore *store, IdemHeldRun *held,
			   IdemRequest *req, IdemStatement *stmt, Jsonb *result,
			   const char *run_id, const char *step, const pg_uuid_t *token,
			   const uint8 *fingerprint, IdemResult *out)
{
	volatile bool executing = false;

	PG_TRY();
	{
		run_step(store, held, req, stmt, result, run_id, step, token,
				 fingerprint, out, &executing);
	}
	PG_CATCH();
	{
		idem_note_error(req, fingerprint, run_id, step, executing);
		PG_RE_THROW();
	}
	PG_END_TRY();
	idem_note_done(req, fingerprint, run_id, step, out->replayed);
}

/* The run id and step name at arguments first and first + 1, and their key. */
static void
step_request(FunctionCallInfo fcinfo, int first, IdemRequest *req,
			 char **run_id, char **step, const pg_uuid_t *token)
{
	*run_id = idem_name_arg(fcinfo, first, IDEM_NAME_RUN_ID);
	*step = idem_name_arg(fcinfo, first + 1, IDEM_NAME_STEP);
	idem_step_key_request(*run_id, *step, token, req);
}

/*
 * idem_step_args
 *		A statement step's request from arguments (run_id, step, sql
 *		[, VARIADIC args]) starting at first, as idem_step() takes them, or
 *		with text_args (run_id, step, sql, args text[]), as idem_call() does.
 */
void
idem_step_args(FunctionCallInfo fcinfo, int first, const char *fname,
			   const pg_uuid_t *token, bool text_args, IdemRequest *req,
			   char **run_id, char **step)
{
	step_request(fcinfo, first, req, run_id, step, token);
	req->sql = idem_sql_arg(fcinfo, first + 2, fname);
	if (text_args)
		idem_collect_text_args(fcinfo, first + STEP_FIXED_ARGS, req);
	else
		idem_collect_args(fcinfo, first + STEP_FIXED_ARGS, req);
}

/* A statement step on the run held holds, or will once it is read. */
static void
step_request_held(const IdemRunStore *store, IdemHeldRun *held,
				  IdemRequest *req, const char *run_id, const char *step,
				  const pg_uuid_t *token, IdemResult *result)
{
	IdemStatement *stmt;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];

	stmt = idem_statement_acquire(req->sql, req->nargs, req->argtypes);
	PG_TRY();
	{
		idem_statement_fingerprint(stmt, req, fingerprint);
		run_step_noted(store, held, req, stmt, NULL, run_id, step, token,
					   fingerprint, result);
	}
	PG_FINALLY();
	{
		idem_statement_release(stmt);
	}
	PG_END_TRY();
}

/*
 * idem_step_request
 *		Replay or execute req (its statement and arguments collected, its
 *		key made by idem_step_key_request()) as step of run_id; held, if not
 *		NULL, is the run as an earlier act of the same call left it.
 */
void
idem_step_request(IdemRequest *req, const char *run_id, const char *step,
				  const pg_uuid_t *token, IdemHeldRun *held,
				  IdemResult *result)
{
	IdemHeldRun none = {0};

	step_request_held(&idem_local_runs, held ? held : &none, req, run_id,
					  step, token, result);
}

/*
 * idem_step_request_in
 *		idem_step_request() on the run and records that store keeps.
 */
void
idem_step_request_in(const IdemRunStore *store, IdemRequest *req,
					 const char *run_id, const char *step,
					 const pg_uuid_t *token, IdemResult *result)
{
	IdemHeldRun none = {0};

	step_request_held(store, &none, req, run_id, step, token, result);
}

/*
 * idem_step(run_id text, step text, sql text [, VARIADIC args "any"])
 *		returns jsonb
 */
Datum
idem_step(PG_FUNCTION_ARGS)
{
	IdemRequest req;
	char	   *run_id;
	char	   *step;
	IdemResult	result;
	const pg_uuid_t *token = idem_lease_token_setting();

	idem_check_can_write("idem_step()");
	idem_step_args(fcinfo, 0, "idem_step()", token, false, &req, &run_id,
				   &step);
	idem_step_request(&req, run_id, step, token, NULL, &result);
	PG_RETURN_JSONB_P(result.response);
}

/*
 * idem_step_complete(run_id text, step text, result jsonb,
 *		lease_token uuid) returns jsonb
 *
 * Records the result of a step done outside the database.  Completing it
 * again with the same result returns it; with another result is ID422, and
 * the first result stays.
 */
Datum
idem_step_complete(PG_FUNCTION_ARGS)
{
	IdemRequest req;
	char	   *run_id;
	char	   *step;
	IdemResult	out;
	const pg_uuid_t *token = PG_NARGS() > 3 ?
		idem_lease_token_arg(fcinfo, 3, false) : NULL;

	if (token == NULL)
		token = idem_lease_token_setting();
	idem_check_can_write("idem_step_complete()");
	step_request(fcinfo, 0, &req, &run_id, &step, token);
	idem_step_complete_in(&idem_local_runs, &req, run_id, step, token,
						  idem_step_result_arg(fcinfo, 2, "idem_step_complete()"),
						  &out);
	PG_RETURN_JSONB_P(out.response);
}

/*
 * idem_step_result_arg
 *		The result of an external step passed as argument argno of fname.
 */
Jsonb *
idem_step_result_arg(FunctionCallInfo fcinfo, int argno, const char *fname)
{
	Jsonb	   *result;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("result passed to %s must not be null", fname),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, "Record an empty result as '{}'.")));
	result = PG_GETARG_JSONB_P(argno);
	idem_check_response_size(result, IDEM_RESPONSE_STEP_RESULT, fname);
	return result;
}

/* An external step's completion on the run held holds, or will. */
static void
complete_held(const IdemRunStore *store, IdemHeldRun *held, IdemRequest *req,
			  const char *run_id, const char *step, const pg_uuid_t *token,
			  Jsonb *result, IdemResult *out)
{
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];

	idem_value_digest("idem_step_complete", JSONBOID, JsonbPGetDatum(result),
					  fingerprint);
	run_step_noted(store, held, req, NULL, result, run_id, step, token,
				   fingerprint, out);
}

/*
 * idem_step_complete_in
 *		Record result as the outcome of step of run_id (req made by
 *		idem_step_key_request()), on the run and records store keeps.
 */
void
idem_step_complete_in(const IdemRunStore *store, IdemRequest *req,
					  const char *run_id, const char *step,
					  const pg_uuid_t *token, Jsonb *result, IdemResult *out)
{
	IdemHeldRun none = {0};

	complete_held(store, &none, req, run_id, step, token, result, out);
}

/*
 * idem_step_key(run_id text, step text) returns text
 *
 * The key a step is recorded under: the same string on every call, fit to
 * be passed on as an Idempotency-Key header.
 */
Datum
idem_step_key(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	char	   *step = idem_name_arg(fcinfo, 1, IDEM_NAME_STEP);

	PG_RETURN_TEXT_P(cstring_to_text(idem_run_step_key(run_id, step)));
}

/* A declared step's name and place, to find duplicates by sorting. */
typedef struct StepName
{
	text	   *name;
	int			ordinal;
} StepName;

/* By name (bytes, then length), then by place. */
static int
step_name_cmp(const void *a, const void *b)
{
	const StepName *x = a;
	const StepName *y = b;
	int			lx = VARSIZE_ANY_EXHDR(x->name);
	int			ly = VARSIZE_ANY_EXHDR(y->name);
	int			c = memcmp(VARDATA_ANY(x->name), VARDATA_ANY(y->name), Min(lx, ly));

	if (c != 0)
		return c;
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return x->ordinal - y->ordinal;
}

static bool
same_name(const StepName *x, const StepName *y)
{
	return VARSIZE_ANY_EXHDR(x->name) == VARSIZE_ANY_EXHDR(y->name) &&
		memcmp(VARDATA_ANY(x->name), VARDATA_ANY(y->name),
			   VARSIZE_ANY_EXHDR(x->name)) == 0;
}

/*
 * A declared step list, checked and rebuilt with lower bound 1 (so that
 * steps[n] is the n-th step however the caller wrote the array).  At most
 * IDEM_MAX_RUN_STEPS names; duplicates are found by sorting, so the check
 * is n log n.
 */
static ArrayType *
checked_steps(ArrayType *arr, const char *run_id)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	StepName   *sorted;
	int			dup = 0;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("steps must be a one-dimensional array"),
				 idem_errhint(ERRCODE_ARRAY_SUBSCRIPT_ERROR, NULL)));
	check_step_count(ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr)), run_id);
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("steps must not be empty"),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Pass NULL to allow any steps in any order.")));
	sorted = palloc(n * sizeof(StepName));
	for (int i = 0; i < n; i++)
	{
		int			len;

		CHECK_FOR_INTERRUPTS();
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("step %d is null", i + 1),
					 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
		sorted[i].name = DatumGetTextPP(elems[i]);
		sorted[i].ordinal = i + 1;
		len = VARSIZE_ANY_EXHDR(sorted[i].name);
		if (len == 0)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("step name must not be empty"),
					 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
		if (len > IDEM_MAX_KEY_BYTES)
			ereport(ERROR,
					(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
					 errmsg("step name is too long"),
					 errdetail_plural("Step %d is %d byte long; the limit is %d bytes.",
									  "Step %d is %d bytes long; the limit is %d bytes.",
									  len, i + 1, len, IDEM_MAX_KEY_BYTES),
					 idem_errhint(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, NULL)));
	}

	/*
	 * Of the names declared more than once, report the one whose second
	 * declaration comes first, with its first.
	 */
	qsort(sorted, n, sizeof(StepName), step_name_cmp);
	for (int i = 1; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		/* i is the second declaration of its name */
		if (same_name(&sorted[i - 1], &sorted[i]) &&
			(i < 2 || !same_name(&sorted[i - 2], &sorted[i - 1])) &&
			(dup == 0 || sorted[i].ordinal < sorted[dup].ordinal))
			dup = i;
	}
	if (dup > 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("step \"%s\" is declared twice", text_to_cstring(sorted[dup].name)),
				 errdetail("Steps %d and %d have the same name.",
						   sorted[dup - 1].ordinal, sorted[dup].ordinal),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	return construct_array(elems, n, TEXTOID, -1, false, TYPALIGN_INT);
}

/* Whether two optional varlena values (arrays, jsonb) are the same bytes. */
static bool
same_value(void *a, void *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return datumIsEqual(PointerGetDatum(a), PointerGetDatum(b), false, -1);
}

/* The step a declared run runs next, or NULL. */
char *
idem_run_next_step(IdemRunRow *run)
{
	int			ndone = run_ndone(run);

	if (run->steps == NULL || ndone >= run_nsteps(run))
		return NULL;
	return declared_step(run, ndone + 1);
}

/* Whether two optional strings are the same. */
static bool
same_string(const char *a, const char *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return strcmp(a, b) == 0;
}

static bool
same_interval(Interval *a, Interval *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return DatumGetBool(DirectFunctionCall2(interval_eq, IntervalPGetDatum(a),
											IntervalPGetDatum(b)));
}

/*
 * idem_run_init_unqueued
 *		A run's fields on no queue: no lease, nothing due.
 */
void
idem_run_init_unqueued(IdemRunRow *run)
{
	run->queue = NULL;
	run->queue_state = NULL;
	run->due_at = DT_NOEND;
	run->attempt = 1;
	run->claims = 0;
	run->has_token = false;
	run->leased_by = InvalidOid;
	run->lease_holder = NULL;
	run->awaiting = NULL;
	run->wait_until = DT_NOEND;
	run->started_step = NULL;
	run->started_count = 0;
	run->max_attempts = 0;
	run->backoff_base = NULL;
	run->backoff_cap = NULL;
	run->jitter = NULL;
}

/* What of idem_run_begin()'s arguments differs from the existing run's */
typedef enum BeginDiffers
{
	BEGIN_SAME,
	BEGIN_STEPS,
	BEGIN_INPUT,
	BEGIN_QUEUE,
	BEGIN_RETRY_POLICY
} BeginDiffers;

static BeginDiffers
begin_differs(IdemRunRow *run, IdemRunRow *asked)
{
	if (!same_value(run->steps, asked->steps))
		return BEGIN_STEPS;
	if (!same_value(run->input, asked->input))
		return BEGIN_INPUT;
	if (!same_string(run->queue, asked->queue))
		return BEGIN_QUEUE;
	if (run->max_attempts != asked->max_attempts ||
		!same_string(run->jitter, asked->jitter) ||
		!same_interval(run->backoff_base, asked->backoff_base) ||
		!same_interval(run->backoff_cap, asked->backoff_cap))
		return BEGIN_RETRY_POLICY;
	return BEGIN_SAME;
}

/* The refusal of a begin whose differs differs from run run_id's */
static int
begin_differs_msg(BeginDiffers differs, const char *run_id)
{
	switch (differs)
	{
		case BEGIN_STEPS:
			return errmsg("run \"%s\" was already begun with different steps", run_id);
		case BEGIN_INPUT:
			return errmsg("run \"%s\" was already begun with different input", run_id);
		case BEGIN_QUEUE:
			return errmsg("run \"%s\" was already begun with a different queue", run_id);
		case BEGIN_RETRY_POLICY:
		case BEGIN_SAME:
			break;
	}
	return errmsg("run \"%s\" was already begun with a different retry policy", run_id);
}

/*
 * idem_run_begin(run_id text, steps text[], input jsonb, queue text,
 *		max_attempts integer, backoff_base interval, backoff_cap interval,
 *		jitter text, OUT status text, OUT next_step text,
 *		OUT created boolean, OUT started_at timestamptz) returns record
 *
 * Begins a run, or returns the existing run when called again with the
 * same steps, input, queue and policy (the same bytes: jsonb 1.0 and 1.00
 * differ, as in request fingerprints); anything else under the same id is
 * ID422.  With a queue (and its produce grant) the run is due at once.
 */
Datum
idem_run_begin(PG_FUNCTION_ARGS)
{
	IdemRunRow	run;
	IdemRunRow	asked;
	IdemQueue	queue;

	idem_check_can_write("idem_run_begin()");
	idem_run_begin_args(fcinfo, 0, &asked);
	if (PG_NARGS() > 7)
	{
		idem_queue_check_policy(fcinfo, 4, 5, 6, 7);
		if (!PG_ARGISNULL(3))
			asked.queue = idem_name_arg(fcinfo, 3, IDEM_NAME_QUEUE);
		else if (!PG_ARGISNULL(4) || !PG_ARGISNULL(5) || !PG_ARGISNULL(6) ||
				 !PG_ARGISNULL(7))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("a retry policy needs a queue"),
					 errdetail("Only runs on a queue are retried."),
					 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Pass the queue the run is enqueued on.")));
		asked.max_attempts = PG_ARGISNULL(4) ? 0 : PG_GETARG_INT32(4);
		asked.backoff_base = PG_ARGISNULL(5) ? NULL : PG_GETARG_INTERVAL_P(5);
		asked.backoff_cap = PG_ARGISNULL(6) ? NULL : PG_GETARG_INTERVAL_P(6);
		asked.jitter = PG_ARGISNULL(7) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(7));
	}
	if (asked.queue != NULL)
		idem_queue_check(asked.queue, GetUserId(), QUEUE_PRODUCE, &queue);
	/*
	 * A worker finishes a queued run with its last declared step: without
	 * declared steps only idem_run_complete() would, and it takes no lease
	 * token, so the run would be claimed until its attempts ran out.
	 */
	if (asked.queue != NULL && asked.steps == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a run on a queue needs declared steps"),
				 errdetail("Run \"%s\" has no steps: its worker could never complete it.",
						   asked.run_id),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Pass the run's steps, or begin it on no queue and complete it with idem_run_complete().")));

	PG_RETURN_DATUM(idem_run_begin_result(fcinfo, &run,
										  idem_run_begin_in(&idem_local_runs,
															idem_key_owner(),
															&asked, &run)));
}

/*
 * idem_run_begin_args
 *		What idem_run_begin() asks for on no queue, from its arguments
 *		(run_id, steps, input) starting at first, checked.
 */
void
idem_run_begin_args(FunctionCallInfo fcinfo, int first, IdemRunRow *asked)
{
	idem_run_init_unqueued(asked);
	asked->run_id = idem_name_arg(fcinfo, first, IDEM_NAME_RUN_ID);
	asked->steps = NULL;
	asked->input = NULL;
	if (!PG_ARGISNULL(first + 1))
		asked->steps = checked_steps(PG_GETARG_ARRAYTYPE_P(first + 1),
									 asked->run_id);
	if (!PG_ARGISNULL(first + 2))
	{
		asked->input = PG_GETARG_JSONB_P(first + 2);
		idem_check_response_size(asked->input, IDEM_RESPONSE_RUN_INPUT, NULL);
	}
}

/*
 * idem_run_begin_in
 *		Begin the run asked for (by idem_run_begin_args(), and its queue)
 *		as owner's in store, or find it begun with the same arguments;
 *		another run under its id is ID422.  Fills run; true if it began it.
 */
bool
idem_run_begin_in(const IdemRunStore *store, Oid owner, IdemRunRow *asked,
				  IdemRunRow *run)
{
	const char *run_id = asked->run_id;

	if (store->lock_and_read(store, owner, run_id, run))
	{
		BeginDiffers differs;

		idem_check_run_visible(run);
		differs = begin_differs(run, asked);
		if (differs != BEGIN_SAME)
		{
			IdemRequest req;

			/* counted and audited as a key's mismatch is, under the run's lock key */
			req.owner = owner;
			req.key = idem_run_lock_key(run_id);
			req.keylen = strlen(req.key);
			req.nargs = 0;
			idem_note_outcome(IDEM_OUTCOME_MISMATCH, &req, NULL, run_id, NULL,
							  ERRCODE_IDEM_KEY_REUSED);
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_REUSED),
					 begin_differs_msg(differs, run_id),
					 errdetail("A run id names one run: its steps, input, queue and retry policy are fixed when it begins."),
					 idem_errhint(ERRCODE_IDEM_KEY_REUSED, "Use a new run id for a new run.")));
		}
		return false;
	}
	*run = *asked;
	run->owner = owner;
	run->status = "running";
	run->started_at = GetCurrentTransactionStartTimestamp();
	run->finished = false;
	run->finished_at = 0;
	run->last_error = NULL;
	run->done_steps = construct_empty_array(TEXTOID);
	run->attempts = construct_empty_array(INT4OID);
	if (run->queue != NULL)
	{
		run->queue_state = "ready";
		run->due_at = run->started_at;
		idem_queue_wake(run->queue);
	}
	store->insert_run(store, run);
	return true;
}

/*
 * idem_run_begin_result
 *		idem_run_begin()'s row: (status, next_step, created, started_at).
 */
Datum
idem_run_begin_result(FunctionCallInfo fcinfo, IdemRunRow *run, bool created)
{
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	char	   *next = idem_run_next_step(run);

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	values[0] = CStringGetTextDatum(run->status);
	nulls[1] = next == NULL;
	values[1] = next ? CStringGetTextDatum(next) : (Datum) 0;
	values[2] = BoolGetDatum(created);
	values[3] = TimestampTzGetDatum(run->started_at);
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values,
											 nulls));
}

/*
 * A queued run that an operator's verb finishes leaves its queue: its
 * lease, if one holds it, ends with outcome (lease_expired if it ran out),
 * and it is due no more.
 */
static void
leave_queue(IdemRunRow *run, const char *outcome, const char *error)
{
	if (run->queue == NULL)
		return;
	idem_run_end_lease_for(run, outcome, error, GetCurrentTimestamp());
	run->queue_state = NULL;
	run->due_at = DT_NOEND;
}

/*
 * Move a run to another status: fail, resume or complete.  Returns the new
 * status.  Each is an operator's verb too: an administrator names another
 * role's run with owner_argno's argument, and the change is audited.
 */
static Datum
set_run_status(FunctionCallInfo fcinfo, const char *verb, IdemRunOp op,
			   int owner_argno)
{
	Oid			owner;
	char	   *run_id;

	idem_check_can_write(psprintf("idem_run_%s()", verb));
	run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	owner = idem_run_owner_arg(fcinfo, owner_argno, op);
	PG_RETURN_TEXT_P(cstring_to_text(idem_run_set_status_in(&idem_local_runs,
															 fcinfo, verb,
															 owner, run_id,
															 1)));
}

/*
 * idem_run_set_status_in
 *		Fail, resume or complete (verb) owner's run run_id in store, failing
 *		it with the reason in argument reason_arg; returns the new status.
 */
char *
idem_run_set_status_in(const IdemRunStore *store, FunctionCallInfo fcinfo,
					   const char *verb, Oid owner, const char *run_id,
					   int reason_arg)
{
	IdemRunRow	run;
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	const char *action = NULL;

	idem_run_lock_in(store, owner, run_id, &run);

	if (strcmp(verb, "fail") == 0)
	{
		if (PG_ARGISNULL(reason_arg))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("reason passed to idem_run_fail() must not be null"),
					 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
		/* a cancelled run that failed could be resumed into executing again */
		if (strcmp(run.status, "completed") == 0 ||
			strcmp(run.status, "cancelled") == 0)
			report_not_running(&run);
		run.last_error = text_to_cstring(PG_GETARG_TEXT_PP(reason_arg));
		/* the run's last error and its attempt's, as a failed step's error */
		idem_check_error_text(IDEM_TEXT_REASON, run.last_error);
		run.status = "failed";
		run.finished = true;
		run.finished_at = now;
		leave_queue(&run, "failed", run.last_error);
		action = "failed";
	}
	else if (strcmp(verb, "resume") == 0)
	{
		if (strcmp(run.status, "completed") == 0 ||
			strcmp(run.status, "cancelled") == 0)
			report_not_running(&run);
		/* a queued run that failed is due again, with fresh attempts */
		if (run.queue != NULL && strcmp(run.status, "failed") == 0)
		{
			run.queue_state = "ready";
			run.due_at = GetCurrentTimestamp();
			run.attempt = 1;
			idem_queue_wake(run.queue);
		}
		if (strcmp(run.status, "running") != 0)
			action = "resumed";
		run.status = "running";
		run.finished = false;
	}
	else
	{
		if (strcmp(run.status, "failed") == 0 ||
			strcmp(run.status, "cancelled") == 0)
			report_not_running(&run);
		if (idem_run_next_step(&run) != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE),
					 errmsg("run \"%s\" has steps that have not completed", run_id),
					 errdetail_plural("%d of its %d step has completed; step \"%s\" is next.",
									  "%d of its %d steps have completed; step \"%s\" is next.",
									  run_nsteps(&run), run_ndone(&run),
									  run_nsteps(&run), idem_run_next_step(&run)),
					 idem_errhint(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE, "A run with declared steps completes with its last step.")));
		if (strcmp(run.status, "completed") != 0)
		{
			action = "completed";
			run.status = "completed";
			run.finished = true;
			run.finished_at = now;
			run.last_error = NULL;
			leave_queue(&run, "completed", NULL);
		}
	}
	store->update_run(store, &run);
	if (action != NULL)
		idem_audit_run_action(owner, run_id, action);
	return run.status;
}

/* idem_run_fail(run_id text, reason text, owner regrole) returns text */
Datum
idem_run_fail(PG_FUNCTION_ARGS)
{
	return set_run_status(fcinfo, "fail", IDEM_RUN_OP_FAIL, 2);
}

/* idem_run_resume(run_id text, owner regrole) returns text */
Datum
idem_run_resume(PG_FUNCTION_ARGS)
{
	return set_run_status(fcinfo, "resume", IDEM_RUN_OP_RESUME, 1);
}

/* idem_run_complete(run_id text, owner regrole) returns text */
Datum
idem_run_complete(PG_FUNCTION_ARGS)
{
	return set_run_status(fcinfo, "complete", IDEM_RUN_OP_COMPLETE, 1);
}

/* The current role's run, for the readers: no lock, the caller's snapshot. */
static void
read_run(FunctionCallInfo fcinfo, IdemRunRow *run)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);

	if (!idem_lookup_run(idem_key_owner(), run_id, run) || !run->visible)
		idem_report_run_not_found(run_id);
}

/*
 * idem_run_status(run_id text) returns table (status, next_step,
 *		steps_done, steps_total, started_at, finished_at, last_error, input)
 */
Datum
idem_run_status(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemRunRow	run;
	Datum		values[8];
	bool		nulls[8];

	InitMaterializedSRF(fcinfo, 0);
	read_run(fcinfo, &run);
	idem_run_status_values(&run, values, nulls);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*
 * idem_run_status_values
 *		idem_run_status()'s row of run: (status, next_step, steps_done,
 *		steps_total, started_at, finished_at, last_error, input).
 */
void
idem_run_status_values(IdemRunRow *run, Datum *values, bool *nulls)
{
	char	   *next = idem_run_next_step(run);

	memset(nulls, 0, 8 * sizeof(bool));
	values[0] = CStringGetTextDatum(run->status);
	nulls[1] = next == NULL;
	values[1] = next ? CStringGetTextDatum(next) : (Datum) 0;
	values[2] = Int32GetDatum(run_ndone(run));
	nulls[3] = run->steps == NULL;
	values[3] = Int32GetDatum(run_nsteps(run));
	values[4] = TimestampTzGetDatum(run->started_at);
	nulls[5] = !run->finished;
	values[5] = TimestampTzGetDatum(run->finished_at);
	nulls[6] = run->last_error == NULL;
	values[6] = run->last_error ? CStringGetTextDatum(run->last_error) : (Datum) 0;
	nulls[7] = run->input == NULL;
	values[7] = JsonbPGetDatum(run->input);
}

/*
 * idem_run_steps(run_id text) returns table (ordinal, step, state,
 *		response, executed_at, attempts, step_key)
 */
Datum
idem_run_steps(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemRunRow	run;

	InitMaterializedSRF(fcinfo, 0);
	read_run(fcinfo, &run);
	idem_run_steps_rows(&idem_local_runs, rsinfo, &run);
	return (Datum) 0;
}

/*
 * idem_run_steps_rows
 *		idem_run_steps()'s rows of run, whose steps' records store keeps:
 *		the declared steps in order, completed or pending; for a run
 *		without declared steps, its completed steps in the order they
 *		completed.
 */
void
idem_run_steps_rows(const IdemRunStore *store, ReturnSetInfo *rsinfo,
					IdemRunRow *run)
{
	Datum	   *names;
	int			n;
	int			ndone;
	Datum	   *counts;
	int			ncounts;
	MemoryContext rowcxt;
	MemoryContext oldcxt;

	deconstruct_array(run->steps ? run->steps : run->done_steps, TEXTOID, -1,
					  false, TYPALIGN_INT, &names, NULL, &n);
	deconstruct_array(run->attempts, INT4OID, 4, true, TYPALIGN_INT,
					  &counts, NULL, &ncounts);
	ndone = run_ndone(run);
	rowcxt = AllocSetContextCreate(CurrentMemoryContext, "idem_run_steps row",
								   ALLOCSET_SMALL_SIZES);

	/* completed steps, declared or not, are the first ndone */
	for (int i = 0; i < n; i++)
	{
		Datum		values[7];
		bool		nulls[7] = {0};
		char	   *name;
		char	   *key;
		int			pos = i < ndone ? i + 1 : 0;
		IdemRecord	rec;
		bool		found;
		const char *state;

		CHECK_FOR_INTERRUPTS();
		oldcxt = MemoryContextSwitchTo(rowcxt);
		name = TextDatumGetCString(names[i]);
		key = idem_run_step_key(run->run_id, name);
		found = pos > 0 && store->read_record(store, run->owner, key, &rec);

		values[0] = Int32GetDatum(i + 1);
		values[1] = names[i];
		if (pos > 0)
			state = "completed";
		else if (run->started_step != NULL && strcmp(run->started_step, name) == 0)
			state = "started";
		else if (run->awaiting != NULL && strcmp(run->awaiting, name) == 0)
			state = "waiting";
		else
			state = "pending";
		values[2] = CStringGetTextDatum(state);
		nulls[3] = nulls[4] = !found;
		if (found)
		{
			values[3] = JsonbPGetDatum(rec.response);
			values[4] = TimestampTzGetDatum(rec.created_at);
		}
		/* a started external step: how many times it was started */
		values[5] = Int32GetDatum(pos > 0 && pos <= ncounts ?
								  DatumGetInt32(counts[pos - 1]) :
								  strcmp(state, "started") == 0 ?
								  run->started_count : 0);
		values[6] = CStringGetTextDatum(key);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
		MemoryContextSwitchTo(oldcxt);
		MemoryContextReset(rowcxt);
	}
	MemoryContextDelete(rowcxt);
}

/*
 * idem_run_try_lock(owner regrole, run_id text) returns boolean
 *
 * Takes a run's lock if it is free, for idem_run_purge(): a run that a
 * step or a run verb holds is left for the next purge, rather than deleted
 * under it or waited for (which could deadlock with a transaction that
 * steps several runs).  So is a run whose lock was given back by the
 * transaction that wrote it and has not committed (idem_queue_drop(), a
 * claim that failed it).
 */
Datum
idem_run_try_lock(PG_FUNCTION_ARGS)
{
	Oid			owner = PG_GETARG_OID(0);
	char	   *run_id = text_to_cstring(PG_GETARG_TEXT_PP(1));
	char	   *lockkey = idem_run_lock_key(run_id);
	int			keylen = strlen(lockkey);

	if (!idem_try_lock_key(owner, lockkey, keylen))
		PG_RETURN_BOOL(false);
	if (!idem_run_replaced(owner, run_id))
		PG_RETURN_BOOL(true);
	idem_unlock_key(owner, lockkey, keylen);
	PG_RETURN_BOOL(false);
}

/* The recorded result of a completed step, or NULL. */
static Jsonb *
recorded_result(IdemRunRow *run, const char *step, int ordinal)
{
	IdemRecord	rec;

	if (done_position(run, step, ordinal) == 0)
		return NULL;
	if (!idem_lookup_key(run->owner, idem_run_step_key(run->run_id, step), &rec) ||
		!rec.visible)
		report_lost_record(&idem_local_runs, run, step);
	return rec.response;
}

/*
 * idem_step_complete_leased
 *		Record result as step of run_id, as idem_step_complete() does
 *		(token NULL: a run that is not on a queue), on the run held holds
 *		or will hold; returns the result recorded.
 */
Jsonb *
idem_step_complete_leased(const char *run_id, const char *step,
						  const pg_uuid_t *token, Jsonb *result,
						  IdemHeldRun *held)
{
	IdemRequest req;
	IdemResult	out;
	IdemHeldRun none = {0};

	idem_step_key_request(run_id, step, token, &req);
	complete_held(&idem_local_runs, held ? held : &none, &req, run_id, step, token, result,
				  &out);
	return out.response;
}

/*
 * idem_step_start_leased
 *		Record that the worker holding token starts an attempt of external
 *		step of run_id, as idem_step_start() does, on the run held holds or
 *		will hold: returns the attempt's number, or 0 with *done set to the
 *		step's recorded result if it has completed (nothing is started
 *		then).
 */
int
idem_step_start_leased(const char *run_id, const char *step,
					   const pg_uuid_t *token, Jsonb **done,
					   IdemHeldRun *held)
{
	IdemHeldRun none = {0};
	IdemRunRow *run;
	int			ordinal;

	run = lock_run_held(&idem_local_runs, held ? held : &none,
						idem_leased_run_owner(run_id, token, IDEM_ACT_RUN_START_STEP),
						run_id, token, IDEM_ACT_RUN_START_STEP);
	idem_run_check_room(run);
	ordinal = idem_run_step_ordinal(run, step);
	*done = recorded_result(run, step, ordinal);
	if (*done != NULL)
		return 0;
	check_step_may_run(&idem_local_runs, run, step, ordinal);
	if (run->started_step != NULL && strcmp(run->started_step, step) == 0)
		run->started_count++;
	else
	{
		run->started_step = pstrdup(step);
		run->started_count = 1;
	}
	idem_update_run(run);
	return run->started_count;
}

/*
 * idem_step_start(run_id text, step text, lease_token uuid)
 *		returns table (step_key, attempt, completed, result)
 *
 * Records, before a worker calls out, that it starts attempt n of an
 * external step: the caller commits this first, so a worker that resumes
 * the run after a crash learns the step was started (and how often) and
 * calls again with the same step key, which the provider deduplicates.  A
 * step that completed is not started again: its result comes back.
 */
Datum
idem_step_start(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	char	   *step = idem_name_arg(fcinfo, 1, IDEM_NAME_STEP);
	const pg_uuid_t *token = idem_lease_token_arg(fcinfo, 2, true);
	int			attempt;
	Jsonb	   *done;
	Datum		values[4];
	bool		nulls[4] = {0};

	idem_check_can_write("idem_step_start()");
	InitMaterializedSRF(fcinfo, 0);
	attempt = idem_step_start_leased(run_id, step, token, &done, NULL);
	values[0] = CStringGetTextDatum(idem_run_step_key(run_id, step));
	if (done != NULL)
	{
		nulls[1] = true;
		values[2] = BoolGetDatum(true);
		values[3] = JsonbPGetDatum(done);
	}
	else
	{
		values[1] = Int32GetDatum(attempt);
		values[2] = BoolGetDatum(false);
		nulls[3] = true;
	}
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/* A duration's microseconds as whole milliseconds for idem_backoff_next(). */
static int
backoff_ms(int64 us)
{
	return (int) Min(us / 1000, (int64) INT_MAX);
}

/*
 * idem_step_fail(run_id text, step text, lease_token uuid, error text,
 *		retry_after interval) returns timestamptz
 *
 * The step's attempt failed: the lease ends, and the run is due again
 * after the backoff of the run's (or its queue's) policy, never before
 * retry_after.  After the last attempt the run is failed, with the error;
 * returns NULL then, else when the run is due again.
 */
Datum
idem_step_fail(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	char	   *step = idem_name_arg(fcinfo, 1, IDEM_NAME_STEP);
	const pg_uuid_t *token = idem_lease_token_arg(fcinfo, 2, true);
	char	   *error;
	int64		retry_after_us = 0;
	IdemRunRow	run;
	IdemQueue	q;
	int			ordinal;
	int			max_attempts;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next;

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("error must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	error = text_to_cstring(PG_GETARG_TEXT_PP(3));
	idem_check_error_text(IDEM_TEXT_ERROR, error);
	if (!PG_ARGISNULL(4))
		retry_after_us = idem_retry_after_usecs(PG_GETARG_INTERVAL_P(4));
	idem_check_can_write("idem_step_fail()");
	idem_lock_run_leased(run_id, token, IDEM_ACT_RUN_FAIL_STEP, &run);
	ordinal = idem_run_step_ordinal(&run, step);
	if (done_position(&run, step, ordinal) > 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE),
				 errmsg("step \"%s\" of run \"%s\" has completed", step, run_id),
				 errdetail("A completed step cannot fail; its result replays."),
				 idem_errhint(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE, NULL)));
	check_step_may_run(&idem_local_runs, &run, step, ordinal);

	idem_queue_read(run.queue, &q);
	max_attempts = run.max_attempts > 0 ? run.max_attempts : q.max_attempts;
	run.last_error = error;
	if (run.attempt >= max_attempts)
	{
		idem_run_end_lease(&run, "failed", error, now);
		run.status = "failed";
		run.finished = true;
		run.finished_at = GetCurrentTransactionStartTimestamp();
		run.queue_state = NULL;
		run.due_at = DT_NOEND;
		idem_update_run(&run);
		idem_stats_count_for(MyDatabaseId, run.owner, IDEM_STAT_RUNS_FAILED, 1);
		PG_RETURN_NULL();
	}
	next = idem_backoff_next(now, run.attempt,
							 backoff_ms(run.backoff_base ?
										idem_interval_usecs(run.backoff_base) :
										q.backoff_base_us),
							 backoff_ms(run.backoff_cap ?
										idem_interval_usecs(run.backoff_cap) :
										q.backoff_cap_us),
							 run.jitter ? idem_jitter_from_name(run.jitter) :
							 q.jitter,
							 retry_after_us);
	idem_run_end_lease(&run, "step_failed", error, now);
	run.attempt++;
	run.queue_state = "ready";
	run.due_at = next;
	idem_update_run(&run);
	idem_stats_count_for(MyDatabaseId, run.owner, IDEM_STAT_RUN_RETRIES, 1);
	PG_RETURN_TIMESTAMPTZ(next);
}

/* A wait's bound, in microseconds: (0, RUN_MAX_WAIT_DAYS]. */
static int64
checked_run_wait(Interval *iv, const char *name)
{
	int64		us = idem_interval_usecs(iv);

	if (us <= 0 || us > (int64) RUN_MAX_WAIT_DAYS * USECS_PER_DAY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be greater than zero and at most %d days",
						name, RUN_MAX_WAIT_DAYS),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	return us;
}

static Datum
await_result(FunctionCallInfo fcinfo, const char *state, Jsonb *payload)
{
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, payload == NULL};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	values[0] = CStringGetTextDatum(state);
	values[1] = payload ? JsonbPGetDatum(payload) : (Datum) 0;
	return HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc), values,
											 nulls));
}

/* JSON null: what a wait that timed out records as its step's result. */
static Jsonb *
json_null(void)
{
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum("null")));
}

static bool
is_json_null(Jsonb *j)
{
	return JB_ROOT_IS_SCALAR(j) &&
		strcmp(JsonbToCString(NULL, &j->root, VARSIZE(j)), "null") == 0;
}

/*
 * idem_run_await(run_id text, event text, lease_token uuid,
 *		timeout interval, OUT state text, OUT payload jsonb) returns record
 *
 * The step named event completes with the payload of the run's signal of
 * that name (state 'signalled'), or with JSON null once timeout has passed
 * without one ('timed_out'); until then the lease ends and the run waits,
 * not claimable until the signal comes or the timeout passes ('waiting':
 * the worker stops working on it).  A later claim's worker calls again
 * and gets the outcome; the timeout counts from the first call.
 */
Datum
idem_run_await(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	char	   *event = idem_name_arg(fcinfo, 1, IDEM_NAME_EVENT);
	const pg_uuid_t *token = idem_lease_token_arg(fcinfo, 2, true);
	int64		timeout_us = PG_ARGISNULL(3) ? 0 :
		checked_run_wait(PG_GETARG_INTERVAL_P(3), "timeout");
	IdemHeldRun held = {0};
	IdemRunRow *run;
	int			ordinal;
	Jsonb	   *done;
	Jsonb	   *payload;
	TimestampTz now = GetCurrentTimestamp();
	bool		same_wait;

	idem_check_can_write("idem_run_await()");
	/* a signalled or timed-out wait completes its step on the row read here */
	run = lock_run_held(&idem_local_runs, &held,
						idem_leased_run_owner(run_id, token, IDEM_ACT_RUN_AWAIT),
						run_id, token, IDEM_ACT_RUN_AWAIT);
	ordinal = idem_run_step_ordinal(run, event);
	done = recorded_result(run, event, ordinal);
	if (done != NULL)
		PG_RETURN_DATUM(await_result(fcinfo, is_json_null(done) ?
									 "timed_out" : "signalled",
									 is_json_null(done) ? NULL : done));
	check_step_may_run(&idem_local_runs, run, event, ordinal);

	if (idem_run_signal_payload(run->owner, run_id, event, &payload))
		PG_RETURN_DATUM(await_result(fcinfo, "signalled",
									 idem_step_complete_leased(run_id, event, token,
														  payload, &held)));
	same_wait = run->awaiting != NULL && strcmp(run->awaiting, event) == 0;
	if (same_wait && !TIMESTAMP_IS_NOEND(run->wait_until) &&
		run->wait_until <= now)
	{
		(void) idem_step_complete_leased(run_id, event, token, json_null(),
										&held);
		PG_RETURN_DATUM(await_result(fcinfo, "timed_out", NULL));
	}
	if (!same_wait)
	{
		run->awaiting = event;
		run->wait_until = timeout_us > 0 ? now + timeout_us : DT_NOEND;
	}
	idem_run_end_lease(run, "waiting", NULL, now);
	run->queue_state = "waiting";
	run->due_at = run->wait_until;
	idem_update_run(run);
	PG_RETURN_DATUM(await_result(fcinfo, "waiting", NULL));
}
