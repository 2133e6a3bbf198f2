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
 *	  src/request/execute.c
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
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "request/request.h"

/* Entry points of the 1.1 SQL definitions; idem.c answers 1.0's. */
PG_FUNCTION_INFO_V1(idem_execute_1_1);
PG_FUNCTION_INFO_V1(idem_execute_ex_1_1);
PG_FUNCTION_INFO_V1(idem_purge_1_1);

/* Arguments before the statement's own: key, sql */
#define IDEM_FIXED_ARGS 2

/*
 * Whether an argument of typid is a string for the statement to type:
 * unknown (a literal or a parameter sent without a type), text and varchar
 * (the types drivers give strings).  Every other type is kept, domains
 * over text, char(n), name and "char" included: whoever cast to them meant
 * that type.
 */
static bool
is_string_type(Oid typid)
{
	return typid == UNKNOWNOID || typid == TEXTOID || typid == VARCHAROID;
}

/*
 * How a string argument arrived: as a C string (a literal or a parameter
 * without a type) or as a text datum (text, varchar, idem_untyped).
 */
#define STRING_NONE		'\0'
#define STRING_CSTRING	'c'
#define STRING_TEXT		't'

/*
 * Give the string arguments (strings[i] not STRING_NONE; a NULL one too)
 * the type the statement gives their $n (text where it gives none), and
 * convert their text with that type's input function, so the request is
 * the one a caller who typed them would make.  A text datum the statement
 * types as text or varchar (one representation) is already that value:
 * it is kept, not copied to a C string and read back, which for a large
 * argument took two copies of it.
 */
static void
type_untyped_args(IdemRequest *req, const char *strings)
{
	idem_statement_infer_types(req->sql, req->nargs, req->argtypes);
	for (int i = 0; i < req->nargs; i++)
	{
		Oid			typinput;
		Oid			typioparam;
		char	   *str;

		if (strings[i] == STRING_NONE || req->nulls[i] == 'n')
			continue;
		if (strings[i] == STRING_TEXT &&
			(req->argtypes[i] == TEXTOID || req->argtypes[i] == VARCHAROID))
		{
			/* read once here, as the input function's copy was */
			req->values[i] =
				PointerGetDatum(PG_DETOAST_DATUM_PACKED(req->values[i]));
			continue;
		}
		str = strings[i] == STRING_CSTRING ? DatumGetCString(req->values[i]) :
			TextDatumGetCString(req->values[i]);
		getTypeInputInfo(req->argtypes[i], &typinput, &typioparam);
		req->values[i] = OidInputFunctionCall(typinput, str, typioparam, -1);
		if (strings[i] == STRING_TEXT)
			pfree(str);
	}
}

/*
 * collect_array
 *		Bind the elements of an array as the arguments; strings: they are
 *		strings to be typed as the statement infers (the idem_untyped[]
 *		forms, idem_call()'s text[], an explicit VARIADIC text[]).
 */
static void
collect_array(ArrayType *arr, bool strings, IdemRequest *req)
{
	Oid			elemtype = ARR_ELEMTYPE(arr);
	int16		typlen;
	bool		typbyval;
	char		typalign;
	bool	   *isnull;
	char	   *kinds;

	idem_check_variadic_list(arr, IDEM_LIST_ARGUMENTS,
							 "Pass a list as one argument of an array type.");
	get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
	deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
					  &req->values, &isnull, &req->nargs);
	req->argtypes = palloc(Max(req->nargs, 1) * sizeof(Oid));
	req->nulls = palloc(Max(req->nargs, 1) * sizeof(char));
	kinds = palloc(Max(req->nargs, 1) * sizeof(char));
	for (int i = 0; i < req->nargs; i++)
	{
		req->argtypes[i] = strings ? UNKNOWNOID : elemtype;
		req->nulls[i] = isnull[i] ? 'n' : ' ';
		/* text, varchar and idem_untyped elements: text datums */
		kinds[i] = strings ? STRING_TEXT : STRING_NONE;
	}
	if (strings && req->nargs > 0)
		type_untyped_args(req, kinds);
}

