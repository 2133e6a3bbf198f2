/*-------------------------------------------------------------------------
 *
 * queue.c
 *		Run queues: idem_queue_create(), idem_queue_alter(),
 *		idem_queue_grant() and idem_queue_revoke(), the removal of a queue
 *		for idem_queue_drop() (control.c), the check of a role's produce,
 *		work and signal privileges, a queue's retry policy, and the wakeup
 *		of claims that wait on a queue.
 *
 * A queue is a row of idem.queues, administered like an outbox topic:
 * the functions are granted by an administrator, never to PUBLIC, and a
 * role may use a queue as its lists say (membership counts; superusers
 * may use every queue).  The row is read by OID, as the key records are,
 * and kept until idem.queues changes.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/queue.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "common/hashfn.h"
#include "executor/spi.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_queue_create);
PG_FUNCTION_INFO_V1(idem_queue_alter);
PG_FUNCTION_INFO_V1(idem_queue_grant);
PG_FUNCTION_INFO_V1(idem_queue_revoke);

/* Most attempts of a step a policy may allow. */
#define QUEUE_MAX_ATTEMPTS		1000

static const char *const privilege_names[] = {"produce", "work", "signal"};

static IdemQuery q_insert = {
	"INSERT INTO idem.queues (queue, producers, workers, signallers,"
	"  concurrency, max_attempts, backoff_base, backoff_cap, jitter, created_at)"
	" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, pg_catalog.now())"
	" ON CONFLICT (queue) DO NOTHING",
	9, {TEXTOID, REGROLEARRAYOID, REGROLEARRAYOID, REGROLEARRAYOID, INT4OID,
	INT4OID, INTERVALOID, INTERVALOID, TEXTOID}
};

/* NULL keeps a value; $7 (uncapped) removes the cap */
static IdemQuery q_alter = {
	"UPDATE idem.queues"
	"   SET concurrency = CASE WHEN $7 THEN NULL ELSE COALESCE($2, concurrency) END,"
	"       max_attempts = COALESCE($3, max_attempts),"
	"       backoff_base = COALESCE($4, backoff_base),"
	"       backoff_cap = COALESCE($5, backoff_cap),"
	"       jitter = COALESCE($6, jitter)"
	" WHERE queue OPERATOR(pg_catalog.=) $1",
	7, {TEXTOID, INT4OID, INT4OID, INTERVALOID, INTERVALOID, TEXTOID, BOOLOID}
};

static IdemQuery q_delete = {
	"DELETE FROM idem.queues WHERE queue OPERATOR(pg_catalog.=) $1",
	1, {TEXTOID}
};

/* $3: 0 producers, 1 workers, 2 signallers */
static IdemQuery q_grant = {
	"UPDATE idem.queues"
	"   SET producers = CASE WHEN $3 OPERATOR(pg_catalog.=) 0 AND NOT $2 OPERATOR(pg_catalog.=) ANY (producers)"
	"                   THEN pg_catalog.array_append(producers, $2) ELSE producers END,"
	"       workers = CASE WHEN $3 OPERATOR(pg_catalog.=) 1 AND NOT $2 OPERATOR(pg_catalog.=) ANY (workers)"
	"                 THEN pg_catalog.array_append(workers, $2) ELSE workers END,"
	"       signallers = CASE WHEN $3 OPERATOR(pg_catalog.=) 2 AND NOT $2 OPERATOR(pg_catalog.=) ANY (signallers)"
	"                    THEN pg_catalog.array_append(signallers, $2) ELSE signallers END"
	" WHERE queue OPERATOR(pg_catalog.=) $1",
	3, {TEXTOID, REGROLEOID, INT4OID}
};

static IdemQuery q_revoke = {
	"UPDATE idem.queues"
	"   SET producers = CASE WHEN $3 OPERATOR(pg_catalog.=) 0"
	"                   THEN pg_catalog.array_remove(producers, $2) ELSE producers END,"
	"       workers = CASE WHEN $3 OPERATOR(pg_catalog.=) 1"
	"                 THEN pg_catalog.array_remove(workers, $2) ELSE workers END,"
	"       signallers = CASE WHEN $3 OPERATOR(pg_catalog.=) 2"
	"                    THEN pg_catalog.array_remove(signallers, $2) ELSE signallers END"
	" WHERE queue OPERATOR(pg_catalog.=) $1",
	3, {TEXTOID, REGROLEOID, INT4OID}
};

