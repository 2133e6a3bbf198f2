/*-------------------------------------------------------------------------
 *
 * wakeup.c
 *		The outbox's wakeup in shared memory: what idem_outbox_wait()
 *		sleeps on, and what a committing producer signals.
 *
 * NOTIFY is the portable wakeup, but PostgreSQL commits notifying
 * transactions one at a time (PreCommit_Notify() takes a lock on the
 * database that is held until the commit is over, its WAL flush
 * included), so every producer of events queues behind every other.  With
 * shared_preload_libraries = 'idem' a producer also signals here, after
 * its commit is visible, without any lock held across commits: one
 * atomic increment and a condition variable broadcast per topic.  A
 * consumer that waits here instead of listening lets producers run with
 * idem.outbox_notify = off.
 *
 * Topics map by hash (with the database) onto a fixed array of slots,
 * each a sequence number and a condition variable.  Two topics that share
 * a slot wake each other's consumers: a spurious wakeup costs one empty
 * claim, a missed one cannot happen.  A backend remembers each slot's
 * sequence number as of its last claim (idem_wakeup_note_claim(), called
 * before the claim takes its snapshot), so a commit that lands between an
 * empty claim and the wait that follows it ends the wait at once.
 *
 * A claim with a wait sleeps here between its passes (idem_wakeup_sleep()),
 * woken by a commit where there is shared memory, and in any case after a
 * poll interval: events and runs also become due by time (a retry's
 * backoff, a sleep, a lease running out), which no commit announces, and
 * without shared_preload_libraries the interval is all there is.
 *
 * It also names each topic's NOTIFY channel.  Any role may LISTEN on any
 * channel, so a channel named after its topic, or a payload naming it,
 * would tell every role the topic, its event rate and its producers'
 * PIDs.  A topic's channel is instead a hash of the topic keyed by the
 * database's secret, which only idem_outbox_channel() hands out, and only
 * to the topic's consumers; the payload is empty.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/outbox/wakeup.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "port/atomics.h"
#include "storage/condition_variable.h"
#include "storage/latch.h"
#include "storage/shmem.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "outbox/outbox.h"

#define CHANNEL_PREFIX	"idem_outbox_"
/* hex digits of the hash in a channel's name: 128 bits, nothing to guess */
#define CHANNEL_HEX		32

/* a power of two; more slots only thin out spurious wakeups */
#define WAKEUP_SLOTS	128

typedef struct WakeupSlot
{
	pg_atomic_uint64 seq;
	ConditionVariable cv;
} WakeupSlot;

static WakeupSlot *wakeup_slots = NULL;

/*
 * Each slot's sequence number at this backend's last claim, valid where
 * noted is set.  A claim in a transaction-snapshot isolation level cannot
 * vouch for anything it did not see, so it leaves nothing noted.
 */
static uint64 *claim_seq = NULL;
static bool *claim_noted = NULL;

Size
idem_wakeup_shmem_size(void)
{
	return mul_size(WAKEUP_SLOTS, sizeof(WakeupSlot));
}

/* Caller holds AddinShmemInitLock. */
void
idem_wakeup_shmem_init(void)
{
	bool		found;

	wakeup_slots = ShmemInitStruct("idem outbox wakeup",
								   idem_wakeup_shmem_size(), &found);
	if (!found)
	{
		for (int i = 0; i < WAKEUP_SLOTS; i++)
		{
			pg_atomic_init_u64(&wakeup_slots[i].seq, 0);
			ConditionVariableInit(&wakeup_slots[i].cv);
		}
	}
}

bool
idem_wakeup_available(void)
{
	return wakeup_slots != NULL;
}

/* The slot of topic in this database. */
static int
topic_slot(const char *topic)
{
	uint32		h = hash_bytes((const unsigned char *) topic, strlen(topic));

	h = hash_combine(h, murmurhash32((uint32) MyDatabaseId));
	return h & (WAKEUP_SLOTS - 1);
}

/*
 * idem_wakeup_topic
 *		Wake the consumers waiting for topic.  Called once the producing
 *		transaction's commit is visible: it cannot fail, and takes no lock
 *		another commit waits for.
 */
void
idem_wakeup_topic(const char *topic)
{
	WakeupSlot *slot;

	if (wakeup_slots == NULL)
		return;
	slot = &wakeup_slots[topic_slot(topic)];
	pg_atomic_fetch_add_u64(&slot->seq, 1);
	ConditionVariableBroadcast(&slot->cv);
}

