/*-------------------------------------------------------------------------
 *
 * tokens.c
 *		The core scanner's token numbers translated into PostgreSQL 15's,
 *		so a statement's token digest is the same on every major.
 *
 * core_yylex() returns the grammar's token numbers, which bison assigns in
 * declaration order: every keyword added to a major (16 and 17 added
 * dozens, e.g. JSON_ARRAY) shifts the numbers of the keywords after it.
 * Request fingerprints hash the token stream, and a record written on one
 * major may be compared on another after pg_upgrade; hashed raw, the same
 * statement would not match itself (a genuine retry refused) and, worse,
 * two different statements could hash alike across majors (a different
 * request replayed).  So every token is hashed in one numbering, the one
 * idem 1.1 recorded on PostgreSQL 15: keywords by their text through
 * tokens15.h, the tokens that carry a value and the multi-character
 * operators by what the running scanner returns for a sample of each
 * (PostgreSQL 17 no longer installs parser/gram.h, and the numbers need
 * not be the same), single characters as themselves.  A keyword this
 * major has and 15 had not is hashed with its text
 * (IDEM_TOK_NEW_KEYWORD); a token of any other kind gets a number no
 * other major gives, so it is never taken for another major's token.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/tokens.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "common/keywords.h"
#include "parser/scanner.h"
#include "utils/memutils.h"

#include "compat.h"
#include "request/tokens.h"

typedef struct Keyword15
{
	const char *name;
	int			token;
} Keyword15;

static const Keyword15 keywords15[] = {
#include "request/tokens15.h"
};

/* a sample of each token that carries a value, and its number in 15 */
typedef struct Sample
{
	const char *text;
	int			token15;
} Sample;

static const Sample samples[] = {
	{"a", IDEM_TOK_IDENT},
	{"U&\"a\"", IDEM_TOK_UIDENT},
	{"1.5", IDEM_TOK_FCONST},
	{"'a'", IDEM_TOK_SCONST},
	{"U&'a'", IDEM_TOK_USCONST},
	{"b'1'", IDEM_TOK_BCONST},
	{"x'1'", IDEM_TOK_XCONST},
	{"~~", IDEM_TOK_OP},
	{"1", IDEM_TOK_ICONST},
	{"$1", IDEM_TOK_PARAM},
	{"::", IDEM_TOK_TYPECAST},
	{"..", IDEM_TOK_DOT_DOT},
	{":=", IDEM_TOK_COLON_EQUALS},
	{"=>", IDEM_TOK_EQUALS_GREATER},
	{"<=", IDEM_TOK_LESS_EQUALS},
	{">=", IDEM_TOK_GREATER_EQUALS},
	{"<>", IDEM_TOK_NOT_EQUALS},
};

/* this major's token number -> 15's, built on first use */
static int *map = NULL;
static int	map_size = 0;

/* a number no major's grammar gives a token: this major's, tagged */
#define FOREIGN_TOKEN(tok) \
	(0x20000000 | (PG_MAJORVERSION_NUM << 16) | (tok))

static int
keyword15(const char *name)
{
	int			lo = 0,
				hi = lengthof(keywords15) - 1;

	while (lo <= hi)
	{
		int			mid = lo + (hi - lo) / 2;
		int			c = strcmp(name, keywords15[mid].name);

		if (c == 0)
			return keywords15[mid].token;
		if (c < 0)
			hi = mid - 1;
		else
			lo = mid + 1;
	}
	return IDEM_TOK_NEW_KEYWORD;
}

static int
sample_token(const char *text)
{
	core_yy_extra_type yyextra;
	core_yyscan_t yyscanner;
	core_YYSTYPE yylval;
	YYLTYPE		yylloc;
	int			tok;

	yyscanner = scanner_init(text, &yyextra, &ScanKeywords, ScanKeywordTokens);

	/*
	 * The samples are read as the grammar defines them, not as the
	 * session's settings would: with standard_conforming_strings off the
	 * scanner refuses U&'a', and the first call of such a session (the map
	 * is built then) would fail.
	 */
	yyextra.standard_conforming_strings = true;
	yyextra.escape_string_warning = false;
	tok = core_yylex(&yylval, &yylloc, yyscanner);
	scanner_finish(yyscanner);
	return tok;
}

static void
build_map(void)
{
	int			ntok = 0;
	int			sampled[lengthof(samples)];
	int		   *m;

	for (int i = 0; i < ScanKeywords.num_keywords; i++)
		ntok = Max(ntok, ScanKeywordTokens[i]);
	for (int i = 0; i < lengthof(samples); i++)
	{
		sampled[i] = sample_token(samples[i].text);
		if (sampled[i] < 256)
			elog(ERROR, "the core scanner reads \"%s\" as the character '%c'",
				 samples[i].text, sampled[i]);
		ntok = Max(ntok, sampled[i]);
	}

	m = MemoryContextAlloc(TopMemoryContext, (ntok + 1) * sizeof(int));
	for (int tok = 0; tok <= ntok; tok++)
		m[tok] = tok < 256 ? tok : FOREIGN_TOKEN(tok);
	for (int i = 0; i < lengthof(samples); i++)
		m[sampled[i]] = samples[i].token15;
	for (int i = 0; i < ScanKeywords.num_keywords; i++)
	{
		const char *name = GetScanKeyword(i, &ScanKeywords);
		int			tok15 = keyword15(name);

		/* on 15 the translation must be the identity */
		if (IDEM_TOKENS_ARE_15 && tok15 != ScanKeywordTokens[i])
			elog(ERROR, "keyword \"%s\" is token %d, not %d as in src/request/tokens15.h",
				 name, ScanKeywordTokens[i], tok15);
		m[ScanKeywordTokens[i]] = tok15;
	}
	if (IDEM_TOKENS_ARE_15)
	{
		for (int i = 0; i < lengthof(samples); i++)
			if (sampled[i] != samples[i].token15)
				elog(ERROR, "\"%s\" is token %d, not %d as in src/request/tokens.h",
					 samples[i].text, sampled[i], samples[i].token15);
		if (ScanKeywords.num_keywords != lengthof(keywords15))
			elog(ERROR, "the core scanner has %d keywords, src/request/tokens15.h %d",
				 ScanKeywords.num_keywords, (int) lengthof(keywords15));
	}
	map_size = ntok + 1;
	map = m;
}

/*
 * idem_token_15
 *		token, a number core_yylex() returned, in PostgreSQL 15's numbering.
 */
int
idem_token_15(int token)
{
	if (map == NULL)
		build_map();
	if (token < 0 || token >= map_size)
		return FOREIGN_TOKEN(token);
	return map[token];
}
