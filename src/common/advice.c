/*-------------------------------------------------------------------------
 *
 * advice.c
 *		What a client should do after an error: idem_retry_advice(sqlstate)
 *		and the "Retry advice" sentence every error idem raises ends its
 *		hint with.
 *
 * Three answers, so a client's retry loop can be mechanical:
 *	 retry		 the same call again, now, with the same key (serialization
 *				 failures, deadlocks, a lost connection): idem makes the retry
 *				 safe, and it replays if the first attempt committed.
 *	 retry_later the same call again after a backoff (the key is in use,
 *				 a lock or statement timed out, the server is short of
 *				 resources or starting up, an I/O or foreign server failed).
 *	 never		 the same call will fail the same way (a different request
 *				 under a key, a step out of sequence, bad input, a business
 *				 error, a cached error).
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/advice.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/builtins.h"

#include "compat.h"
#include "common/common.h"

/*
 * Class 72, "snapshot too old": PostgreSQL 17 removed old_snapshot_threshold
 * and with it ERRCODE_SNAPSHOT_TOO_OLD, but the SQLSTATE stays in the
 * standard and a server before 17 (or another database behind a foreign
 * table) may still raise it.
 */
#define SNAPSHOT_TOO_OLD_CLASS MAKE_SQLSTATE('7', '2', '0', '0', '0')

PG_FUNCTION_INFO_V1(idem_retry_advice);

/*
 * retry_advice_for
 *		The advice for an error code (MAKE_SQLSTATE form).
 */
static const char *
retry_advice_for(int sqlerrcode)
{
	switch (sqlerrcode)
	{
		case ERRCODE_T_R_SERIALIZATION_FAILURE:
		case ERRCODE_T_R_DEADLOCK_DETECTED:
		case ERRCODE_T_R_STATEMENT_COMPLETION_UNKNOWN:
		case ERRCODE_ADMIN_SHUTDOWN:
		case ERRCODE_CRASH_SHUTDOWN:
		case ERRCODE_IDLE_IN_TRANSACTION_SESSION_TIMEOUT:
		case ERRCODE_IDLE_SESSION_TIMEOUT:
			return "retry";
		case ERRCODE_IDEM_IN_PROGRESS:
		case ERRCODE_LOCK_NOT_AVAILABLE:
		case ERRCODE_QUERY_CANCELED:
		case ERRCODE_CANNOT_CONNECT_NOW:
			return "retry_later";
	}
	switch (ERRCODE_TO_CATEGORY(sqlerrcode))
	{
		case ERRCODE_CONNECTION_EXCEPTION:
		case ERRCODE_TRANSACTION_ROLLBACK:
		case SNAPSHOT_TOO_OLD_CLASS:
			return "retry";
		case ERRCODE_INSUFFICIENT_RESOURCES:
		case ERRCODE_SYSTEM_ERROR:
		case ERRCODE_FDW_ERROR:
			return "retry_later";
	}
	return "never";
}

/*
 * idem_sqlstate_transient
 *		Whether a retry of an error of this code (or class, in its
 *		MAKE_SQLSTATE(c1, c2, '0', '0', '0') form) may succeed: what
 *		idem.cache_errors must never record.
 */
bool
idem_sqlstate_transient(int sqlerrcode)
{
	return strcmp(retry_advice_for(sqlerrcode), "never") != 0;
}

/*
 * idem_errhint
 *		errhint() for an error idem raises: the hint, if any, then the retry
 *		advice for its code.  Use as an ereport() auxiliary.
 */
int
idem_errhint(int sqlerrcode, const char *hint)
{
	const char *advice = retry_advice_for(sqlerrcode);

	if (hint != NULL)
		return errhint("%s Retry advice: %s.", hint, advice);
	return errhint("Retry advice: %s.", advice);
}

/*
 * idem_retry_advice(sqlstate text) returns text
 */
Datum
idem_retry_advice(PG_FUNCTION_ARGS)
{
	char	   *s;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("sqlstate must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	s = text_to_cstring(PG_GETARG_TEXT_PP(0));
	if (strlen(s) != 5 || strspn(s, "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") != 5)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("\"%s\" is not a SQLSTATE", s),
				 errdetail("A SQLSTATE is five characters, digits or upper-case letters."),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	PG_RETURN_TEXT_P(cstring_to_text(retry_advice_for(MAKE_SQLSTATE(s[0], s[1], s[2], s[3], s[4]))));
}
