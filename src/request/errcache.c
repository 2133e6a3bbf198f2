/*-------------------------------------------------------------------------
 *
 * errcache.c
 *		Cached business errors: idem.cache_errors and the subtransaction
 *		that turns a listed error into the key's recorded outcome.
 *
 * With idem.cache_errors naming SQLSTATE classes or codes (e.g. '23, P0001'),
 * idem_execute() runs the business statement in a subtransaction.  If it
 * fails with a listed code, the subtransaction is rolled back (undoing
 * whatever the statement wrote), the error becomes the response
 * {"error": {"sqlstate", "message", "detail", "hint"}}, and the key records
 * it, so a retry replays the same error instead of running again.  Any other
 * error is raised as usual.  Transient conditions (whatever
 * idem_retry_advice() does not answer "never" for, and classes 57, 58, 72
 * and HV), idem's own class ID, internal errors (XX), the server's limits
 * (54) and the transaction's state (25) can never be listed: a retry of
 * those must run again, or they are not the business's.  A transient code
 * in a listed class (55P03 in 55) is raised, never recorded.  A recorded
 * error is held to idem.max_response_size like any response.  When the
 * list is empty (the default) no subtransaction is used.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/errcache.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/json.h"
#include "utils/jsonb.h"

#include "compat.h"
#include "request/request.h"

/* The parsed list: classes match on their first two characters. */
typedef struct CacheList
{
	int			n;
	struct
	{
		int			code;		/* MAKE_SQLSTATE form */
		bool		is_class;
	}			entries[FLEXIBLE_ARRAY_MEMBER];
} CacheList;

static CacheList *cache_list = NULL;

static bool
is_sqlstate_char(char c)
{
	return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'Z');
}

/* Why a class or code can never be cached. */
typedef enum Uncacheable
{
	CACHEABLE,
	UNCACHEABLE_IDEM,			/* one of idem's own outcomes */
	UNCACHEABLE_INTERNAL,		/* XX */
	UNCACHEABLE_TRANSIENT,		/* a retry may succeed */
	UNCACHEABLE_SERVER			/* about the server or the transaction */
} Uncacheable;

/*
 * Why a class or code (MAKE_SQLSTATE form) can never be cached.
 * Transient is what idem_retry_advice() does not answer "never" for, so the
 * two agree; a class is also transient when some of its codes are (57: a
 * cancel or a shutdown).  Classes 54 (a limit of the server) and 25 (the
 * state of the caller's transaction) say nothing about the request.
 */
static Uncacheable
uncacheable_reason(int code)
{
	static const char *const transient_classes[] = {"08", "40", "53", "57", "58", "72", "HV"};
	static const char *const server_classes[] = {"54", "25"};
	const char *cls = unpack_sql_state(code);

	if (strncmp(cls, "ID", 2) == 0)
		return UNCACHEABLE_IDEM;
	if (strncmp(cls, "XX", 2) == 0)
		return UNCACHEABLE_INTERNAL;
	if (idem_sqlstate_transient(code))
		return UNCACHEABLE_TRANSIENT;
	for (int i = 0; i < lengthof(transient_classes); i++)
		if (strncmp(cls, transient_classes[i], 2) == 0)
			return UNCACHEABLE_TRANSIENT;
	for (int i = 0; i < lengthof(server_classes); i++)
		if (strncmp(cls, server_classes[i], 2) == 0)
			return UNCACHEABLE_SERVER;
	return CACHEABLE;
}

