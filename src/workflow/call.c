/*-------------------------------------------------------------------------
 *
 * call.c
 *		idem_call(): a call and its options in one statement, so a client
 *		needs one round trip where BEGIN; SET LOCAL ...; SELECT; COMMIT
 *		needs four.
 *
 * The options are the settings a call reads (idem.outbox_topic, idem.ttl,
 * idem.wait), set for the duration of this call only, the way a function's
 * SET clause sets them: a GUC nest level that is unwound when the call
 * returns, and by the transaction's abort if it fails.  The arguments are
 * a text[] typed by the statement, as untyped driver parameters are, so a
 * client passes a plain array of strings.  With run_id and step instead of
 * a key, the call is a workflow step; with lease_token too, a step of the
 * queued run that token leases.
 *
 * A worker's step may also carry its neighbours' bookkeeping, so that their
 * records commit with the step's instead of in transactions of their own:
 * complete_step and complete_result record the result of the external step
 * before it (what idem_step_complete() does), first; start_step records the
 * start of the external step after it (what idem_step_start() does), last.
 * Both are what the separate calls would record, only committed together:
 * an external step whose completion is lost with the transaction is still
 * started on record, so its retry calls out again under the same key, which
 * the provider deduplicates; and a start that commits with the step before
 * it commits before the worker calls out.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/call.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_call);

/* idem_call()'s parameters */
enum
{
	CALL_KEY,
	CALL_SQL,
	CALL_ARGS,
	CALL_OUTBOX_TOPIC,
	CALL_TTL,
	CALL_WAIT,
	CALL_RUN_ID,
	CALL_STEP,
	CALL_LEASE_TOKEN,
	CALL_COMPLETE_STEP,
	CALL_COMPLETE_RESULT,
	CALL_START_STEP
};

static void
set_option(const char *name, const char *value)
{
	(void) set_config_option(name, value,
							 superuser() ? PGC_SUSET : PGC_USERSET,
							 PGC_S_SESSION, GUC_ACTION_SAVE, true, 0, false);
}

