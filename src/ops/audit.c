/*-------------------------------------------------------------------------
 *
 * audit.c
 *		The audit trail (idem.audit, read through the idem_audit view):
 *		entries written in the caller's transaction, the shared-memory
 *		queue for rejected attempts, its draining, and retention.
 *
 * idem.audit = executions writes one row per execution and per replay into
 * idem.audit in the caller's own transaction: it commits or vanishes with the
 * call's effect.  idem.audit = all also records every rejected attempt
 * (ID422, ID409, class 40 conflicts, sequencing and business errors).  That
 * transaction aborts, so its entry goes into a queue in shared memory
 * instead, which the background worker writes out for each database
 * (worker.c).  Entries are lost if the server stops or crashes while they are
 * queued or being written, and an attempt whose database or role has used up
 * its share of the queue (fair_share()) is not queued, so that no role can
 * crowd out the others.  idem_stats and idem_stats_roles count what they can
 * see in the row of the database and role that lost it (audit_dropped): a
 * used-up share, a database whose extension is gone, a worker's failed write.
 * Without shared_preload_libraries there is no queue: rejected attempts are
 * not recorded, and the first one in a session says so.
 *
 * Queue locking: one LWLock ("idem audit queue") covers the whole array;
 * a producer holds it to copy one entry in, a worker to copy its
 * database's entries out.  No catalog access or allocation happens under
 * it, and a producer calls in from a PG_CATCH block, so queueing neither
 * allocates nor raises.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/ops/audit.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <sys/socket.h>

#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "common/ip.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/backend_status.h"
#include "utils/builtins.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
#include "utils/xid8.h"

#include "compat.h"
#include "ops/ops.h"

/*
 * A queued entry keeps a run id and step name whole: they are names of up
 * to IDEM_MAX_KEY_BYTES, which idem_audit_history() looks up, and a cut one
 * could end inside a multibyte character.
 */
#define AUDIT_NAME_LEN			(IDEM_MAX_KEY_BYTES + 1)
#define AUDIT_ADDR_LEN			64

typedef struct AuditEntry
{
	Oid			dbid;			/* InvalidOid: free slot */
	uint64		seq;			/* queue order */
	TimestampTz at;
	Oid			owner;
	Oid			actor;			/* the role that called */
	int			outcome;
	int			sqlerrcode;
	int			pid;
	uint64		xid;			/* FullTransactionId, 0 if none */
	bool		has_fingerprint;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	char		key[IDEM_MAX_KEY_BYTES + 1];
	char		run_id[AUDIT_NAME_LEN];
	char		step[AUDIT_NAME_LEN];
	char		appname[NAMEDATALEN];
	char		client_addr[AUDIT_ADDR_LEN];
} AuditEntry;

typedef struct AuditQueue
{
	LWLock	   *lock;
	Latch	   *launcher_latch; /* set when the queue fills up */
	int			size;
	int			used;
	int			hint;			/* where a producer starts looking */
	uint64		next_seq;
	AuditEntry	entries[FLEXIBLE_ARRAY_MEMBER];
} AuditQueue;

static AuditQueue *queue = NULL;

PG_FUNCTION_INFO_V1(idem_purge_audit_1_1);

static const char *const outcome_names[] = {
	[IDEM_OUTCOME_EXECUTED] = "executed",
	[IDEM_OUTCOME_REPLAYED] = "replayed",
	[IDEM_OUTCOME_MISMATCH] = "mismatch",
	[IDEM_OUTCOME_IN_PROGRESS] = "in_progress",
	[IDEM_OUTCOME_CONFLICT] = "conflict",
	[IDEM_OUTCOME_SEQUENCING] = "sequencing",
	[IDEM_OUTCOME_ERROR] = "error",
};

/* the client's address, as text, worked out once per session */
static char client_addr[AUDIT_ADDR_LEN];
static bool client_addr_known = false;
static bool told_no_queue = false;

Size
idem_audit_shmem_size(void)
{
	return add_size(offsetof(AuditQueue, entries),
					mul_size(idem_audit_queue_size, sizeof(AuditEntry)));
}

