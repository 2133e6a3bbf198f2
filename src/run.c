/*-------------------------------------------------------------------------
 *
 * run.c
 *		Workflow runs: idem_run_begin(), idem_step(), idem_step_complete(),
 *		idem_step_key(), the run verbs (fail, resume, complete) and the
 *		readers idem_run_status() and idem_run_steps().
 *
 * A run is a row of idem.runs, owned like a key by the role that began it.
 * A step is recorded as an ordinary key record in idem.keys, under the key
 * idem_step_key(run, step) and with no expiry, plus a row of idem.run_steps
 * (ordinal, attempts); so a step replays exactly as idem_execute() does,
 * and idem_execute() under the step's key is the same request.  The step's
 * business write, its records, the run's progress and its outbox event
 * commit in the caller's transaction, or not at all.
 *
 * Every call on a run takes the run's advisory lock (honouring idem.wait)
 * and then the run's row FOR UPDATE.  The lock serializes the run's steps;
 * the row lock makes a REPEATABLE READ or SERIALIZABLE caller whose
 * snapshot predates another agent's progress fail with 40001 instead of
 * acting on what it saw.
 *
 * The run tables are not visible to the roles that use them (schema idem is
 * closed), so the bookkeeping statements run through SPI as the bootstrap
 * superuser, with every name in their text schema-qualified; the caller's
 * own statement never does.  Their plans are prepared once per backend.
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
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
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

/* The bookkeeping statements; $1 is always the owner, $2 the run id. */
typedef enum RunQuery
{
	Q_RUN_GET,
	Q_RUN_BEGIN_GET,
	Q_RUN_INSERT,
	Q_RUN_ADVANCE,
	Q_RUN_SET_STATUS,
	Q_STEP_INSERT,
	Q_STEP_ATTEMPT,
	Q_RUN_STATUS,
	Q_RUN_STEPS,
	NUM_RUN_QUERIES
} RunQuery;

typedef struct RunQueryDef
{
	const char *sql;
	int			nargs;
	Oid			argtypes[6];
} RunQueryDef;

#define EQ " OPERATOR(pg_catalog.=) "
#define RUN_IS " WHERE owner" EQ "$1 AND run_id" EQ "$2"