/*
 * idem_wakeup_note_claim
 *		Remember topic's sequence number before a claim takes its
 *		snapshot: every commit not counted in it is seen by the claim, and
 *		every later one moves the number on.
 */
void
idem_wakeup_note_claim(const char *topic)
{
	int			index;

	if (wakeup_slots == NULL)
		return;
	if (claim_seq == NULL)
	{
		claim_seq = MemoryContextAllocZero(TopMemoryContext,
										   WAKEUP_SLOTS * sizeof(uint64));
		claim_noted = MemoryContextAllocZero(TopMemoryContext,
											 WAKEUP_SLOTS * sizeof(bool));
	}
	index = topic_slot(topic);
	if (IsolationUsesXactSnapshot())
	{
		claim_noted[index] = false;
		return;
	}
	/* the snapshot's ProcArrayLock keeps this read before it */
	claim_seq[index] = pg_atomic_read_u64(&wakeup_slots[index].seq);
	claim_noted[index] = true;
}

/*
 * idem_wakeup_wait
 *		Sleep until an event of topic is committed after this backend's
 *		last claim of it (or, with no claim noted, after the wait began),
 *		or until timeout_ms have passed.  Returns whether an event came.
 *		Interrupts (a cancel, statement_timeout, a shutdown) end the wait
 *		with their error.
 */
bool
idem_wakeup_wait(const char *topic, long timeout_ms)
{
	WakeupSlot *slot;
	int			index;
	uint64		since;
	TimestampTz end;
	bool		woken = false;

	Assert(wakeup_slots != NULL);
	index = topic_slot(topic);
	slot = &wakeup_slots[index];
	if (claim_noted != NULL && claim_noted[index])
		since = claim_seq[index];
	else
		since = pg_atomic_read_u64(&slot->seq);
	end = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), timeout_ms);

	ConditionVariablePrepareToSleep(&slot->cv);
	for (;;)
	{
		long		left;

		if (pg_atomic_read_u64(&slot->seq) != since)
		{
			woken = true;
			break;
		}
		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), end);
		if (left <= 0)
			break;
		(void) ConditionVariableTimedSleep(&slot->cv, left, PG_WAIT_EXTENSION);
	}
	ConditionVariableCancelSleep();
	return woken;
}

/*
 * idem_wakeup_sleep
 *		The pause of a claim with a wait between two passes: until topic
 *		is woken (with shared memory) or ms have passed, at most
 *		IDEM_CLAIM_POLL_MS.  Interrupts end it with their error.
 */
void
idem_wakeup_sleep(const char *topic, long ms)
{
	ms = Max(Min(ms, IDEM_CLAIM_POLL_MS), 1);
	if (wakeup_slots != NULL)
		(void) idem_wakeup_wait(topic, ms);
	else
	{
		(void) WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 ms, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
	CHECK_FOR_INTERRUPTS();
}

/*
 * idem_wakeup_channel
 *		The NOTIFY channel of topic in this database, into channel
 *		(NAMEDATALEN bytes): "idem_outbox_" and 32 hex digits of
 *		SHA-256(secret, database, topic).
 */
void
idem_wakeup_channel(const char *topic, char *channel)
{
	static const char hex[] = "0123456789abcdef";
	IdemSha256	buf;
	idem_sha256_ctx ctx;
	uint64		secret = idem_catalog_secret();
	uint8		digest[32];
	char	   *p;

	StaticAssertStmt(sizeof(CHANNEL_PREFIX) - 1 + CHANNEL_HEX < NAMEDATALEN,
					 "channel name too long");
	ctx = idem_sha256_begin(&buf);
	idem_sha256_update(ctx, &secret, sizeof(secret));
	idem_sha256_update(ctx, &MyDatabaseId, sizeof(MyDatabaseId));
	idem_sha256_update(ctx, topic, strlen(topic));
	idem_sha256_end(ctx, digest);

	strcpy(channel, CHANNEL_PREFIX);
	p = channel + sizeof(CHANNEL_PREFIX) - 1;
	for (int i = 0; i < CHANNEL_HEX / 2; i++)
	{
		*p++ = hex[digest[i] >> 4];
		*p++ = hex[digest[i] & 0x0f];
	}
	*p = '\0';
}