/* Caller holds AddinShmemInitLock. */
void
idem_audit_shmem_init(void)
{
	bool		found;

	queue = ShmemInitStruct("idem audit queue", idem_audit_shmem_size(), &found);
	if (!found)
	{
		queue->lock = &(GetNamedLWLockTranche("idem audit queue"))->lock;
		queue->launcher_latch = NULL;
		queue->size = idem_audit_queue_size;
		queue->used = 0;
		queue->hint = 0;
		queue->next_seq = 1;
		for (int i = 0; i < queue->size; i++)
			queue->entries[i].dbid = InvalidOid;
	}
}

void
idem_audit_set_launcher_latch(Latch *latch)
{
	if (queue == NULL)
		return;
	LWLockAcquire(queue->lock, LW_EXCLUSIVE);
	queue->launcher_latch = latch;
	LWLockRelease(queue->lock);
}

/* The client's address as text, or NULL for a Unix socket or a worker. */
static const char *
get_client_addr(void)
{
	if (!client_addr_known)
	{
		client_addr_known = true;
		client_addr[0] = '\0';
		/* pgstat's copy of the address: libpq-be.h needs GSSAPI headers */
		if (MyBEEntry != NULL &&
			(MyBEEntry->st_clientaddr.addr.ss_family == AF_INET ||
			 MyBEEntry->st_clientaddr.addr.ss_family == AF_INET6))
		{
			if (pg_getnameinfo_all(&MyBEEntry->st_clientaddr.addr,
								   MyBEEntry->st_clientaddr.salen,
								   client_addr, sizeof(client_addr),
								   NULL, 0, NI_NUMERICHOST) != 0)
				client_addr[0] = '\0';
		}
	}
	return client_addr[0] ? client_addr : NULL;
}

static void
copy_name(char *dst, const char *src, int size)
{
	if (src == NULL)
		dst[0] = '\0';
	else
		strlcpy(dst, src, size);
}

/*
 * Whether (dbid, owner) may take one more slot: fair shares of one queue
 * that every database and role fills.
 *
 * A database may hold no more entries than the queue has free slots, and
 * a role in it no more than half of them, so one that floods the queue
 * stops at a third of it (a database at a half) while the rest stays open
 * to everyone else: what is refused is then the flooder's own attempts,
 * never those of a database or role that has few queued.
 */
static bool
fair_share(int free_slots, int db_held, int role_held)
{
	return free_slots > 0 && db_held < free_slots && 2 * role_held < free_slots;
}

/*
 * Queue a rejected attempt for the worker.  Runs in a PG_CATCH block:
 * no allocation, no error.
 */
static void
queue_entry(IdemOutcome outcome, const IdemRequest *req,
			const uint8 *fingerprint, const char *run_id, const char *step,
			int sqlerrcode)
{
	AuditEntry *e = NULL;
	bool		wake = false;
	Latch	   *latch = NULL;
	FullTransactionId fxid = GetTopFullTransactionIdIfAny();
	const char *addr = get_client_addr();
	int			free_slot = -1;
	int			db_held = 0;
	int			role_held = 0;

	LWLockAcquire(queue->lock, LW_EXCLUSIVE);
	for (int n = 0; n < queue->size; n++)
	{
		int			i = (queue->hint + n) % queue->size;
		AuditEntry *q = &queue->entries[i];

		if (!OidIsValid(q->dbid))
		{
			if (free_slot < 0)
				free_slot = i;
		}
		else if (q->dbid == MyDatabaseId)
		{
			db_held++;
			if (q->owner == req->owner)
				role_held++;
		}
	}
	if (free_slot >= 0 &&
		fair_share(queue->size - queue->used, db_held, role_held))
	{
		e = &queue->entries[free_slot];
		queue->hint = (free_slot + 1) % queue->size;
		e->dbid = MyDatabaseId;
		e->seq = queue->next_seq++;
		e->at = GetCurrentTimestamp();
		e->owner = req->owner;
		e->actor = GetUserId();
		e->outcome = outcome;
		e->sqlerrcode = sqlerrcode;
		e->pid = MyProcPid;
		e->xid = FullTransactionIdIsValid(fxid) ? U64FromFullTransactionId(fxid) : 0;
		e->has_fingerprint = fingerprint != NULL;
		if (fingerprint != NULL)
			memcpy(e->fingerprint, fingerprint, IDEM_FINGERPRINT_LEN);
		copy_name(e->key, req->key, sizeof(e->key));
		copy_name(e->run_id, run_id, sizeof(e->run_id));
		copy_name(e->step, step, sizeof(e->step));
		copy_name(e->appname, application_name, sizeof(e->appname));
		copy_name(e->client_addr, addr, sizeof(e->client_addr));
		queue->used++;
		wake = queue->used >= queue->size / 2;
	}
	else
		wake = true;			/* a share is used up: drain now */
	latch = queue->launcher_latch;
	LWLockRelease(queue->lock);

	/*
	 * A refused entry counts for the database and role that lost it.  A
	 * rejected attempt is mostly queued from its error's cleanup.
	 */
	if (e == NULL)
		idem_stats_count_for(MyDatabaseId, req->owner, IDEM_STAT_AUDIT_DROPPED, 1);
	else
		idem_stats_count_in_error(IDEM_STAT_AUDIT_QUEUED, 1);
	if (wake && latch != NULL)
		SetLatch(latch);
}

