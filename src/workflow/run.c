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
	const char *parts[] = {IDEM_STEP_KEY_PART, run_id, step};

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

/*
 * Where name is in a text[] without nulls (1-based), or 0: one pass over
 * the array, no copy of its elements.
 */
static int
name_position(ArrayType *arr, const char *name)
{
	ArrayIterator it = array_create_iterator(arr, 0, NULL);
	size_t		len = strlen(name);
	Datum		elem;
	bool		isnull;
	int			pos = 0;
	int			found = 0;

	while (array_iterate(it, &elem, &isnull))
	{
		text	   *t = DatumGetTextPP(elem);

		pos++;
		if (!isnull && VARSIZE_ANY_EXHDR(t) == len &&
			memcmp(VARDATA_ANY(t), name, len) == 0)
		{
			found = pos;
			break;
		}
	}
	array_free_iterator(it);
	return found;
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
	return name_position(run->done_steps, step);
}

/*
 * The position of step among the run's declared steps (1-based), or 0 if
 * the run declared none.  A name the run did not declare is an error.
 */
static int
step_ordinal(IdemRunRow *run, const char *step)
{
	int			ordinal;

	if (run->steps == NULL)
		return 0;
	ordinal = name_position(run->steps, step);
	if (ordinal > 0)
		return ordinal;
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_STEP_UNDECLARED),
			 errmsg("run \"%s\" has no step \"%s\"", run->run_id, step),
			 errdetail("The run was begun with a list of steps, and this name is not in it."),
			 idem_errhint(ERRCODE_IDEM_STEP_UNDECLARED, "Use one of the names passed to idem_run_begin().")));
	return 0;					/* keep compiler quiet */
}

/* Refuse a run of more than IDEM_MAX_RUN_STEPS steps. */
static void
check_step_count(int n, const char *run_id)
{
	if (n > IDEM_MAX_RUN_STEPS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("run \"%s\" would have too many steps", run_id),
				 errdetail("It would have %d steps; a run has at most %d.",
						   n, IDEM_MAX_RUN_STEPS),
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
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
			 errmsg("run \"%s\" is %s", run->run_id, run->status),
			 errdetail("A completed run executes no new steps; completed steps still replay."),
			 idem_errhint(ERRCODE_IDEM_RUN_NOT_RUNNING, "Begin a new run for new work.")));
}

/* A completed step must never run again, even if its record is gone. */
static void
report_lost_record(IdemRunRow *run, const char *step)
{
	ereport(ERROR,
			(errcode(ERRCODE_DATA_CORRUPTED),
			 errmsg("step \"%s\" of run \"%s\" is counted as completed but has no record",
					step, run->run_id),
			 errdetail("The key record %s was removed from idem.keys.",
					   derive_step_key(run->run_id, step)),
			 idem_errhint(ERRCODE_DATA_CORRUPTED, NULL)));
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
	{
		if (name_position(run->done_steps, step) > 0)
			report_lost_record(run, step);
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
		report_lost_record(run, step);
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
		/* a failure the run was resumed from is over */
		run->last_error = NULL;
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
		int			pos = done_position(&run, step, ordinal);

		/*
		 * A record the run does not list was written outside the run's
		 * functions (before they owned the key): it may expire or hold a
		 * cached error, which a step's record never does.
		 */
		if (pos == 0)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_REUSED),
					 errmsg("step \"%s\" of run \"%s\" has a record its run did not write",
							step, run.run_id),
					 errdetail("The key record %s was not written by the run's functions.",
							   req->key),
					 idem_errhint(ERRCODE_IDEM_KEY_REUSED, "Give the step another name, or remove the record once it has expired.")));
		count_attempt(&run, pos);
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
	/*
	 * The step's place among the run's completed steps orders its events:
	 * the run's lock makes that the order in which the steps committed.
	 */
	if (topic != NULL)
		idem_insert_outbox(req->key, req->owner, topic, response, now,
						   run_id, step, run_ndone(&run));
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
					 errdetail("Step %d is %d bytes long; the limit is %d bytes.",
							   i + 1, len, IDEM_MAX_KEY_BYTES),
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
		steps = checked_steps(PG_GETARG_ARRAYTYPE_P(1), run_id);
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
		{
			IdemRequest req;

			/* counted and audited as a key's mismatch is, under the run's lock key */
			req.owner = owner;
			req.key = lockkey;
			req.keylen = strlen(lockkey);
			req.nargs = 0;
			idem_note_outcome(IDEM_OUTCOME_MISMATCH, &req, NULL, run_id, NULL,
							  ERRCODE_IDEM_KEY_REUSED);
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_REUSED),
					 errmsg("run \"%s\" was already begun with different %s",
							run_id,
							!same_value(run.steps, steps) ? "steps" : "input"),
					 errdetail("A run id names one run: its steps and input are fixed when it begins."),
					 idem_errhint(ERRCODE_IDEM_KEY_REUSED, "Use a new run id for a new run.")));
		}
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
			run.last_error = NULL;
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
	Datum	   *names;
	int			n;
	int			ndone;
	Datum	   *counts;
	int			ncounts;
	MemoryContext rowcxt;
	MemoryContext oldcxt;

	InitMaterializedSRF(fcinfo, 0);
	read_run(fcinfo, &run);
	deconstruct_array(run.steps ? run.steps : run.done_steps, TEXTOID, -1,
					  false, TYPALIGN_INT, &names, NULL, &n);
	deconstruct_array(run.attempts, INT4OID, 4, true, TYPALIGN_INT,
					  &counts, NULL, &ncounts);
	ndone = run_ndone(&run);
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

		CHECK_FOR_INTERRUPTS();
		oldcxt = MemoryContextSwitchTo(rowcxt);
		name = TextDatumGetCString(names[i]);
		key = derive_step_key(run.run_id, name);
		found = pos > 0 && idem_lookup_key(run.owner, key, &rec) && rec.visible;

		values[0] = Int32GetDatum(i + 1);
		values[1] = names[i];
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
		MemoryContextSwitchTo(oldcxt);
		MemoryContextReset(rowcxt);
	}
	MemoryContextDelete(rowcxt);
	return (Datum) 0;
}

/*
 * idem_run_try_lock(owner regrole, run_id text) returns boolean
 *
 * Takes a run's lock if it is free, for idem_run_purge(): a run that a
 * step or a run verb holds is left for the next purge, rather than deleted
 * under it or waited for (which could deadlock with a transaction that
 * steps several runs).
 */
Datum
idem_run_try_lock(PG_FUNCTION_ARGS)
{
	Oid			owner = PG_GETARG_OID(0);
	char	   *lockkey = run_lock_key(text_to_cstring(PG_GETARG_TEXT_PP(1)));

	PG_RETURN_BOOL(idem_try_lock_key(owner, lockkey, strlen(lockkey)));
}
