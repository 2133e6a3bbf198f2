/*-------------------------------------------------------------------------
 *
 * statement.c
 *		Request identity and the business statements a backend has seen:
 *		validation, the request fingerprint, the session settings that
 *		change what a statement means, and a bounded cache of plans.
 *
 * A statement is identified by its SQL text, its argument types and the
 * session settings that change what the text means (see settings below).
 * The first time a backend sees one it parses it once to check that it is a
 * single plannable statement, and hashes the core scanner's token stream;
 * both results are kept, so a replay costs neither a parse nor SPI.  The
 * plan is prepared lazily, on the first execution, checked once more on the
 * analyzed statement, and kept with SPI_keepplan, so the plan cache
 * revalidates it on DDL and role changes like any other kept plan.
 *
 * Keying the cache by the settings matters beyond the fingerprint: a
 * literal such as '2024-01-02 12:00' is coerced to timestamptz when the plan
 * is prepared, with the TimeZone of that moment, and the plan cache does not
 * replan when TimeZone changes.  A plan shared across settings would make
 * the result of a call depend on the backend's history.
 *
 * The cache is an LRU bounded by idem.statement_cache_size entries and by
 * idem.statement_cache_memory bytes.  Entries in use by a running
 * idem_execute() (a business statement can itself call idem_execute()) are
 * pinned and never evicted.
 *
 * The fingerprint (version 3) is SHA-256 over the token stream digest, the
 * settings digest, the argument count, and each argument's type identity and
 * value.  Values are hashed in a form no session setting changes: built-in
 * scalars by their typlen bytes, domains as their base type, arrays element
 * by element and records field by field with each element's or field's type
 * (and an anonymous record's field names), ranges by their flags and bounds,
 * enums by label, and base types defined in the database by their bytes
 * (never by text output, which DateStyle or TimeZone change, nor by a send
 * function, whose text parts follow client_encoding).  Every NaN is one NaN.
 * A numeric argument that the statement uses only through one numeric(p,s)
 * column is hashed as the column stores it (see find_numeric_uses()).
 * Version 1 (idem 1.0) is kept only to compare records written by 1.0; see
 * idem_statement_fingerprint_v1().  Version 2 (idem 1.1) is version 3
 * without field names; see idem_statement_fingerprint_v2_same().
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/statement.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/transam.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/ilist.h"
#include "miscadmin.h"
#include "nodes/nodeFuncs.h"
#include "nodes/parsenodes.h"
#include "parser/analyze.h"
#include "parser/parse_expr.h"
#include "parser/scanner.h"
#include "pgtime.h"
#include "tcop/utility.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/float.h"
#include "utils/bytea.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/multirangetypes.h"
#include "utils/rangetypes.h"
#include "utils/syscache.h"
#include "utils/xml.h"
#include "tsearch/ts_cache.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/pg_locale.h"
#include "utils/plancache.h"
#include "utils/typcache.h"

#include "compat.h"
#include "request/request.h"
#include "request/tokens.h"

/* Domain tag of version 2 fingerprints, so no v1 input can collide. */
#define FINGERPRINT_V2_TAG		"idem fingerprint 2"

/*
 * How a top-level argument's value enters the fingerprint.  The built-in
 * scalars are recognised once per statement and hashed by hash_scalar()
 * with the length kept here; everything else (complex) goes through
 * hash_datum(), which looks its type up per value.
 */
typedef struct ArgHashInfo
{
	bool		complex;		/* domain, array, record, enum, range, ... */
	int16		typlen;
	bool		typbyval;
	Oid			basetype;		/* the type itself, or a domain's base */
	char	   *typident;		/* stable name of the declared type */
	int32		numeric_typmod; /* numeric(p,s) every use applies, or -1 */
} ArgHashInfo;

/*
 * The session settings that change what a statement text or a text value
 * means: which objects names resolve to (search_path), how the scanner
 * reads string literals (standard_conforming_strings), how "x = NULL"
 * parses (transform_null_equals), how literals and text become values
 * (TimeZone, timezone_abbreviations, DateStyle, IntervalStyle, lc_monetary,
 * lc_numeric, lc_time, array_nulls, xmloption, default_text_search_config),
 * and how values become text, which a statement that casts to text stores
 * (extra_float_digits, bytea_output, xmlbinary, quote_all_identifiers, and
 * DateStyle, IntervalStyle, TimeZone again).  Strings are copied, not
 * compared by pointer: a GUC's new value can land at its old value's
 * address.
 */
#define SETTING_LEN		256

typedef struct IdemSettings
{
	pg_tz	   *timezone;		/* pg_tzset() caches one pg_tz per name */
	int			datestyle;
	int			dateorder;
	int			intervalstyle;
	int			float_digits;
	int			bytea_output;
	int			xmloption;
	int			xmlbinary;
	bool		standard_strings;
	bool		array_nulls;
	bool		null_equals;
	bool		quote_all;
	char		tz_abbrevs[SETTING_LEN];
	char		monetary[SETTING_LEN];
	char		numeric[SETTING_LEN];
	char		time[SETTING_LEN];
	char		ts_config[SETTING_LEN];
} IdemSettings;

static IdemSettings settings_seen;
static bool settings_seen_valid = false;
static OverrideSearchPath *search_path_seen = NULL;
static MemoryContext settings_cxt = NULL;
static uint8 settings_digest[IDEM_FINGERPRINT_LEN];
static uint64 settings_hash;

struct IdemStatement
{
	uint64		hashkey;		/* hash of sql, argtypes, settings */
	char	   *sql;
	int			nargs;
	Oid		   *argtypes;
	ArgHashInfo *arginfo;
	const char *command;		/* "INSERT", "SELECT", ... */
	uint8		digest[IDEM_FINGERPRINT_LEN];	/* of the token stream */
	uint8		settings[IDEM_FINGERPRINT_LEN]; /* settings it was made under */
	uint8		ident[IDEM_FINGERPRINT_LEN];	/* v2 prefix: tag, digest, settings */
	SPIPlanPtr	plan;			/* NULL until first executed */
	Oid		   *inferred;		/* for argtypes with UNKNOWNOID: the types
								 * the statement gave them, once inferred */
	uint64		inferred_epoch; /* inferred at this epoch */
	bool		has_numeric;	/* an argument is numeric */
	uint64		uses_epoch;		/* numeric_typmods found at this epoch */
	uint64		typident_epoch; /* arginfo's typidents named at this epoch */
	bool		plan_checked;	/* analyzed statement verified */
	bool		resized;		/* plan may have grown since last measured */
	Size		bytes;			/* memory charged to the cache */
	int			pins;
	bool		cached;			/* false: transient, freed on release */
	MemoryContext cxt;			/* everything above except the plan */
	dlist_node	lru;
};

typedef struct StatementCacheEntry
{
	uint64		hashkey;
	IdemStatement *stmt;
} StatementCacheEntry;

