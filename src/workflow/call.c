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
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/call.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
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
	CALL_LEASE_TOKEN
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
 * idem_call(key text, sql text, args text[] DEFAULT '{}',
 *		outbox_topic text, ttl interval, wait boolean, run_id text, step text,
 *		lease_token uuid, OUT response jsonb, OUT replayed boolean,
 *		OUT first_executed_at timestamptz) returns record
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

	idem_check_can_write("idem_call()");

	if (is_step && !PG_ARGISNULL(CALL_KEY))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem_call() takes either a key or a run_id and a step"),
				 errdetail("A step's key is idem_step_key(run_id, step)."),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Pass NULL as the key of a step.")));
	if (!is_step && PG_NARGS() > CALL_LEASE_TOKEN &&
		!PG_ARGISNULL(CALL_LEASE_TOKEN))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem_call() takes a lease_token only with a run_id and a step"),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	if (PG_ARGISNULL(CALL_SQL))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("statement passed to idem_call() must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));

	nestlevel = idem_call_options(fcinfo, CALL_OUTBOX_TOPIC, CALL_TTL, CALL_WAIT);

	if (is_step)
	{
		run_id = idem_name_arg(fcinfo, CALL_RUN_ID, "run id");
		step = idem_name_arg(fcinfo, CALL_STEP, "step name");
		token = PG_NARGS() > CALL_LEASE_TOKEN ?
			idem_lease_token_arg(fcinfo, CALL_LEASE_TOKEN, false) : NULL;
		if (token == NULL)
			token = idem_lease_token_setting();
		idem_step_key_request(run_id, step, token, &req);
	}
	else
	{
		req.owner = idem_key_owner();
		req.ttl = idem_checked_ttl();
		req.key = idem_name_arg(fcinfo, CALL_KEY, "idempotency key");
		req.keylen = strlen(req.key);
		idem_check_not_step_key(req.key, "idem_call()");
	}
	req.sql = text_to_cstring(PG_GETARG_TEXT_PP(CALL_SQL));
	idem_collect_text_args(fcinfo, CALL_ARGS, &req);

	if (is_step)
		idem_step_request(&req, run_id, step, token, &result);
	else
		idem_execute_request(&req, &result);

	AtEOXact_GUC(true, nestlevel);
	PG_RETURN_DATUM(idem_result_datum(&result));
}
