/*-------------------------------------------------------------------------
 *
 * statement.c
 *		The business statements a backend has seen: validation, the
 *		request fingerprint, and a bounded cache of prepared plans.
 *
 * A statement is identified by its SQL text and its argument types.  The
 * first time a backend sees one it parses it once to check that it is a
 * single plannable statement, and hashes the core scanner's token stream;
 * both results are kept, so a replay costs neither a parse nor SPI.  The
 * plan is prepared lazily, on the first execution, and kept with
 * SPI_keepplan, so the plan cache revalidates it on DDL, search_path and
 * role changes like any other kept plan.
 *
 * The cache is an LRU of idem.statement_cache_size entries.  Entries in use
 * by a running idem_execute() (a business statement can itself call
 * idem_execute()) are pinned and never evicted.
 *
 * The fingerprint is SHA-256 over the token stream digest, the argument
 * count, and each argument's type identity and value.  Token streams make
 * whitespace, comments, keyword case and quoting style irrelevant while
 * every constant still counts (the query jumble of pg_stat_statements
 * ignores constants, so it cannot be used alone).
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/statement.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/transam.h"
#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "lib/ilist.h"
#include "nodes/parsenodes.h"
#include "parser/scanner.h"
#include "parser/gram.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "compat.h"
#include "idem.h"

/* How each argument's value enters the fingerprint. */
typedef enum ArgHashKind
{
	ARG_HASH_BYVAL,				/* the Datum itself */
	ARG_HASH_FIXED,				/* typlen bytes behind the pointer */
	ARG_HASH_VARLENA,			/* detoasted payload bytes */
	ARG_HASH_CSTRING,			/* NUL-terminated bytes */
	ARG_HASH_OUTPUT				/* the type's text output */
} ArgHashKind;

typedef struct ArgHashInfo
{
	ArgHashKind kind;
	int16		typlen;
	FmgrInfo	output;			/* ARG_HASH_OUTPUT only */
	char	   *typident;		/* stable name of the type */
} ArgHashInfo;

struct IdemStatement
{
	uint64		hashkey;		/* hash of sql and argtypes: the cache key */
	char	   *sql;
	int			nargs;
	Oid		   *argtypes;
	ArgHashInfo *arginfo;
	const char *command;		/* "INSERT", "SELECT", ... */
	uint8		digest[IDEM_FINGERPRINT_LEN];	/* of the token stream */
	SPIPlanPtr	plan;			/* NULL until first executed */
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

static HTAB *statement_cache = NULL;
static MemoryContext statement_cache_cxt = NULL;
static dlist_head statement_lru = DLIST_STATIC_INIT(statement_lru);
static int	statement_count = 0;

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
}

static uint64
statement_hashkey(const char *sql, int nargs, Oid *argtypes)
{
	uint64		h;

	h = hash_bytes_extended((const unsigned char *) sql, strlen(sql), 0);
	if (nargs > 0)
		h ^= hash_bytes_extended((const unsigned char *) argtypes,
								 nargs * sizeof(Oid), h);
	return h;
}

static bool
statement_matches(IdemStatement *stmt, const char *sql, int nargs,
				  Oid *argtypes)
{
	return stmt->nargs == nargs &&
		strcmp(stmt->sql, sql) == 0 &&
		(nargs == 0 ||
		 memcmp(stmt->argtypes, argtypes, nargs * sizeof(Oid)) == 0);
}

