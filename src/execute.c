/*-------------------------------------------------------------------------
 *
 * execute.c
 *		idem_execute(): run a business statement at most once per key.
 *
 * One call: validate, lock the key, look it up, and either replay the
 * stored response or run the statement through SPI and write the key record
 * (and an outbox event if idem.outbox_topic is set) in the caller's
 * transaction.  The record is inserted once, after the statement ran, so
 * there is never a "pending" row: if anything fails, or the caller rolls
 * back, the business write and the record vanish together.
 *
 * No subtransaction is used.  The business statement's errors propagate
 * untouched and abort the caller's transaction (or savepoint), which is
 * exactly what must happen to whatever the statement had written.
 *
 * The function is SECURITY INVOKER: the statement runs with the caller's
 * privileges.  A key is (owner, key), the owner being the current user at
 * the time of the call: another role presenting the same text has a key of
 * its own, with its own lock, and learns nothing about this one.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/execute.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "idem.h"

/* Entry points of the 1.1 SQL definitions; idem.c answers 1.0's. */
PG_FUNCTION_INFO_V1(idem_execute_1_1);
PG_FUNCTION_INFO_V1(idem_execute_ex_1_1);
PG_FUNCTION_INFO_V1(idem_purge_1_1);

/* Arguments before the statement's own: key, sql */
#define IDEM_FIXED_ARGS 2

/*
 * Keys whose business statement is running in this backend, innermost
 * first.  Nodes live on the C stack of the calls that pushed them.
 */
typedef struct InflightKey
{
	Oid			owner;
	const char *key;
	struct InflightKey *next;
} InflightKey;

static InflightKey *inflight_keys = NULL;

typedef struct IdemResult
{
	Jsonb	   *response;
	bool		replayed;
	TimestampTz first_executed_at;
} IdemResult;

static void
check_can_write(void)
{
	PreventCommandDuringRecovery("idem_execute()");
	PreventCommandIfReadOnly("idem_execute()");
	PreventCommandIfParallelMode("idem_execute()");
}

static char *
get_key_arg(FunctionCallInfo fcinfo)
{
	char	   *key;
	int			len;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("idempotency key must not be null")));

	key = text_to_cstring(PG_GETARG_TEXT_PP(0));
	len = strlen(key);
	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idempotency key must not be empty")));
	if (len > IDEM_MAX_KEY_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("idempotency key is too long"),
				 errdetail("The key is %d bytes long; the limit is %d bytes.",
						   len, IDEM_MAX_KEY_BYTES),
				 errhint("Hash long natural keys, for example with sha256(), and use the digest as the key.")));
	return key;
}

/*
 * Bind the arguments after key and sql.  An explicit VARIADIC array is
 * unpacked, so VARIADIC ARRAY['a', 'b'] is the same request as 'a', 'b'.
 * Untyped literals arrive as C strings of type unknown and are bound as
 * text.
 */
static void
collect_args(FunctionCallInfo fcinfo, IdemRequest *req)
{
	int			nargs = PG_NARGS() - IDEM_FIXED_ARGS;

	req->nargs = 0;
	if (nargs <= 0)
		return;

	if (get_fn_expr_variadic(fcinfo->flinfo))
	{
		ArrayType  *arr;
		Oid			elemtype;
		int16		typlen;
		bool		typbyval;
		char		typalign;
		bool	   *isnull;

		/* like format(): VARIADIC NULL means no arguments */
		if (PG_ARGISNULL(IDEM_FIXED_ARGS))
			return;
		arr = PG_GETARG_ARRAYTYPE_P(IDEM_FIXED_ARGS);
		elemtype = ARR_ELEMTYPE(arr);
		get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
		deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
						  &req->values, &isnull, &req->nargs);
		req->argtypes = palloc(req->nargs * sizeof(Oid));
		req->nulls = palloc(req->nargs * sizeof(char));
		for (int i = 0; i < req->nargs; i++)
		{
			req->argtypes[i] = elemtype;
			req->nulls[i] = isnull[i] ? 'n' : ' ';
		}
		return;
	}

	req->nargs = nargs;
	req->argtypes = palloc(nargs * sizeof(Oid));
	req->values = palloc(nargs * sizeof(Datum));
	req->nulls = palloc(nargs * sizeof(char));
	for (int i = 0; i < nargs; i++)
	{
		int			argno = IDEM_FIXED_ARGS + i;
		Oid			typid = get_fn_expr_argtype(fcinfo->flinfo, argno);
		bool		isnull = PG_ARGISNULL(argno);

		if (!OidIsValid(typid))
			ereport(ERROR,
					(errcode(ERRCODE_INDETERMINATE_DATATYPE),
					 errmsg("could not determine the data type of argument %d", i + 1)));

		req->values[i] = isnull ? (Datum) 0 : PG_GETARG_DATUM(argno);
		if (typid == UNKNOWNOID)
		{
			typid = TEXTOID;
			if (!isnull)
				req->values[i] = CStringGetTextDatum(DatumGetCString(req->values[i]));
		}
		req->argtypes[i] = typid;
		req->nulls[i] = isnull ? 'n' : ' ';
	}
}

