/*-------------------------------------------------------------------------
 *
 * idem.c
 *		Module entry: PG_MODULE_MAGIC and the idem.* configuration
 *		parameters.
 *
 * idem needs no shared memory, so it works without shared_preload_libraries;
 * every parameter is USERSET so a caller can SET LOCAL it for one call.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/idem.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "compat.h"
#include "idem.h"

PG_MODULE_MAGIC;

int			idem_ttl = 86400;
bool		idem_wait = true;
int			idem_max_response_size = 1024 * 1024;
char	   *idem_outbox_topic = NULL;
int			idem_statement_cache_size = 256;
bool		idem_durable_replay = false;

void		_PG_init(void);

void
_PG_init(void)
{
	DefineCustomIntVariable("idem.ttl",
							"How long a key record stays valid after it is written.",
							"An expired record counts as absent: the next call with its key executes again.",
							&idem_ttl,
							86400, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.wait",
							 "Whether a call waits for a concurrent call with the same key.",
							 "When off, such a call fails at once with SQLSTATE ID409.",
							 &idem_wait,
							 true,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_response_size",
							"Largest response, in bytes, that idem stores for a key.",
							NULL,
							&idem_max_response_size,
							1024 * 1024, 1024, MaxAllocSize / 2,
							PGC_USERSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomStringVariable("idem.outbox_topic",
							   "Topic of the outbox event each executed call writes; empty writes none.",
							   NULL,
							   &idem_outbox_topic,
							   "",
							   PGC_USERSET, 0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("idem.statement_cache_size",
							"How many prepared business statements a backend keeps.",
							"Least recently used statements are dropped beyond this number.",
							&idem_statement_cache_size,
							256, 1, 100000,
							PGC_USERSET, 0,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.durable_replay",
							 "Whether a replay waits until the original result is durable on synchronous standbys.",
							 "When on, a replay writes one small WAL record, so its commit waits for synchronous replication like any write.",
							 &idem_durable_replay,
							 false,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	MarkGUCPrefixReserved("idem");
}
