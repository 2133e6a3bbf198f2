/*-------------------------------------------------------------------------
 *
 * tokens.h
 *		The core scanner's tokens in one numbering on every major: the one
 *		PostgreSQL 15's grammar used (src/request/tokens.c).
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/tokens.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_TOKENS_H
#define IDEM_TOKENS_H

/* the tokens that carry a value, and the multi-character operators */
#define IDEM_TOK_IDENT				258
#define IDEM_TOK_UIDENT				259
#define IDEM_TOK_FCONST				260
#define IDEM_TOK_SCONST				261
#define IDEM_TOK_USCONST			262
#define IDEM_TOK_BCONST				263
#define IDEM_TOK_XCONST				264
#define IDEM_TOK_OP					265
#define IDEM_TOK_ICONST				266
#define IDEM_TOK_PARAM				267
#define IDEM_TOK_TYPECAST			268
#define IDEM_TOK_DOT_DOT			269
#define IDEM_TOK_COLON_EQUALS		270
#define IDEM_TOK_EQUALS_GREATER		271
#define IDEM_TOK_LESS_EQUALS		272
#define IDEM_TOK_GREATER_EQUALS		273
#define IDEM_TOK_NOT_EQUALS			274

/*
 * A keyword PostgreSQL 15 did not have: its text (yylval.keyword) must
 * enter the digest with it.
 */
#define IDEM_TOK_NEW_KEYWORD		0x10000

extern int	idem_token_15(int token);

#endif							/* IDEM_TOKENS_H */