static Datum
fingerprint_datum(const uint8 *fingerprint)
{
	bytea	   *fp = palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);

	SET_VARSIZE(fp, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	memcpy(VARDATA(fp), fingerprint, IDEM_FINGERPRINT_LEN);
	return PointerGetDatum(fp);
}

static void
set_text(Datum *values, bool *nulls, int attno, const char *s)
{
	if (s == NULL || s[0] == '\0')
		nulls[attno - 1] = true;
	else
		values[attno - 1] = CStringGetTextDatum(s);
}

/* Write one entry into idem.audit in the current transaction. */
static void
insert_entry(TimestampTz at, Oid owner, Oid actor, const char *key,
			 const char *run_id, const char *step, const char *outcome,
			 const uint8 *fingerprint, int sqlerrcode, uint64 xid, int pid,
			 const char *appname, const char *addr)
{
	Datum		values[Natts_audit];
	bool		nulls[Natts_audit] = {0};

	values[Anum_audit_at - 1] = TimestampTzGetDatum(at);
	values[Anum_audit_key - 1] = CStringGetTextDatum(key);
	values[Anum_audit_owner - 1] = ObjectIdGetDatum(owner);
	set_text(values, nulls, Anum_audit_run_id, run_id);
	set_text(values, nulls, Anum_audit_step, step);
	values[Anum_audit_outcome - 1] = CStringGetTextDatum(outcome);
	if (fingerprint != NULL)
		values[Anum_audit_fingerprint - 1] = fingerprint_datum(fingerprint);
	else
		nulls[Anum_audit_fingerprint - 1] = true;
	if (sqlerrcode != 0)
		values[Anum_audit_sqlstate - 1] = CStringGetTextDatum(unpack_sql_state(sqlerrcode));
	else
		nulls[Anum_audit_sqlstate - 1] = true;
	if (xid != 0)
		values[Anum_audit_xid - 1] = FullTransactionIdGetDatum(FullTransactionIdFromU64(xid));
	else
		nulls[Anum_audit_xid - 1] = true;
	values[Anum_audit_pid - 1] = Int32GetDatum(pid);
	set_text(values, nulls, Anum_audit_appname, appname);
	if (addr != NULL && addr[0] != '\0')
		values[Anum_audit_client_addr - 1] = DirectFunctionCall1(inet_in, CStringGetDatum(addr));
	else
		nulls[Anum_audit_client_addr - 1] = true;
	values[Anum_audit_actor - 1] = ObjectIdGetDatum(actor);

	idem_insert_audit_row(values, nulls);
}

/*
 * idem_audit_note
 *		Audit one call's outcome at the level idem.audit asks for.
 */