/*
 * idem_collect_args
 *		Bind the arguments from position first on.
 *
 * An explicit VARIADIC array is unpacked, so VARIADIC ARRAY[1, 2] is the same
 * request as 1, 2.  Arguments of a string type (literals without a cast,
 * which arrive as C strings of type unknown, parameters sent without a
 * type, text and varchar, and the elements of the idem_untyped[]
 * overloads, which only untyped arguments reach) take the types the
 * statement infers for them.
 */
void
idem_collect_args(FunctionCallInfo fcinfo, int first, IdemRequest *req)
{
	int			nargs = PG_NARGS() - first;
	char	   *kinds = NULL;
	bool		any_untyped = false;

	req->nargs = 0;
	if (nargs <= 0)
		return;

	if (get_fn_expr_variadic(fcinfo->flinfo))
	{
		ArrayType  *arr;

		/* like format(): VARIADIC NULL means no arguments */
		if (PG_ARGISNULL(first))
			return;
		arr = PG_GETARG_ARRAYTYPE_P(first);
		/* the idem_untyped[] overloads, or a VARIADIC array of strings */
		collect_array(arr, is_string_type(ARR_ELEMTYPE(arr)) ||
						   get_func_variadictype(fcinfo->flinfo->fn_oid) != ANYOID,
						   req);
		return;
	}

	req->nargs = nargs;
	req->argtypes = palloc(nargs * sizeof(Oid));
	req->values = palloc(nargs * sizeof(Datum));
	req->nulls = palloc(nargs * sizeof(char));
	kinds = palloc0(nargs * sizeof(char));
	for (int i = 0; i < nargs; i++)
	{
		int			argno = first + i;
		Oid			typid = get_fn_expr_argtype(fcinfo->flinfo, argno);
		bool		isnull = PG_ARGISNULL(argno);

		if (!OidIsValid(typid))
			ereport(ERROR,
					(errcode(ERRCODE_INDETERMINATE_DATATYPE),
					 errmsg("could not determine the data type of argument %d", i + 1),
					 idem_errhint(ERRCODE_INDETERMINATE_DATATYPE, NULL)));

		req->values[i] = isnull ? (Datum) 0 : PG_GETARG_DATUM(argno);
		if (is_string_type(typid))
		{
			kinds[i] = typid == UNKNOWNOID ? STRING_CSTRING : STRING_TEXT;
			typid = UNKNOWNOID;
			any_untyped = true;
		}
		req->argtypes[i] = typid;
		req->nulls[i] = isnull ? 'n' : ' ';
	}
	if (any_untyped)
		type_untyped_args(req, kinds);
}

/*
 * idem_check_not_step_key
 *		Refuse a workflow step's key (idem_step_key()) outside the run's
 *		functions: only they check the run's order and status, and a step's
 *		record must never expire or hold a cached error.
 */
void
idem_check_not_step_key(const char *key, const char *fname)
{
	size_t		len = strlen(IDEM_STEP_KEY_PART);

	if (strncmp(key, IDEM_STEP_KEY_PART, len) == 0 && key[len] == ':')
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s does not take a workflow step's key", fname),
				 errdetail("Keys that begin with \"%s:\" belong to workflow runs.",
						   IDEM_STEP_KEY_PART),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Run the step with idem_step(), idem_step_complete() or idem_call(run_id => ..., step => ...).")));
}

/*
 * idem_report_key_reused
 *		ID422: req's key holds a different request; detail says how.
 */
void
idem_report_key_reused(IdemRequest *req, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_KEY_REUSED),
			 errmsg("idempotency key \"%s\" was already used for a different request",
					req->key),
			 errdetail("%s", detail),
			 idem_errhint(ERRCODE_IDEM_KEY_REUSED, "Use a new key for a new request.")));
}

/*
 * Whether a record is this request: NULL if it is, else why not.  Records
 * written by idem 1.0 carry a version 1 fingerprint and are compared the
 * way 1.0 computed it, unless its arguments are of a kind version 1 could
 * not tell apart.  Records written by idem 1.1 (version 2) are compared
 * where version 2 and 3 agree, and refused where version 2 could not tell
 * records with different field names apart.  A request that is not a
 * statement (stmt NULL: a step result) is fingerprinted alike by all three.
 */