static const RunQueryDef run_queries[NUM_RUN_QUERIES] = {
	[Q_RUN_GET] = {
		"SELECT steps, status, steps_done FROM idem.runs" RUN_IS " FOR UPDATE",
		2, {OIDOID, TEXTOID}
	},
	[Q_RUN_BEGIN_GET] = {
		"SELECT status, steps IS NOT DISTINCT FROM $3, input IS NOT DISTINCT FROM $4"
		" FROM idem.runs" RUN_IS " FOR UPDATE",
		4, {OIDOID, TEXTOID, TEXTARRAYOID, JSONBOID}
	},
	[Q_RUN_INSERT] = {
		"INSERT INTO idem.runs (run_id, owner, steps, input, status, steps_done, started_at)"
		" VALUES ($2, $1, $3, $4, 'running', 0, $5) ON CONFLICT DO NOTHING",
		5, {OIDOID, TEXTOID, TEXTARRAYOID, JSONBOID, TIMESTAMPTZOID}
	},
	[Q_RUN_ADVANCE] = {
		"UPDATE idem.runs SET steps_done = $3, status = $4, finished_at = $5" RUN_IS,
		5, {OIDOID, TEXTOID, INT4OID, TEXTOID, TIMESTAMPTZOID}
	},
	[Q_RUN_SET_STATUS] = {
		"UPDATE idem.runs SET status = $3, finished_at = $4,"
		" last_error = COALESCE($5, last_error)" RUN_IS,
		5, {OIDOID, TEXTOID, TEXTOID, TIMESTAMPTZOID, TEXTOID}
	},
	[Q_STEP_INSERT] = {
		"INSERT INTO idem.run_steps (owner, run_id, step, ordinal, step_key, executed_at, attempts)"
		" VALUES ($1, $2, $3, $4, $5, $6, 1)",
		6, {OIDOID, TEXTOID, TEXTOID, INT4OID, TEXTOID, TIMESTAMPTZOID}
	},
	[Q_STEP_ATTEMPT] = {
		"UPDATE idem.run_steps SET attempts = attempts OPERATOR(pg_catalog.+) 1"
		RUN_IS " AND step" EQ "$3",
		3, {OIDOID, TEXTOID, TEXTOID}
	},
	[Q_RUN_STATUS] = {
		"SELECT status,"
		" CASE WHEN steps IS NOT NULL AND steps_done OPERATOR(pg_catalog.<) pg_catalog.cardinality(steps)"
		"  THEN steps[steps_done OPERATOR(pg_catalog.+) 1] END,"
		" steps_done, pg_catalog.cardinality(steps), started_at, finished_at, last_error, input"
		" FROM idem.runs" RUN_IS,
		2, {OIDOID, TEXTOID}
	},
	[Q_RUN_STEPS] = {
		"SELECT s.ordinal, s.step,"
		" CASE WHEN d.step IS NULL THEN 'pending' ELSE 'completed' END,"
		" k.response, d.executed_at, COALESCE(d.attempts, 0)"
		" FROM idem.runs r"
		" CROSS JOIN LATERAL ("
		"  SELECT t.ord::pg_catalog.int4 AS ordinal, t.step"
		"    FROM pg_catalog.unnest(r.steps) WITH ORDINALITY AS t(step, ord)"
		"  UNION ALL"
		"  SELECT x.ordinal, x.step FROM idem.run_steps x"
		"   WHERE r.steps IS NULL AND x.owner" EQ "r.owner AND x.run_id" EQ "r.run_id) s"
		" LEFT JOIN idem.run_steps d ON d.owner" EQ "r.owner AND d.run_id" EQ "r.run_id"
		"  AND d.step" EQ "s.step"
		" LEFT JOIN idem.keys k ON k.owner" EQ "d.owner AND k.key" EQ "d.step_key"
		" WHERE r.owner" EQ "$1 AND r.run_id" EQ "$2"
		" ORDER BY s.ordinal",
		2, {OIDOID, TEXTOID}
	},
};

static SPIPlanPtr run_plans[NUM_RUN_QUERIES];

/* A run as a step sees it, read under the run's lock. */
typedef struct IdemRun
{
	Oid			owner;
	char	   *run_id;
	ArrayType  *steps;			/* declared steps, or NULL */
	char	   *status;
	int32		steps_done;
} IdemRun;

/* The user the bookkeeping statements ran as before they switched. */
typedef struct RunCatalogSession
{
	Oid			saved_userid;
	int			saved_secctx;
	MemoryContext callercxt;	/* where results outlive SPI_finish() */
} RunCatalogSession;

/*
 * Open SPI and become the bootstrap superuser, who owns idem's tables
 * whatever role created the extension.  An error restores the user with the
 * (sub)transaction's abort.
 */
static void
run_catalog_begin(RunCatalogSession *session)
{
	session->callercxt = CurrentMemoryContext;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	GetUserIdAndSecContext(&session->saved_userid, &session->saved_secctx);
	SetUserIdAndSecContext(BOOTSTRAP_SUPERUSERID,
						   session->saved_secctx |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
}

static void
run_catalog_end(RunCatalogSession *session)
{
	SetUserIdAndSecContext(session->saved_userid, session->saved_secctx);
	SPI_finish();
}

/* Run a bookkeeping statement; the caller is inside run_catalog_begin(). */
static uint64
run_query(RunQuery q, Datum *values, const char *nulls)
{
	int			rc;

	if (run_plans[q] == NULL)
	{
		const RunQueryDef *def = &run_queries[q];
		SPIPlanPtr	plan;

		plan = SPI_prepare(def->sql, def->nargs, (Oid *) def->argtypes);
		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for idem run query %d: %s",
				 (int) q, SPI_result_code_string(SPI_result));
		SPI_keepplan(plan);
		run_plans[q] = plan;
	}
	rc = SPI_execute_plan(run_plans[q], values, nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "idem run query %d failed: %s", (int) q,
			 SPI_result_code_string(rc));
	return SPI_processed;
}