void
idem_audit_note(IdemOutcome outcome, const IdemRequest *req,
				const uint8 *fingerprint, const char *run_id,
				const char *step, int sqlerrcode)
{
	if (outcome == IDEM_OUTCOME_EXECUTED || outcome == IDEM_OUTCOME_REPLAYED)
	{
		FullTransactionId fxid;

		/* the entry's own insert gives the transaction its id */
		fxid = GetTopFullTransactionId();
		insert_entry(GetCurrentTimestamp(), req->owner, GetUserId(), req->key,
					 run_id, step, outcome_names[outcome], fingerprint, sqlerrcode,
					 U64FromFullTransactionId(fxid), MyProcPid,
					 application_name, get_client_addr());
		idem_stats_count(IDEM_STAT_AUDIT_WRITTEN, 1);
		return;
	}

	if (idem_audit_level != IDEM_AUDIT_ALL)
		return;
	if (queue != NULL)
		queue_entry(outcome, req, fingerprint, run_id, step, sqlerrcode);
	else if (!told_no_queue)
	{
		told_no_queue = true;
		ereport(NOTICE,
				(errmsg("idem.audit = all cannot record rejected attempts in this session"),
				 errdetail("Rejected attempts reach the audit trail through shared memory, which idem has only when it is loaded at server start; executions and replays are recorded."),
				 errhint("Add idem to shared_preload_libraries and restart the server.")));
	}
}

/*
 * idem_audit_run_action
 *		Audit an operator's verb on a run (cancelled, retried, failed,
 *		resumed) in the caller's transaction, at every idem.audit level but
 *		off: it changes what the run does next, and the caller may be an
 *		administrator acting on another role's run.  The entry's key is the
 *		run id.
 */
void
idem_audit_run_action(Oid owner, const char *run_id, const char *action)
{
	FullTransactionId fxid;

	if (idem_audit_level == IDEM_AUDIT_OFF)
		return;
	fxid = GetTopFullTransactionId();
	insert_entry(GetCurrentTimestamp(), owner, GetUserId(), run_id, run_id,
				 NULL, action, NULL, 0, U64FromFullTransactionId(fxid),
				 MyProcPid, application_name, get_client_addr());
	idem_stats_count(IDEM_STAT_AUDIT_WRITTEN, 1);
}

static int
entry_seq_cmp(const void *a, const void *b)
{
	uint64		sa = ((const AuditEntry *) a)->seq;
	uint64		sb = ((const AuditEntry *) b)->seq;

	return (sa > sb) - (sa < sb);
}

/*
 * idem_audit_drain
 *		Move up to batch_size queued entries of this database into
 *		idem.audit, in the current transaction; return how many.
 *
 * If the transaction then fails, those entries are lost: the caller
 * counts them as dropped.
 */
int64
idem_audit_drain(int batch_size)
{
	AuditEntry *taken;
	int			n = 0;

	if (queue == NULL)
		return 0;
	(void) idem_audit_relid();	/* the table must be sound before we take */

	taken = palloc(sizeof(AuditEntry) * Min(batch_size, queue->size));
	LWLockAcquire(queue->lock, LW_EXCLUSIVE);
	for (int i = 0; i < queue->size && n < batch_size && n < queue->size; i++)
	{
		AuditEntry *e = &queue->entries[i];

		if (e->dbid != MyDatabaseId)
			continue;
		memcpy(&taken[n++], e, sizeof(AuditEntry));
		e->dbid = InvalidOid;
		queue->used--;
	}
	LWLockRelease(queue->lock);

	qsort(taken, n, sizeof(AuditEntry), entry_seq_cmp);
	PG_TRY();
	{
		for (int i = 0; i < n; i++)
		{
			AuditEntry *e = &taken[i];

			insert_entry(e->at, e->owner, e->actor, e->key, e->run_id, e->step,
						 outcome_names[e->outcome],
						 e->has_fingerprint ? e->fingerprint : NULL,
						 e->sqlerrcode, e->xid, e->pid, e->appname,
						 e->client_addr);
		}
	}
	PG_CATCH();
	{
		for (int i = 0; i < n; i++)
			idem_stats_count_for(MyDatabaseId, taken[i].owner,
								 IDEM_STAT_AUDIT_DROPPED, 1);
		PG_RE_THROW();
	}
	PG_END_TRY();
	idem_stats_count(IDEM_STAT_AUDIT_WRITTEN, n);
	pfree(taken);
	return n;
}