/*
 * Counts invalidations of relations, functions and operators, after which
 * what parse analysis found for a statement's arguments is looked for
 * again: ALTER TABLE may change a column's type (the type an untyped
 * argument takes) or its scale (the numeric(p,s) a numeric argument is
 * stored with), and a function or operator replaced by one with other
 * parameter types gives an untyped argument another type.  Statements
 * start at 0, the epoch at 1.
 */
static uint64 relations_epoch = 1;

/*
 * Counts invalidations of types and schemas, after which the names of the
 * arguments' types are looked up again: a type enters the fingerprint by
 * its qualified name, which ALTER TYPE ... RENAME or SET SCHEMA and ALTER
 * SCHEMA ... RENAME change, and a backend that kept the old one would
 * fingerprint a retry differently from every other backend.
 */
static uint64 types_epoch = 1;

static HTAB *statement_cache = NULL;
static MemoryContext statement_cache_cxt = NULL;
static dlist_head statement_lru = DLIST_STATIC_INIT(statement_lru);
static int	statement_count = 0;
static Size statement_bytes = 0;

static void hash_datum(idem_sha256_ctx ctx, Oid typid, Datum value);
static void hash_range_value(idem_sha256_ctx ctx, TypeCacheEntry *typcache,
							 RangeType *range);
static void statement_ident(IdemStatement *stmt);

/* ---------------------------------------------------------------------
 * Settings
 * ---------------------------------------------------------------------
 */

static void
copy_setting(char *dest, const char *value)
{
	if (value == NULL)
		value = "";
	if (strlcpy(dest, value, SETTING_LEN) >= SETTING_LEN)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("setting value \"%s\" is too long for idem", value),
				 errdetail("idem compares settings of up to %d bytes.",
						   SETTING_LEN - 1),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, NULL)));
}

static void
read_settings(IdemSettings *s)
{
	memset(s, 0, sizeof(*s));
	s->timezone = session_timezone;
	s->datestyle = DateStyle;
	s->dateorder = DateOrder;
	s->intervalstyle = IntervalStyle;
	/*
	 * Each setting counts as the behaviour it selects, not as its spelling:
	 * every positive extra_float_digits selects the shortest exact output,
	 * so PgJDBC's 3 and lib/pq's 2 are psql's 1; zero and below each round
	 * differently.
	 */
	s->float_digits = extra_float_digits > 0 ? 1 : extra_float_digits;
	s->bytea_output = bytea_output;
	s->xmloption = xmloption;
	s->xmlbinary = xmlbinary;
	s->standard_strings = standard_conforming_strings;
	s->array_nulls = Array_nulls;
	s->null_equals = Transform_null_equals;
	s->quote_all = quote_all_identifiers;
	copy_setting(s->tz_abbrevs,
				 GetConfigOption("timezone_abbreviations", true, false));
	copy_setting(s->monetary, locale_monetary);
	copy_setting(s->numeric, locale_numeric);
	copy_setting(s->time, locale_time);
	copy_setting(s->ts_config, TSCurrentConfig);
}

static void
update_str(idem_sha256_ctx ctx, const char *s)
{
	uint32		len = strlen(s);

	idem_sha256_update(ctx, &len, sizeof(len));
	idem_sha256_update(ctx, s, len);
}

/*
 * Hash the settings by value and the search path by schema name, never by
 * OID, so that the digest survives a dump and restore.  The backend's own
 * temporary schema is left out: it joins the path when the session first
 * creates a temporary table, and counting it would make every retry from
 * a session that ever did so a different request.
 */
static void
digest_settings(const IdemSettings *s)
{
	IdemSha256	sha;
	idem_sha256_ctx ctx = idem_sha256_begin(&sha);
	List	   *path = fetch_search_path(true);
	ListCell   *lc;
	int32		ints[7] = {s->datestyle, s->dateorder, s->intervalstyle,
	s->float_digits, s->bytea_output, s->xmloption, s->xmlbinary};
	char		bools[3] = {s->standard_strings, s->array_nulls, s->null_equals};

	update_str(ctx, pg_get_timezone_name(s->timezone));
	idem_sha256_update(ctx, ints, sizeof(ints));
	idem_sha256_update(ctx, bools, sizeof(bools));
	update_str(ctx, s->tz_abbrevs);
	update_str(ctx, s->monetary);
	update_str(ctx, s->numeric);
	update_str(ctx, s->time);
	update_str(ctx, s->ts_config);
	foreach(lc, path)
	{
		Oid			nspid = lfirst_oid(lc);
		char	   *name;

		if (isTempNamespace(nspid))
			continue;
		name = get_namespace_name(nspid);
		if (name != NULL)
			update_str(ctx, name);
	}
	list_free(path);

	/*
	 * Only when on, after a length no schema name has, so that the digest
	 * of the default settings is the one idem 1.1 computed.
	 */
	if (s->quote_all)
	{
		uint32		mark = PG_UINT32_MAX;

		idem_sha256_update(ctx, &mark, sizeof(mark));
	}
	idem_sha256_end(ctx, settings_digest);
	memcpy(&settings_hash, settings_digest, sizeof(settings_hash));
}

/*
 * A renamed schema keeps its OID, so the search path still "matches", but
 * the digest names it: compute it again.  The names of the statements'
 * argument types name it too (types_epoch); one callback serves both, as a
 * backend has few syscache callback slots.
 */
static void
settings_namespace_inval(Datum arg, int cacheid, uint32 hashvalue)
{
	settings_seen_valid = false;
	types_epoch++;
}

/*
 * The digest of the current settings.  Recomputed only when a setting or
 * the effective search path changed since the last call, so a replay pays
 * a few comparisons.
 */
static const uint8 *
current_settings(void)
{
	IdemSettings now;

	if (settings_cxt == NULL)
	{
		settings_cxt = AllocSetContextCreate(TopMemoryContext,
											 "idem settings",
											 ALLOCSET_SMALL_SIZES);
		CacheRegisterSyscacheCallback(NAMESPACEOID, settings_namespace_inval,
									  (Datum) 0);
	}
	read_settings(&now);
	if (settings_seen_valid &&
		memcmp(&now, &settings_seen, sizeof(now)) == 0 &&
		OverrideSearchPathMatchesCurrent(search_path_seen))
		return settings_digest;

	settings_seen_valid = false;
	MemoryContextReset(settings_cxt);
	digest_settings(&now);
	search_path_seen = GetOverrideSearchPath(settings_cxt);
	/* memcpy, so the padding compared above is copied too */
	memcpy(&settings_seen, &now, sizeof(now));
	settings_seen_valid = true;
	return settings_digest;
}

/*
 * idem_statement_check_settings
 *		Refuse a business statement that changed a setting of the request
 *		identity (search_path, TimeZone, ...), the role, or one of idem's
 *		own parameters (before: as they were when it started), with
 *		set_config(), SET or SET ROLE in a function it calls: every later
 *		request of the session (or transaction) would mean something else
 *		than the same call before it, or be keyed by another role, or be
 *		recorded differently.  The error aborts the transaction, which
 *		takes the change back.
 */
