/*-------------------------------------------------------------------------
 *
 * compat.h
 *		Every PG_VERSION_NUM switch idem needs, so the rest of the code is
 *		written against one API (PostgreSQL 15) and builds on 15, 17 and 18.
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


/*
 * The majors idem is built and tested on are 15, 17 and 18
 * (scripts/test-versions.sh); every switch below is needed by one of them.
 */
#if PG_VERSION_NUM < 150000
#error "idem requires PostgreSQL 15 or later"
#endif

/*
 * Whether the core scanner numbers its tokens as src/request/tokens15.h
 * does: on 15 src/request/tokens.c checks the table against the server
 * instead of translating.
 */
#if PG_VERSION_NUM >= 150000 && PG_VERSION_NUM < 160000
#define IDEM_TOKENS_ARE_15 true
#else
#define IDEM_TOKENS_ARE_15 false
#endif

/* namespace.c's "is this still the same search path" API was renamed in 17 */
#include "catalog/namespace.h"
#if PG_VERSION_NUM >= 170000
#define OverrideSearchPath SearchPathMatcher
#define GetOverrideSearchPath(cxt) GetSearchPathMatcher(cxt)
#define OverrideSearchPathMatchesCurrent(path) \
	SearchPathMatchesCurrentEnvironment(path)
#endif

/*
 * A function that never returns: from 18 marked with pg_noreturn before its
 * declaration (pg_attribute_noreturn() is gone); before 18 the attribute
 * that macro expanded to works in the same place.
 */
#if PG_VERSION_NUM < 180000
#define pg_noreturn pg_attribute_noreturn()
#endif

/*
 * Index scans take an instrumentation struct from 18 on; idem's catalog
 * scans pass none (NULL), written against 18's signature.
 */
#include "access/genam.h"
#if PG_VERSION_NUM < 180000
#define index_beginscan(heap, index, snapshot, instrument, nkeys, norderbys) \
	index_beginscan((heap), (index), (snapshot), (nkeys), (norderbys))
#endif

/*
 * From 17 an index access method may keep state between the inserts of a
 * statement (BRIN keeps its range map's buffer pinned) until
 * index_insert_cleanup(); before 17 there is none to release.
 */
#if PG_VERSION_NUM < 170000
#define index_insert_cleanup(index, indexInfo) ((void) 0)
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
 * Fill an event id with 16 random bytes.  Ids must be unique, not secret:
 * a per-backend xoroshiro128** generator with a strong seed (15+) costs a
 * few nanoseconds where OpenSSL's RAND_bytes cost microseconds per call.
 */
#include "common/pg_prng.h"
static inline void
idem_random_id(uint8 *dest)
{
	static pg_prng_state state;
	static bool seeded = false;
	uint64		hi,
				lo;

	if (!seeded)
	{
		if (!pg_prng_strong_seed(&state))
			elog(ERROR, "could not seed the event id generator");
		seeded = true;
	}
	hi = pg_prng_uint64(&state);
	lo = pg_prng_uint64(&state);
	memcpy(dest, &hi, sizeof(hi));
	memcpy(dest + sizeof(hi), &lo, sizeof(lo));
}

/*
 * SHA-256 into caller-provided state: IdemSha256 buf; ctx =
 * idem_sha256_begin(&buf).  Where PostgreSQL is built with OpenSSL (as
 * Debian's is) this is OpenSSL's SHA-256 on a stack context: pg_cryptohash
 * allocates, registers with the resource owner and fetches an EVP method
 * on every call, about half of what a replay spends on its fingerprint.
 * The digest is the same SHA-256 either way.
 */

#ifdef USE_OPENSSL
/* the one-shot SHA256_* API is deprecated in OpenSSL 3 but kept */
#define OPENSSL_SUPPRESS_DEPRECATED
#include <openssl/sha.h>

typedef SHA256_CTX IdemSha256;
typedef IdemSha256 *idem_sha256_ctx;

static inline idem_sha256_ctx
idem_sha256_begin(IdemSha256 *buf)
{
	if (SHA256_Init(buf) != 1)
		elog(ERROR, "could not initialize SHA-256 context");
	return buf;
}

static inline void
idem_sha256_update(idem_sha256_ctx ctx, const void *data, size_t len)
{
	if (SHA256_Update(ctx, data, len) != 1)
		elog(ERROR, "could not update SHA-256 context");
}

