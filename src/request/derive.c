/*-------------------------------------------------------------------------
 *
 * derive.c
 *		Keys derived from business context: idem_key(VARIADIC parts) and
 *		idem_state_hash(anyelement).
 *
 * A derived key must be the same string in every session, under every
 * setting, after a dump and restore, and two different lists of parts must
 * never give the same key.  Parts are joined with ':' after escaping '\',
 * ':' and '#' with a backslash, so ('a:b', 'c') and ('a', 'b:c') differ.  A
 * key longer than IDEM_MAX_KEY_BYTES keeps a readable prefix and ends in
 * '#' and the hex SHA-256 of the whole encoding; an unhashed key never holds
 * an unescaped '#', so the two forms cannot meet.
 *
 * Non-text parts are written with their type's output function.  The SQL
 * definitions pin, with SET clauses, every setting that changes the output
 * of a built-in type (DateStyle, TimeZone, IntervalStyle,
 * extra_float_digits, bytea_output, ...), so a timestamptz part reads the
 * same whatever the caller's time zone; search_path (pg_catalog alone) and
 * quote_all_identifiers too, so a regclass part names its table the same
 * way in every session.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/derive.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "fmgr.h"
#include "lib/stringinfo.h"
#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "compat.h"
#include "request/request.h"

PG_FUNCTION_INFO_V1(idem_key);
PG_FUNCTION_INFO_V1(idem_state_hash);

/* '#' and 64 hex digits */
#define HASHED_SUFFIX_LEN	(1 + 2 * IDEM_FINGERPRINT_LEN)

static void
append_hex(StringInfo buf, const uint8 *bytes, int len)
{
	static const char hex[] = "0123456789abcdef";

	for (int i = 0; i < len; i++)
	{
		appendStringInfoChar(buf, hex[bytes[i] >> 4]);
		appendStringInfoChar(buf, hex[bytes[i] & 0x0f]);
	}
}

/*
 * idem_derive_key
 *		The canonical key for a list of text parts (see the file header).
 */
char *
idem_derive_key(int nparts, const char *const *parts)
{
	StringInfoData buf;
	StringInfoData out;
	uint8		digest[IDEM_FINGERPRINT_LEN];
	int			cut;
	bool		escaped = false;
	IdemSha256	sha;
	idem_sha256_ctx ctx;

	initStringInfo(&buf);
	for (int i = 0; i < nparts; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (i > 0)
			appendStringInfoChar(&buf, ':');
		for (const char *p = parts[i]; *p; p++)
		{
			if (*p == '\\' || *p == ':' || *p == '#')
				appendStringInfoChar(&buf, '\\');
			appendStringInfoChar(&buf, *p);
		}
	}
	if (buf.len <= IDEM_MAX_KEY_BYTES)
		return buf.data;

	ctx = idem_sha256_begin(&sha);
	idem_sha256_update(ctx, buf.data, buf.len);
	idem_sha256_end(ctx, digest);

	/* a prefix of whole characters that does not end inside an escape */
	cut = pg_mbcliplen(buf.data, buf.len, IDEM_MAX_KEY_BYTES - HASHED_SUFFIX_LEN);
	for (int i = 0; i < cut; i++)
		escaped = (!escaped && buf.data[i] == '\\');
	if (escaped)
		cut--;

	initStringInfo(&out);
	appendBinaryStringInfo(&out, buf.data, cut);
	appendStringInfoChar(&out, '#');
	append_hex(&out, digest, IDEM_FINGERPRINT_LEN);
	pfree(buf.data);
	return out.data;
}

/*
 * A part's text.  An anonymous record's text leaves out its field names, so
 * (25 AS amount) and (25 AS refund_id) would make one key: refused.  No
 * column, domain or range holds one, so checking the part's type suffices.
 * A void part's text is empty, so idem_key(f(), 'x') and idem_key('', 'x')
 * would be one key: refused too.
 */