static void
check_not_inflight(IdemRequest *req)
{
	for (InflightKey *k = inflight_keys; k != NULL; k = k->next)
	{
		if (k->owner == req->owner && strcmp(k->key, req->key) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_IN_PROGRESS),
					 errmsg("idempotency key \"%s\" is already being executed by an enclosing idem_execute() call",
							req->key),
					 errdetail("A business statement called idem_execute() with its own key.")));
	}
}

static void
report_key_reused(IdemRequest *req, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_KEY_REUSED),
			 errmsg("idempotency key \"%s\" was already used for a different request",
					req->key),
			 errdetail("%s", detail),
			 errhint("Use a new key for a new request.")));
}

/*
 * Whether a record is this request.  Records written by idem 1.0 carry a
 * version 1 fingerprint and are compared the way 1.0 computed it, unless
 * its arguments are of a kind version 1 could not tell apart.
 */
static void
check_fingerprint(IdemStatement *stmt, IdemRequest *req, IdemRecord *rec,
				  const uint8 *fingerprint)
{
	uint8		v1[IDEM_FINGERPRINT_LEN];

	if (rec->fpversion == IDEM_FINGERPRINT_VERSION)
	{
		if (memcmp(rec->fingerprint, fingerprint, IDEM_FINGERPRINT_LEN) != 0)
			report_key_reused(req, "The statement text, the settings that change its meaning, or the arguments differ from the request first recorded under this key.");
		return;
	}
	if (rec->fpversion != 1)
		report_key_reused(req, "The record was written by another version of idem, whose fingerprint this version cannot compare.");
	if (!idem_statement_fingerprint_v1(stmt, req, v1))
		report_key_reused(req, "The record was written by idem 1.0, whose fingerprint cannot tell apart requests with arguments of these types.");
	if (memcmp(rec->fingerprint, v1, IDEM_FINGERPRINT_LEN) != 0)
		report_key_reused(req, "The statement text or the arguments differ from the request first recorded under this key.");
}

/*
 * Decide what an existing record means for this request: replay it, or
 * raise the error that says why not.  Returns false if the record has
 * expired and was removed.
 */
static bool
check_record(IdemStatement *stmt, IdemRequest *req, IdemRecord *rec,
			 const uint8 *fingerprint, TimestampTz now)
{
	if (!rec->visible)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent use of idempotency key \"%s\"",
						req->key),
				 errdetail("Another transaction recorded this key after this transaction's snapshot was taken."),
				 errhint("Retry the transaction: the retry will replay the recorded response.")));

	if (rec->expires_at <= now)
	{
		idem_delete_key(rec);
		return false;
	}

	check_fingerprint(stmt, req, rec, fingerprint);
	return true;
}

/*
 * Run the business statement and return its response, built in the
 * caller's memory context.
 */
static Jsonb *
run_statement(IdemStatement *stmt, IdemRequest *req)
{
	MemoryContext callercxt = CurrentMemoryContext;
	SPIPlanPtr	plan;
	Jsonb	   *response;
	int			rc;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	plan = idem_statement_plan(stmt);
	rc = SPI_execute_plan(plan, req->values, req->nulls, false, 0);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));

	MemoryContextSwitchTo(callercxt);
	response = idem_build_response(idem_statement_command(stmt),
								   SPI_processed, SPI_tuptable);
	if (VARSIZE(response) > idem_max_response_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("idem_execute() response is too large"),
				 errdetail("The response is %u bytes; idem.max_response_size is %d bytes.",
						   (unsigned int) VARSIZE(response), idem_max_response_size),
				 errhint("Return fewer rows or columns, or raise idem.max_response_size.")));

	SPI_finish();
	return response;
}