void
idem_statement_check_settings(IdemStatement *stmt,
							  const IdemSessionState *before)
{
	const char *changed;

	if (memcmp(current_settings(), stmt->settings, IDEM_FINGERPRINT_LEN) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("business statement changed a setting that is part of the request identity"),
				 errdetail("search_path, TimeZone, DateStyle and the other settings idem compares decide what every later request of the session means."),
				 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, "Change the setting before the call, or in a SET clause of the function the statement calls, which restores it on exit.")));
	changed = idem_session_state_changed(before);
	if (changed != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("business statement changed setting \"%s\"", changed),
				 errdetail("The role and the idem.* settings decide whose keys every later request of the session uses and what idem records for it."),
				 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, "Change the setting before the call, or in a SET clause of the function the statement calls, which restores it on exit.")));
}

/* ---------------------------------------------------------------------
 * Validation
 * ---------------------------------------------------------------------
 */

/*
 * Report a parse error inside the business statement the way PL/pgSQL
 * and SPI do: the position points into the statement, which is shown as
 * the internal query, not into the caller's outer query.
 */
static void
statement_error_callback(void *arg)
{
	const char *sql = (const char *) arg;
	int			pos = geterrposition();

	if (pos > 0)
	{
		errposition(0);
		internalerrposition(pos);
		internalerrquery(sql);
	}
}

static bool
select_has_into(SelectStmt *s)
{
	if (s == NULL)
		return false;
	if (s->intoClause != NULL)
		return true;
	/* INTO on a set operation sits on one of its leaves */
	return select_has_into(s->larg) || select_has_into(s->rarg);
}

static void
reject_select_into(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("idem_execute() does not run SELECT INTO"),
			 errdetail("SELECT INTO creates a table."),
			 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, "Use INSERT INTO ... SELECT.")));
}

/*
 * Reject anything but one SELECT, INSERT, UPDATE, DELETE or MERGE, and
 * return its command tag.  Checked on the raw parse tree so that a replay
 * validates exactly as a first execution does, without planning; the
 * analyzed statement is checked again before its first execution
 * (check_analyzed).
 */
static const char *
check_statement(const char *sql)
{
	List	   *parsetree = raw_parser((sql), RAW_PARSE_DEFAULT);
	RawStmt    *raw;
	Node	   *stmt;

	if (list_length(parsetree) != 1)
		ereport(ERROR,
				(errcode(ERRCODE_SYNTAX_ERROR),
				 errmsg("idem_execute() requires exactly one SQL statement"),
				 errdetail_plural("The statement string contains %d statement.",
								  "The statement string contains %d statements.",
								  list_length(parsetree), list_length(parsetree)),
				 idem_errhint(ERRCODE_SYNTAX_ERROR, "Make one idem_execute() call per statement, each with its own key, or combine the writes in one statement with data-modifying WITH clauses.")));

	raw = linitial_node(RawStmt, parsetree);
	stmt = raw->stmt;

	switch (nodeTag(stmt))
	{
		case T_InsertStmt:
		case T_UpdateStmt:
		case T_DeleteStmt:
		case T_MergeStmt:
			break;
		case T_SelectStmt:
			if (select_has_into((SelectStmt *) stmt))
				reject_select_into();
			break;
		case T_TransactionStmt:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
					 errmsg("transaction control is not allowed in idem_execute()"),
					 errdetail("idem_execute() runs inside the caller's transaction, which commits or rolls back the key record together with the business write."),
					 idem_errhint(ERRCODE_INVALID_TRANSACTION_TERMINATION, NULL)));
			break;
		case T_CopyStmt:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("COPY is not allowed in idem_execute()"),
					 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, NULL)));
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("idem_execute() does not run %s statements",
							CreateCommandName(stmt)),
					 errdetail("Only SELECT, INSERT, UPDATE, DELETE and MERGE can be run with an idempotency key."),
					 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, NULL)));
	}

	return CreateCommandName(stmt);
}

/*
 * The ground truth: what the parser made of the statement.  Parse analysis
 * turns SELECT INTO, however it is spelled, into CREATE TABLE AS; only a
 * statement that stays a plain query may run.  Utility commands that rules
 * put in place of the statement are the table owner's business and pass.
 */
static void
check_analyzed(SPIPlanPtr plan)
{
	List	   *sources = SPI_plan_get_plan_sources(plan);
	ListCell   *lc;

	foreach(lc, sources)
	{
		CachedPlanSource *ps = (CachedPlanSource *) lfirst(lc);
		ListCell   *lq;

		foreach(lq, ps->query_list)
		{
			Query	   *q = lfirst_node(Query, lq);

			if (q->commandType != CMD_UTILITY || q->querySource != QSRC_ORIGINAL)
				continue;
			if (IsA(q->utilityStmt, CreateTableAsStmt))
				reject_select_into();
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("idem_execute() does not run %s statements",
							CreateCommandName(q->utilityStmt)),
					 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, NULL)));
		}
	}
}

/*
 * Hash the token stream of sql into digest and return the highest $n it
 * references.  Identifiers come back case-folded and string literals
 * de-quoted from the scanner, so only what the parser would see counts.
 */
static int
digest_tokens(const char *sql, uint8 *digest)
{
	core_yy_extra_type yyextra;
	core_yyscan_t yyscanner;
	core_YYSTYPE yylval;
	YYLTYPE		yylloc;
	IdemSha256	sha;
	idem_sha256_ctx ctx = idem_sha256_begin(&sha);
	int			maxparam = 0;

	yyscanner = scanner_init(sql, &yyextra, &ScanKeywords, ScanKeywordTokens);

	for (;;)
	{
		int			tok = core_yylex(&yylval, &yylloc, yyscanner);
		int32		tok32;

		if (tok == 0)
			break;
		/* the same number on every major (src/request/tokens.c) */
		tok = idem_token_15(tok);
		tok32 = tok;
		idem_sha256_update(ctx, &tok32, sizeof(tok32));

		switch (tok)
		{
			case IDEM_TOK_IDENT:
			case IDEM_TOK_UIDENT:
			case IDEM_TOK_FCONST:
			case IDEM_TOK_SCONST:
			case IDEM_TOK_USCONST:
			case IDEM_TOK_BCONST:
			case IDEM_TOK_XCONST:
			case IDEM_TOK_OP:
				/* length first, so adjacent tokens cannot run together */
				update_str(ctx, yylval.str);
				break;
			case IDEM_TOK_NEW_KEYWORD:
				update_str(ctx, yylval.keyword);
				break;
			case IDEM_TOK_ICONST:
			case IDEM_TOK_PARAM:
				idem_sha256_update(ctx, &yylval.ival, sizeof(yylval.ival));
				if (tok == IDEM_TOK_PARAM)
					maxparam = Max(maxparam, yylval.ival);
				break;
			default:
				/* keywords and punctuation: the token number says it all */
				break;
		}
	}

	scanner_finish(yyscanner);
	idem_sha256_end(ctx, digest);
	return maxparam;
}