static bool
in_list(Oid dbid, const Oid *dbids, int ndbs)
{
	for (int i = 0; i < ndbs; i++)
		if (dbids[i] == dbid)
			return true;
	return false;
}

/*
 * Free queued entries that match; count them as dropped, except those of
 * a database missing from existing (if given): it was dropped, and its
 * counts go with its row (stats.c), not to another's.
 */
static void
discard_entries(bool (*match) (Oid dbid, const Oid *dbids, int ndbs),
				const Oid *dbids, int ndbs,
				const Oid *existing, int nexisting)
{
	if (queue == NULL)
		return;
	LWLockAcquire(queue->lock, LW_EXCLUSIVE);
	for (int i = 0; i < queue->size; i++)
	{
		AuditEntry *e = &queue->entries[i];

		if (OidIsValid(e->dbid) && match(e->dbid, dbids, ndbs))
		{
			if (existing == NULL || in_list(e->dbid, existing, nexisting))
				idem_stats_count_for(e->dbid, e->owner, IDEM_STAT_AUDIT_DROPPED, 1);
			e->dbid = InvalidOid;
			queue->used--;
		}
	}
	LWLockRelease(queue->lock);
}

static bool
not_in_list(Oid dbid, const Oid *dbids, int ndbs)
{
	return !in_list(dbid, dbids, ndbs);
}

static bool
is_first(Oid dbid, const Oid *dbids, int ndbs)
{
	return dbid == dbids[0];
}

/*
 * idem_audit_discard_other
 *		Drop queued entries of databases not in the list: dropped ones
 *		(not in existing, every database pg_database has), templates and
 *		databases closed to connections, which no purge worker visits.
 */
void
idem_audit_discard_other(const Oid *dbids, int ndbs,
						 const Oid *existing, int nexisting)
{
	discard_entries(not_in_list, dbids, ndbs, existing, nexisting);
}

/*
 * idem_audit_discard_db
 *		Drop queued entries of a database without the extension.
 */
void
idem_audit_discard_db(Oid dbid)
{
	discard_entries(is_first, &dbid, 1, NULL, 0);
}

/*
 * The oldest entries through the BRIN index on at (a bitmap scan, which a
 * B-tree-only direct scan could not do); rows another purge has locked are
 * skipped, so concurrent purges share the work.  No ORDER BY: entries are
 * appended in time order, and every batch takes only expired ones.
 */
static IdemQuery q_purge_audit = {
	"DELETE FROM idem.audit"
	" WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
	"   SELECT ctid FROM idem.audit"
	"    WHERE at OPERATOR(pg_catalog.<) $1"
	"    LIMIT $2"
	"    FOR UPDATE SKIP LOCKED))",
	2, {TIMESTAMPTZOID, INT4OID}
};

/*
 * idem_audit_purge_expired
 *		Delete up to batch_size entries older than idem.audit_retention;
 *		return how many.  0 retention keeps everything.  Needs a
 *		transaction with a snapshot, as any SPI caller.
 */
int64
idem_audit_purge_expired(int batch_size)
{
	IdemOwnerSPI spi;
	Datum		values[2];
	char		nulls[2] = {' ', ' '};
	int64		deleted;

	if (idem_audit_retention <= 0)
		return 0;
	values[0] = TimestampTzGetDatum(TimestampTzPlusMilliseconds(GetCurrentTransactionStartTimestamp(),
																-((int64) idem_audit_retention) * 1000));
	values[1] = Int32GetDatum(batch_size);
	idem_owner_spi_begin(&spi, idem_audit_relid());
	(void) idem_query_run(&q_purge_audit, values, nulls, 0);
	deleted = (int64) SPI_processed;
	idem_owner_spi_end(&spi);
	idem_stats_count(IDEM_STAT_PURGED_AUDIT, deleted);
	return deleted;
}

/*
 * idem_purge_audit(batch_size integer) returns bigint
 */
Datum
idem_purge_audit_1_1(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(idem_audit_purge_expired(idem_purge_batch_arg(fcinfo, "idem_purge_audit()")));
}