static const char *
fingerprint_mismatch(IdemStatement *stmt, IdemRequest *req, IdemRecord *rec,
					 const uint8 *fingerprint)
{
	uint8		v1[IDEM_FINGERPRINT_LEN];

	if (rec->fpversion == 2 && stmt != NULL &&
		!idem_statement_fingerprint_v2_same(req))
		return "The record was written by idem 1.1, whose fingerprint cannot tell apart records with different field names.";
	if (rec->fpversion == IDEM_FINGERPRINT_VERSION || rec->fpversion == 2)
	{
		if (memcmp(rec->fingerprint, fingerprint, IDEM_FINGERPRINT_LEN) != 0)
			return "The statement text, the settings that change its meaning, or the arguments differ from the request first recorded under this key.";
		return NULL;
	}
	if (rec->fpversion != 1 || stmt == NULL)
		return "The record was written by another version of idem, whose fingerprint this version cannot compare.";
	if (!idem_statement_fingerprint_v1(stmt, req, v1))
		return "The record was written by idem 1.0, whose fingerprint cannot tell apart requests with arguments of these types.";
	if (memcmp(rec->fingerprint, v1, IDEM_FINGERPRINT_LEN) != 0)
		return "The statement text or the arguments differ from the request first recorded under this key.";
	return NULL;
}

/*
 * idem_record_matches
 *		Whether rec, found under req's key, was written by this very request.
 */
bool
idem_record_matches(IdemStatement *stmt, IdemRequest *req, IdemRecord *rec,
					const uint8 *fingerprint)
{
	return fingerprint_mismatch(stmt, req, rec, fingerprint) == NULL;
}

/*
 * idem_check_visible
 *		A record the caller's snapshot cannot see (REPEATABLE READ or
 *		SERIALIZABLE: it was committed after the snapshot) must not be
 *		acted on either way.
 */
void
idem_check_visible(IdemRequest *req, IdemRecord *rec)
{
	if (!rec->visible)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent use of idempotency key \"%s\"",
						req->key),
				 errdetail("Another transaction recorded this key after this transaction's snapshot was taken."),
				 idem_errhint(ERRCODE_T_R_SERIALIZATION_FAILURE, "Retry the transaction: the retry will replay the recorded response.")));
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
	const char *mismatch;

	idem_check_visible(req, rec);
	if (rec->expires_at <= now)
	{
		idem_delete_key(rec);
		return false;
	}
	mismatch = fingerprint_mismatch(stmt, req, rec, fingerprint);
	if (mismatch != NULL)
		idem_report_key_reused(req, mismatch);
	return true;
}

/*
 * idem_find_record
 *		Lock req's key and look it up: true if a live record of this very
 *		request exists (rec is filled, to be replayed), false if the key is
 *		free.  Raises the error that says why otherwise.
 *
 * stmt may be NULL for a request that is not a statement (a step result
 * recorded by idem_step_complete()).
 */
bool
idem_find_record(IdemStatement *stmt, IdemRequest *req,
				 const uint8 *fingerprint, TimestampTz now, IdemRecord *rec)
{
	idem_check_not_inflight(req);
	idem_lock_key(req->owner, req->key, req->keylen, idem_wait);
	return idem_lookup_key(req->owner, req->key, rec) &&
		check_record(stmt, req, rec, fingerprint, now);
}

/*
 * The outbox topic a call by owner writes to, read before the business
 * statement runs (it could change it with set_config()) and checked
 * against the topic's publishers, so a refused call runs nothing.
 */
char *
idem_current_topic(Oid owner)
{
	char	   *topic;

	if (idem_outbox_topic == NULL || idem_outbox_topic[0] == '\0')
		return NULL;
	topic = pstrdup(idem_outbox_topic);
	/* a topic the role may not publish to fails before anything runs */
	idem_outbox_check_publish(topic, owner);
	return topic;
}

/*
 * idem_check_may_execute
 *		What a request under a free key must pass before its statement
 *		runs; returns the outbox topic the call writes to (NULL: none).
 *		idem_dry_run() asks the same, so a dry run refuses whatever the call
 *		would refuse.
 */
char *
idem_check_may_execute(IdemRequest *req)
{
	return idem_current_topic(req->owner);
}

