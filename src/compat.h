/*-------------------------------------------------------------------------
 *
 * compat.h
 *		Every PG_VERSION_NUM switch idem needs, so the rest of the code is
 *		written against one API (PostgreSQL 15) and builds on 14 to 17.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/compat.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_COMPAT_H
#define IDEM_COMPAT_H

#include "parser/parser.h"
#include "utils/guc.h"


#if PG_VERSION_NUM < 150000
#define MarkGUCPrefixReserved(prefix) EmitWarningsOnPlaceholders(prefix)
#endif

#include "replication/message.h"
#if PG_VERSION_NUM >= 170000
#define LogTransactionalMessage(prefix, msg, len) \
	LogLogicalMessage((prefix), (msg), (len), true, false)
#else
#define LogTransactionalMessage(prefix, msg, len) \
	LogLogicalMessage((prefix), (msg), (len), true)
#endif


/*
 * SHA-256 through pg_cryptohash, which arrived in 14; that sets idem's floor.
 */
#if PG_VERSION_NUM >= 140000
#include "common/cryptohash.h"
#include "common/sha2.h"
typedef pg_cryptohash_ctx *idem_sha256_ctx;

static inline idem_sha256_ctx
idem_sha256_begin(void)
{
	pg_cryptohash_ctx *ctx = pg_cryptohash_create(PG_SHA256);

	if (ctx == NULL || pg_cryptohash_init(ctx) < 0)
		elog(ERROR, "could not initialize SHA-256 context");
	return ctx;
}

static inline void
idem_sha256_update(idem_sha256_ctx ctx, const void *data, size_t len)
{
	if (pg_cryptohash_update(ctx, (const uint8 *) data, len) < 0)
		elog(ERROR, "could not update SHA-256 context");
}

static inline void
idem_sha256_end(idem_sha256_ctx ctx, uint8 *dest)
{
	if (pg_cryptohash_final(ctx, dest, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not finalize SHA-256 context");
	pg_cryptohash_free(ctx);
}
#else
#error "idem requires PostgreSQL 14 or later (pg_cryptohash)"
#endif

#endif							/* IDEM_COMPAT_H */