static void
check_parameter_count(int maxparam, int nargs)
{
	if (maxparam > nargs)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_PARAMETER),
				 errmsg("there is no parameter $%d", maxparam),
				 errdetail_plural("idem_execute() was given %d argument after the statement.",
								  "idem_execute() was given %d arguments after the statement.",
								  nargs, nargs),
				 idem_errhint(ERRCODE_UNDEFINED_PARAMETER, NULL)));
	if (maxparam < nargs)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_PARAMETER),
				 errmsg_plural("idem_execute() was given %d argument but the statement uses %d",
							   "idem_execute() was given %d arguments but the statement uses %d",
							   nargs, nargs, maxparam),
				 idem_errhint(ERRCODE_UNDEFINED_PARAMETER, "Reference every argument as $1, $2, ... in the statement.")));
}

/* ---------------------------------------------------------------------
 * The statement cache
 * ---------------------------------------------------------------------
 */

static void
relations_inval(Datum arg, Oid relid)
{
	relations_epoch++;
}

static void
routines_inval(Datum arg, int cacheid, uint32 hashvalue)
{
	relations_epoch++;
}

static void
types_inval(Datum arg, int cacheid, uint32 hashvalue)
{
	types_epoch++;
}

static void
statement_cache_init(void)
{
	HASHCTL		ctl;

	statement_cache_cxt = AllocSetContextCreate(TopMemoryContext,
												"idem statement cache",
												ALLOCSET_DEFAULT_SIZES);
	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(StatementCacheEntry);
	ctl.hcxt = statement_cache_cxt;
	statement_cache = hash_create("idem statements", 256, &ctl,
								  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	CacheRegisterRelcacheCallback(relations_inval, (Datum) 0);
	CacheRegisterSyscacheCallback(PROCOID, routines_inval, (Datum) 0);
	CacheRegisterSyscacheCallback(OPEROID, routines_inval, (Datum) 0);
	/* a schema's rename is settings_namespace_inval()'s too */
	CacheRegisterSyscacheCallback(TYPEOID, types_inval, (Datum) 0);
}

static uint64
statement_hashkey(const char *sql, int nargs, Oid *argtypes)
{
	uint64		h;

	h = hash_bytes_extended((const unsigned char *) sql, strlen(sql),
							settings_hash);
	if (nargs > 0)
		h ^= hash_bytes_extended((const unsigned char *) argtypes,
								 nargs * sizeof(Oid), h);
	return h;
}

static bool
statement_matches(IdemStatement *stmt, const char *sql, int nargs,
				  Oid *argtypes, const uint8 *settings)
{
	return stmt->nargs == nargs &&
		memcmp(stmt->settings, settings, IDEM_FINGERPRINT_LEN) == 0 &&
		strcmp(stmt->sql, sql) == 0 &&
		(nargs == 0 ||
		 memcmp(stmt->argtypes, argtypes, nargs * sizeof(Oid)) == 0);
}

/* The stable name of an argument's declared type: a built-in's OID. */
static char *
arg_typident(Oid typid)
{
	return typid < FirstGenbkiObjectId ? psprintf("%u", typid)
		: format_type_be_qualified(typid);
}

/*
 * Decide how values of typid enter the fingerprint.  Built-in base types
 * are hashed by their bytes, which are exact and independent of every
 * session setting; anything else (domains, arrays, records, enums, ranges,
 * types defined in the database) by hash_datum().
 */
static void
describe_arg(Oid typid, ArgHashInfo *info)
{
	int16		typlen;
	bool		typbyval;
	Oid			basetype = getBaseType(typid);

	get_typlenbyval(basetype, &typlen, &typbyval);
	info->typlen = typlen;
	info->typbyval = typbyval;
	info->basetype = basetype;
	info->numeric_typmod = -1;
	info->typident = arg_typident(typid);
	info->complex = basetype != typid || basetype >= FirstGenbkiObjectId ||
		get_typtype(basetype) != TYPTYPE_BASE ||
		OidIsValid(get_element_type(basetype)) || basetype == RECORDOID;
}

static IdemStatement *
statement_create(uint64 hashkey, const char *sql, int nargs, Oid *argtypes,
				 const uint8 *settings)
{
	MemoryContext cxt;
	MemoryContext oldcxt;
	IdemStatement *stmt;
	const char *command;
	uint8		digest[IDEM_FINGERPRINT_LEN];
	int			maxparam;
	ErrorContextCallback errcallback;

	/* validate first, so a bad statement allocates nothing that lives on */
	errcallback.callback = statement_error_callback;
	errcallback.arg = (void *) sql;
	errcallback.previous = error_context_stack;
	error_context_stack = &errcallback;
	command = check_statement(sql);
	maxparam = digest_tokens(sql, digest);
	error_context_stack = errcallback.previous;
	check_parameter_count(maxparam, nargs);

	/*
	 * Built under the caller's context and moved into the cache only when
	 * complete, as the plan cache does: an error half-way (a type dropped
	 * meanwhile) then frees it with the caller's memory.
	 */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "idem statement",
								ALLOCSET_SMALL_SIZES);
	oldcxt = MemoryContextSwitchTo(cxt);

	stmt = palloc0(sizeof(IdemStatement));
	stmt->hashkey = hashkey;
	stmt->sql = pstrdup(sql);
	stmt->nargs = nargs;
	stmt->command = pstrdup(command);
	memcpy(stmt->digest, digest, sizeof(digest));
	memcpy(stmt->settings, settings, IDEM_FINGERPRINT_LEN);
	statement_ident(stmt);
	stmt->cxt = cxt;
	stmt->typident_epoch = types_epoch;
	if (nargs > 0)
	{
		stmt->argtypes = palloc(nargs * sizeof(Oid));
		memcpy(stmt->argtypes, argtypes, nargs * sizeof(Oid));
		stmt->arginfo = palloc0(nargs * sizeof(ArgHashInfo));
		for (int i = 0; i < nargs; i++)
		{
			describe_arg(argtypes[i], &stmt->arginfo[i]);
			stmt->has_numeric |= argtypes[i] == NUMERICOID;
		}
	}
	MemoryContextSwitchTo(oldcxt);
	MemoryContextSetParent(cxt, statement_cache_cxt);
	stmt->bytes = MemoryContextMemAllocated(cxt, true);
	return stmt;
}

/*
 * What every version 2 fingerprint of this statement starts with, hashed
 * once here so that a call hashes 32 bytes instead of 80.
 */
static void
statement_ident(IdemStatement *stmt)
{
	IdemSha256	sha;
	idem_sha256_ctx ctx = idem_sha256_begin(&sha);

	idem_sha256_update(ctx, FINGERPRINT_V2_TAG, sizeof(FINGERPRINT_V2_TAG));
	idem_sha256_update(ctx, stmt->digest, IDEM_FINGERPRINT_LEN);
	idem_sha256_update(ctx, stmt->settings, IDEM_FINGERPRINT_LEN);
	idem_sha256_end(ctx, stmt->ident);
}

static void
statement_free(IdemStatement *stmt)
{
	if (stmt->plan)
		SPI_freeplan(stmt->plan);
	MemoryContextDelete(stmt->cxt);
}