static char *
part_text(Oid typid, Datum value, int partno)
{
	Oid			output;
	bool		isvarlena;

	if (typid == RECORDOID || typid == RECORDARRAYOID)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("key part %d is an anonymous record", partno),
				 errdetail("The text of an anonymous record leaves out its field names, so records with different fields could give the same key."),
				 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, "Pass its fields as separate parts, or cast it to a composite type.")));
	if (typid == VOIDOID)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("key part %d is of type void", partno),
				 errdetail("A void value has no text, so the key would be the one an empty part gives."),
				 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, "Pass the value that names the request instead.")));
	if (typid == UNKNOWNOID)
		return pstrdup(DatumGetCString(value));
	getTypeOutputInfo(typid, &output, &isvarlena);
	return OidOutputFunctionCall(output, value);
}

/*
 * idem_key(VARIADIC parts "any") returns text
 */
Datum
idem_key(PG_FUNCTION_ARGS)
{
	int			nparts;
	char	  **parts;

	if (get_fn_expr_variadic(fcinfo->flinfo))
	{
		ArrayType  *arr;
		Datum	   *elems;
		bool	   *nulls;
		Oid			elemtype;
		int16		typlen;
		bool		typbyval;
		char		typalign;

		if (PG_ARGISNULL(0))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("key parts must not be null"),
					 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
		arr = PG_GETARG_ARRAYTYPE_P(0);
		idem_check_variadic_list(arr, IDEM_LIST_KEY_PARTS,
								 "Pass a list as one part of an array type.");
		elemtype = ARR_ELEMTYPE(arr);
		get_typlenbyvalalign(elemtype, &typlen, &typbyval, &typalign);
		deconstruct_array(arr, elemtype, typlen, typbyval, typalign,
						  &elems, &nulls, &nparts);
		parts = palloc(Max(nparts, 1) * sizeof(char *));
		for (int i = 0; i < nparts; i++)
		{
			CHECK_FOR_INTERRUPTS();
			if (nulls[i])
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("key part %d is null", i + 1),
						 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, "A key must name its request completely; pass a placeholder such as '' for an absent value.")));
			parts[i] = part_text(elemtype, elems[i], i + 1);
		}
	}
	else
	{
		nparts = PG_NARGS();
		parts = palloc(Max(nparts, 1) * sizeof(char *));
		for (int i = 0; i < nparts; i++)
		{
			Oid			typid = get_fn_expr_argtype(fcinfo->flinfo, i);

			if (PG_ARGISNULL(i))
				ereport(ERROR,
						(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
						 errmsg("key part %d is null", i + 1),
						 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, "A key must name its request completely; pass a placeholder such as '' for an absent value.")));
			if (!OidIsValid(typid))
				ereport(ERROR,
						(errcode(ERRCODE_INDETERMINATE_DATATYPE),
						 errmsg("could not determine the data type of key part %d", i + 1),
						 idem_errhint(ERRCODE_INDETERMINATE_DATATYPE, NULL)));
			parts[i] = part_text(typid, PG_GETARG_DATUM(i), i + 1);
		}
	}
	if (nparts == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a key needs at least one part"),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));

	PG_RETURN_TEXT_P(cstring_to_text(idem_derive_key(nparts,
													 (const char *const *) parts)));
}

/*
 * idem_state_hash(anyelement) returns text
 *
 * A revision tag for a value's current content, by the bytes of its typed
 * fields (see idem_value_digest), not by text output.
 */
Datum
idem_state_hash(PG_FUNCTION_ARGS)
{
	Oid			typid = get_fn_expr_argtype(fcinfo->flinfo, 0);
	uint8		digest[IDEM_FINGERPRINT_LEN];
	StringInfoData buf;

	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("value passed to idem_state_hash() must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	if (!OidIsValid(typid))
		ereport(ERROR,
				(errcode(ERRCODE_INDETERMINATE_DATATYPE),
				 errmsg("could not determine the data type of the value passed to idem_state_hash()"),
				 idem_errhint(ERRCODE_INDETERMINATE_DATATYPE, NULL)));

	idem_value_digest("idem_state_hash", typid, PG_GETARG_DATUM(0), digest);
	initStringInfo(&buf);
	append_hex(&buf, digest, IDEM_FINGERPRINT_LEN);
	PG_RETURN_TEXT_P(cstring_to_text(buf.data));
}
