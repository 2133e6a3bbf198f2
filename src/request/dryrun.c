/*-------------------------------------------------------------------------
 *
 * dryrun.c
 *		idem_dry_run(): what idem_execute() would do now, without doing it.
 *
 * The whole look-ahead runs in a subtransaction that is always rolled
 * back: the key's lock (taken without waiting), the business statement's
 * writes and anything its functions wrote in this database disappear with
 * it, and nothing is recorded.  What a rollback cannot undo is documented:
 * sequence values the statement drew, and effects outside the database
 * (dblink, NOTIFY is undone but a function that called out is not).
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/dryrun.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "fmgr.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include "compat.h"
#include "request/request.h"

PG_FUNCTION_INFO_V1(idem_dry_run);

typedef struct DryRunResult
{
	const char *action;			/* execute, replay, mismatch, in_progress, expired */
	Jsonb	   *response;		/* NULL for mismatch and in_progress */
} DryRunResult;

/* What idem_execute() would do with req, inside the subtransaction. */
static void
look_ahead(IdemStatement *stmt, IdemRequest *req, const uint8 *fingerprint,
		   DryRunResult *result)
{
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	IdemRecord	rec;

	idem_check_not_inflight(req);
	result->response = NULL;
	if (!idem_try_lock_key(req->owner, req->key, req->keylen))
	{
		result->action = "in_progress";
		return;
	}
	if (idem_lookup_key(req->owner, req->key, &rec))
	{
		idem_check_visible(req, &rec);
		if (rec.expires_at > now)
		{
			if (idem_record_matches(stmt, req, &rec, fingerprint))
			{
				result->action = "replay";
				result->response = rec.response;
			}
			else
				result->action = "mismatch";
			return;
		}
		result->action = "expired";
	}
	else
		result->action = "execute";
	/* an unknown topic, a missing grant: the call's own refusals */
	(void) idem_check_may_execute(req);
	{
		bool		cached_error;

		result->response = idem_execute_caching_errors(stmt, req, &cached_error);
	}
}

/*
 * look_ahead() in a subtransaction that is rolled back, so the statement
 * changes nothing.  A function of its own: PG_TRY blocks nested in one
 * function shadow each other's variables, which 17's -Wshadow refuses.
 */
static void
look_ahead_undone(IdemStatement *stmt, IdemRequest *req,
				  const uint8 *fingerprint, DryRunResult *result)
{
	IdemSubxact sx;

	idem_subxact_begin(&sx);
	PG_TRY();
	{
		look_ahead(stmt, req, fingerprint, result);
	}
	PG_CATCH();
	{
		/* the statement's own error, raised again once it is undone */
		ReThrowError(idem_subxact_abort(&sx));
	}
	PG_END_TRY();
	idem_subxact_end(&sx, false);
}

/*
 * idem_dry_run(key text, sql text [, VARIADIC args "any"],
 *		OUT action text, OUT response jsonb) returns record
 */
Datum
idem_dry_run(PG_FUNCTION_ARGS)
{
	IdemRequest req;
	IdemStatement *stmt;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	DryRunResult result;
	TupleDesc	tupdesc;
	Datum		values[2];
	bool		nulls[2] = {false, false};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	/* the same checks, and so the same errors, as idem_execute() */
	idem_keyed_request(fcinfo, "idem_dry_run()", 0, &req);

	stmt = idem_statement_acquire(req.sql, req.nargs, req.argtypes);
	PG_TRY();
	{
		idem_statement_fingerprint(stmt, &req, fingerprint);

		look_ahead_undone(stmt, &req, fingerprint, &result);
	}
	PG_FINALLY();
	{
		idem_statement_release(stmt);
	}
	PG_END_TRY();

	values[0] = CStringGetTextDatum(result.action);
	if (result.response != NULL)
		values[1] = JsonbPGetDatum(result.response);
	else
		nulls[1] = true;
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}
