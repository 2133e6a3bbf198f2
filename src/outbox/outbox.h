/*-------------------------------------------------------------------------
 *
 * outbox.h
 *		The outbox: events written with a call, topics, delivery, and the
 *		shared-memory wakeup of waiting consumers.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/outbox/outbox.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OUTBOX_H
#define IDEM_OUTBOX_H

#include "common/common.h"

/*
 * A tenant's event under Citus: the tenant's shard of idem.citus_outbox on
 * this node (found, and kept here by Citus's shard metadata lock, by the
 * caller) and the tenant's distribution value.
 */
typedef struct IdemEventShard
{
	Oid			relid;
	Datum		tenant;
} IdemEventShard;

/* outbox.c: outbox events, topics, delivery */
extern void idem_outbox_check_publish(const char *topic, Oid role);
extern void idem_insert_outbox(const char *key, Oid owner, const char *topic,
							   Jsonb *payload, TimestampTz created_at,
							   const char *run_id, const char *step,
							   int32 run_position, const IdemEventShard *shard);
/* Citus's shard metadata lock, set where Citus's library is known (idem.c) */
extern void (*idem_outbox_lock_shard) (int64 shardid);
extern int64 idem_outbox_purge_delivered(int batch_size);
extern void idem_wake_at_commit(const char *name);


/* wakeup.c: the outbox's wakeup in shared memory */
extern Size idem_wakeup_shmem_size(void);
extern void idem_wakeup_shmem_init(void);
extern bool idem_wakeup_available(void);
extern void idem_wakeup_topic(const char *topic);
extern void idem_wakeup_note_claim(const char *topic);
extern bool idem_wakeup_wait(const char *topic, long timeout_ms);
extern void idem_wakeup_sleep(const char *topic, long ms);
extern void idem_wakeup_channel(const char *topic, char *channel);

#endif							/* IDEM_OUTBOX_H */