/* What a statement costs: its own context plus its kept plan's. */
static Size
statement_measure(IdemStatement *stmt)
{
	Size		bytes = MemoryContextMemAllocated(stmt->cxt, true);
	ListCell   *lc;

	if (stmt->plan == NULL)
		return bytes;
	foreach(lc, SPI_plan_get_plan_sources(stmt->plan))
	{
		CachedPlanSource *ps = (CachedPlanSource *) lfirst(lc);

		bytes += MemoryContextMemAllocated(ps->context, true);
		if (ps->gplan)
			bytes += MemoryContextMemAllocated(ps->gplan->context, true);
	}
	return bytes;
}

static bool
statement_cache_over(void)
{
	return statement_count > idem_statement_cache_size ||
		statement_bytes > (Size) idem_statement_cache_memory * 1024;
}

/* Drop least recently used, unpinned entries beyond the configured bounds. */
static void
statement_cache_trim(void)
{
	dlist_node *cur = statement_lru.head.prev;

	/* walk from the tail (least recently used); the list is circular */
	while (statement_cache_over() && cur != &statement_lru.head)
	{
		dlist_node *prev = cur->prev;
		IdemStatement *victim = dlist_container(IdemStatement, lru, cur);

		if (victim->pins == 0)
		{
			dlist_delete(&victim->lru);
			hash_search(statement_cache, &victim->hashkey, HASH_REMOVE, NULL);
			statement_count--;
			statement_bytes -= victim->bytes;
			statement_free(victim);
		}
		cur = prev;
	}
}

/*
 * idem_statement_acquire
 *		Find or create the statement for (sql, argtypes) under the current
 *		settings and pin it.
 *
 * Raises the statement's validation error, if any.  Every successful call
 * must be paired with idem_statement_release(), also on error.
 */
IdemStatement *
idem_statement_acquire(const char *sql, int nargs, Oid *argtypes)
{
	const uint8 *settings = current_settings();
	uint64		hashkey = statement_hashkey(sql, nargs, argtypes);
	StatementCacheEntry *entry;
	IdemStatement *stmt;
	bool		found;

	if (statement_cache == NULL)
		statement_cache_init();

	entry = hash_search(statement_cache, &hashkey, HASH_FIND, NULL);
	if (entry != NULL)
	{
		if (statement_matches(entry->stmt, sql, nargs, argtypes, settings))
		{
			stmt = entry->stmt;
			dlist_move_head(&statement_lru, &stmt->lru);
			stmt->pins++;
			return stmt;
		}

		/* a 64-bit hash collision: serve this one uncached */
		stmt = statement_create(hashkey, sql, nargs, argtypes, settings);
		stmt->pins = 1;
		return stmt;
	}

	stmt = statement_create(hashkey, sql, nargs, argtypes, settings);
	stmt->pins = 1;
	if (stmt->bytes > (Size) idem_statement_cache_memory * 1024)
		return stmt;			/* larger than the whole cache: transient */
	stmt->cached = true;
	entry = hash_search(statement_cache, &hashkey, HASH_ENTER, &found);
	entry->stmt = stmt;
	dlist_push_head(&statement_lru, &stmt->lru);
	statement_count++;
	statement_bytes += stmt->bytes;
	statement_cache_trim();
	return stmt;
}

void
idem_statement_release(IdemStatement *stmt)
{
	Assert(stmt->pins > 0);
	stmt->pins--;
	if (!stmt->cached)
	{
		if (stmt->pins == 0)
			statement_free(stmt);
	}
	else if (stmt->resized)
	{
		Size		bytes = statement_measure(stmt);

		statement_bytes += bytes - stmt->bytes;
		stmt->bytes = bytes;
		stmt->resized = false;
	}
	statement_cache_trim();
}

const char *
idem_statement_command(IdemStatement *stmt)
{
	return stmt->command;
}

/*
 * idem_statement_plan
 *		The kept plan, prepared on first use.  Caller is connected to SPI.
 */
SPIPlanPtr
idem_statement_plan(IdemStatement *stmt)
{
	if (stmt->plan == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(stmt->sql, stmt->nargs, stmt->argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for idem statement: %s",
				 SPI_result_code_string(SPI_result));
		if (!stmt->plan_checked)
		{
			check_analyzed(plan);
			stmt->plan_checked = true;
		}
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		stmt->plan = plan;
	}
	stmt->resized = true;
	return stmt->plan;
}

/*
 * Errors that say the statement cannot be analyzed with its untyped
 * parameters open (a missing table, an ambiguous operator, a literal of the
 * wrong type), which preparing it reports again if they stand.  Anything
 * else (a cancel, a timeout, out of memory, a deadlock) is not about the
 * statement and must not be swallowed.
 */
static bool
is_analysis_error(int sqlerrcode)
{
	int			category = ERRCODE_TO_CATEGORY(sqlerrcode);

	return category == ERRCODE_SYNTAX_ERROR_OR_ACCESS_RULE_VIOLATION ||
		category == ERRCODE_DATA_EXCEPTION ||
		category == ERRCODE_FEATURE_NOT_SUPPORTED;
}

/*
 * Parse analysis of a validated statement, in a subtransaction: the query,
 * or NULL when the statement cannot be analyzed now (a missing table, an
 * ambiguous operator).  Parameters whose *ptypes entry is InvalidOid are
 * open, and their types are filled in, as parse_analyze_varparams() does.
 */
static Query *
analyze_statement(const char *sql, Oid **ptypes, int *nparams)
{
	RawStmt    *raw = linitial_node(RawStmt, pg_parse_query(sql));
	IdemSubxact sx;
	Query	   *query = NULL;

	idem_subxact_begin(&sx);
	PG_TRY();
	{
		query = parse_analyze_varparams(raw, sql, ptypes, nparams, NULL);
		idem_subxact_end(&sx, true);
	}
	PG_CATCH();
	{
		ErrorData  *edata = idem_subxact_abort(&sx);

		if (!is_analysis_error(edata->sqlerrcode))
			ReThrowError(edata);
		FreeErrorData(edata);
		query = NULL;
	}
	PG_END_TRY();
	return query;
}

/*
 * Analyze a validated statement with its untyped parameters open.  False
 * when it cannot be analyzed that way; the untyped ones are then text.
 */
static bool
infer_types(const char *sql, int nargs, Oid *types)
{
	Oid		   *ptypes = palloc(nargs * sizeof(Oid));
	int			nparams = nargs;
	bool		inferred;

	for (int i = 0; i < nargs; i++)
		ptypes[i] = types[i] == UNKNOWNOID ? InvalidOid : types[i];
	inferred = analyze_statement(sql, &ptypes, &nparams) != NULL;

	for (int i = 0; i < nargs; i++)
	{
		if (types[i] != UNKNOWNOID)
			continue;
		types[i] = TEXTOID;
		if (inferred && i < nparams && OidIsValid(ptypes[i]) &&
			ptypes[i] != UNKNOWNOID)
			types[i] = ptypes[i];
	}
	pfree(ptypes);
	return inferred;
}

