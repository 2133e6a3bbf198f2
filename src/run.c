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
 * count in the run's row; so a step replays exactly as idem_execute() does,
 * and idem_execute() under the step's key is the same request.  The step's
 * business write, its record, the run's progress and its outbox event
 * commit in the caller's transaction, or not at all.
 *
 * Every call that changes a run takes the run's advisory lock (honouring
 * idem.wait) and reads the run's latest version, as key lookups do: the lock
 * serializes the run's steps, and a REPEATABLE READ or SERIALIZABLE caller
 * whose snapshot cannot see that version (another agent moved the run on)
 * fails with 40001 instead of acting on what it saw.  The run's row is
 * read and updated directly (catalog.c), one HOT update per step.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/run.c
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
#include "utils/timestamp.h"

#include "compat.h"
#include "idem.h"

PG_FUNCTION_INFO_V1(idem_run_begin);
PG_FUNCTION_INFO_V1(idem_step);
PG_FUNCTION_INFO_V1(idem_step_complete);
PG_FUNCTION_INFO_V1(idem_step_key);
PG_FUNCTION_INFO_V1(idem_run_fail);
PG_FUNCTION_INFO_V1(idem_run_resume);
PG_FUNCTION_INFO_V1(idem_run_complete);
PG_FUNCTION_INFO_V1(idem_run_status);
PG_FUNCTION_INFO_V1(idem_run_steps);

/* Arguments of idem_step() before the statement's own: run, step, sql */
#define STEP_FIXED_ARGS 3

/* Keys derived for a run: its lock, and each step's record. */
static char *
run_lock_key(const char *run_id)
{
	const char *parts[] = {"idem.run", run_id};

	return idem_derive_key(2, parts);
}

static char *
derive_step_key(const char *run_id, const char *step)
{
	const char *parts[] = {"idem.step", run_id, step};

	return idem_derive_key(3, parts);
}

static void
report_run_not_found(const char *run_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_RUN_NOT_FOUND),
			 errmsg("run \"%s\" does not exist", run_id),
			 errdetail("No run with this id was begun by the current role."),
			 idem_errhint(ERRCODE_IDEM_RUN_NOT_FOUND, "Begin it with idem_run_begin() first.")));
}

/*
 * A run a caller's snapshot cannot see the latest version of (REPEATABLE
 * READ or SERIALIZABLE: another agent moved it on after the snapshot) must
 * not be acted on.
 */
static void
check_run_visible(IdemRunRow *run)
{
	if (!run->visible)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update of run \"%s\"",
						run->run_id),
				 errdetail("Another transaction changed the run after this transaction's snapshot was taken."),
				 idem_errhint(ERRCODE_T_R_SERIALIZATION_FAILURE, "Retry the transaction: the retry sees the run's progress.")));
}

/*
 * Take the run's lock and read the run, as the current snapshot may act on
 * it.  Raises ID404 if the current role has no such run.
 */
static void
lock_run(Oid owner, const char *run_id, IdemRunRow *run)
{
	char	   *lockkey = run_lock_key(run_id);

	idem_lock_key(owner, lockkey, strlen(lockkey), idem_wait);
	if (!idem_lookup_run(owner, run_id, run))
		report_run_not_found(run_id);
	check_run_visible(run);
}

/* Elements of a text[] as C strings. */
static char **
text_elems(ArrayType *arr, int *n)
{
	Datum	   *elems;
	char	  **names;

	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT, &elems, NULL, n);
	names = palloc(Max(*n, 1) * sizeof(char *));
	for (int i = 0; i < *n; i++)
		names[i] = TextDatumGetCString(elems[i]);
	return names;
}

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
	int			n;

	return text_elems(run->steps, &n)[ordinal - 1];
}

/* Where step is among the completed steps (1-based), or 0. */
static int
done_position(IdemRunRow *run, const char *step)
{
	int			n;
	char	  **names = text_elems(run->done_steps, &n);

	for (int i = 0; i < n; i++)
		if (strcmp(names[i], step) == 0)
			return i + 1;
	return 0;
}

/*
 * The position of step among the run's declared steps (1-based), or 0 if
 * the run declared none.  A name the run did not declare is an error.
 */