/*
 * Reject anything but one SELECT, INSERT, UPDATE, DELETE or MERGE, and
 * return its command tag.  Checked on the raw parse tree so that a replay
 * validates exactly as a first execution does, without planning.
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
				 errdetail("The statement string contains %d statements.",
						   list_length(parsetree)),
				 errhint("Make one idem_execute() call per statement, each with its own key, or combine the writes in one statement with data-modifying WITH clauses.")));

	raw = linitial_node(RawStmt, parsetree);
	stmt = raw->stmt;

	switch (nodeTag(stmt))
	{
		case T_InsertStmt:
		case T_UpdateStmt:
		case T_DeleteStmt:
#if PG_VERSION_NUM >= 150000
		case T_MergeStmt:
#endif
			break;
		case T_SelectStmt:
			if (((SelectStmt *) stmt)->intoClause == NULL)
				break;
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("idem_execute() does not run SELECT INTO"),
					 errhint("Use INSERT INTO ... SELECT.")));
			break;
		case T_TransactionStmt:
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_TERMINATION),
					 errmsg("transaction control is not allowed in idem_execute()"),
					 errdetail("idem_execute() runs inside the caller's transaction, which commits or rolls back the key record together with the business write.")));
			break;
		case T_CopyStmt:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("COPY is not allowed in idem_execute()")));
			break;
		default:
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("idem_execute() does not run %s statements",
							CreateCommandName(stmt)),
					 errdetail("Only SELECT, INSERT, UPDATE, DELETE and MERGE can be run with an idempotency key.")));
	}

	return CreateCommandName(stmt);
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
	idem_sha256_ctx ctx = idem_sha256_begin();
	int			maxparam = 0;

	yyscanner = scanner_init(sql, &yyextra, &ScanKeywords, ScanKeywordTokens);

	for (;;)
	{
		int			tok = core_yylex(&yylval, &yylloc, yyscanner);
		int32		tok32 = tok;

		if (tok == 0)
			break;
		idem_sha256_update(ctx, &tok32, sizeof(tok32));

		switch (tok)
		{
			case IDENT:
			case UIDENT:
			case FCONST:
			case SCONST:
			case USCONST:
			case BCONST:
			case XCONST:
			case Op:
				{
					/* length first, so adjacent tokens cannot run together */
					uint32		len = strlen(yylval.str);

					idem_sha256_update(ctx, &len, sizeof(len));
					idem_sha256_update(ctx, yylval.str, len);
					break;
				}
			case ICONST:
			case PARAM:
				idem_sha256_update(ctx, &yylval.ival, sizeof(yylval.ival));
				if (tok == PARAM)
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
				 errdetail("idem_execute() was given %d argument(s) after the statement.",
						   nargs)));
	if (maxparam < nargs)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_PARAMETER),
				 errmsg("idem_execute() was given %d argument(s) but the statement uses %d",
						nargs, maxparam),
				 errhint("Reference every argument as $1, $2, ... in the statement.")));
}

/*
 * Decide how values of typid enter the fingerprint.  Built-in scalar types
 * hash their binary form, which is exact and independent of DateStyle,
 * TimeZone or extra_float_digits.  Types defined in the database, and
 * records, whose binary forms embed OIDs that a restore renumbers, hash their text
 * output instead, so that the fingerprint survives a dump and restore.
 * (Arrays of built-in types are built-in types; their binary form names
 * only the built-in element type.)
 */
static void
describe_arg(Oid typid, ArgHashInfo *info)
{
	int16		typlen;
	bool		typbyval;
	char		typtype = get_typtype(typid);
	bool		builtin = typid < FirstGenbkiObjectId;

	get_typlenbyval(typid, &typlen, &typbyval);
	info->typlen = typlen;
	info->typident = builtin ? psprintf("%u", typid)
		: format_type_be_qualified(typid);

	if (!builtin || typtype != TYPTYPE_BASE || typid == RECORDOID)
	{
		Oid			outfunc;
		bool		isvarlena;

		info->kind = ARG_HASH_OUTPUT;
		getTypeOutputInfo(typid, &outfunc, &isvarlena);
		fmgr_info_cxt(outfunc, &info->output, CurrentMemoryContext);
	}
	else if (typbyval)
		info->kind = ARG_HASH_BYVAL;
	else if (typlen > 0)
		info->kind = ARG_HASH_FIXED;
	else if (typlen == -1)
		info->kind = ARG_HASH_VARLENA;
	else
		info->kind = ARG_HASH_CSTRING;
}

static IdemStatement *
statement_create(uint64 hashkey, const char *sql, int nargs, Oid *argtypes)
{
	MemoryContext cxt;
	MemoryContext oldcxt;
	IdemStatement *stmt;
	const char *command;
	uint8		digest[IDEM_FINGERPRINT_LEN];
	int			maxparam;

	/* validate first, so a bad statement allocates nothing that lives on */
	command = check_statement(sql);
	maxparam = digest_tokens(sql, digest);
	check_parameter_count(maxparam, nargs);

	cxt = AllocSetContextCreate(statement_cache_cxt, "idem statement",
								ALLOCSET_SMALL_SIZES);
	oldcxt = MemoryContextSwitchTo(cxt);

	stmt = palloc0(sizeof(IdemStatement));
	stmt->hashkey = hashkey;
	stmt->sql = pstrdup(sql);
	stmt->nargs = nargs;
	stmt->command = pstrdup(command);
	memcpy(stmt->digest, digest, sizeof(digest));
	stmt->cxt = cxt;
	if (nargs > 0)
	{
		stmt->argtypes = palloc(nargs * sizeof(Oid));
		memcpy(stmt->argtypes, argtypes, nargs * sizeof(Oid));
		stmt->arginfo = palloc0(nargs * sizeof(ArgHashInfo));
		for (int i = 0; i < nargs; i++)
			describe_arg(argtypes[i], &stmt->arginfo[i]);
	}
	MemoryContextSwitchTo(oldcxt);
	return stmt;
}

static void
statement_free(IdemStatement *stmt)
{
	if (stmt->plan)
		SPI_freeplan(stmt->plan);
	MemoryContextDelete(stmt->cxt);
}