static void
execute_and_record(IdemStatement *stmt, IdemRequest *req,
				   const uint8 *fingerprint, TimestampTz now,
				   IdemResult *result)
{
	Oid			owner = req->owner;
	char	   *topic = idem_check_may_execute(req);
	bool		cached_error;

	result->response = idem_execute_caching_errors(stmt, req, &cached_error);
	/* a failed statement had no effect to announce */
	if (cached_error)
		topic = NULL;

	idem_insert_key(req->key, owner, fingerprint, result->response, now,
					idem_new_record_expiry(owner, req->key, req->ttl));
	if (topic != NULL)
		idem_insert_outbox(req->key, owner, topic, result->response, now,
						   NULL, NULL, 0, NULL);
	result->replayed = false;
	result->first_executed_at = now;
}

/*
 * idem_replay_record
 *		The result of a call that replays rec, the record of its request.
 *
 * A replay writes no WAL, so its commit waits for nobody.  If the original
 * commit's wait for a synchronous standby was cancelled, the record is
 * visible here but may not survive a failover, and acknowledging a replay
 * would confirm a result that can still be lost.  With idem.durable_replay,
 * one transactional WAL record makes this commit flush and wait for
 * synchronous replication past the original commit's LSN.
 */
void
idem_replay_record(IdemRequest *req, const IdemRecord *rec, IdemResult *result)
{
	result->response = rec->response;
	result->replayed = true;
	result->first_executed_at = rec->created_at;
	if (idem_durable_replay)
		LogTransactionalMessage("idem", req->key, req->keylen);
}

/*
 * idem_sql_arg
 *		The business statement passed as argument argno of fname.
 */