static int
step_ordinal(IdemRunRow *run, const char *step)
{
	int			n;
	char	  **names;

	if (run->steps == NULL)
		return 0;
	names = text_elems(run->steps, &n);
	for (int i = 0; i < n; i++)
		if (strcmp(names[i], step) == 0)
			return i + 1;
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_STEP_UNDECLARED),
			 errmsg("run \"%s\" has no step \"%s\"", run->run_id, step),
			 errdetail("The run was begun with a list of steps, and this name is not in it."),
			 idem_errhint(ERRCODE_IDEM_STEP_UNDECLARED, "Use one of the names passed to idem_run_begin().")));
	return 0;					/* keep compiler quiet */
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
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
			 errmsg("run \"%s\" is %s", run->run_id, run->status),
			 errdetail("A completed run executes no new steps; completed steps still replay."),
			 idem_errhint(ERRCODE_IDEM_RUN_NOT_RUNNING, "Begin a new run for new work.")));
}

/*
 * Whether a step that has no record may run now: the run must be running,
 * and when it declared its steps, every earlier one must have completed.
 */
static void
check_step_may_run(IdemRunRow *run, const char *step, int ordinal)
{
	int			ndone = run_ndone(run);

	if (strcmp(run->status, "running") != 0)
		report_not_running(run);
	if (ordinal == 0)
		return;
	if (ordinal > ndone + 1)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE),
				 errmsg("step \"%s\" of run \"%s\" cannot run yet", step,
						run->run_id),
				 errdetail("It is step %d; step %d (\"%s\") has not completed.",
						   ordinal, ndone + 1, declared_step(run, ndone + 1)),
				 idem_errhint(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE, "Run the steps in the order idem_run_begin() declared them; idem_run_status() names the next one.")));
	if (ordinal <= ndone)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("step \"%s\" of run \"%s\" is counted as completed but has no record",
						step, run->run_id),
				 errdetail("The key record %s was removed from idem.keys.",
						   derive_step_key(run->run_id, step)),
				 idem_errhint(ERRCODE_DATA_CORRUPTED, NULL)));
}

/*
 * Record a step that just completed: one more completed step, with one
 * attempt.  The last declared step completes the run in the same
 * transaction.
 */
static void
record_step(IdemRunRow *run, const char *step, TimestampTz now)
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
	names[n] = CStringGetTextDatum(step);
	counts[n] = Int32GetDatum(1);
	run->done_steps = construct_array(names, n + 1, TEXTOID, -1, false,
									  TYPALIGN_INT);
	run->attempts = construct_array(counts, n + 1, INT4OID, 4, true,
									TYPALIGN_INT);
	if (run->steps != NULL && n + 1 == run_nsteps(run))
	{
		run->status = "completed";
		run->finished = true;
		run->finished_at = now;
	}
	idem_update_run(run);
}

/* Count a replay of completed step number pos (1-based). */
static void
count_attempt(IdemRunRow *run, int pos)
{
	Datum	   *counts;
	int			n;

	deconstruct_array(run->attempts, INT4OID, 4, true, TYPALIGN_INT,
					  &counts, NULL, &n);
	counts[pos - 1] = Int32GetDatum(DatumGetInt32(counts[pos - 1]) + 1);
	run->attempts = construct_array(counts, n, INT4OID, 4, true, TYPALIGN_INT);
	idem_update_run(run);
}

/*
 * One step of a run, as a statement (stmt) or as a result recorded from
 * outside (result).  req->key is the step's key; fingerprint identifies the
 * request.  Fills out.
 */
static void
run_step(IdemRequest *req, IdemStatement *stmt, Jsonb *result,
		 const char *run_id, const char *step, const uint8 *fingerprint,
		 IdemResult *out, volatile bool *executing)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz never;
	IdemRunRow	run;
	IdemRecord	rec;
	int			ordinal;
	char	   *topic;
	Jsonb	   *response;

	lock_run(req->owner, run_id, &run);
	ordinal = step_ordinal(&run, step);

	if (idem_find_record(stmt, req, fingerprint, now, &rec))
	{
		int			pos = done_position(&run, step);

		/*
		 * A record the run does not list was written by idem_execute()
		 * under the step's key: the same request, so the step is done;
		 * adopt it.
		 */
		if (pos > 0)
			count_attempt(&run, pos);
		else
		{
			check_step_may_run(&run, step, ordinal);
			record_step(&run, step, now);
		}
		if (idem_durable_replay)
			idem_make_replay_durable(req);
		out->response = rec.response;
		out->replayed = true;
		out->first_executed_at = rec.created_at;
		return;
	}

	check_step_may_run(&run, step, ordinal);
	topic = idem_current_topic(req->owner);
	*executing = true;
	response = stmt != NULL ? idem_execute_statement(stmt, req) : result;

	TIMESTAMP_NOEND(never);
	idem_insert_key(req->key, req->owner, fingerprint, response, now, never);
	record_step(&run, step, now);
	if (topic != NULL)
		idem_insert_outbox(req->key, req->owner, topic, response, now,
						   run_id, step);
	out->response = response;
	out->replayed = false;
	out->first_executed_at = now;
}