static void
report_no_queue(const char *queue)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("run queue \"%s\" does not exist", queue),
			 idem_errhint(ERRCODE_UNDEFINED_OBJECT, "An administrator creates queues with idem_queue_create().")));
}

/*
 * The queues this backend read, by name, kept across transactions until
 * idem_catalog_generation() moves on: idem.queues' trigger invalidates the
 * table's relcache entry on every change, which does that once the change
 * commits (at once in its own transaction).  A claim, an enqueue and a
 * step's failure then read no row; the role lists are kept, and checked
 * at every use, so that a change of membership counts at once, as in
 * PostgreSQL's own privilege checks.
 */
typedef struct QueueCacheEntry
{
	char		name[QUEUE_MAX_NAME_BYTES + 1]; /* the hash key */
	IdemQueue	q;
	ArrayType  *lists[3];		/* producers, workers, signallers */
} QueueCacheEntry;

static HTAB *queue_cache = NULL;
static MemoryContext queue_cache_cxt = NULL;
static uint64 queue_cache_generation = 0;

/* Copy the row idem_registry_probe() found into a new cache entry, arg. */
static void
read_queue_row(TupleTableSlot *slot, void *arg)
{
	QueueCacheEntry *e = arg;
	MemoryContext old = MemoryContextSwitchTo(queue_cache_cxt);
	bool		isnull;
	Datum		d;

	for (int i = 0; i < 3; i++)
		e->lists[i] = DatumGetArrayTypePCopy(slot_getattr(slot,
														  Anum_queues_producers + i,
														  &isnull));
	e->q.queue = NULL;
	d = slot_getattr(slot, Anum_queues_concurrency, &isnull);
	e->q.concurrency = isnull ? 0 : DatumGetInt32(d);
	e->q.max_attempts = DatumGetInt32(slot_getattr(slot, Anum_queues_max_attempts, &isnull));
	e->q.backoff_base_us = idem_interval_usecs(DatumGetIntervalP(slot_getattr(slot, Anum_queues_backoff_base, &isnull)));
	e->q.backoff_cap_us = idem_interval_usecs(DatumGetIntervalP(slot_getattr(slot, Anum_queues_backoff_cap, &isnull)));
	e->q.jitter = idem_jitter_from_name(TextDatumGetCString(slot_getattr(slot, Anum_queues_jitter, &isnull)));
	MemoryContextSwitchTo(old);
}

/*
 * Read the queue into q (in the caller's memory context); with role, also
 * whether role may use it as priv asks.  Returns false if there is no such
 * queue.
 */
static bool
read_queue(const char *queue, Oid role, IdemQueuePrivilege priv,
		   IdemQueue *q, bool *allowed)
{
	QueueCacheEntry *e;
	QueueCacheEntry fresh;
	uint64		generation;
	Oid			relid;
	Oid			pkey;

	idem_check_name(IDEM_NAME_QUEUE, queue, QUEUE_MAX_NAME_BYTES, NULL);
	/* resolve first: a change that arrives during the read voids it */
	relid = idem_catalog_queues(&pkey);
	generation = idem_catalog_generation();
	if (queue_cache == NULL || queue_cache_generation != generation)
	{
		HASHCTL		ctl;

		if (queue_cache_cxt == NULL)
			queue_cache_cxt = AllocSetContextCreate(CacheMemoryContext,
													"idem queues",
													ALLOCSET_SMALL_SIZES);
		else
			MemoryContextReset(queue_cache_cxt);
		ctl.keysize = QUEUE_MAX_NAME_BYTES + 1;
		ctl.entrysize = sizeof(QueueCacheEntry);
		ctl.hcxt = queue_cache_cxt;
		queue_cache = hash_create("idem queues", 16, &ctl,
								  HASH_ELEM | HASH_STRINGS | HASH_CONTEXT);
		queue_cache_generation = generation;
	}
	e = hash_search(queue_cache, queue, HASH_FIND, NULL);
	if (e == NULL)
	{
		if (!idem_registry_probe(relid, pkey, queue, read_queue_row, &fresh))
			return false;
		e = &fresh;
		if (idem_catalog_generation() == generation)
		{
			e = hash_search(queue_cache, queue, HASH_ENTER, NULL);
			memcpy(e->lists, fresh.lists, sizeof(fresh.lists));
			e->q = fresh.q;
		}
	}
	*q = e->q;
	q->queue = pstrdup(queue);
	if (allowed != NULL)
		*allowed = superuser_arg(role) ||
			idem_role_in(role, PointerGetDatum(e->lists[priv]));
	return true;
}