/*
 * idem_statement_infer_types
 *		Give each untyped argument the type the statement gives its $n, as
 *		PREPARE without types does.
 *
 * types[i] is the argument's own type, or UNKNOWNOID for an argument sent
 * without one (a literal without a cast, a driver parameter of type 0);
 * those are replaced by the inferred type, or text where the statement
 * leaves it open.  If the statement cannot be analyzed with them open (an
 * operator that becomes ambiguous, a missing table), they are text, as
 * without inference, and the statement's own error, if any, comes when it
 * is prepared.  Raises the statement's validation errors, and any error of
 * the analysis that is not about the statement (a cancel, out of memory).
 *
 * The answer is kept in the statement cache under the untyped signature,
 * so a driver's repeated call parses and analyzes its statement once per
 * backend, until a relation, function or operator changes: unlike a
 * prepared statement's parameter types, it follows a column whose type
 * changed, or a function replaced by one with other parameter types, as a
 * new backend would, rather than make this backend's calls another request
 * or fail.  An analysis that failed is not kept, so a statement that ran
 * before its table existed is inferred again.
 */
void
idem_statement_infer_types(const char *sql, int nargs, Oid *types)
{
	IdemStatement *stmt = idem_statement_acquire(sql, nargs, types);

	PG_TRY();
	{
		if (stmt->inferred == NULL || stmt->inferred_epoch != relations_epoch)
		{
			Oid		   *inferred = palloc(nargs * sizeof(Oid));
			uint64		epoch = relations_epoch;

			memcpy(inferred, types, nargs * sizeof(Oid));
			if (infer_types(sql, nargs, inferred))
			{
				if (stmt->inferred == NULL)
					stmt->inferred = MemoryContextAlloc(stmt->cxt,
														nargs * sizeof(Oid));
				memcpy(stmt->inferred, inferred, nargs * sizeof(Oid));
				stmt->inferred_epoch = epoch;
				stmt->resized = true;
			}
			else if (stmt->inferred != NULL)
			{
				pfree(stmt->inferred);
				stmt->inferred = NULL;
			}
			memcpy(types, inferred, nargs * sizeof(Oid));
			pfree(inferred);
		}
		else
			memcpy(types, stmt->inferred, nargs * sizeof(Oid));
	}
	PG_FINALLY();
	{
		idem_statement_release(stmt);
	}
	PG_END_TRY();
}

/* ---------------------------------------------------------------------
 * Fingerprints
 * ---------------------------------------------------------------------
 */

static void
update_bytes(idem_sha256_ctx ctx, const void *data, uint32 len)
{
	idem_sha256_update(ctx, &len, sizeof(len));
	idem_sha256_update(ctx, data, len);
}

/*
 * typlen bytes of a pass-by-value Datum, whatever the Datum word holds.
 * Floats compare as SQL compares them: every NaN is one value.
 */
static void
update_byval(idem_sha256_ctx ctx, Oid typid, Datum value, int16 typlen)
{
	char		buf[sizeof(Datum)];

	Assert(typlen > 0 && typlen <= sizeof(Datum));
	if (typid == FLOAT8OID && isnan(DatumGetFloat8(value)))
		value = Float8GetDatum(get_float8_nan());
	else if (typid == FLOAT4OID && isnan(DatumGetFloat4(value)))
		value = Float4GetDatum(get_float4_nan());
	store_att_byval(buf, value, typlen);
	idem_sha256_update(ctx, buf, typlen);
}

static void
update_varlena(idem_sha256_ctx ctx, Datum value)
{
	struct varlena *v = PG_DETOAST_DATUM_PACKED(value);

	update_bytes(ctx, VARDATA_ANY(v), VARSIZE_ANY_EXHDR(v));
	if ((Pointer) v != DatumGetPointer(value))
		pfree(v);
}

/* A type nested in a value: a built-in by OID, any other by name. */
static void
update_typident(idem_sha256_ctx ctx, Oid typid)
{
	/* the tag keeps an OID's bytes from reading as a name's length */
	char		tag = typid < FirstGenbkiObjectId ? 'o' : 'n';

	idem_sha256_update(ctx, &tag, 1);
	if (tag == 'o')
		idem_sha256_update(ctx, &typid, sizeof(typid));
	else
	{
		char	   *name = format_type_be_qualified(typid);

		update_str(ctx, name);
		pfree(name);
	}
}

static void
hash_array_value(idem_sha256_ctx ctx, Datum value)
{
	ArrayType  *arr = DatumGetArrayTypeP(value);
	Oid			elemtype = ARR_ELEMTYPE(arr);
	int32		ndim = ARR_NDIM(arr);
	ArrayIterator it;
	Datum		elem;
	bool		isnull;

	update_typident(ctx, elemtype);
	idem_sha256_update(ctx, &ndim, sizeof(ndim));
	idem_sha256_update(ctx, ARR_DIMS(arr), ndim * sizeof(int));
	idem_sha256_update(ctx, ARR_LBOUND(arr), ndim * sizeof(int));

	/*
	 * Element by element, not unpacked first: an argument of millions of
	 * elements would take a pointer and a flag per element more, and the
	 * loop must be cancellable.
	 */
	it = array_create_iterator(arr, 0, NULL);
	while (array_iterate(it, &elem, &isnull))
	{
		char		flag = isnull;

		CHECK_FOR_INTERRUPTS();
		idem_sha256_update(ctx, &flag, 1);
		if (!isnull)
			hash_datum(ctx, elemtype, elem);
	}
	array_free_iterator(it);
}

/*
 * A record field by field.  An anonymous record's field names are hashed
 * too: to_jsonb() and row_to_json() write them, so (25 AS amount) and
 * (25 AS refund_id) are different requests.  A composite type's fields are
 * named by the type, whose name identifies it already.
 */
static void
hash_record_value(idem_sha256_ctx ctx, Datum value)
{
	HeapTupleHeader td = DatumGetHeapTupleHeader(value);
	bool		anonymous = HeapTupleHeaderGetTypeId(td) == RECORDOID;
	TupleDesc	tupdesc;
	HeapTupleData tuple;
	Datum	   *values;
	bool	   *nulls;
	int32		nfields = 0;

	tupdesc = lookup_rowtype_tupdesc(HeapTupleHeaderGetTypeId(td),
									 HeapTupleHeaderGetTypMod(td));
	tuple.t_len = HeapTupleHeaderGetDatumLength(td);
	ItemPointerSetInvalid(&tuple.t_self);
	tuple.t_tableOid = InvalidOid;
	tuple.t_data = td;

	values = palloc(tupdesc->natts * sizeof(Datum));
	nulls = palloc(tupdesc->natts * sizeof(bool));
	heap_deform_tuple(&tuple, tupdesc, values, nulls);

	for (int i = 0; i < tupdesc->natts; i++)
		if (!TupleDescAttr(tupdesc, i)->attisdropped)
			nfields++;
	idem_sha256_update(ctx, &nfields, sizeof(nfields));
	for (int i = 0; i < tupdesc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(tupdesc, i);
		char		isnull = nulls[i];

		if (att->attisdropped)
			continue;
		if (anonymous)
			update_str(ctx, NameStr(att->attname));
		update_typident(ctx, att->atttypid);
		idem_sha256_update(ctx, &isnull, 1);
		if (!isnull)
			hash_datum(ctx, att->atttypid, values[i]);
	}
	pfree(values);
	pfree(nulls);
	ReleaseTupleDesc(tupdesc);
}