/* SPI result column i (1-based) of row 0, or isnull */
static Datum
result_value(int col, bool *isnull)
{
	return SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, col,
						 isnull);
}

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
 * Take the run's lock, then its row, and read it into run (in the
 * caller's memory).  Raises ID404 if the current role has no such run.
 */
static void
lock_run(Oid owner, const char *run_id, IdemRun *run)
{
	RunCatalogSession session;
	char	   *lockkey = run_lock_key(run_id);
	Datum		values[2];
	bool		isnull;

	idem_lock_key(owner, lockkey, strlen(lockkey), idem_wait);

	run_catalog_begin(&session);
	values[0] = ObjectIdGetDatum(owner);
	values[1] = CStringGetTextDatum(run_id);
	if (run_query(Q_RUN_GET, values, NULL) == 0)
		report_run_not_found(run_id);

	MemoryContextSwitchTo(session.callercxt);
	run->owner = owner;
	run->run_id = pstrdup(run_id);
	run->steps = NULL;
	{
		Datum		d = result_value(1, &isnull);

		if (!isnull)
			run->steps = DatumGetArrayTypePCopy(d);
	}
	run->status = TextDatumGetCString(result_value(2, &isnull));
	run->steps_done = DatumGetInt32(result_value(3, &isnull));
	run_catalog_end(&session);
}

static int
run_nsteps(IdemRun *run)
{
	return run->steps == NULL ? 0 : ArrayGetNItems(ARR_NDIM(run->steps),
												   ARR_DIMS(run->steps));
}

/* The name of declared step ordinal (1-based). */
static char *
declared_step(IdemRun *run, int ordinal)
{
	Datum	   *elems;
	int			n;

	deconstruct_array(run->steps, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, NULL, &n);
	return TextDatumGetCString(elems[ordinal - 1]);
}

/*
 * The position of step among the run's declared steps (1-based), or 0 if
 * the run declared none.  A name the run did not declare is an error.
 */
static int
step_ordinal(IdemRun *run, const char *step)
{
	Datum	   *elems;
	int			n;

	if (run->steps == NULL)
		return 0;
	deconstruct_array(run->steps, TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, NULL, &n);
	for (int i = 0; i < n; i++)
	{
		char	   *name = TextDatumGetCString(elems[i]);

		if (strcmp(name, step) == 0)
			return i + 1;
	}
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_STEP_UNDECLARED),
			 errmsg("run \"%s\" has no step \"%s\"", run->run_id, step),
			 errdetail("The run was begun with a list of steps, and this name is not in it."),
			 idem_errhint(ERRCODE_IDEM_STEP_UNDECLARED, "Use one of the names passed to idem_run_begin().")));
	return 0;					/* keep compiler quiet */
}

static void
report_not_running(IdemRun *run)
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
 * Returns the step's ordinal in the run.
 */
static int
check_step_may_run(IdemRun *run, const char *step, int ordinal)
{
	if (strcmp(run->status, "running") != 0)
		report_not_running(run);
	if (ordinal == 0)
		return run->steps_done + 1;
	if (ordinal > run->steps_done + 1)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE),
				 errmsg("step \"%s\" of run \"%s\" cannot run yet", step,
						run->run_id),
				 errdetail("It is step %d; step %d (\"%s\") has not completed.",
						   ordinal, run->steps_done + 1,
						   declared_step(run, run->steps_done + 1)),
				 idem_errhint(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE, "Run the steps in the order idem_run_begin() declared them; idem_run_status() names the next one.")));
	if (ordinal <= run->steps_done)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("step \"%s\" of run \"%s\" is counted as completed but has no record",
						step, run->run_id),
				 errdetail("The key record %s was removed from idem.keys.",
						   derive_step_key(run->run_id, step)),
				 idem_errhint(ERRCODE_DATA_CORRUPTED, NULL)));
	return ordinal;
}

/*
 * Record a step that just completed and advance the run; the last declared
 * step completes the run in the same transaction.
 */