/* A step's request: the caller's role and the step's key. */
void
idem_step_key_request(const char *run_id, const char *step, IdemRequest *req)
{
	req->owner = idem_key_owner();
	req->ttl = 0;
	req->key = derive_step_key(run_id, step);
	req->keylen = strlen(req->key);
	req->nargs = 0;
}

/*
 * run_step(), with its outcome counted and audited (run id and step
 * included) whether it succeeds or fails.
 */
static void
run_step_noted(IdemRequest *req, IdemStatement *stmt, Jsonb *result,
			   const char *run_id, const char *step,
			   const uint8 *fingerprint, IdemResult *out)
{
	volatile bool executing = false;

	PG_TRY();
	{
		run_step(req, stmt, result, run_id, step, fingerprint, out,
				 &executing);
	}
	PG_CATCH();
	{
		int			code = geterrcode();

		idem_note_outcome(idem_error_outcome(code, executing), req,
						  fingerprint, run_id, step, code);
		PG_RE_THROW();
	}
	PG_END_TRY();
	idem_note_outcome(out->replayed ? IDEM_OUTCOME_REPLAYED : IDEM_OUTCOME_EXECUTED,
					  req, fingerprint, run_id, step, 0);
}

static void
step_request(FunctionCallInfo fcinfo, IdemRequest *req, char **run_id,
			 char **step)
{
	*run_id = idem_name_arg(fcinfo, 0, "run id");
	*step = idem_name_arg(fcinfo, 1, "step name");
	idem_step_key_request(*run_id, *step, req);
}

/*
 * idem_step_request
 *		Replay or execute req (its statement and arguments collected, its
 *		key made by idem_step_key_request()) as step of run_id.
 */
void
idem_step_request(IdemRequest *req, const char *run_id, const char *step,
				  IdemResult *result)
{
	IdemStatement *stmt;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];

	stmt = idem_statement_acquire(req->sql, req->nargs, req->argtypes);
	PG_TRY();
	{
		idem_statement_fingerprint(stmt, req, fingerprint);
		run_step_noted(req, stmt, NULL, run_id, step, fingerprint, result);
	}
	PG_FINALLY();
	{
		idem_statement_release(stmt);
	}
	PG_END_TRY();
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

	idem_check_can_write("idem_step()");
	step_request(fcinfo, &req, &run_id, &step);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("statement passed to idem_step() must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	req.sql = text_to_cstring(PG_GETARG_TEXT_PP(2));
	idem_collect_args(fcinfo, STEP_FIXED_ARGS, &req);
	idem_step_request(&req, run_id, step, &result);
	PG_RETURN_JSONB_P(result.response);
}

/*
 * idem_step_complete(run_id text, step text, result jsonb) returns jsonb
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
	Jsonb	   *result;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	IdemResult	out;

	idem_check_can_write("idem_step_complete()");
	step_request(fcinfo, &req, &run_id, &step);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("result passed to idem_step_complete() must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, "Record an empty result as '{}'.")));
	result = PG_GETARG_JSONB_P(2);
	idem_check_response_size(result, "idem_step_complete() result");

	idem_value_digest("idem_step_complete", JSONBOID, JsonbPGetDatum(result),
					  fingerprint);
	run_step_noted(&req, NULL, result, run_id, step, fingerprint, &out);
	PG_RETURN_JSONB_P(out.response);
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
	char	   *run_id = idem_name_arg(fcinfo, 0, "run id");
	char	   *step = idem_name_arg(fcinfo, 1, "step name");

	PG_RETURN_TEXT_P(cstring_to_text(derive_step_key(run_id, step)));
}

/*
 * A declared step list, checked and rebuilt with lower bound 1 (so that
 * steps[n] is the n-th step however the caller wrote the array).
 */