/* A range by its flags and bounds, each bound as its subtype's value. */
static void
hash_range_value(idem_sha256_ctx ctx, TypeCacheEntry *typcache, RangeType *range)
{
	RangeBound	lower;
	RangeBound	upper;
	bool		empty;
	char		flags[5];

	range_deserialize(typcache, range, &lower, &upper, &empty);
	flags[0] = empty;
	flags[1] = lower.infinite;
	flags[2] = lower.inclusive;
	flags[3] = upper.infinite;
	flags[4] = upper.inclusive;
	idem_sha256_update(ctx, flags, sizeof(flags));
	if (empty)
		return;
	if (!lower.infinite)
		hash_datum(ctx, typcache->rngelemtype->type_id, lower.val);
	if (!upper.infinite)
		hash_datum(ctx, typcache->rngelemtype->type_id, upper.val);
}

/*
 * A base type's value, built in or defined in the database, by its bytes:
 * exact, and unlike text output or a send function (whose text parts follow
 * client_encoding) independent of every setting.
 */
static void
hash_scalar(idem_sha256_ctx ctx, Oid basetype, int16 typlen, bool typbyval,
			Datum value)
{
	if (typbyval)
		update_byval(ctx, basetype, value, typlen);
	else if (typlen > 0)
		idem_sha256_update(ctx, DatumGetPointer(value), typlen);
	else if (typlen == -1)
		update_varlena(ctx, value);
	else
		update_str(ctx, DatumGetCString(value));
}

/*
 * Hash one value of typid in a form that no session setting changes.
 */
static void
hash_datum(idem_sha256_ctx ctx, Oid typid, Datum value)
{
	Oid			basetype;
	int16		typlen;
	bool		typbyval;
	char		typtype;

	check_stack_depth();

	basetype = getBaseType(typid);
	typtype = get_typtype(basetype);
	get_typlenbyval(basetype, &typlen, &typbyval);

	if (typlen == -1 && OidIsValid(get_element_type(basetype)))
		hash_array_value(ctx, value);
	else if (typtype == TYPTYPE_COMPOSITE || basetype == RECORDOID)
		hash_record_value(ctx, value);
	else if (typtype == TYPTYPE_ENUM)
	{
		/* the label, not the OID a restore renumbers */
		char	   *label = OidOutputFunctionCall(F_ENUM_OUT, value);

		update_str(ctx, label);
		pfree(label);
	}
	else if (typtype == TYPTYPE_RANGE)
		hash_range_value(ctx, lookup_type_cache(basetype, TYPECACHE_RANGE_INFO),
				   DatumGetRangeTypeP(value));
	else if (typtype == TYPTYPE_MULTIRANGE)
	{
		TypeCacheEntry *typcache = lookup_type_cache(basetype,
													 TYPECACHE_MULTIRANGE_INFO);
		RangeType **ranges;
		int32		count;

		multirange_deserialize(typcache->rngtype,
							   DatumGetMultirangeTypeP(value), &count, &ranges);
		idem_sha256_update(ctx, &count, sizeof(count));
		for (int i = 0; i < count; i++)
		{
			CHECK_FOR_INTERRUPTS();
			hash_range_value(ctx, typcache->rngtype, ranges[i]);
		}
	}
	else
		hash_scalar(ctx, basetype, typlen, typbyval, value);
}

/* How the statement uses each argument: numeric(p,s) typmods */
typedef struct ParamUses
{
	int			nargs;
	int32	   *typmod;			/* NUMERIC_USE_* or the one typmod */
} ParamUses;

#define NUMERIC_USE_NONE	(-1)	/* not seen yet */
#define NUMERIC_USE_EXACT	(-2)	/* seen as it is, or with two typmods */

static void
note_numeric_use(ParamUses *uses, int paramid, int32 typmod)
{
	int32	   *slot;

	if (paramid < 1 || paramid > uses->nargs)
		return;
	slot = &uses->typmod[paramid - 1];
	if (*slot == NUMERIC_USE_NONE)
		*slot = typmod;
	else if (*slot != typmod)
		*slot = NUMERIC_USE_EXACT;
}

static bool
numeric_uses_walker(Node *node, ParamUses *uses)
{
	if (node == NULL)
		return false;
	if (IsA(node, Query))
		return query_tree_walker((Query *) node, numeric_uses_walker, uses, 0);
	if (IsA(node, FuncExpr) &&
		((FuncExpr *) node)->funcid == F_NUMERIC_NUMERIC_INT4 &&
		list_length(((FuncExpr *) node)->args) == 2)
	{
		Node	   *arg = linitial(((FuncExpr *) node)->args);
		Node	   *typmod = lsecond(((FuncExpr *) node)->args);

		/* a column's numeric(p,s): the length coercion of an assignment */
		if (IsA(arg, Param) && ((Param *) arg)->paramkind == PARAM_EXTERN &&
			IsA(typmod, Const) && !((Const *) typmod)->constisnull &&
			DatumGetInt32(((Const *) typmod)->constvalue) >= (int32) VARHDRSZ)
		{
			note_numeric_use(uses, ((Param *) arg)->paramid,
							 DatumGetInt32(((Const *) typmod)->constvalue));
			return false;
		}
	}
	if (IsA(node, Param) && ((Param *) node)->paramkind == PARAM_EXTERN)
	{
		note_numeric_use(uses, ((Param *) node)->paramid, NUMERIC_USE_EXACT);
		return false;
	}
	return expression_tree_walker(node, numeric_uses_walker, uses);
}

/*
 * Find, for each numeric argument, the numeric(p,s) through which the
 * statement uses it, if it uses it only through one: an INSERT or UPDATE
 * of a numeric(12,2) column that nothing else reads the argument for.
 * The statement then cannot tell 25, 25.00 and 0.25e2 apart (it stores and
 * returns 25.00 for each), so they are one request; an argument used
 * otherwise (RETURNING $2, $2::text, a comparison, an unconstrained
 * numeric column) keeps its scale.  A statement that cannot be analyzed
 * now (a missing table) keeps every scale.
 */