static void
record_step(IdemRun *run, const char *step, int ordinal, const char *key,
			TimestampTz now)
{
	RunCatalogSession session;
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	int32		done = run->steps_done + 1;
	bool		finished = run->steps != NULL && done == run_nsteps(run);

	run_catalog_begin(&session);
	values[0] = ObjectIdGetDatum(run->owner);
	values[1] = CStringGetTextDatum(run->run_id);
	values[2] = CStringGetTextDatum(step);
	values[3] = Int32GetDatum(ordinal);
	values[4] = CStringGetTextDatum(key);
	values[5] = TimestampTzGetDatum(now);
	run_query(Q_STEP_INSERT, values, nulls);

	values[2] = Int32GetDatum(done);
	values[3] = CStringGetTextDatum(finished ? "completed" : "running");
	values[4] = TimestampTzGetDatum(now);
	nulls[4] = finished ? ' ' : 'n';
	run_query(Q_RUN_ADVANCE, values, nulls);
	run_catalog_end(&session);
}

/* Count a replay of step; false if the run has no row for it. */
static bool
count_attempt(IdemRun *run, const char *step)
{
	RunCatalogSession session;
	Datum		values[3];
	uint64		n;

	run_catalog_begin(&session);
	values[0] = ObjectIdGetDatum(run->owner);
	values[1] = CStringGetTextDatum(run->run_id);
	values[2] = CStringGetTextDatum(step);
	n = run_query(Q_STEP_ATTEMPT, values, NULL);
	run_catalog_end(&session);
	return n > 0;
}

/*
 * One step of a run, as a statement (stmt) or as a result recorded from
 * outside (result).  req->key is the step's key; fingerprint identifies the
 * request.  Returns the step's response.
 */
static Jsonb *
run_step(IdemRequest *req, IdemStatement *stmt, Jsonb *result,
		 const char *run_id, const char *step, const uint8 *fingerprint)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	TimestampTz never;
	IdemRun		run;
	IdemRecord	rec;
	int			ordinal;
	char	   *topic;
	Jsonb	   *response;

	lock_run(req->owner, run_id, &run);
	ordinal = step_ordinal(&run, step);

	if (idem_find_record(stmt, req, fingerprint, now, &rec))
	{
		/*
		 * A record without a step row was written by idem_execute() under
		 * the step's key: the same request, so the step is done; adopt it.
		 */
		if (!count_attempt(&run, step))
			record_step(&run, step, check_step_may_run(&run, step, ordinal),
						req->key, now);
		if (idem_durable_replay)
			idem_make_replay_durable(req);
		return rec.response;
	}

	ordinal = check_step_may_run(&run, step, ordinal);
	topic = idem_current_topic();
	response = stmt != NULL ? idem_execute_statement(stmt, req) : result;

	TIMESTAMP_NOEND(never);
	idem_insert_key(req->key, req->owner, fingerprint, response, now, never);
	record_step(&run, step, ordinal, req->key, now);
	if (topic != NULL)
		idem_insert_outbox(req->key, req->owner, topic, response, now);
	return response;
}

static void
step_request(FunctionCallInfo fcinfo, IdemRequest *req, char **run_id,
			 char **step)
{
	req->owner = GetUserId();
	req->ttl = 0;
	*run_id = idem_name_arg(fcinfo, 0, "run id");
	*step = idem_name_arg(fcinfo, 1, "step name");
	req->key = derive_step_key(*run_id, *step);
	req->keylen = strlen(req->key);
	req->nargs = 0;
}

/*
 * idem_step(run_id text, step text, sql text [, VARIADIC args "any"])
 *		returns jsonb
 */
