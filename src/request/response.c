/*-------------------------------------------------------------------------
 *
 * response.c
 *		Capture a business statement's outcome as idem's jsonb response.
 *
 * The response is {"rows": [...], "command": "INSERT", "rowcount": 1}:
 * "rows" holds the rows the statement returned, each exactly as
 * to_jsonb(row) renders it (empty without RETURNING), "command" the
 * command tag and "rowcount" the number of rows processed.  Each row is
 * formed as a record Datum and passed through core's to_jsonb, so column
 * types render exactly as they do in SQL.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/response.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/pg_type.h"
#include "funcapi.h"
#include "nodes/makefuncs.h"
#include "utils/fmgroids.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "request/request.h"

static FmgrInfo to_jsonb_record;
static bool to_jsonb_record_ready = false;

/*
 * to_jsonb takes its input type from the call expression, so give the
 * FmgrInfo one that says "record".
 */
static void
init_to_jsonb_record(void)
{
	MemoryContext oldcxt = MemoryContextSwitchTo(TopMemoryContext);

	fmgr_info(F_TO_JSONB, &to_jsonb_record);
	to_jsonb_record.fn_expr = (Node *)
		makeFuncExpr(F_TO_JSONB, JSONBOID,
					 list_make1(makeNullConst(RECORDOID, -1, InvalidOid)),
					 InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
	MemoryContextSwitchTo(oldcxt);
	to_jsonb_record_ready = true;
}

static void
push_key(JsonbParseState **state, const char *key)
{
	JsonbValue	v;

	v.type = jbvString;
	v.val.string.val = (char *) key;
	v.val.string.len = strlen(key);
	pushJsonbValue(state, WJB_KEY, &v);
}

/*
 * A row object keeps one value per name, so a result with two columns of
 * one name would be stored with one of them lost.  Refuse it instead.
 */
static void
check_column_names(TupleDesc tupdesc)
{
	for (int i = 0; i < tupdesc->natts; i++)
	{
		Form_pg_attribute a = TupleDescAttr(tupdesc, i);

		if (a->attisdropped)
			continue;
		for (int j = 0; j < i; j++)
		{
			Form_pg_attribute b = TupleDescAttr(tupdesc, j);

			if (!b->attisdropped &&
				strcmp(NameStr(a->attname), NameStr(b->attname)) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_DUPLICATE_COLUMN),
						 errmsg("idem_execute() cannot record a result with two columns named \"%s\"",
								NameStr(a->attname)),
						 errdetail("A response row keeps one value per column name, so one of the values would be lost."),
						 idem_errhint(ERRCODE_DUPLICATE_COLUMN, "Give every column of the result its own name, for example with AS.")));
		}
	}
}

static void
push_rows(JsonbParseState **state, SPITupleTable *tuptable, uint64 nrows)
{
	TupleDesc	tupdesc;

	if (tuptable != NULL)
		check_column_names(tuptable->tupdesc);
	pushJsonbValue(state, WJB_BEGIN_ARRAY, NULL);
	if (tuptable != NULL && nrows > 0)
	{
		if (!to_jsonb_record_ready)
			init_to_jsonb_record();

		/* a registered record type, so to_jsonb can look the columns up */
		tupdesc = BlessTupleDesc(CreateTupleDescCopy(tuptable->tupdesc));
		for (uint64 i = 0; i < nrows; i++)
		{
			Datum		row = heap_copy_tuple_as_datum(tuptable->vals[i], tupdesc);
			Jsonb	   *j = DatumGetJsonbP(FunctionCall1(&to_jsonb_record, row));
			JsonbValue	v;

			v.type = jbvBinary;
			v.val.binary.data = &j->root;
			v.val.binary.len = VARSIZE(j) - VARHDRSZ;
			pushJsonbValue(state, WJB_ELEM, &v);
		}
	}
	pushJsonbValue(state, WJB_END_ARRAY, NULL);
}

/*
 * idem_build_response
 *		The jsonb response for a statement that processed nrows rows and
 *		returned tuptable (NULL without RETURNING), in CurrentMemoryContext.
 */
Jsonb *
idem_build_response(const char *command, uint64 processed,
					SPITupleTable *tuptable)
{
	JsonbParseState *state = NULL;
	JsonbValue	v;
	JsonbValue *result;

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);

	push_key(&state, "rows");
	push_rows(&state, tuptable, tuptable ? processed : 0);

	push_key(&state, "command");
	v.type = jbvString;
	v.val.string.val = (char *) command;
	v.val.string.len = strlen(command);
	pushJsonbValue(&state, WJB_VALUE, &v);

	push_key(&state, "rowcount");
	v.type = jbvNumeric;
	v.val.numeric = int64_to_numeric((int64) processed);
	pushJsonbValue(&state, WJB_VALUE, &v);

	result = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(result);
}

/*
 * idem_check_response_size
 *		Refuse a response (what names it) above idem.max_response_size.
 */
void
idem_check_response_size(Jsonb *response, const char *what)
{
	if (VARSIZE(response) > idem_max_response_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("%s is too large", what),
				 errdetail("The response is %u bytes; idem.max_response_size is %d bytes.",
						   (unsigned int) VARSIZE(response), idem_max_response_size),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, "Return fewer rows or columns, or raise idem.max_response_size.")));
}
