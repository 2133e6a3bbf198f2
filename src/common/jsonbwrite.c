/*-------------------------------------------------------------------------
 *
 * jsonbwrite.c
 *		Write a jsonb value made of other jsonb values (a response's rows,
 *		a run's step results) directly in jsonb's binary format.
 *
 * pushJsonbValue() unpacks every jsonb it is given into JsonbValues, tens
 * to hundreds of bytes for each scalar and container in it, and
 * JsonbValueToJsonb() converts them all back in one pass that cannot be
 * cancelled: many times the memory of the values, and seconds, for
 * values already in the format.  Here each one is copied whole, as
 * convertJsonbArray() and convertJsonbObject() would write it.
 *
 * The format: a container's header (its count and kind), one JEntry per
 * child (for an object, the keys' then the values', the keys sorted
 * shorter first, then bytewise, and unique), then the children's data;
 * containers and numerics are aligned to 4 bytes, the padding counted in
 * the child's length.  Every JB_OFFSET_STRIDE'th JEntry holds the end
 * offset of its child's data instead of its length.  A container's
 * offsets are its own, so a container copied to a 4-byte boundary reads
 * as it did; a raw scalar (a jsonb that is a string, a number, a boolean
 * or null) is written as the scalar it holds.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/jsonbwrite.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"

#include "common/common.h"

static void
too_large(bool object)
{
	ereport(ERROR,
			(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
			 object ?
			 errmsg("total size of jsonb object elements exceeds the maximum of %d bytes",
					JENTRY_OFFLENMASK) :
			 errmsg("total size of jsonb array elements exceeds the maximum of %d bytes",
					JENTRY_OFFLENMASK),
			 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, NULL)));
}

static int
append_padding(StringInfo buf)
{
	int			padlen = INTALIGN(buf->len) - buf->len;

	appendBinaryStringInfo(buf, "\0\0\0", padlen);
	return padlen;
}

/*
 * idem_jsonb_begin
 *		Start a jsonb datum in buf (empty): its varlena header, filled in by
 *		idem_jsonb_end().  size: about how large it will be, allocated at
 *		once (0: grow as needed).
 */
void
idem_jsonb_begin(StringInfo buf, Size size)
{
	initStringInfo(buf);
	if (size > 0 && size < MaxAllocSize / 2)
		enlargeStringInfo(buf, (int) size);
	appendBinaryStringInfo(buf, "\0\0\0\0", VARHDRSZ);
}

/*
 * idem_jsonb_end
 *		The jsonb datum written in buf, whose root container is closed.
 */
Jsonb *
idem_jsonb_end(StringInfo buf)
{
	SET_VARSIZE(buf->data, buf->len);
	return (Jsonb *) buf->data;
}

/*
 * idem_jsonb_open
 *		Start a container in buf: an object of n pairs or an array of n
 *		elements.  Its children are then added in order (an object's keys
 *		first, then its values) and it is closed with idem_jsonb_close().
 */
void
idem_jsonb_open(IdemJsonbWriter *w, StringInfo buf, bool object, uint64 n)
{
	uint32		header;

	if (n > JB_CMASK)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 object ?
				 errmsg("number of jsonb object pairs exceeds the maximum allowed (%zu)",
						(Size) JB_CMASK) :
				 errmsg("number of jsonb array elements exceeds the maximum allowed (%zu)",
						(Size) JB_CMASK),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, NULL)));
	w->buf = buf;
	w->start = buf->len;
	w->object = object;
	w->nentries = object ? 2 * n : n;
	w->next = 0;
	w->total = 0;
	append_padding(buf);
	header = (uint32) n | (object ? JB_FOBJECT : JB_FARRAY);
	appendBinaryStringInfo(buf, (char *) &header, sizeof(header));
	w->entries = buf->len;
	enlargeStringInfo(buf, w->nentries * sizeof(JEntry));
	buf->len += w->nentries * sizeof(JEntry);
	buf->data[buf->len] = '\0';
}

/* Record the next child, of type and len bytes just written */
static void
add_entry(IdemJsonbWriter *w, JEntry type, Size len)
{
	JEntry		entry = type | (JEntry) len;

	Assert(w->next < w->nentries);
	w->total += len;
	if (w->total > JENTRY_OFFLENMASK)
		too_large(w->object);
	if (w->next % JB_OFFSET_STRIDE == 0)
		entry = type | JENTRY_HAS_OFF | (JEntry) w->total;
	memcpy(w->buf->data + w->entries + w->next * sizeof(JEntry), &entry,
		   sizeof(entry));
	w->next++;
}

/*
 * idem_jsonb_add_string
 *		Add a string child: an object's key, or a value.
 */
void
idem_jsonb_add_string(IdemJsonbWriter *w, const char *str, int len)
{
	appendBinaryStringInfo(w->buf, str, len);
	add_entry(w, JENTRY_ISSTRING, len);
}

/*
 * idem_jsonb_add_numeric
 *		Add a number child.
 */
void
idem_jsonb_add_numeric(IdemJsonbWriter *w, Numeric num)
{
	int			padlen = append_padding(w->buf);

	appendBinaryStringInfo(w->buf, (char *) num, VARSIZE_ANY(num));
	add_entry(w, JENTRY_ISNUMERIC, padlen + VARSIZE_ANY(num));
}

/*
 * idem_jsonb_add_jsonb
 *		Add the value of a jsonb datum as a child.
 */
void
idem_jsonb_add_jsonb(IdemJsonbWriter *w, Jsonb *value)
{
	JsonbContainer *root = &value->root;

	if (JsonContainerIsScalar(root))
	{
		/* a raw scalar is an array of one, whose data starts aligned */
		JEntry		entry = root->children[0];
		char	   *data = (char *) &root->children[1];

		if (JBE_ISNUMERIC(entry))
			idem_jsonb_add_numeric(w, (Numeric) data);
		else
		{
			Size		len = JBE_ISSTRING(entry) ? JBE_OFFLENFLD(entry) : 0;

			appendBinaryStringInfo(w->buf, data, len);
			add_entry(w, entry & JENTRY_TYPEMASK, len);
		}
		return;
	}
	{
		int			padlen = append_padding(w->buf);

		appendBinaryStringInfo(w->buf, (char *) root,
							   VARSIZE(value) - VARHDRSZ);
		add_entry(w, JENTRY_ISCONTAINER, padlen + VARSIZE(value) - VARHDRSZ);
	}
}

/*
 * idem_jsonb_close
 *		Close a container whose children are all added; parent: the
 *		container it is a child of, or NULL for the root.
 */
void
idem_jsonb_close(IdemJsonbWriter *w, IdemJsonbWriter *parent)
{
	Size		len = w->buf->len - w->start;

	Assert(w->next == w->nentries);
	if (len > JENTRY_OFFLENMASK)
		too_large(w->object);
	if (parent != NULL)
		add_entry(parent, JENTRY_ISCONTAINER, len);
}

/*
 * idem_jsonb_key_cmp
 *		The order of an object's keys, for qsort() of an array of char *.
 */
int
idem_jsonb_key_cmp(const void *a, const void *b)
{
	const char *ka = *(const char *const *) a;
	const char *kb = *(const char *const *) b;
	size_t		la = strlen(ka);
	size_t		lb = strlen(kb);

	if (la != lb)
		return la < lb ? -1 : 1;
	return memcmp(ka, kb, la);
}