/* the leases that hold: on the claim's index, after now */
static IdemQuery q_count_leased = {
	"SELECT pg_catalog.count(*)::pg_catalog.int4 FROM idem.runs"
	" WHERE queue OPERATOR(pg_catalog.=) $1"
	"   AND queue_state IS NOT NULL"
	"   AND due_at OPERATOR(pg_catalog.>) $2"
	"   AND queue_state OPERATOR(pg_catalog.=) 'leased'",
	2, {TEXTOID, TIMESTAMPTZOID},
	CURSOR_OPT_GENERIC_PLAN
};

/*
 * The lock that takes turns on a capped queue's count of leases: a
 * transaction that leases under the cap holds it until it commits, so the
 * next count sees its leases.  A heavyweight lock rather than the queue's
 * row, so that a claim that leased nothing (and may wait on) lets go of it.
 */
static void
queue_cap_locktag(LOCKTAG *tag, const char *queue)
{
	uint32		h = DatumGetUInt32(hash_any((const unsigned char *) queue,
											strlen(queue)));

	/* owner 0: no role's key lock is in that namespace */
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, InvalidOid, h, IDEM_LOCKTAG_CLASS);
}

/*
 * The lock that a producer's enqueue shares and idem_queue_remove() takes
 * alone: a run enqueued by a transaction that read the queue before its
 * drop committed would be left on no queue, and claimed again by a later
 * queue of the same name.  Owner 1: no role has that OID, and the cap
 * lock's owner is 0.
 */
static void
queue_lifecycle_lock(const char *queue, LOCKMODE mode)
{
	LOCKTAG		tag;
	uint32		h = DatumGetUInt32(hash_any((const unsigned char *) queue,
											strlen(queue)));

	SET_LOCKTAG_ADVISORY(tag, MyDatabaseId, 1, h, IDEM_LOCKTAG_CLASS);
	/* a drop that committed while this waited is read, as a table lock's */
	if (LockAcquire(&tag, mode, false, false) != LOCKACQUIRE_ALREADY_HELD)
		AcceptInvalidationMessages();
}

/*
 * idem_queue_room
 *		How many of want runs may be leased now under q's concurrency cap
 *		(all of them without one).  Takes the queue's cap lock, kept until
 *		the transaction ends unless idem_queue_room_release() gives it back.
 */
int32
idem_queue_room(IdemQueue *q, int32 want, TimestampTz now)
{
	IdemOwnerSPI spi;
	Datum		values[2];
	char		nulls[2] = {' ', ' '};
	bool		isnull;
	int32		leased;
	LOCKTAG		tag;

	if (q->concurrency <= 0)
		return want;
	queue_cap_locktag(&tag, q->queue);
	if (LockAcquire(&tag, ExclusiveLock, false, false) != LOCKACQUIRE_ALREADY_HELD)
	{
		IdemQueue	latest;

		/*
		 * idem_queue_alter() changes the policy under this lock: a claim
		 * that waited for it counts under the cap the change set, not the
		 * one it read before.  A queue dropped meanwhile has no runs left
		 * to lease.
		 */
		AcceptInvalidationMessages();
		if (read_queue(q->queue, InvalidOid, QUEUE_WORK, &latest, NULL))
		{
			latest.queue = q->queue;
			*q = latest;
			if (q->concurrency <= 0)
			{
				LockRelease(&tag, ExclusiveLock, false);
				return want;
			}
		}
	}
	values[0] = CStringGetTextDatum(q->queue);
	values[1] = TimestampTzGetDatum(now);
	idem_owner_spi_begin(&spi, idem_catalog_runs());

	/*
	 * Every lease committed so far, whatever the isolation level: a holder
	 * whose lease ran out, in a transaction whose snapshot predates the
	 * claim that leased another run in its place, must not find that room.
	 * The cap lock keeps leases from being added until this transaction
	 * ends, so the count stays an upper bound.
	 */
	idem_query_run_latest(&q_count_leased, values, nulls, 0);
	leased = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
										 SPI_tuptable->tupdesc, 1, &isnull));
	idem_owner_spi_end(&spi);
	return Max(Min(want, q->concurrency - leased), 0);
}

/*
 * idem_queue_room_release
 *		Give back the cap lock idem_queue_room() took, after counting led to
 *		no lease: a claim that waits for runs must not make every other
 *		claim of the queue wait with it.
 */