Datum
idem_step(PG_FUNCTION_ARGS)
{
	IdemRequest req;
	IdemStatement *stmt;
	char	   *run_id;
	char	   *step;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	Jsonb	   *response = NULL;

	idem_check_can_write("idem_step()");
	step_request(fcinfo, &req, &run_id, &step);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("statement passed to idem_step() must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	req.sql = text_to_cstring(PG_GETARG_TEXT_PP(2));
	idem_collect_args(fcinfo, STEP_FIXED_ARGS, &req);

	stmt = idem_statement_acquire(req.sql, req.nargs, req.argtypes);
	PG_TRY();
	{
		idem_statement_fingerprint(stmt, &req, fingerprint);
		response = run_step(&req, stmt, NULL, run_id, step, fingerprint);
	}
	PG_FINALLY();
	{
		idem_statement_release(stmt);
	}
	PG_END_TRY();
	PG_RETURN_JSONB_P(response);
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
	PG_RETURN_JSONB_P(run_step(&req, NULL, result, run_id, step, fingerprint));
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

/*
 * Read the run's status row (Q_RUN_STATUS) inside a catalog session;
 * false if there is none.
 */
static bool
fetch_status(Oid owner, const char *run_id)
{
	Datum		values[2];

	values[0] = ObjectIdGetDatum(owner);
	values[1] = CStringGetTextDatum(run_id);
	return run_query(Q_RUN_STATUS, values, NULL) > 0;
}

/* Q_RUN_STATUS columns: status, next_step, steps_done, steps_total,
 * started_at, finished_at, last_error, input */
#define NUM_STATUS_COLUMNS 8

static Datum
run_status_datum(FunctionCallInfo fcinfo, Oid owner, const char *run_id,
				 bool created)
{
	RunCatalogSession session;
	TupleDesc	tupdesc;
	Datum		values[4];
	bool		nulls[4];
	HeapTuple	tuple;

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	tupdesc = BlessTupleDesc(tupdesc);

	run_catalog_begin(&session);
	if (!fetch_status(owner, run_id))
		report_run_not_found(run_id);
	values[0] = result_value(1, &nulls[0]);
	values[1] = result_value(2, &nulls[1]);
	values[2] = BoolGetDatum(created);
	nulls[2] = false;
	values[3] = result_value(5, &nulls[3]);
	MemoryContextSwitchTo(session.callercxt);
	tuple = heap_form_tuple(tupdesc, values, nulls);
	run_catalog_end(&session);
	return HeapTupleGetDatum(tuple);
}

/*
 * idem_run_begin(run_id text, steps text[], input jsonb,
 *		OUT status text, OUT next_step text, OUT created boolean,
 *		OUT started_at timestamptz) returns record
 *
 * Begins a run, or returns the existing run when called again with the
 * same steps and input; other steps or input under the same id is ID422.
 */
Datum
idem_run_begin(PG_FUNCTION_ARGS)
{
	char	   *run_id;
	ArrayType  *steps = NULL;
	Jsonb	   *input = NULL;
	Oid			owner = GetUserId();
	char	   *lockkey;
	RunCatalogSession session;
	Datum		values[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', ' '};
	bool		created = false;

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

	run_catalog_begin(&session);
	values[0] = ObjectIdGetDatum(owner);
	values[1] = CStringGetTextDatum(run_id);
	values[2] = steps ? PointerGetDatum(steps) : (Datum) 0;
	nulls[2] = steps ? ' ' : 'n';
	values[3] = input ? JsonbPGetDatum(input) : (Datum) 0;
	nulls[3] = input ? ' ' : 'n';
	if (run_query(Q_RUN_BEGIN_GET, values, nulls) > 0)
	{
		bool		isnull;

		if (!DatumGetBool(result_value(2, &isnull)) ||
			!DatumGetBool(result_value(3, &isnull)))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_REUSED),
					 errmsg("run \"%s\" was already begun with different %s",
							run_id,
							!DatumGetBool(result_value(2, &isnull)) ? "steps" : "input"),
					 errdetail("A run id names one run: its steps and input are fixed when it begins."),
					 idem_errhint(ERRCODE_IDEM_KEY_REUSED, "Use a new run id for a new run.")));
	}
	else
	{
		values[4] = TimestampTzGetDatum(GetCurrentTransactionStartTimestamp());
		if (run_query(Q_RUN_INSERT, values, nulls) != 1)
			elog(ERROR, "run \"%s\" appeared while its lock was held", run_id);
		created = true;
		CommandCounterIncrement();
	}
	run_catalog_end(&session);

	return run_status_datum(fcinfo, owner, run_id, created);
}

/*
 * Move a run to another status: fail, resume or complete.  Returns the new
 * status.
 */
