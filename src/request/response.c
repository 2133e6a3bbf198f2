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
 * The response is written in jsonb's binary format here rather than built
 * with pushJsonbValue(), which unpacks every row it is given into
 * JsonbValues (hundreds of bytes for a row of one column) and converts
 * them all back at the end, in a pass that cannot be cancelled.  Each row
 * is already a jsonb container: it is copied whole into the array, as
 * convertJsonbArray() would write it.  The layout: a container's header
 * (count and kind), one JEntry per child (for an object, the keys' then
 * the values'), then the children's data, containers and numerics aligned
 * to 4 bytes, the padding counted in the child's length.  Every
 * JB_OFFSET_STRIDE'th JEntry holds the end offset of its data instead of
 * its length.
 */

static int
append_padding(StringInfo buf)
{
	int			padlen = INTALIGN(buf->len) - buf->len;

	appendBinaryStringInfo(buf, "\0\0\0", padlen);
	return padlen;
}

static void
too_large(const char *kind)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 errmsg("total size of jsonb %s elements exceeds the maximum of %d bytes",
					kind, JENTRY_OFFLENMASK),
			 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, "Return fewer rows or columns.")));
}

/* The JEntry of a container's child i of len bytes; total: the lengths so far */
static JEntry
child_entry(int i, JEntry type, Size len, Size *total, const char *kind)
{
	*total += len;
	if (*total > JENTRY_OFFLENMASK)
		too_large(kind);
	if (i % JB_OFFSET_STRIDE == 0)
		return type | JENTRY_HAS_OFF | (JEntry) *total;
	return type | (JEntry) len;
}

/* the rows as a jsonb array container; returns its length */
static Size
append_rows(StringInfo buf, ResponseReceiver *r)
{
	int			start = buf->len;
	uint32		header;
	int			entries;
	Size		total = 0;

	if (r->nrows > JB_CMASK)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("number of jsonb array elements exceeds the maximum allowed (%zu)",
						(Size) JB_CMASK),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, "Return fewer rows.")));
	append_padding(buf);
	header = (uint32) r->nrows | JB_FARRAY;
	appendBinaryStringInfo(buf, (char *) &header, sizeof(header));
	entries = buf->len;
	enlargeStringInfo(buf, r->nrows * sizeof(JEntry));
	buf->len += r->nrows * sizeof(JEntry);
	for (uint64 i = 0; i < r->nrows; i++)
	{
		Size		len = VARSIZE(r->rows[i]) - VARHDRSZ;
		JEntry		entry;

		CHECK_FOR_INTERRUPTS();
		len += append_padding(buf);
		appendBinaryStringInfo(buf, (char *) &r->rows[i]->root,
							   VARSIZE(r->rows[i]) - VARHDRSZ);
		entry = child_entry(i, JENTRY_ISCONTAINER, len, &total, "array");
		memcpy(buf->data + entries + i * sizeof(JEntry), &entry, sizeof(entry));
	}
	if (buf->len - start > JENTRY_OFFLENMASK)
		too_large("array");
	return buf->len - start;
}

/*
 * idem_build_response
 *		The jsonb response for a statement that processed that many rows,
 *		with the rows it returned that the receiver from
 *		idem_response_receiver() holds (none without RETURNING), in
 *		CurrentMemoryContext.
 */
Jsonb *
idem_build_response(const char *command, uint64 processed,
					DestReceiver *rows)
{
	ResponseReceiver *r = (ResponseReceiver *) rows;
	/* an object's keys are sorted, shorter first */
	static const char *const keys[] = {"rows", "command", "rowcount"};
	Numeric		rowcount = int64_to_numeric((int64) processed);
	StringInfoData buf;
	JEntry		entries[2 * lengthof(keys)];
	int			entries_at;
	uint32		header = lengthof(keys) | JB_FOBJECT;
	Size		total = 0;
	Size		len;

	if (r->tupdesc != NULL)
		check_column_names(r->tupdesc);
	initStringInfo(&buf);
	/* the rows' containers, their JEntries and padding, and a little more */
	if (r->size + r->nrows * (sizeof(JEntry) + 3) < JENTRY_OFFLENMASK)
		enlargeStringInfo(&buf, 256 + strlen(command) + r->size +
						  r->nrows * (sizeof(JEntry) + 3));
	buf.len = VARHDRSZ;
	appendBinaryStringInfo(&buf, (char *) &header, sizeof(header));
	entries_at = buf.len;
	buf.len += sizeof(entries);
	for (int i = 0; i < lengthof(keys); i++)
	{
		appendBinaryStringInfo(&buf, keys[i], strlen(keys[i]));
		entries[i] = child_entry(i, JENTRY_ISSTRING, strlen(keys[i]), &total,
								 "object");
	}
	len = append_rows(&buf, r);
	entries[3] = child_entry(3, JENTRY_ISCONTAINER, len, &total, "object");
	appendBinaryStringInfo(&buf, command, strlen(command));
	entries[4] = child_entry(4, JENTRY_ISSTRING, strlen(command), &total,
							 "object");
	len = append_padding(&buf) + VARSIZE_ANY(rowcount);
	appendBinaryStringInfo(&buf, (char *) rowcount, VARSIZE_ANY(rowcount));
	entries[5] = child_entry(5, JENTRY_ISNUMERIC, len, &total, "object");
	memcpy(buf.data + entries_at, entries, sizeof(entries));
	SET_VARSIZE(buf.data, buf.len);
	return (Jsonb *) buf.data;
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