void
idem_queue_room_release(IdemQueue *q)
{
	LOCKTAG		tag;

	if (q->concurrency <= 0)
		return;
	queue_cap_locktag(&tag, q->queue);
	LockRelease(&tag, ExclusiveLock, false);
}

/*
 * idem_queue_read
 *		The queue's policy; an error if it does not exist.
 */
void
idem_queue_read(const char *queue, IdemQueue *q)
{
	if (!read_queue(queue, InvalidOid, QUEUE_WORK, q, NULL))
		report_no_queue(queue);
}

/*
 * idem_queue_allows
 *		Whether role may use queue as priv asks (the queue must exist);
 *		fills q.
 */
bool
idem_queue_allows(const char *queue, Oid role, IdemQueuePrivilege priv,
				  IdemQueue *q)
{
	bool		allowed;

	if (!read_queue(queue, role, priv, q, &allowed))
		report_no_queue(queue);
	return allowed;
}

/*
 * idem_queue_may
 *		Whether role may use queue as priv asks; false if there is no such
 *		queue (a run's queue a superuser deleted).
 */
bool
idem_queue_may(const char *queue, Oid role, IdemQueuePrivilege priv)
{
	IdemQueue	q;
	bool		allowed;

	return read_queue(queue, role, priv, &q, &allowed) && allowed;
}

/* The refusal of priv on queue */
static int
queue_denied_msg(IdemQueuePrivilege priv, const char *queue)
{
	switch (priv)
	{
		case QUEUE_PRODUCE:
			return errmsg("permission denied to produce on run queue \"%s\"", queue);
		case QUEUE_WORK:
			return errmsg("permission denied to work on run queue \"%s\"", queue);
		case QUEUE_SIGNAL:
			return errmsg("permission denied to signal on run queue \"%s\"", queue);
	}
	return errmsg("permission denied for run queue \"%s\"", queue);
}

/* Why role may not use a queue as priv asks */
static int
queue_denied_detail(IdemQueuePrivilege priv, const char *role)
{
	switch (priv)
	{
		case QUEUE_PRODUCE:
			return errdetail("Role \"%s\" is not among the queue's producers.", role);
		case QUEUE_WORK:
			return errdetail("Role \"%s\" is not among the queue's workers.", role);
		case QUEUE_SIGNAL:
			return errdetail("Role \"%s\" is not among the queue's signallers.", role);
	}
	return 0;
}

/*
 * idem_queue_check
 *		Fail unless role may use queue as priv asks (42704 if there is no
 *		such queue, 42501 without the grant); fills q.
 */
void
idem_queue_check(const char *queue, Oid role, IdemQueuePrivilege priv,
				 IdemQueue *q)
{
	if (priv == QUEUE_PRODUCE)
	{
		idem_check_name(IDEM_NAME_QUEUE, queue, QUEUE_MAX_NAME_BYTES, NULL);
		queue_lifecycle_lock(queue, ShareLock);
	}
	if (!idem_queue_allows(queue, role, priv, q))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 queue_denied_msg(priv, queue),
				 queue_denied_detail(priv, GetUserNameFromId(role, false)),
				 idem_errhint(ERRCODE_INSUFFICIENT_PRIVILEGE,
							  psprintf("An administrator grants it with idem_queue_grant('%s', role, '%s').",
									   queue, privilege_names[priv]))));
}

/*
 * idem_queue_exists
 *		Whether there is such a queue (a run's queue may have been dropped).
 */
bool
idem_queue_exists(const char *queue)
{
	IdemQueue	q;

	return read_queue(queue, InvalidOid, QUEUE_WORK, &q, NULL);
}

/* The name claims on queue wait on (the outbox's wakeup, under a prefix). */
void
idem_queue_channel(const char *queue, char *name, size_t size)
{
	snprintf(name, size, "idem.queue:%s", queue);
}

/*
 * idem_queue_wake
 *		Wake the claims waiting on queue when the transaction commits.
 */
void
idem_queue_wake(const char *queue)
{
	char		name[QUEUE_MAX_NAME_BYTES + 16];

	idem_queue_channel(queue, name, sizeof(name));
	idem_wake_at_commit(name);
}

