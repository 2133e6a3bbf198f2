/*-------------------------------------------------------------------------
 *
 * expiry.c
 *		When a new key record expires: the idem.ttl ceiling, and the
 *		promise that an acknowledged call replays for at least idem.ttl
 *		after its commit.
 *
 * A record is written when its call ends, but it only counts from the
 * moment its transaction commits: a client may keep the transaction open,
 * or commit a prepared transaction, long after the call.  Rewriting every
 * record at commit would double the cost of a new key, so a record is
 * written with a second of slack (expires_at = end of call + idem.ttl +
 * 1 s), and at PRE_COMMIT (or PRE_PREPARE) only the records of a
 * transaction that outlived that slack are restamped from the clock.  Any
 * record therefore expires no earlier than idem.ttl after its transaction
 * began to commit (for a prepared transaction: after PREPARE TRANSACTION).
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/expiry.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/extension.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "request/request.h"

#define COMMIT_SLACK_USECS		USECS_PER_SEC

/*
 * A record this transaction wrote, when its expiry was computed, and the
 * subtransaction that wrote it: a rolled-back savepoint takes its record
 * along, and its entry must go too, or its ttl would be applied to a
 * later record of the same key.
 */
typedef struct PendingRecord
{
	IdemXactItem item;			/* first: the subtransaction, the next entry */
	Oid			owner;
	char	   *key;
	int64		ttl_usecs;
	TimestampTz stamped_at;
} PendingRecord;

/* In TopTransactionContext; forgotten at the end of every transaction. */
static IdemXactItem *pending = NULL;
static bool callback_registered = false;

static void
restamp_pending(void)
{
	TimestampTz now = GetCurrentTimestamp();
	bool		snapshot_pushed = false;

	for (IdemXactItem *item = pending; item != NULL; item = item->next)
	{
		PendingRecord *p = (PendingRecord *) item;

		if (now - p->stamped_at <= COMMIT_SLACK_USECS)
			continue;
		/* DROP EXTENSION later in this transaction took the table along */
		if (!OidIsValid(get_extension_oid("idem", true)))
			break;

		/*
		 * COMMIT has popped the statement's snapshot by now, but the update
		 * may need one, as AfterTriggerFireDeferred() knows: to read the
		 * record's TOASTed values, and for a CHECK constraint on idem.keys
		 * that calls a function running queries.
		 */
		if (!snapshot_pushed && !ActiveSnapshotSet())
		{
			PushActiveSnapshot(GetTransactionSnapshot());
			snapshot_pushed = true;
		}
		idem_restamp_key(p->owner, p->key,
						 now + p->ttl_usecs + COMMIT_SLACK_USECS);
	}
	if (snapshot_pushed)
		PopActiveSnapshot();
}

static void
expiry_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	idem_xact_list_subxact(&pending, event, mySubid, parentSubid);
}

static void
expiry_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (pending != NULL)
				restamp_pending();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			pending = NULL;
			break;
		default:
			break;
	}
}

/*
 * idem_checked_ttl
 *		idem.ttl for this call; refuse it if it exceeds the administrator's
 *		ceiling.
 */
int
idem_checked_ttl(void)
{
	if (idem_ttl > idem_max_ttl)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("idem.ttl exceeds idem.max_ttl"),
				 /* idem.ttl is above idem.max_ttl, so at least 2 */
				 errdetail_plural("idem.ttl is %d seconds; idem.max_ttl, set by an administrator, is %d second.",
								  "idem.ttl is %d seconds; idem.max_ttl, set by an administrator, is %d seconds.",
								  idem_max_ttl, idem_ttl, idem_max_ttl),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Lower idem.ttl, or ask an administrator to raise idem.max_ttl.")));
	return idem_ttl;
}

/*
 * idem_new_record_expiry
 *		expires_at for a record about to be written, remembered so the
 *		commit can move it if the transaction lingers.
 */
TimestampTz
idem_new_record_expiry(Oid owner, const char *key, int ttl)
{
	MemoryContext oldcxt;
	PendingRecord *p;

	if (!callback_registered)
	{
		RegisterXactCallback(expiry_xact_callback, NULL);
		RegisterSubXactCallback(expiry_subxact_callback, NULL);
		callback_registered = true;
	}

	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	p = palloc(sizeof(PendingRecord));
	p->owner = owner;
	p->key = pstrdup(key);
	p->ttl_usecs = (int64) ttl * USECS_PER_SEC;
	p->stamped_at = GetCurrentTimestamp();
	p->item.subid = GetCurrentSubTransactionId();
	p->item.next = pending;
	pending = &p->item;
	MemoryContextSwitchTo(oldcxt);

	return p->stamped_at + p->ttl_usecs + COMMIT_SLACK_USECS;
}