static ArrayType *
checked_steps(ArrayType *arr)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("steps must be a one-dimensional array"),
				 idem_errhint(ERRCODE_ARRAY_SUBSCRIPT_ERROR, NULL)));
	deconstruct_array(arr, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &n);
	if (n == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("steps must not be empty"),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Pass NULL to allow any steps in any order.")));
	for (int i = 0; i < n; i++)
	{
		char	   *name;

		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("step %d is null", i + 1),
					 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
		name = TextDatumGetCString(elems[i]);
		if (name[0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("step name must not be empty"),
					 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
		if (strlen(name) > IDEM_MAX_KEY_BYTES)
			ereport(ERROR,
					(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
					 errmsg("step name is too long"),
					 errdetail("Step %d is %d bytes long; the limit is %d bytes.",
							   i + 1, (int) strlen(name), IDEM_MAX_KEY_BYTES),
					 idem_errhint(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, NULL)));
		for (int j = 0; j < i; j++)
			if (!nulls[j] && datumIsEqual(elems[i], elems[j], false, -1))
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("step \"%s\" is declared twice", name),
						 errdetail("Steps %d and %d have the same name.", j + 1, i + 1),
						 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	}
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
static char *
next_step(IdemRunRow *run)
{
	int			ndone = run_ndone(run);

	if (run->steps == NULL || ndone >= run_nsteps(run))
		return NULL;
	return declared_step(run, ndone + 1);
}

/*
 * idem_run_begin(run_id text, steps text[], input jsonb,
 *		OUT status text, OUT next_step text, OUT created boolean,
 *		OUT started_at timestamptz) returns record
 *
 * Begins a run, or returns the existing run when called again with the
 * same steps and input (the same bytes: jsonb 1.0 and 1.00 differ, as in
 * request fingerprints); other steps or input under the same id is ID422.
 */
Datum
idem_run_begin(PG_FUNCTION_ARGS)
{
	char	   *run_id;
	ArrayType  *steps = NULL;
	Jsonb	   *input = NULL;
	Oid			owner = idem_key_owner();
	char	   *lockkey;
	IdemRunRow	run;
	bool		created = false;
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4] = {false, false, false, false};
	char	   *next;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	idem_check_can_write("idem_run_begin()");
	run_id = idem_name_arg(fcinfo, 0, "run id");
	if (!PG_ARGISNULL(1))
		steps = checked_steps(PG_GETARG_ARRAYTYPE_P(1));
	if (!PG_ARGISNULL(2))
	{
		input = PG_GETARG_JSONB_P(2);
		idem_check_response_size(input, "run input");
	}

	lockkey = run_lock_key(run_id);
	idem_lock_key(owner, lockkey, strlen(lockkey), idem_wait);
	if (idem_lookup_run(owner, run_id, &run))
	{
		check_run_visible(&run);
		if (!same_value(run.steps, steps) || !same_value(run.input, input))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_REUSED),
					 errmsg("run \"%s\" was already begun with different %s",
							run_id,
							!same_value(run.steps, steps) ? "steps" : "input"),
					 errdetail("A run id names one run: its steps and input are fixed when it begins."),
					 idem_errhint(ERRCODE_IDEM_KEY_REUSED, "Use a new run id for a new run.")));
	}
	else
	{
		run.owner = owner;
		run.run_id = run_id;
		run.steps = steps;
		run.input = input;
		run.status = "running";
		run.started_at = GetCurrentTransactionStartTimestamp();
		run.finished = false;
		run.finished_at = 0;
		run.last_error = NULL;
		run.done_steps = construct_empty_array(TEXTOID);
		run.attempts = construct_empty_array(INT4OID);
		idem_insert_run(&run);
		created = true;
	}

	values[0] = CStringGetTextDatum(run.status);
	next = next_step(&run);
	nulls[1] = next == NULL;
	values[1] = next ? CStringGetTextDatum(next) : (Datum) 0;
	values[2] = BoolGetDatum(created);
	values[3] = TimestampTzGetDatum(run.started_at);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}

/*
 * Move a run to another status: fail, resume or complete.  Returns the new
 * status.
 */