static int64
checked_backoff(FunctionCallInfo fcinfo, int argno, const char *name)
{
	int64		us;

	idem_arg_not_null(fcinfo, argno, name);
	us = idem_interval_usecs(PG_GETARG_INTERVAL_P(argno));
	if (us < 0 || us > (int64) INT_MAX * 1000)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be between 0 and %d days", name,
						(int) ((int64) INT_MAX * 1000 / USECS_PER_DAY)),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	return us;
}

/*
 * idem_queue_check_policy
 *		Check a retry policy's arguments (any may be NULL: the queue's
 *		own applies), as idem_queue_create() and idem_run_begin() get them.
 */
void
idem_queue_check_policy(FunctionCallInfo fcinfo, int attempts_arg,
						int base_arg, int cap_arg, int jitter_arg)
{
	if (!PG_ARGISNULL(attempts_arg))
	{
		int32		n = PG_GETARG_INT32(attempts_arg);

		if (n < 1 || n > QUEUE_MAX_ATTEMPTS)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("max_attempts must be between 1 and %d", QUEUE_MAX_ATTEMPTS),
					 errdetail("max_attempts is %d.", n),
					 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	}
	if (!PG_ARGISNULL(base_arg))
		(void) checked_backoff(fcinfo, base_arg, "backoff_base");
	if (!PG_ARGISNULL(cap_arg))
		(void) checked_backoff(fcinfo, cap_arg, "backoff_cap");
	if (!PG_ARGISNULL(jitter_arg))
		(void) idem_jitter_from_name(text_to_cstring(PG_GETARG_TEXT_PP(jitter_arg)));
}

/*
 * idem_queue_create(queue text, producers regrole[], workers regrole[],
 *		concurrency integer, max_attempts integer, backoff_base interval,
 *		backoff_cap interval, jitter text, signallers regrole[]) returns void
 */
Datum
idem_queue_create(PG_FUNCTION_ARGS)
{
	IdemOwnerSPI spi;
	char	   *queue;
	Datum		values[9];
	char		nulls[9] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
	uint64		inserted;

	queue = idem_name_arg(fcinfo, 0, IDEM_NAME_QUEUE);
	idem_check_name(IDEM_NAME_QUEUE, queue, QUEUE_MAX_NAME_BYTES, NULL);
	values[0] = CStringGetTextDatum(queue);
	values[1] = idem_roles_arg(fcinfo, 1, "producers");
	values[2] = idem_roles_arg(fcinfo, 2, "workers");
	values[3] = idem_roles_arg(fcinfo, 8, "signallers");
	if (PG_ARGISNULL(3))
		nulls[4] = 'n';
	else
	{
		int32		c = PG_GETARG_INT32(3);

		if (c < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("concurrency must be at least 1"),
					 errdetail("concurrency is %d.", c),
					 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Pass NULL for no cap.")));
		values[4] = Int32GetDatum(c);
	}
	if (PG_ARGISNULL(4) || PG_ARGISNULL(5) || PG_ARGISNULL(6) || PG_ARGISNULL(7))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("a queue's retry policy must not be null"),
				 errdetail("max_attempts, backoff_base, backoff_cap and jitter need values."),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	idem_queue_check_policy(fcinfo, 4, 5, 6, 7);
	values[5] = PG_GETARG_DATUM(4);
	values[6] = PG_GETARG_DATUM(5);
	values[7] = PG_GETARG_DATUM(6);
	values[8] = PG_GETARG_DATUM(7);
	idem_check_can_write("idem_queue_create()");

	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run(&q_insert, values, nulls, 0);
	inserted = SPI_processed;
	idem_owner_spi_end(&spi);
	if (inserted == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("run queue \"%s\" already exists", queue),
				 idem_errhint(ERRCODE_DUPLICATE_OBJECT, "Use idem_queue_grant() to add roles to it.")));
	PG_RETURN_VOID();
}

/*
 * idem_queue_alter(queue text, concurrency integer, max_attempts integer,
 *		backoff_base interval, backoff_cap interval, jitter text,
 *		uncapped boolean) returns void
 *
 * A NULL keeps the queue's value.  The change holds from the next claim,
 * and from the next failure of a step (its attempts, its backoff): leases
 * held keep (a lower cap leases nothing more until they fall under it),
 * and a run that backs off keeps its due time.  The queue's cap lock is
 * taken, so a claim counting under the old cap finishes first, and one
 * that waits for it counts under the new one (idem_queue_room()).
 */