static void
find_numeric_uses(IdemStatement *stmt)
{
	ParamUses	uses;
	Oid		   *ptypes = palloc(stmt->nargs * sizeof(Oid));
	int			nparams = stmt->nargs;
	Query	   *query;
	/* before the analysis: an invalidation during it is not missed */
	uint64		epoch = relations_epoch;

	uses.nargs = stmt->nargs;
	uses.typmod = palloc(stmt->nargs * sizeof(int32));
	for (int i = 0; i < stmt->nargs; i++)
		uses.typmod[i] = NUMERIC_USE_NONE;
	memcpy(ptypes, stmt->argtypes, stmt->nargs * sizeof(Oid));
	query = analyze_statement(stmt->sql, &ptypes, &nparams);
	if (query != NULL)
		(void) query_tree_walker(query, numeric_uses_walker, &uses, 0);
	else
		for (int i = 0; i < stmt->nargs; i++)
			uses.typmod[i] = NUMERIC_USE_EXACT;

	for (int i = 0; i < stmt->nargs; i++)
		stmt->arginfo[i].numeric_typmod =
			stmt->argtypes[i] == NUMERICOID && uses.typmod[i] >= 0 ?
			uses.typmod[i] : -1;
	stmt->uses_epoch = epoch;
	pfree(uses.typmod);
	pfree(ptypes);
}

/*
 * A numeric value as a numeric(p,s) typmod stores it: rounded to the
 * scale.  An overflow of the precision is the statement's error to raise.
 */
static Datum
numeric_as_stored(Datum value, int32 typmod)
{
	int32		scale = (((typmod - VARHDRSZ) & 0x7ff) ^ 1024) - 1024;

	return DirectFunctionCall2(numeric_round, value, Int32GetDatum(scale));
}

/*
 * Look the names of stmt's argument types up again after a type or schema
 * changed.  The epoch is read first: an invalidation that arrives while
 * the names are read makes the next call read them again.
 */
static void
name_arg_types(IdemStatement *stmt)
{
	uint64		epoch = types_epoch;
	MemoryContext oldcxt = MemoryContextSwitchTo(stmt->cxt);

	for (int i = 0; i < stmt->nargs; i++)
	{
		ArgHashInfo *info = &stmt->arginfo[i];
		char	   *name = arg_typident(stmt->argtypes[i]);

		pfree(info->typident);
		info->typident = name;
	}
	MemoryContextSwitchTo(oldcxt);
	stmt->resized = true;
	stmt->typident_epoch = epoch;
}

/*
 * idem_statement_fingerprint
 *		Compute the request fingerprint (version 3) of req, a call of stmt.
 */
void
idem_statement_fingerprint(IdemStatement *stmt, IdemRequest *req,
						   uint8 *fingerprint)
{
	IdemSha256	sha;
	idem_sha256_ctx ctx = idem_sha256_begin(&sha);
	int32		nargs = req->nargs;

	if (stmt->has_numeric && stmt->uses_epoch != relations_epoch)
		find_numeric_uses(stmt);
	if (stmt->typident_epoch != types_epoch)
		name_arg_types(stmt);

	idem_sha256_update(ctx, stmt->ident, IDEM_FINGERPRINT_LEN);
	idem_sha256_update(ctx, &nargs, sizeof(nargs));
	for (int i = 0; i < req->nargs; i++)
	{
		ArgHashInfo *info = &stmt->arginfo[i];
		char		isnull = req->nulls[i];
		Datum		value = req->values[i];

		update_str(ctx, info->typident);
		idem_sha256_update(ctx, &isnull, 1);
		if (isnull == 'n')
			continue;
		if (info->numeric_typmod >= 0)
			value = numeric_as_stored(value, info->numeric_typmod);
		if (info->complex)
			hash_datum(ctx, req->argtypes[i], value);
		else
			hash_scalar(ctx, info->basetype, info->typlen, info->typbyval,
						value);
	}
	idem_sha256_end(ctx, fingerprint);
}

/*
 * idem_statement_fingerprint_v2_same
 *		Whether req's version 3 fingerprint is the one idem 1.1 (version 2)
 *		computed.  Version 3 differs only in hashing an anonymous record's
 *		field names; such a record can arrive only as an argument of type
 *		record or record[] (no column, domain or range holds one).
 */
bool
idem_statement_fingerprint_v2_same(IdemRequest *req)
{
	for (int i = 0; i < req->nargs; i++)
		if (req->argtypes[i] == RECORDOID || req->argtypes[i] == RECORDARRAYOID)
			return false;
	return true;
}

/*
 * idem_statement_fingerprint_v1
 *		The fingerprint idem 1.0 recorded, for comparing a record it wrote.
 *
 * Version 1 ignored the session settings, hashed pass-by-value arguments
 * as the raw Datum word and everything outside the built-in scalars by its
 * text output.  Where that text form could make two different requests
 * look equal (domains, records, arrays of them, types defined in the
 * database) idem cannot tell whether a 1.0 record is this request, so it
 * returns false and the caller refuses rather than replay.
 */
bool
idem_statement_fingerprint_v1(IdemStatement *stmt, IdemRequest *req,
							  uint8 *fingerprint)
{
	IdemSha256	sha;
	idem_sha256_ctx ctx;
	int32		nargs = req->nargs;

	for (int i = 0; i < req->nargs; i++)
		if (stmt->arginfo[i].complex &&
			!(stmt->arginfo[i].basetype < FirstGenbkiObjectId &&
			  stmt->arginfo[i].basetype == req->argtypes[i] &&
			  get_typtype(req->argtypes[i]) == TYPTYPE_BASE &&
			  req->argtypes[i] != RECORDOID))
			return false;

	ctx = idem_sha256_begin(&sha);
	idem_sha256_update(ctx, stmt->digest, IDEM_FINGERPRINT_LEN);
	idem_sha256_update(ctx, &nargs, sizeof(nargs));
	for (int i = 0; i < req->nargs; i++)
	{
		ArgHashInfo *info = &stmt->arginfo[i];
		char		isnull = req->nulls[i];
		Datum		value = req->values[i];

		idem_sha256_update(ctx, info->typident, strlen(info->typident) + 1);
		idem_sha256_update(ctx, &isnull, 1);
		if (isnull == 'n')
			continue;
		if (info->typbyval)
			idem_sha256_update(ctx, &value, sizeof(Datum));
		else if (info->typlen > 0)
			idem_sha256_update(ctx, DatumGetPointer(value), info->typlen);
		else if (info->typlen == -2)
		{
			const char *s = DatumGetCString(value);

			idem_sha256_update(ctx, s, strlen(s) + 1);
		}
		else
		{
			/* varlena, and built-in arrays, which 1.0 hashed as bytes */
			update_varlena(ctx, value);
		}
	}
	idem_sha256_end(ctx, fingerprint);
	return true;
}

/*
 * idem_value_digest
 *		SHA-256 of a tag and one typed value, hashed as request arguments
 *		are: independent of every session setting, and of the OIDs a
 *		restore renumbers.  Tags keep digests made for different purposes
 *		apart.
 */
void
idem_value_digest(const char *tag, Oid typid, Datum value, uint8 *digest)
{
	IdemSha256	sha;
	idem_sha256_ctx ctx = idem_sha256_begin(&sha);

	update_str(ctx, tag);
	update_typident(ctx, typid);
	hash_datum(ctx, typid, value);
	idem_sha256_end(ctx, digest);
}