static Datum
set_run_status(FunctionCallInfo fcinfo, const char *verb)
{
	Oid			owner = GetUserId();
	char	   *run_id;
	char	   *reason = NULL;
	const char *status;
	IdemRun		run;
	RunCatalogSession session;
	Datum		values[5];
	char		nulls[5] = {' ', ' ', ' ', ' ', 'n'};
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
		reason = text_to_cstring(PG_GETARG_TEXT_PP(1));
		if (strcmp(run.status, "completed") == 0)
			report_not_running(&run);
		status = "failed";
	}
	else if (strcmp(verb, "resume") == 0)
	{
		if (strcmp(run.status, "completed") == 0)
			report_not_running(&run);
		status = "running";
	}
	else
	{
		if (strcmp(run.status, "failed") == 0)
			report_not_running(&run);
		if (run.steps != NULL && run.steps_done < run_nsteps(&run))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE),
					 errmsg("run \"%s\" has steps that have not completed", run_id),
					 errdetail("%d of its %d steps have completed; step \"%s\" is next.",
							   run.steps_done, run_nsteps(&run),
							   declared_step(&run, run.steps_done + 1)),
					 idem_errhint(ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE, "A run with declared steps completes with its last step.")));
		status = "completed";
	}

	run_catalog_begin(&session);
	values[0] = ObjectIdGetDatum(owner);
	values[1] = CStringGetTextDatum(run_id);
	values[2] = CStringGetTextDatum(status);
	values[3] = TimestampTzGetDatum(now);
	if (strcmp(status, "running") == 0)
		nulls[3] = 'n';
	if (reason != NULL)
	{
		values[4] = CStringGetTextDatum(reason);
		nulls[4] = ' ';
	}
	run_query(Q_RUN_SET_STATUS, values, nulls);
	run_catalog_end(&session);
	PG_RETURN_TEXT_P(cstring_to_text(status));
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

/*
 * Return the rows of the last bookkeeping query as the function's result
 * set.  Output column key_col (1-based, or 0 for none) is the step key of
 * the step named in query column step_col.
 */
static void
return_rows(FunctionCallInfo fcinfo, const char *run_id, int step_col,
			int key_col)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TupleDesc	outdesc = rsinfo->setDesc;
	int			natts = outdesc->natts;
	Datum	   *values = palloc(natts * sizeof(Datum));
	bool	   *nulls = palloc(natts * sizeof(bool));

	for (uint64 row = 0; row < SPI_processed; row++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[row];

		for (int i = 0; i < natts; i++)
		{
			if (i + 1 == key_col)
			{
				bool		isnull;
				Datum		name = SPI_getbinval(tuple, SPI_tuptable->tupdesc,
												 step_col, &isnull);

				values[i] = CStringGetTextDatum(derive_step_key(run_id,
																TextDatumGetCString(name)));
				nulls[i] = false;
			}
			else
				values[i] = SPI_getbinval(tuple, SPI_tuptable->tupdesc, i + 1,
										  &nulls[i]);
		}
		tuplestore_putvalues(rsinfo->setResult, outdesc, values, nulls);
	}
}

/*
 * idem_run_status(run_id text) returns table (status, next_step,
 *		steps_done, steps_total, started_at, finished_at, last_error, input)
 */
Datum
idem_run_status(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, "run id");
	Oid			owner = GetUserId();	/* before becoming the superuser */
	RunCatalogSession session;

	InitMaterializedSRF(fcinfo, 0);
	idem_catalog_check();
	run_catalog_begin(&session);
	if (!fetch_status(owner, run_id))
		report_run_not_found(run_id);
	return_rows(fcinfo, run_id, 0, 0);
	run_catalog_end(&session);
	return (Datum) 0;
}

/*
 * idem_run_steps(run_id text) returns table (ordinal, step, state,
 *		response, executed_at, attempts, step_key)
 */
Datum
idem_run_steps(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, "run id");
	Oid			owner = GetUserId();
	RunCatalogSession session;
	Datum		values[2];

	InitMaterializedSRF(fcinfo, 0);
	idem_catalog_check();
	run_catalog_begin(&session);
	if (!fetch_status(owner, run_id))
		report_run_not_found(run_id);
	values[0] = ObjectIdGetDatum(owner);
	values[1] = CStringGetTextDatum(run_id);
	run_query(Q_RUN_STEPS, values, NULL);
	return_rows(fcinfo, run_id, 2, 7);
	run_catalog_end(&session);
	return (Datum) 0;
}