Datum
idem_queue_alter(PG_FUNCTION_ARGS)
{
	IdemOwnerSPI spi;
	char	   *queue;
	Datum		values[7];
	char		nulls[7] = {' ', ' ', ' ', ' ', ' ', ' ', ' '};
	bool		uncapped;
	LOCKTAG		tag;
	uint64		updated;

	queue = idem_name_arg(fcinfo, 0, IDEM_NAME_QUEUE);
	idem_check_name(IDEM_NAME_QUEUE, queue, QUEUE_MAX_NAME_BYTES, NULL);
	idem_arg_not_null(fcinfo, 6, "uncapped");
	uncapped = PG_GETARG_BOOL(6);
	if (!PG_ARGISNULL(1))
	{
		int32		c = PG_GETARG_INT32(1);

		if (uncapped)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("concurrency and uncapped cannot both be given"),
					 errdetail("uncapped => true removes the cap; concurrency sets one."),
					 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
		if (c < 1)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("concurrency must be at least 1"),
					 errdetail("concurrency is %d.", c),
					 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Pass uncapped => true for no cap.")));
	}
	idem_queue_check_policy(fcinfo, 2, 3, 4, 5);
	idem_check_can_write("idem_queue_alter()");
	values[0] = CStringGetTextDatum(queue);
	for (int i = 1; i <= 5; i++)
	{
		values[i] = PG_GETARG_DATUM(i);
		if (PG_ARGISNULL(i))
			nulls[i] = 'n';
	}
	values[6] = BoolGetDatum(uncapped);

	queue_cap_locktag(&tag, queue);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run(&q_alter, values, nulls, 0);
	updated = SPI_processed;
	idem_owner_spi_end(&spi);
	if (updated == 0)
		report_no_queue(queue);
	/* a raised cap has room for the claims that wait */
	idem_queue_wake(queue);
	PG_RETURN_VOID();
}

/*
 * idem_queue_remove
 *		Delete the queue's row for idem_queue_drop(), once no transaction
 *		that may enqueue on it is in progress; 42704 if there is none.  The
 *		claims that wait on it wake at commit, and fail (42704).
 */
void
idem_queue_remove(const char *queue)
{
	IdemOwnerSPI spi;
	Datum		values[1];
	char		nulls[1] = {' '};
	uint64		deleted;

	idem_check_name(IDEM_NAME_QUEUE, queue, QUEUE_MAX_NAME_BYTES, NULL);
	queue_lifecycle_lock(queue, ExclusiveLock);
	values[0] = CStringGetTextDatum(queue);
	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run(&q_delete, values, nulls, 0);
	deleted = SPI_processed;
	idem_owner_spi_end(&spi);
	if (deleted == 0)
		report_no_queue(queue);
	idem_queue_wake(queue);
}

static void
change_queue(FunctionCallInfo fcinfo, IdemQuery *q, const char *what)
{
	IdemOwnerSPI spi;
	char	   *queue;
	char	   *privilege;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	int			priv = -1;
	uint64		updated;

	queue = idem_name_arg(fcinfo, 0, IDEM_NAME_QUEUE);
	if (PG_ARGISNULL(1) || PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("role and privilege must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	privilege = text_to_cstring(PG_GETARG_TEXT_PP(2));
	for (int i = 0; i < lengthof(privilege_names); i++)
		if (strcmp(privilege, privilege_names[i]) == 0)
			priv = i;
	if (priv < 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unrecognized run queue privilege \"%s\"", privilege),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "The privileges are \"produce\", \"work\" and \"signal\".")));
	idem_check_can_write(what);
	/* a dropped role's OID may still be revoked */
	if (q == &q_grant)
		idem_check_role_exists(PG_GETARG_OID(1));
	values[0] = CStringGetTextDatum(queue);
	values[1] = PG_GETARG_DATUM(1);
	values[2] = Int32GetDatum(priv);

	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run(q, values, nulls, 0);
	updated = SPI_processed;
	idem_owner_spi_end(&spi);
	if (updated == 0)
		report_no_queue(queue);
}

/* idem_queue_grant(queue text, role regrole, privilege text) returns void */
Datum
idem_queue_grant(PG_FUNCTION_ARGS)
{
	change_queue(fcinfo, &q_grant, "idem_queue_grant()");
	PG_RETURN_VOID();
}

/* idem_queue_revoke(queue text, role regrole, privilege text) returns void */
Datum
idem_queue_revoke(PG_FUNCTION_ARGS)
{
	change_queue(fcinfo, &q_revoke, "idem_queue_revoke()");
	PG_RETURN_VOID();
}