char *
idem_sql_arg(FunctionCallInfo fcinfo, int argno, const char *fname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("statement passed to %s must not be null", fname),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

/* A keyed request's key and statement, checked as idem_execute() does. */
static void
keyed_request_head(FunctionCallInfo fcinfo, const char *fname, int keyarg,
				   IdemRequest *req)
{
	idem_check_can_write(fname);
	req->ttl = idem_checked_ttl();

	req->owner = idem_key_owner();
	req->key = idem_name_arg(fcinfo, keyarg, IDEM_NAME_KEY);
	req->keylen = strlen(req->key);
	idem_check_not_step_key(req->key, fname);
	req->sql = idem_sql_arg(fcinfo, keyarg + 1, fname);
}

/*
 * idem_keyed_request
 *		The request of a call shaped (key text, sql text [, VARIADIC args]),
 *		checked the way idem_execute() checks it; fname names the function.
 *		keyarg is the key's argument number: the statement follows it, then
 *		the statement's arguments.
 */
void
idem_keyed_request(FunctionCallInfo fcinfo, const char *fname, int keyarg,
				   IdemRequest *req)
{
	keyed_request_head(fcinfo, fname, keyarg, req);
	idem_collect_args(fcinfo, keyarg + IDEM_FIXED_ARGS, req);
}

/*
 * idem_keyed_array_request
 *		The same for a call shaped (key text, sql text, ..., args text[]):
 *		the statement's arguments are argument argsarg, text typed by the
 *		statement as untyped driver parameters are.
 */
void
idem_keyed_array_request(FunctionCallInfo fcinfo, const char *fname,
						 int keyarg, int argsarg, IdemRequest *req)
{
	keyed_request_head(fcinfo, fname, keyarg, req);
	idem_collect_text_args(fcinfo, argsarg, req);
}

/*
 * idem_collect_text_args
 *		The statement's arguments from a text[] argument argsarg (none if
 *		it is NULL), typed by the statement as untyped driver parameters
 *		are.
 */
void
idem_collect_text_args(FunctionCallInfo fcinfo, int argsarg, IdemRequest *req)
{
	req->nargs = 0;
	if (!PG_ARGISNULL(argsarg))
		collect_array(PG_GETARG_ARRAYTYPE_P(argsarg), true, req);
}

/* idem_execute() and idem_execute_ex(): one call, two result shapes. */
static void
execute_internal(FunctionCallInfo fcinfo, IdemResult *result)
{
	IdemRequest req;

	idem_keyed_request(fcinfo, "idem_execute()", 0, &req);
	idem_execute_request(&req, result);
}

/*
 * idem_execute_request
 *		Replay or execute req, a checked request under a key.
 */
void
idem_execute_request(IdemRequest *req, IdemResult *result)
{
	IdemStatement *stmt;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	volatile bool fingerprinted = false;
	volatile bool executing = false;

	stmt = idem_statement_acquire(req->sql, req->nargs, req->argtypes);
	PG_TRY();
	{
		IdemRecord	rec;

		idem_statement_fingerprint(stmt, req, fingerprint);
		fingerprinted = true;
		if (idem_find_record(stmt, req, fingerprint, now, &rec))
			idem_replay_record(req, &rec, result);
		else
		{
			executing = true;
			execute_and_record(stmt, req, fingerprint, now, result);
		}
	}
	PG_CATCH();
	{
		idem_note_error(req, fingerprinted ? fingerprint : NULL, NULL, NULL,
						executing);
		idem_statement_release(stmt);
		PG_RE_THROW();
	}
	PG_END_TRY();
	idem_statement_release(stmt);
	idem_note_done(req, fingerprint, NULL, NULL, result->replayed);
}

/*
 * idem_execute(key text, sql text [, VARIADIC args "any"]) returns jsonb
 */
Datum
idem_execute_1_1(PG_FUNCTION_ARGS)
{
	IdemResult	result;

	execute_internal(fcinfo, &result);
	PG_RETURN_JSONB_P(result.response);
}

/*
 * idem_result_desc_init
 *		Entries 1 to IDEM_RESULT_COLUMNS of d: a call's result (response
 *		jsonb, replayed boolean, first_executed_at timestamptz).
 */
void
idem_result_desc_init(TupleDesc d)
{
	TupleDescInitEntry(d, 1, "response", JSONBOID, -1, 0);
	TupleDescInitEntry(d, 2, "replayed", BOOLOID, -1, 0);
	TupleDescInitEntry(d, 3, "first_executed_at", TIMESTAMPTZOID, -1, 0);
}

/*
 * idem_result_values
 *		The values of those entries for result.
 */
void
idem_result_values(IdemResult *result, Datum *values, bool *nulls)
{
	values[0] = JsonbPGetDatum(result->response);
	values[1] = BoolGetDatum(result->replayed);
	values[2] = TimestampTzGetDatum(result->first_executed_at);
	nulls[0] = nulls[1] = nulls[2] = false;
}

/*
 * idem_result_datum
 *		A call's result as the record (response jsonb, replayed boolean,
 *		first_executed_at timestamptz) that idem_execute_ex() returns.
 *
 * The row type is built and blessed once per backend: get_call_result_type()
 * would rebuild it from pg_proc's OUT parameters on every call, a large
 * share of a replay's cost.  The executor still checks it against the
 * function's declared row type.
 */
Datum
idem_result_datum(IdemResult *result)
{
	static TupleDesc desc = NULL;
	Datum		values[IDEM_RESULT_COLUMNS];
	bool		nulls[IDEM_RESULT_COLUMNS];

	if (desc == NULL)
	{
		MemoryContext oldcxt = MemoryContextSwitchTo(CacheMemoryContext);
		TupleDesc	d = CreateTemplateTupleDesc(IDEM_RESULT_COLUMNS);

		idem_result_desc_init(d);
		desc = BlessTupleDesc(d);
		MemoryContextSwitchTo(oldcxt);
	}
	idem_result_values(result, values, nulls);
	return HeapTupleGetDatum(heap_form_tuple(desc, values, nulls));
}

/*
 * idem_execute_ex(key text, sql text [, VARIADIC args "any"])
 *		returns (response jsonb, replayed boolean, first_executed_at timestamptz)
 */
Datum
idem_execute_ex_1_1(PG_FUNCTION_ARGS)
{
	IdemResult	result;

	execute_internal(fcinfo, &result);
	PG_RETURN_DATUM(idem_result_datum(&result));
}

/*
 * idem_purge(batch_size integer) returns bigint
 *
 * Up to batch_size expired key records and records of dropped roles (the
 * count returned); and the dropped roles out of the topics' and queues'
 * role lists, with a batch of their runs.
 */
Datum
idem_purge_1_1(PG_FUNCTION_ARGS)
{
	int32		batch_size = idem_purge_batch_arg(fcinfo, "idem_purge()");
	int64		purged = idem_purge_expired(batch_size);

	(void) idem_forget_dropped_roles(batch_size);
	PG_RETURN_INT64(purged);
}