static Datum
set_run_status(FunctionCallInfo fcinfo, const char *verb)
{
	Oid			owner = idem_key_owner();
	char	   *run_id;
	IdemRunRow	run;
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	idem_check_can_write(psprintf("idem_run_%s()", verb));
	run_id = idem_name_arg(fcinfo, 0, "run id");
	lock_run(owner, run_id, &run);

	if (strcmp(verb, "fail") == 0)
	{
		if (PG_ARGISNULL(1))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("reason passed to idem_run_fail() must not be null"),
					 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
		if (strcmp(run.status, "completed") == 0)
			report_not_running(&run);
		run.last_error = text_to_cstring(PG_GETARG_TEXT_PP(1));
		run.status = "failed";
		run.finished = true;
		run.finished_at = now;
	}
	else if (strcmp(verb, "resume") == 0)
	{
		if (strcmp(run.status, "completed") == 0)
			report_not_running(&run);
		run.status = "running";
		run.finished = false;
	}
	else
	{
		if (strcmp(run.status, "failed") == 0)
			report_not_running(&run);
		if (next_step(&run) != NULL)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE),
					 errmsg("run \"%s\" has steps that have not completed", run_id),
					 errdetail("%d of its %d steps have completed; step \"%s\" is next.",
							   run_ndone(&run), run_nsteps(&run), next_step(&run)),
					 idem_errhint(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE, "A run with declared steps completes with its last step.")));
		if (strcmp(run.status, "completed") != 0)
		{
			run.status = "completed";
			run.finished = true;
			run.finished_at = now;
		}
	}
	idem_update_run(&run);
	PG_RETURN_TEXT_P(cstring_to_text(run.status));
}

/* idem_run_fail(run_id text, reason text) returns text */
Datum
idem_run_fail(PG_FUNCTION_ARGS)
{
	return set_run_status(fcinfo, "fail");
}

/* idem_run_resume(run_id text) returns text */
Datum
idem_run_resume(PG_FUNCTION_ARGS)
{
	return set_run_status(fcinfo, "resume");
}

/* idem_run_complete(run_id text) returns text */
Datum
idem_run_complete(PG_FUNCTION_ARGS)
{
	return set_run_status(fcinfo, "complete");
}

/* The current role's run, for the readers: no lock, the caller's snapshot. */
static void
read_run(FunctionCallInfo fcinfo, IdemRunRow *run)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, "run id");

	if (!idem_lookup_run(idem_key_owner(), run_id, run) || !run->visible)
		report_run_not_found(run_id);
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
	bool		nulls[8] = {0};
	char	   *next;

	InitMaterializedSRF(fcinfo, 0);
	read_run(fcinfo, &run);
	next = next_step(&run);
	values[0] = CStringGetTextDatum(run.status);
	nulls[1] = next == NULL;
	values[1] = next ? CStringGetTextDatum(next) : (Datum) 0;
	values[2] = Int32GetDatum(run_ndone(&run));
	nulls[3] = run.steps == NULL;
	values[3] = Int32GetDatum(run_nsteps(&run));
	values[4] = TimestampTzGetDatum(run.started_at);
	nulls[5] = !run.finished;
	values[5] = TimestampTzGetDatum(run.finished_at);
	nulls[6] = run.last_error == NULL;
	values[6] = run.last_error ? CStringGetTextDatum(run.last_error) : (Datum) 0;
	nulls[7] = run.input == NULL;
	values[7] = JsonbPGetDatum(run.input);
	tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	return (Datum) 0;
}

/*
 * idem_run_steps(run_id text) returns table (ordinal, step, state,
 *		response, executed_at, attempts, step_key)
 *
 * The declared steps in order, completed or pending; for a run without
 * declared steps, its completed steps in the order they completed.
 */
Datum
idem_run_steps(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	IdemRunRow	run;
	char	  **names;
	int			n;
	Datum	   *counts;
	int			ncounts;

	InitMaterializedSRF(fcinfo, 0);
	read_run(fcinfo, &run);
	names = text_elems(run.steps ? run.steps : run.done_steps, &n);
	deconstruct_array(run.attempts, INT4OID, 4, true, TYPALIGN_INT,
					  &counts, NULL, &ncounts);

	for (int i = 0; i < n; i++)
	{
		Datum		values[7];
		bool		nulls[7] = {0};
		char	   *key = derive_step_key(run.run_id, names[i]);
		int			pos = run.steps ? done_position(&run, names[i]) : i + 1;
		IdemRecord	rec;
		bool		found = pos > 0 &&
			idem_lookup_key(run.owner, key, &rec) && rec.visible;

		values[0] = Int32GetDatum(i + 1);
		values[1] = CStringGetTextDatum(names[i]);
		values[2] = CStringGetTextDatum(pos > 0 ? "completed" : "pending");
		nulls[3] = nulls[4] = !found;
		if (found)
		{
			values[3] = JsonbPGetDatum(rec.response);
			values[4] = TimestampTzGetDatum(rec.created_at);
		}
		values[5] = Int32GetDatum(pos > 0 && pos <= ncounts ?
								  DatumGetInt32(counts[pos - 1]) : 0);
		values[6] = CStringGetTextDatum(key);
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