bool
idem_cache_errors_check(char **newval, void **extra, GucSource source)
{
	const char *p = *newval;
	CacheList  *list;
	int			max = 1;

	for (const char *q = p; *q; q++)
		if (*q == ',')
			max++;
	list = guc_malloc(LOG, offsetof(CacheList, entries) +
					  max * sizeof(list->entries[0]));
	if (list == NULL)
		return false;
	list->n = 0;

	while (*p)
	{
		const char *tok;
		int			len = 0;

		while (*p == ' ' || *p == ',')
			p++;
		if (*p == '\0')
			break;
		tok = p;
		while (is_sqlstate_char(tok[len]))
			len++;
		if ((len != 2 && len != 5) ||
			(tok[len] != '\0' && tok[len] != ',' && tok[len] != ' '))
		{
			GUC_check_errdetail("\"%s\" is not a list of SQLSTATE classes (two characters) or codes (five), separated by commas.",
								*newval);
			guc_free(list);
			return false;
		}
		list->entries[list->n].is_class = (len == 2);
		list->entries[list->n].code = len == 2 ?
			MAKE_SQLSTATE(tok[0], tok[1], '0', '0', '0') :
			MAKE_SQLSTATE(tok[0], tok[1], tok[2], tok[3], tok[4]);
		switch (uncacheable_reason(list->entries[list->n].code))
		{
			case CACHEABLE:
				break;
			case UNCACHEABLE_IDEM:
				GUC_check_errdetail("\"%.*s\" cannot be cached: it is one of idem's own outcomes, not a business error.",
									len, tok);
				guc_free(list);
				return false;
			case UNCACHEABLE_INTERNAL:
				GUC_check_errdetail("\"%.*s\" cannot be cached: it is an internal error, not a business error.",
									len, tok);
				guc_free(list);
				return false;
			case UNCACHEABLE_TRANSIENT:
				GUC_check_errdetail("\"%.*s\" cannot be cached: it is a transient condition, which a retry must run again.",
									len, tok);
				guc_free(list);
				return false;
			case UNCACHEABLE_SERVER:
				GUC_check_errdetail("\"%.*s\" cannot be cached: it is about the server's limits or the transaction's state, not a business error.",
									len, tok);
				guc_free(list);
				return false;
		}
		list->n++;
		p = tok + len;
	}
	*extra = list;
	return true;
}

void
idem_cache_errors_assign(const char *newval, void *extra)
{
	cache_list = (CacheList *) extra;
}

static bool
is_cached(int sqlerrcode)
{
	/* a listed class may hold transient codes (55: 55P03) */
	if (idem_sqlstate_transient(sqlerrcode))
		return false;
	for (int i = 0; i < cache_list->n; i++)
	{
		int			code = cache_list->entries[i].code;

		if (cache_list->entries[i].is_class ?
			ERRCODE_TO_CATEGORY(sqlerrcode) == code : sqlerrcode == code)
			return true;
	}
	return false;
}

static void
append_field(StringInfo buf, const char *name, const char *value, bool last)
{
	escape_json(buf, name);
	appendStringInfoChar(buf, ':');
	if (value != NULL)
		escape_json(buf, value);
	else
		appendStringInfoString(buf, "null");
	if (!last)
		appendStringInfoChar(buf, ',');
}

static Jsonb *
error_response(ErrorData *edata)
{
	StringInfoData buf;

	initStringInfo(&buf);
	appendStringInfoString(&buf, "{\"error\":{");
	append_field(&buf, "sqlstate", unpack_sql_state(edata->sqlerrcode), false);
	append_field(&buf, "message", edata->message, false);
	append_field(&buf, "detail", edata->detail, false);
	append_field(&buf, "hint", edata->hint, true);
	appendStringInfoString(&buf, "}}");
	return DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(buf.data)));
}

/*
 * idem_execute_caching_errors
 *		Run req's statement; with idem.cache_errors set, a listed error is
 *		returned as the response (and *cached set) instead of raised.
 */
Jsonb *
idem_execute_caching_errors(IdemStatement *stmt, IdemRequest *req,
							bool *cached)
{
	IdemSubxact sx;
	Jsonb	   *response = NULL;

	*cached = false;
	if (cache_list == NULL || cache_list->n == 0)
		return idem_execute_statement(stmt, req);

	idem_subxact_begin(&sx);
	PG_TRY();
	{
		response = idem_execute_statement(stmt, req);
		idem_subxact_end(&sx, true);
	}
	PG_CATCH();
	{
		bool		refused = idem_refused_statement();
		ErrorData  *edata = idem_subxact_abort(&sx);

		/* idem's own refusal of what the statement did is never an outcome */
		if (refused || !is_cached(edata->sqlerrcode))
			ReThrowError(edata);
		response = error_response(edata);
		FreeErrorData(edata);
		/* the recorded error is held to the ceiling of any response */
		idem_check_response_size(response, IDEM_RESPONSE_CACHED_ERROR, NULL);
		*cached = true;
	}
	PG_END_TRY();
	return response;
}