/* Drop least recently used, unpinned entries beyond the configured size. */
static void
statement_cache_trim(void)
{
	dlist_node *cur = statement_lru.head.prev;

	/* walk from the tail (least recently used); the list is circular */
	while (statement_count > idem_statement_cache_size &&
		   cur != &statement_lru.head)
	{
		dlist_node *prev = cur->prev;
		IdemStatement *victim = dlist_container(IdemStatement, lru, cur);

		if (victim->pins == 0)
		{
			dlist_delete(&victim->lru);
			hash_search(statement_cache, &victim->hashkey, HASH_REMOVE, NULL);
			statement_count--;
			statement_free(victim);
		}
		cur = prev;
	}
}

/*
 * idem_statement_acquire
 *		Find or create the statement for (sql, argtypes) and pin it.
 *
 * Raises the statement's validation error, if any.  Every successful call
 * must be paired with idem_statement_release(), also on error.
 */
IdemStatement *
idem_statement_acquire(const char *sql, int nargs, Oid *argtypes)
{
	uint64		hashkey = statement_hashkey(sql, nargs, argtypes);
	StatementCacheEntry *entry;
	IdemStatement *stmt;
	bool		found;

	if (statement_cache == NULL)
		statement_cache_init();

	entry = hash_search(statement_cache, &hashkey, HASH_FIND, NULL);
	if (entry != NULL)
	{
		if (statement_matches(entry->stmt, sql, nargs, argtypes))
		{
			stmt = entry->stmt;
			dlist_move_head(&statement_lru, &stmt->lru);
			stmt->pins++;
			return stmt;
		}

		/* a 64-bit hash collision: serve this one uncached */
		stmt = statement_create(hashkey, sql, nargs, argtypes);
		stmt->pins = 1;
		return stmt;
	}

	stmt = statement_create(hashkey, sql, nargs, argtypes);
	stmt->pins = 1;
	stmt->cached = true;
	entry = hash_search(statement_cache, &hashkey, HASH_ENTER, &found);
	entry->stmt = stmt;
	dlist_push_head(&statement_lru, &stmt->lru);
	statement_count++;
	statement_cache_trim();
	return stmt;
}

void
idem_statement_release(IdemStatement *stmt)
{
	Assert(stmt->pins > 0);
	stmt->pins--;
	if (!stmt->cached && stmt->pins == 0)
		statement_free(stmt);
	else if (stmt->cached)
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
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		stmt->plan = plan;
	}
	return stmt->plan;
}

static void
hash_arg_value(idem_sha256_ctx ctx, ArgHashInfo *info, Datum value)
{
	switch (info->kind)
	{
		case ARG_HASH_BYVAL:
			idem_sha256_update(ctx, &value, sizeof(Datum));
			break;
		case ARG_HASH_FIXED:
			idem_sha256_update(ctx, DatumGetPointer(value), info->typlen);
			break;
		case ARG_HASH_VARLENA:
			{
				struct varlena *v = PG_DETOAST_DATUM_PACKED(value);
				uint32		len = VARSIZE_ANY_EXHDR(v);

				idem_sha256_update(ctx, &len, sizeof(len));
				idem_sha256_update(ctx, VARDATA_ANY(v), len);
				if ((Pointer) v != DatumGetPointer(value))
					pfree(v);
				break;
			}
		case ARG_HASH_CSTRING:
			{
				const char *s = DatumGetCString(value);

				idem_sha256_update(ctx, s, strlen(s) + 1);
				break;
			}
		case ARG_HASH_OUTPUT:
			{
				char	   *s = OutputFunctionCall(&info->output, value);

				idem_sha256_update(ctx, s, strlen(s) + 1);
				pfree(s);
				break;
			}
	}
}

/*
 * idem_statement_hash_args
 *		Compute the request fingerprint of req, a call of stmt.
 */
void
idem_statement_hash_args(IdemStatement *stmt, IdemRequest *req,
						 uint8 *fingerprint)
{
	idem_sha256_ctx ctx = idem_sha256_begin();
	int32		nargs = req->nargs;

	idem_sha256_update(ctx, stmt->digest, IDEM_FINGERPRINT_LEN);
	idem_sha256_update(ctx, &nargs, sizeof(nargs));
	for (int i = 0; i < req->nargs; i++)
	{
		ArgHashInfo *info = &stmt->arginfo[i];
		char		isnull = req->nulls[i];

		idem_sha256_update(ctx, info->typident, strlen(info->typident) + 1);
		idem_sha256_update(ctx, &isnull, 1);
		if (isnull != 'n')
			hash_arg_value(ctx, info, req->values[i]);
	}
	idem_sha256_end(ctx, fingerprint);
}
