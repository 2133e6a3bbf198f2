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
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "utils/datum.h"
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

/*
 * The rows of a statement's result as they are produced, each rendered
 * at once and the result's tuple discarded, so that a statement returning
 * more than idem.max_response_size is refused when its rows pass the
 * limit, instead of after the executor and the response being built have
 * held all of them in memory.
 */
typedef struct ResponseReceiver
{
	DestReceiver pub;
	MemoryContext cxt;			/* the rows', until rDestroy */
	MemoryContext rowcxt;		/* each row's rendering, emptied after it */
	TupleDesc	tupdesc;		/* blessed; NULL until the result starts */
	Jsonb	  **rows;
	uint64		nrows;
	uint64		maxrows;
	Size		size;			/* of the rows' containers */
} ResponseReceiver;

static void
response_startup(DestReceiver *self, int operation, TupleDesc typeinfo)
{
	ResponseReceiver *r = (ResponseReceiver *) self;
	MemoryContext oldcxt = MemoryContextSwitchTo(r->cxt);

	if (!to_jsonb_record_ready)
		init_to_jsonb_record();
	/* a registered record type, so to_jsonb can look the columns up */
	r->tupdesc = BlessTupleDesc(CreateTupleDescCopy(typeinfo));
	r->rowcxt = AllocSetContextCreate(r->cxt, "idem response row",
									  ALLOCSET_DEFAULT_SIZES);
	MemoryContextSwitchTo(oldcxt);
}

static bool
response_receive(TupleTableSlot *slot, DestReceiver *self)
{
	ResponseReceiver *r = (ResponseReceiver *) self;
	MemoryContext oldcxt = MemoryContextSwitchTo(r->rowcxt);
	bool		should_free;
	HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
	Datum		row = heap_copy_tuple_as_datum(tuple, r->tupdesc);
	Jsonb	   *j = DatumGetJsonbP(FunctionCall1(&to_jsonb_record, row));

	/*
	 * A row's container is copied whole into the response's array, so the
	 * response is at least as large as its rows' containers together.
	 */
	r->size += VARSIZE(j) - VARHDRSZ;
	if (r->size > (Size) idem_max_response_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("idem_execute() response is too large"),
				 errdetail_plural("The first %llu row takes %zu bytes; idem.max_response_size is %d bytes.",
								  "The first %llu rows take %zu bytes; idem.max_response_size is %d bytes.",
								  (unsigned long) r->nrows + 1,
								  (unsigned long long) r->nrows + 1, r->size,
								  idem_max_response_size),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, "Return fewer rows or columns, or raise idem.max_response_size.")));

	MemoryContextSwitchTo(r->cxt);
	if (r->nrows == r->maxrows)
	{
		r->maxrows = r->maxrows == 0 ? 16 : r->maxrows * 2;
		/* empty rows under a raised limit: more than 1 GB of pointers */
		r->rows = r->rows == NULL ?
			palloc(r->maxrows * sizeof(Jsonb *)) :
			repalloc_huge(r->rows, r->maxrows * sizeof(Jsonb *));
	}
	r->rows[r->nrows++] = (Jsonb *) datumCopy(JsonbPGetDatum(j), false, -1);
	MemoryContextSwitchTo(oldcxt);
	MemoryContextReset(r->rowcxt);
	return true;
}

static void
response_shutdown(DestReceiver *self)
{
}

static void
response_destroy(DestReceiver *self)
{
	ResponseReceiver *r = (ResponseReceiver *) self;

	MemoryContextDelete(r->cxt);
	pfree(r);
}

/*
 * idem_response_receiver
 *		A receiver for a business statement's result, in
 *		CurrentMemoryContext, for idem_build_response(); its rDestroy frees
 *		the rows once the response is built.
 */
DestReceiver *
idem_response_receiver(void)
{
	ResponseReceiver *r = palloc0(sizeof(ResponseReceiver));

	r->pub.receiveSlot = response_receive;
	r->pub.rStartup = response_startup;
	r->pub.rShutdown = response_shutdown;
	r->pub.rDestroy = response_destroy;
	/* neither SPI's tuple table nor a client: SPI leaves it alone */
	r->pub.mydest = DestNone;
	r->cxt = AllocSetContextCreate(CurrentMemoryContext, "idem response rows",
								   ALLOCSET_DEFAULT_SIZES);
	return &r->pub;
}

/*
 * idem_build_response
 *		The jsonb response for a statement that processed that many rows,
 *		with the rows it returned that the receiver from
 *		idem_response_receiver() holds (none without RETURNING), in
 *		CurrentMemoryContext.
 *
 * Each row is copied into the response whole (src/common/jsonbwrite.c).
 */
Jsonb *
idem_build_response(const char *command, uint64 processed,
					DestReceiver *rows)
{
	ResponseReceiver *r = (ResponseReceiver *) rows;
	/* an object's keys in jsonb's order */
	static const char *const keys[] = {"rows", "command", "rowcount"};
	StringInfoData buf;
	IdemJsonbWriter response;
	IdemJsonbWriter array;

	if (r->tupdesc != NULL)
		check_column_names(r->tupdesc);
	/* the rows, a JEntry and at most 3 bytes of padding each, the rest */
	idem_jsonb_begin(&buf, r->size + r->nrows * (sizeof(JEntry) + 3) +
					 strlen(command) + 256);
	idem_jsonb_open(&response, &buf, true, lengthof(keys));
	for (int i = 0; i < lengthof(keys); i++)
		idem_jsonb_add_string(&response, keys[i], strlen(keys[i]));
	idem_jsonb_open(&array, &buf, false, r->nrows);
	for (uint64 i = 0; i < r->nrows; i++)
	{
		CHECK_FOR_INTERRUPTS();
		idem_jsonb_add_jsonb(&array, r->rows[i]);
	}
	idem_jsonb_close(&array, &response);
	idem_jsonb_add_string(&response, command, strlen(command));
	idem_jsonb_add_numeric(&response, int64_to_numeric((int64) processed));
	idem_jsonb_close(&response, NULL);
	return idem_jsonb_end(&buf);
}

/* The message of a response of kind that is too large */
static int
too_large_msg(IdemResponseKind kind, const char *fname)
{
	switch (kind)
	{
		case IDEM_RESPONSE_EXECUTE:
			return errmsg("idem_execute() response is too large");
		case IDEM_RESPONSE_CACHED_ERROR:
			return errmsg("cached error response is too large");
		case IDEM_RESPONSE_SIGNAL:
			return errmsg("signal payload is too large");
		case IDEM_RESPONSE_STEP_RESULT:
			return errmsg("result passed to %s is too large", fname);
		case IDEM_RESPONSE_RUN_INPUT:
			return errmsg("run input is too large");
	}
	return errmsg("response is too large");
}

/*
 * idem_check_response_size
 *		Refuse a response of kind above idem.max_response_size; fname names
 *		the function an external step's result was passed to.
 */
void
idem_check_response_size(Jsonb *response, IdemResponseKind kind,
						 const char *fname)
{
	if (VARSIZE(response) > idem_max_response_size)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 too_large_msg(kind, fname),
				 errdetail_plural("The response is %u byte; idem.max_response_size is %d bytes.",
								  "The response is %u bytes; idem.max_response_size is %d bytes.",
								  VARSIZE(response),
								  (unsigned int) VARSIZE(response), idem_max_response_size),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, "Return fewer rows or columns, or raise idem.max_response_size.")));
}