static void
execute_and_record(IdemStatement *stmt, IdemRequest *req,
				   const uint8 *fingerprint, TimestampTz now,
				   IdemResult *result)
{
	InflightKey self;
	Oid			owner = req->owner;
	char	   *topic = NULL;

	/*
	 * Settings the record depends on are read before the business statement
	 * runs: it could change them with set_config(), and idem.ttl was checked
	 * against idem.max_ttl on entry.
	 */
	if (idem_outbox_topic != NULL && idem_outbox_topic[0] != '\0')
		topic = pstrdup(idem_outbox_topic);

	self.owner = owner;
	self.key = req->key;
	self.next = inflight_keys;
	inflight_keys = &self;

	result->response = run_statement(stmt, req);

	inflight_keys = self.next;

	idem_insert_key(req->key, owner, fingerprint, result->response, now,
					idem_new_record_expiry(owner, req->key, req->ttl));
	if (topic != NULL)
		idem_insert_outbox(req->key, owner, topic, result->response, now);
	result->replayed = false;
	result->first_executed_at = now;
}

/*
 * A replay writes no WAL, so its commit waits for nobody.  If the original
 * commit's wait for a synchronous standby was cancelled, the record is
 * visible here but may not survive a failover, and acknowledging a replay
 * would confirm a result that can still be lost.  One transactional WAL
 * record makes this commit flush and wait for synchronous replication past
 * the original commit's LSN.
 */
static void
make_replay_durable(IdemRequest *req)
{
	LogTransactionalMessage("idem", req->key, req->keylen);
}

static void
idem_execute_internal(FunctionCallInfo fcinfo, IdemResult *result)
{
	IdemRequest req;
	IdemStatement *stmt;
	InflightKey *saved_inflight = inflight_keys;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	volatile bool fingerprinted = false;
	volatile bool executing = false;

	check_can_write();
	req.ttl = idem_checked_ttl();

	req.owner = GetUserId();
	req.key = get_key_arg(fcinfo);
	req.keylen = strlen(req.key);
	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("statement passed to idem_execute() must not be null")));
	req.sql = text_to_cstring(PG_GETARG_TEXT_PP(1));
	collect_args(fcinfo, &req);

	stmt = idem_statement_acquire(req.sql, req.nargs, req.argtypes);
	PG_TRY();
	{
		IdemRecord	rec;

		idem_statement_fingerprint(stmt, &req, fingerprint);
		fingerprinted = true;
		check_not_inflight(&req);
		idem_lock_key(req.owner, req.key, req.keylen, idem_wait);

		if (idem_lookup_key(req.owner, req.key, &rec) &&
			check_record(stmt, &req, &rec, fingerprint, now))
		{
			result->response = rec.response;
			result->replayed = true;
			result->first_executed_at = rec.created_at;
			if (idem_durable_replay)
				make_replay_durable(&req);
		}
		else
		{
			executing = true;
			execute_and_record(stmt, &req, fingerprint, now, result);
		}
	}
	PG_CATCH();
	{
		int			code = geterrcode();

		idem_note_outcome(idem_error_outcome(code, executing), &req,
						  fingerprinted ? fingerprint : NULL, NULL, NULL, code);
		inflight_keys = saved_inflight;
		idem_statement_release(stmt);
		PG_RE_THROW();
	}
	PG_END_TRY();
	inflight_keys = saved_inflight;
	idem_statement_release(stmt);
	idem_note_outcome(result->replayed ? IDEM_OUTCOME_REPLAYED : IDEM_OUTCOME_EXECUTED,
					  &req, fingerprint, NULL, NULL, 0);
}

/*
 * idem_execute(key text, sql text [, VARIADIC args "any"]) returns jsonb
 */
Datum
idem_execute_1_1(PG_FUNCTION_ARGS)
{
	IdemResult	result;

	idem_execute_internal(fcinfo, &result);
	PG_RETURN_JSONB_P(result.response);
}

/*
 * idem_execute_ex(key text, sql text [, VARIADIC args "any"])
 *		returns (response jsonb, replayed boolean, first_executed_at timestamptz)
 */
Datum
idem_execute_ex_1_1(PG_FUNCTION_ARGS)
{
	IdemResult	result;
	TupleDesc	tupdesc;
	Datum		values[3];
	bool		nulls[3] = {0};

	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	idem_execute_internal(fcinfo, &result);

	values[0] = JsonbPGetDatum(result.response);
	values[1] = BoolGetDatum(result.replayed);
	values[2] = TimestampTzGetDatum(result.first_executed_at);
	PG_RETURN_DATUM(HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
													  values, nulls)));
}

/*
 * idem_purge(batch_size integer) returns bigint
 */
Datum
idem_purge_1_1(PG_FUNCTION_ARGS)
{
	int32		batch_size = PG_GETARG_INT32(0);

	if (batch_size <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be greater than zero")));
	PreventCommandDuringRecovery("idem_purge()");
	PreventCommandIfReadOnly("idem_purge()");

	PG_RETURN_INT64(idem_purge_expired(batch_size));
}