/* A ttl option as whole seconds, the unit of idem.ttl. */
static char *
ttl_seconds(Interval *ttl)
{
	float8		secs = DatumGetFloat8(DirectFunctionCall2(interval_part,
														  CStringGetTextDatum("epoch"),
														  IntervalPGetDatum(ttl)));

	if (secs < 1 || secs > INT_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be between 1 second and %d seconds", INT_MAX),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	return psprintf("%.0f", secs);
}

/*
 * idem_call_options
 *		Set the options a call reads (idem.outbox_topic, idem.ttl,
 *		idem.wait) from its arguments topic_arg, ttl_arg and wait_arg, those
 *		not NULL (ttl_arg -1: a step's call, whose record never expires,
 *		takes none), for this call only; returns the GUC nest level for
 *		AtEOXact_GUC(true, ...) when the call returns.
 */
int
idem_call_options(FunctionCallInfo fcinfo, int topic_arg, int ttl_arg,
				  int wait_arg)
{
	int			nestlevel = NewGUCNestLevel();

	if (!PG_ARGISNULL(topic_arg))
		set_option("idem.outbox_topic", text_to_cstring(PG_GETARG_TEXT_PP(topic_arg)));
	if (ttl_arg >= 0 && !PG_ARGISNULL(ttl_arg))
		set_option("idem.ttl", ttl_seconds(PG_GETARG_INTERVAL_P(ttl_arg)));
	if (!PG_ARGISNULL(wait_arg))
		set_option("idem.wait", PG_GETARG_BOOL(wait_arg) ? "on" : "off");
	return nestlevel;
}

/*
 * The call's result, and the step it started (started NULL: none; attempt
 * 0: none, the step had completed).  The row type is built once per
 * backend, as idem_result_datum()'s.
 */
static Datum
call_result(IdemResult *result, const char *run_id, const char *started,
			int attempt)
{
	static TupleDesc desc = NULL;
	Datum		values[IDEM_RESULT_COLUMNS + 2];
	bool		nulls[IDEM_RESULT_COLUMNS + 2];

	if (desc == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(CacheMemoryContext);
		TupleDesc	d = CreateTemplateTupleDesc(IDEM_RESULT_COLUMNS + 2);

		idem_result_desc_init(d);
		TupleDescInitEntry(d, IDEM_RESULT_COLUMNS + 1, "started_key", TEXTOID, -1, 0);
		TupleDescInitEntry(d, IDEM_RESULT_COLUMNS + 2, "started_attempt", INT4OID, -1, 0);
		desc = BlessTupleDesc(d);
		MemoryContextSwitchTo(oldcxt);
	}
	idem_result_values(result, values, nulls);
	nulls[IDEM_RESULT_COLUMNS] = started == NULL;
	if (started != NULL)
		values[IDEM_RESULT_COLUMNS] =
			CStringGetTextDatum(idem_run_step_key(run_id, started));
	nulls[IDEM_RESULT_COLUMNS + 1] = attempt <= 0;
	if (attempt > 0)
		values[IDEM_RESULT_COLUMNS + 1] = Int32GetDatum(attempt);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

/*
 * Whether argument argno is NULL or not passed: a definition of idem_call()
 * from before an update (1.1 has no lease_token, no complete_step...) calls
 * this library with fewer arguments, and is refused only once the call
 * reaches idem's tables, after its arguments are read.
 */
static bool
arg_absent(FunctionCallInfo fcinfo, int argno)
{
	return PG_NARGS() <= argno || PG_ARGISNULL(argno);
}

/* An option that only a step takes, argument argno. */
static void
check_step_option(FunctionCallInfo fcinfo, int argno, bool is_step)
{
	if (!is_step && !arg_absent(fcinfo, argno))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 argno == CALL_LEASE_TOKEN ?
				 errmsg("idem_call() takes a lease_token only with a run_id and a step") :
				 argno == CALL_COMPLETE_STEP ?
				 errmsg("idem_call() takes a complete_step only with a run_id and a step") :
				 errmsg("idem_call() takes a start_step only with a run_id and a step"),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
}

/*
 * idem_call(key text, sql text, args text[] DEFAULT '{}',
 *		outbox_topic text, ttl interval, wait boolean, run_id text, step text,
 *		lease_token uuid, complete_step text, complete_result jsonb,
 *		start_step text, OUT response jsonb, OUT replayed boolean,
 *		OUT first_executed_at timestamptz, OUT started_key text,
 *		OUT started_attempt integer) returns record
 */
Datum
idem_call(PG_FUNCTION_ARGS)
{
	IdemRequest req;
	IdemResult	result;
	int			nestlevel;
	bool		is_step = !PG_ARGISNULL(CALL_RUN_ID) || !PG_ARGISNULL(CALL_STEP);
	char	   *run_id = NULL;
	char	   *step = NULL;
	const pg_uuid_t *token = NULL;
	char	   *complete_step = NULL;
	Jsonb	   *complete_result = NULL;
	char	   *start_step = NULL;
	int			started_attempt = 0;
	IdemHeldRun held = {0};

	idem_check_can_write("idem_call()");

	if (is_step && !PG_ARGISNULL(CALL_KEY))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem_call() takes either a key or a run_id and a step"),
				 errdetail("A step's key is idem_step_key(run_id, step)."),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Pass NULL as the key of a step.")));
	check_step_option(fcinfo, CALL_LEASE_TOKEN, is_step);
	check_step_option(fcinfo, CALL_COMPLETE_STEP, is_step);
	check_step_option(fcinfo, CALL_START_STEP, is_step);
	if (arg_absent(fcinfo, CALL_COMPLETE_STEP) !=
		arg_absent(fcinfo, CALL_COMPLETE_RESULT))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem_call() takes complete_step and complete_result together"),
				 errdetail("complete_result is the result of the external step complete_step."),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Record an empty result as '{}'.")));
	if (PG_ARGISNULL(CALL_SQL))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("statement passed to idem_call() must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));

	if (is_step)
	{
		run_id = idem_name_arg(fcinfo, CALL_RUN_ID, IDEM_NAME_RUN_ID);
		step = idem_name_arg(fcinfo, CALL_STEP, IDEM_NAME_STEP);
		token = arg_absent(fcinfo, CALL_LEASE_TOKEN) ? NULL :
			idem_lease_token_arg(fcinfo, CALL_LEASE_TOKEN, false);
		if (token == NULL)
			token = idem_lease_token_setting();
		if (!arg_absent(fcinfo, CALL_START_STEP))
		{
			start_step = idem_name_arg(fcinfo, CALL_START_STEP, IDEM_NAME_STEP);
			if (token == NULL)
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("idem_call() takes a start_step only with a lease_token"),
						 errdetail("An external step is started by the worker holding its run's lease."),
						 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, "Pass the lease_token idem_run_claim() returned.")));
		}
		/*
		 * The completion is the external step's own, recorded as
		 * idem_step_complete() would: before this call's options apply (its
		 * outbox_topic publishes this step's response, not that result).
		 */
		if (!arg_absent(fcinfo, CALL_COMPLETE_STEP))
		{
			complete_step = idem_name_arg(fcinfo, CALL_COMPLETE_STEP, IDEM_NAME_STEP);
			complete_result = idem_step_result_arg(fcinfo, CALL_COMPLETE_RESULT,
												   "idem_call()");
			(void) idem_step_complete_leased(run_id, complete_step, token,
											 complete_result, &held);
		}
	}

	nestlevel = idem_call_options(fcinfo, CALL_OUTBOX_TOPIC, CALL_TTL, CALL_WAIT);

	if (is_step)
		idem_step_key_request(run_id, step, token, &req);
	else
	{
		req.owner = idem_key_owner();
		req.ttl = idem_checked_ttl();
		req.key = idem_name_arg(fcinfo, CALL_KEY, IDEM_NAME_KEY);
		req.keylen = strlen(req.key);
		idem_check_not_step_key(req.key, "idem_call()");
	}
	req.sql = text_to_cstring(PG_GETARG_TEXT_PP(CALL_SQL));
	idem_collect_text_args(fcinfo, CALL_ARGS, &req);

	if (is_step)
		idem_step_request(&req, run_id, step, token, &held, &result);
	else
		idem_execute_request(&req, &result);

	AtEOXact_GUC(true, nestlevel);

	/* a step that completed already is not started: NULL attempt */
	if (start_step != NULL)
	{
		Jsonb	   *done;

		started_attempt = idem_step_start_leased(run_id, start_step, token,
												 &done, &held);
	}
	PG_RETURN_DATUM(call_result(&result, run_id, start_step, started_attempt));
}