static inline void
idem_sha256_end(idem_sha256_ctx ctx, uint8 *dest)
{
	if (SHA256_Final(dest, ctx) != 1)
		elog(ERROR, "could not finalize SHA-256 context");
}
#else
#include "common/cryptohash.h"
#include "common/sha2.h"

typedef pg_cryptohash_ctx *IdemSha256;
typedef IdemSha256 *idem_sha256_ctx;

static inline idem_sha256_ctx
idem_sha256_begin(IdemSha256 *buf)
{
	*buf = pg_cryptohash_create(PG_SHA256);
	if (*buf == NULL || pg_cryptohash_init(*buf) < 0)
		elog(ERROR, "could not initialize SHA-256 context");
	return buf;
}

static inline void
idem_sha256_update(idem_sha256_ctx ctx, const void *data, size_t len)
{
	if (pg_cryptohash_update(*ctx, (const uint8 *) data, len) < 0)
		elog(ERROR, "could not update SHA-256 context");
}

static inline void
idem_sha256_end(idem_sha256_ctx ctx, uint8 *dest)
{
	if (pg_cryptohash_final(*ctx, dest, PG_SHA256_DIGEST_LENGTH) < 0)
		elog(ERROR, "could not finalize SHA-256 context");
	pg_cryptohash_free(*ctx);
}
#endif


/*
 * The tree walkers took a walker of unspecified parameters, bool (*) (),
 * before 16's tree_walker_callback; a compiler that defaults to C23 (GCC 15)
 * reads that as taking none and refuses idem's walkers.  Cast them, as 16's
 * own macros do, through void (*) (void), which -Wcast-function-type
 * accepts.  The header comes first: the macros must not rewrite its
 * declarations.
 */
#include "nodes/nodeFuncs.h"
#if PG_VERSION_NUM < 160000
#define query_tree_walker(query, walker, context, flags) \
	query_tree_walker((query), (bool (*) ()) (void (*) (void)) (walker), (context), (flags))
#define expression_tree_walker(node, walker, context) \
	expression_tree_walker((node), (bool (*) ()) (void (*) (void)) (walker), (context))
#endif

/* GUC "extra" data: guc_malloc() and guc_free() are exported from 16 on */
#if PG_VERSION_NUM < 160000
#define guc_malloc(elevel, size) malloc(size)
#define guc_free(ptr) free(ptr)
#endif


/*
 * A uniform double in [0, 1) for backoff jitter (the per-backend global
 * generator, seeded at backend start).
 */
#include "common/pg_prng.h"
#define idem_random_double() pg_prng_double(&pg_global_prng_state)

/*
 * The GUC table (idem.c reads the placeholders a session set before the
 * library was loaded) and validating a setting as the role that made it.
 */
#include "utils/guc_tables.h"
#if PG_VERSION_NUM >= 160000
#define idem_guc_variables(n) get_guc_variables(n)
#else
static inline struct config_generic **
idem_guc_variables(int *n)
{
	*n = GetNumConfigOptions();
	return get_guc_variables();
}
#endif
#define idem_guc_setter(gen) ((gen)->srole)

/*
 * Update a heap tuple and say which indexes need an entry for the new
 * version: none (a HOT update), only the summarizing ones (a HOT update
 * that changed a BRIN column, 16 on) or all.
 */
#include "access/heapam.h"
#include "nodes/execnodes.h"
typedef enum IdemIndexUpdate
{
	IDEM_INDEX_NONE,
	IDEM_INDEX_SUMMARIZING,
	IDEM_INDEX_ALL
} IdemIndexUpdate;

static inline IdemIndexUpdate
idem_simple_heap_update(Relation rel, ItemPointer otid, HeapTuple tup)
{
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update;

	simple_heap_update(rel, otid, tup, &update);
	return update == TU_None ? IDEM_INDEX_NONE :
		update == TU_Summarizing ? IDEM_INDEX_SUMMARIZING : IDEM_INDEX_ALL;
#else
	simple_heap_update(rel, otid, tup);
	return HeapTupleIsHeapOnly(tup) ? IDEM_INDEX_NONE : IDEM_INDEX_ALL;
#endif
}

#if PG_VERSION_NUM >= 160000
#define idem_index_is_summarizing(ii) ((ii)->ii_Summarizing)
#else
#define idem_index_is_summarizing(ii) false
#endif

#endif							/* IDEM_COMPAT_H */
