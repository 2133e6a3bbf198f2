/*-------------------------------------------------------------------------
 *
 * runlease.c
 *		A queued run's lease as the run's functions see it: finding the
 *		run a worker names by its id and lease token (any owner's), the
 *		fence every step, completion, failure, wait and extension passes,
 *		and the record of each claim in idem.run_attempts.  The lease
 *		itself (tokens, fence decision, backoff) is common/lease.c's, shared
 *		with outbox events.
 *
 * A run's lease lives on its row of idem.runs (queue_state 'leased', the
 * token, due_at its end), so the fence of a step reads nothing the step
 * does not read already: the run's lock is taken, its latest version read,
 * and the token compared before anything executes.  The fence comes before
 * the snapshot check, so a holder whose lease was taken over gets ID412 at
 * every isolation level.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/runlease.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/syscache.h"
#include "utils/uuid.h"

#include "compat.h"
#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_runs_admin);

/* A worker's run: by id among queued runs, with whether the token holds it. */
static IdemQuery q_queued_by_id = {
	"SELECT owner, lease_token OPERATOR(pg_catalog.=) $2, queue_state, status,"
	"       lease_holder, queue"
	"  FROM idem.runs"
	" WHERE run_id OPERATOR(pg_catalog.=) $1 AND queue IS NOT NULL",
	2, {TEXTOID, UUIDOID}
};

/*
 * The owners and queues of the runs whose tokens this backend saw last
 * (claimed, or looked up): a worker's steps name the run by id and token,
 * and a token belongs to one run forever, so the owner a step would look
 * up again is known.  A stale entry is harmless: the fence compares the
 * token with the run's row under its lock.  An entry serves only the run
 * it was noted for: a token presented with another run's id is looked up,
 * and answered as any backend answers it.  The queue is kept for the work
 * grant, which every call checks again.
 */
#define TOKEN_CACHE_SIZE	16
static struct
{
	pg_uuid_t	token;
	Oid			owner;
	char		run_id[IDEM_MAX_KEY_BYTES + 1];
	char		queue[QUEUE_MAX_NAME_BYTES + 1];
} token_cache[TOKEN_CACHE_SIZE];
static int	token_cache_next = 0;

/*
 * idem_run_token_owner_note
 *		Remember that token leases a run of owner on queue.
 */
void
idem_run_token_owner_note(const pg_uuid_t *token, const char *run_id,
						  Oid owner, const char *queue)
{
	token_cache[token_cache_next].token = *token;
	token_cache[token_cache_next].owner = owner;
	strlcpy(token_cache[token_cache_next].run_id, run_id,
			sizeof(token_cache[token_cache_next].run_id));
	strlcpy(token_cache[token_cache_next].queue, queue,
			sizeof(token_cache[token_cache_next].queue));
	token_cache_next = (token_cache_next + 1) % TOKEN_CACHE_SIZE;
}

static Oid
token_owner_cached(const pg_uuid_t *token, const char *run_id,
				   const char **queue)
{
	for (int i = 0; i < TOKEN_CACHE_SIZE; i++)
		if (OidIsValid(token_cache[i].owner) &&
			memcmp(token_cache[i].token.data, token->data, UUID_LEN) == 0 &&
			strcmp(token_cache[i].run_id, run_id) == 0)
		{
			*queue = token_cache[i].queue;
			return token_cache[i].owner;
		}
	return InvalidOid;
}

/*
 * idem_run_name_position
 *		Where name is in a text[] without nulls (1-based), or 0: one pass
 *		over the array, no copy of its elements.
 */
int
idem_run_name_position(ArrayType *arr, const char *name)
{
	ArrayIterator it = array_create_iterator(arr, 0, NULL);
	size_t		len = strlen(name);
	Datum		elem;
	bool		isnull;
	int			pos = 0;
	int			found = 0;

	while (array_iterate(it, &elem, &isnull))
	{
		text	   *t;

		pos++;
		if (isnull)
			continue;
		t = DatumGetTextPP(elem);
		if (VARSIZE_ANY_EXHDR(t) == len &&
			memcmp(VARDATA_ANY(t), name, len) == 0)
		{
			found = pos;
			break;
		}
	}
	array_free_iterator(it);
	return found;
}

/*
 * idem_run_step_ordinal
 *		The position of step among the run's declared steps (1-based), or
 *		0 if the run declared none.  A name the run did not declare is
 *		ID400.
 */
int
idem_run_step_ordinal(IdemRunRow *run, const char *step)
{
	int			ordinal;

	if (run->steps == NULL)
		return 0;
	ordinal = idem_run_name_position(run->steps, step);
	if (ordinal > 0)
		return ordinal;
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_STEP_UNDECLARED),
			 errmsg("run \"%s\" has no step \"%s\"", run->run_id, step),
			 errdetail("The run was begun with a list of steps, and this name is not in it."),
			 idem_errhint(ERRCODE_IDEM_STEP_UNDECLARED, "Use one of the names passed to idem_run_begin().")));
	return 0;					/* keep compiler quiet */
}

/* Keys derived for a run: its lock, and each step's record. */
char *
idem_run_lock_key(const char *run_id)
{
	const char *parts[] = {"idem.run", run_id};

	return idem_derive_key(2, parts);
}

char *
idem_run_step_key(const char *run_id, const char *step)
{
	const char *parts[] = {IDEM_STEP_KEY_PART, run_id, step};

	return idem_derive_key(3, parts);
}

void
idem_report_run_not_found(const char *run_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_RUN_NOT_FOUND),
			 errmsg("run \"%s\" does not exist", run_id),
			 errdetail("No run with this id was begun by the current role."),
			 idem_errhint(ERRCODE_IDEM_RUN_NOT_FOUND, "Begin it with idem_run_begin() first.")));
}

/*
 * idem_run_check_queued
 *		55000 unless the run is on a queue: detail says what only a queued
 *		run does, hint what to do instead.
 */
void
idem_run_check_queued(IdemRunRow *run, const char *detail, const char *hint)
{
	if (run->queue == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("run \"%s\" is on no queue", run->run_id),
				 errdetail("%s", detail),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, hint)));
}

/*
 * A run a caller's snapshot cannot see the latest version of (REPEATABLE
 * READ or SERIALIZABLE: another agent moved it on after the snapshot) must
 * not be acted on.
 */
void
idem_check_run_visible(IdemRunRow *run)
{
	if (!run->visible)
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access due to concurrent update of run \"%s\"",
						run->run_id),
				 errdetail("Another transaction changed the run after this transaction's snapshot was taken."),
				 idem_errhint(ERRCODE_T_R_SERIALIZATION_FAILURE, "Retry the transaction: the retry sees the run's progress.")));
}

static void
lock_and_read(Oid owner, const char *run_id, IdemRunRow *run)
{
	if (!idem_lock_and_lookup_run(owner, run_id, idem_run_lock_key(run_id),
								  idem_wait, run))
		idem_report_run_not_found(run_id);
}

/*
 * idem_lock_run
 *		Take the run's lock and read the run, as the current snapshot may
 *		act on it.  Raises ID404 if owner has no such run.
 */
void
idem_lock_run(Oid owner, const char *run_id, IdemRunRow *run)
{
	lock_and_read(owner, run_id, run);
	idem_check_run_visible(run);
}

static const pg_uuid_t *
parse_token(const char *text)
{
	return DatumGetUUIDP(DirectFunctionCall1(uuid_in, CStringGetDatum(text)));
}

/*
 * idem_lease_token_arg
 *		A lease token argument, or NULL when it is null and not required.
 */
const pg_uuid_t *
idem_lease_token_arg(FunctionCallInfo fcinfo, int argno, bool required)
{
	if (PG_ARGISNULL(argno))
	{
		if (required)
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("lease_token must not be null"),
					 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, "Pass the lease_token idem_run_claim() returned.")));
		return NULL;
	}
	return PG_GETARG_UUID_P(argno);
}

/*
 * idem_lease_token_setting
 *		The token idem.lease_token names, for idem_step(), or NULL.
 */
const pg_uuid_t *
idem_lease_token_setting(void)
{
	if (idem_lease_token == NULL || idem_lease_token[0] == '\0')
		return NULL;
	return parse_token(idem_lease_token);
}

/* A queued run with the id a worker named, whose lease the token is not. */
typedef struct OtherRun
{
	char	   *queue;
	char	   *state;
	char	   *holder;
	bool		leased;
} OtherRun;

static void
report_no_queued_run(const char *run_id)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_RUN_NOT_FOUND),
			 errmsg("run \"%s\" does not exist", run_id),
			 errdetail("No run with this id is on a queue the current role works."),
			 idem_errhint(ERRCODE_IDEM_RUN_NOT_FOUND, "Pass the run_id idem_run_claim() returned.")));
}

/*
 * The work grant of the queue of a run that token leased or leases:
 * checked at every call (42501 without it).  A queue that was dropped
 * took the lease with it (idem_queue_drop() cancelled the run): ID412, as
 * for a run cancelled on its queue, not 42704.
 */
static void
check_works_queue(const char *queue, Oid caller, const char *run_id)
{
	IdemQueue	q;

	if (!idem_queue_exists(queue))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_LOST),
				 errmsg("lease token does not hold run \"%s\"", run_id),
				 errdetail("The run's queue \"%s\" was dropped: the run was cancelled and no lease holds it.",
						   queue),
				 idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Stop working on the run.")));
	idem_queue_check(queue, caller, QUEUE_WORK, &q);
}

/*
 * idem_leased_run_owner
 *		The owner of the queued run run_id that token leases: a worker
 *		works other roles' runs, and names them by id and token.  The
 *		caller must be among the workers of the run's queue at every call,
 *		not only at the claim (42501), as a consumer at every ack: a revoke
 *		stops a worker that holds a lease.  Raises ID404 if no run with the
 *		id is on a queue the caller works (whether another queue has one is
 *		not the caller's to know), ID412 if the token holds none of them
 *		(saying why for the first, in the terms of act).
 *
 * The run is looked up as committed now, whatever the isolation level, as
 * the fence reads it: a REPEATABLE READ snapshot taken before the claim
 * that issued the token committed does not show the token, and would tell
 * its holder that the lease is lost.  The owner a token names never
 * changes, and the fence is checked again under the run's lock, before
 * the snapshot's own check (40001).
 */
Oid
idem_leased_run_owner(const char *run_id, const pg_uuid_t *token,
					  IdemLeaseAct act)
{
	IdemOwnerSPI spi;
	Datum		values[2];
	char		nulls[2] = {' ', ' '};
	Oid			caller = GetUserId();
	Oid			owner = InvalidOid;
	const char *queue = NULL;
	OtherRun   *others = NULL;
	int			nothers = 0;

	owner = token_owner_cached(token, run_id, &queue);
	if (OidIsValid(owner))
	{
		check_works_queue(queue, caller, run_id);
		return owner;
	}
	values[0] = CStringGetTextDatum(run_id);
	values[1] = UUIDPGetDatum(token);
	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run_latest(&q_queued_by_id, values, nulls, 0);
	if (SPI_processed > 0)
		others = MemoryContextAlloc(spi.callercxt,
									sizeof(OtherRun) * SPI_processed);
	for (uint64 i = 0; i < SPI_processed && !OidIsValid(owner); i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;
		bool		matches = DatumGetBool(SPI_getbinval(tup, desc, 2, &isnull)) && !isnull;
		MemoryContext oldcxt = MemoryContextSwitchTo(spi.callercxt);

		if (matches)
		{
			owner = DatumGetObjectId(SPI_getbinval(tup, desc, 1, &isnull));
			queue = pstrdup(SPI_getvalue(tup, desc, 6));
		}
		else
		{
			OtherRun   *o = &others[nothers++];
			char	   *qs = SPI_getvalue(tup, desc, 3);
			char	   *holder = SPI_getvalue(tup, desc, 5);

			o->queue = pstrdup(SPI_getvalue(tup, desc, 6));
			o->leased = qs != NULL && strcmp(qs, "leased") == 0;
			o->state = pstrdup(qs != NULL ? qs : SPI_getvalue(tup, desc, 4));
			o->holder = holder ? pstrdup(holder) : NULL;
		}
		MemoryContextSwitchTo(oldcxt);
	}
	idem_owner_spi_end(&spi);
	if (OidIsValid(owner))
	{
		check_works_queue(queue, caller, run_id);
		idem_run_token_owner_note(token, run_id, owner, queue);
		return owner;
	}
	for (int i = 0; i < nothers; i++)
		if (idem_queue_may(others[i].queue, caller, QUEUE_WORK))
			idem_lease_lost(idem_lease_fence(others[i].leased, false),
							act, run_id, others[i].state,
							others[i].leased ? others[i].holder : NULL);
	report_no_queued_run(run_id);
	return InvalidOid;			/* keep compiler quiet */
}

/* The message of act on a queued run without a lease token */
static int
token_needed_msg(IdemLeaseAct act, const char *run_id, const char *queue)
{
	switch (act)
	{
		case IDEM_ACT_RUN_START_STEP:
			return errmsg("run \"%s\" is on queue \"%s\": a lease token is needed to start a step of it",
						  run_id, queue);
		case IDEM_ACT_RUN_AWAIT:
			return errmsg("run \"%s\" is on queue \"%s\": a lease token is needed to await an event of it",
						  run_id, queue);
		case IDEM_ACT_RUN_FAIL_STEP:
			return errmsg("run \"%s\" is on queue \"%s\": a lease token is needed to fail a step of it",
						  run_id, queue);
		case IDEM_ACT_RUN_EXTEND:
			return errmsg("run \"%s\" is on queue \"%s\": a lease token is needed to extend it",
						  run_id, queue);
		case IDEM_ACT_RUN_RELEASE:
			return errmsg("run \"%s\" is on queue \"%s\": a lease token is needed to release it",
						  run_id, queue);
		case IDEM_ACT_RUN_SLEEP:
			return errmsg("run \"%s\" is on queue \"%s\": a lease token is needed to put it to sleep",
						  run_id, queue);
		default:
			return errmsg("run \"%s\" is on queue \"%s\": a lease token is needed to work on it",
						  run_id, queue);
	}
}

/*
 * idem_run_fence
 *		Raise ID412 unless token is the lease that holds the run now, for
 *		act.  A run that is on no queue takes no token; a queued run's
 *		every step, completion, failure, wait and extension needs its
 *		token.  A lease that ran out but was not taken over still holds.
 */
void
idem_run_fence(IdemRunRow *run, const pg_uuid_t *token, IdemLeaseAct act)
{
	bool		leased;
	bool		matches;

	if (run->queue == NULL)
	{
		if (token == NULL)
			return;
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_LOST),
				 errmsg("lease token does not hold run \"%s\"", run->run_id),
				 errdetail("The run is on no queue: no lease holds it."),
				 idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Call the run's functions without a lease token.")));
	}
	if (token == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_LOST),
				 token_needed_msg(act, run->run_id, run->queue),
				 errdetail("Only the worker that holds a queued run's lease works on it."),
				 idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the run with idem_run_claim() and pass its lease_token.")));
	leased = run->queue_state != NULL && strcmp(run->queue_state, "leased") == 0 &&
		strcmp(run->status, "running") == 0;
	matches = run->has_token &&
		memcmp(run->lease_token.data, token->data, UUID_LEN) == 0;
	if (idem_lease_fence(leased, matches) != IDEM_FENCE_HELD)
		idem_lease_lost(idem_lease_fence(leased, matches), act, run->run_id,
						run->queue_state != NULL ? run->queue_state : run->status,
						leased ? run->lease_holder : NULL);

	/*
	 * A lease taken before the run's owner was dropped: its steps would
	 * write for a role that no longer exists, and the next claim fails the
	 * run (idem_run_claim()).
	 */
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(run->owner)))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_LOST),
				 errmsg("lease token does not hold run \"%s\"", run->run_id),
				 errdetail("The run's owner role was dropped: the run executes nothing more."),
				 idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not work on the run; the next claim fails it.")));
}

/*
 * idem_run_check_room
 *		Before a holder whose lease ran out goes on working (a statement
 *		step, an external step's start, an extension): the lease still
 *		holds, but no longer has room under the queue's cap if a claim
 *		leased another run in its place meanwhile, and the two holders
 *		would work beyond the cap.  ID412 then.  Recording what was done
 *		(a result, a failure) and letting go (release, await, sleep) need
 *		no room.
 */
void
idem_run_check_room(IdemRunRow *run)
{
	TimestampTz now = GetCurrentTimestamp();
	IdemQueue	q;

	if (run->queue == NULL || run->due_at > now)
		return;
	idem_queue_read(run->queue, &q);
	if (idem_queue_room(&q, 1, now) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_LOST),
				 errmsg("lease of run \"%s\" ran out while queue \"%s\" is at its concurrency cap",
						run->run_id, run->queue),
				 errdetail_plural("The queue leases at most %d run at once; another run was leased in this one's place after its lease ran out.",
								  "The queue leases at most %d runs at once; other runs were leased in this one's place after its lease ran out.",
								  q.concurrency, q.concurrency),
				 idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Stop working on the run; a claim takes it over once the cap leaves room. Extend leases before they run out.")));
}

/*
 * idem_lock_run_fenced
 *		idem_lock_run(), with the fence checked on the run's latest version
 *		before the snapshot is: a holder whose lease was taken over gets
 *		ID412 at every isolation level, not a serialization failure.
 */
void
idem_lock_run_fenced(Oid owner, const char *run_id, const pg_uuid_t *token,
					 IdemLeaseAct act, IdemRunRow *run)
{
	lock_and_read(owner, run_id, run);
	idem_run_fence(run, token, act);
	idem_check_run_visible(run);
}

/*
 * idem_lock_run_leased
 *		Lock and read the queued run that token leases, fenced: the run's
 *		functions that take a lease token start here.
 */
void
idem_lock_run_leased(const char *run_id, const pg_uuid_t *token,
					 IdemLeaseAct act, IdemRunRow *run)
{
	idem_lock_run_fenced(idem_leased_run_owner(run_id, token, act), run_id, token,
						 act, run);
}

/*
 * idem_run_attempt_begin
 *		Record the claim that just leased run (its claims already counted):
 *		the row commits with the claim.
 */
void
idem_run_attempt_begin(IdemRunRow *run, const char *step, TimestampTz now)
{
	idem_insert_run_attempt(run->owner, run->run_id, run->claims, run->attempt,
							step, run->lease_holder, run->leased_by, now);
}

/*
 * idem_run_end_lease
 *		End the run's lease, if one holds it, with outcome on its attempt's
 *		record; the caller sets the run's new queue_state and writes it.
 */
void
idem_run_end_lease(IdemRunRow *run, const char *outcome, const char *error,
				   TimestampTz now)
{
	if (run->claims > 0 && run->queue_state != NULL &&
		strcmp(run->queue_state, "leased") == 0)
		idem_end_run_attempt(run->owner, run->run_id, run->claims, now,
							 outcome, error);
	run->has_token = false;
	run->leased_by = InvalidOid;
	run->lease_holder = NULL;
}

/*
 * idem_run_end_lease_expired
 *		End the run's lease that ran out: its attempt died (the worker
 *		stopped, or was killed), counted as an expired lease.
 */
void
idem_run_end_lease_expired(IdemRunRow *run, TimestampTz now)
{
	idem_run_end_lease(run, "lease_expired", "lease expired", now);
	idem_stats_count_for(MyDatabaseId, run->owner,
						 IDEM_STAT_RUN_LEASE_EXPIRIES, 1);
}

/*
 * idem_run_end_lease_for
 *		End the run's lease for an operator's verb (cancel, fail, complete)
 *		with outcome: a lease that ran out ends as lease_expired instead,
 *		as the claim that took the run over would end it.  The holder did
 *		not stop for the verb; it was gone.
 */
void
idem_run_end_lease_for(IdemRunRow *run, const char *outcome,
					   const char *error, TimestampTz now)
{
	if (run->queue_state != NULL && strcmp(run->queue_state, "leased") == 0 &&
		run->due_at <= now)
		idem_run_end_lease_expired(run, now);
	else
		idem_run_end_lease(run, outcome, error, now);
}

/*
 * idem_run_is_admin
 *		Superusers and members of idem_admin act on every role's runs.
 */
bool
idem_run_is_admin(Oid role)
{
	Oid			admin;

	/* superusers first: the role's trust check reads its memberships */
	if (superuser_arg(role))
		return true;
	admin = idem_admin_role();
	return OidIsValid(admin) && has_privs_of_role(role, admin);
}

/*
 * idem_runs_admin() returns boolean
 *
 * Whether the current role sees every role's runs in idem_runs and
 * idem_run_attempts: administrators, and members of pg_monitor.
 */
Datum
idem_runs_admin(PG_FUNCTION_ARGS)
{
	Oid			role = GetUserId();

	PG_RETURN_BOOL(idem_run_is_admin(role) ||
				   has_privs_of_role(role, ROLE_PG_MONITOR));
}

/* The refusal of op on another role's runs, role naming the owner */
static int
owner_denied_msg(IdemRunOp op, const char *role)
{
	switch (op)
	{
		case IDEM_RUN_OP_READ:
			return errmsg("permission denied to read runs of role \"%s\"", role);
		case IDEM_RUN_OP_CANCEL:
			return errmsg("permission denied to cancel runs of role \"%s\"", role);
		case IDEM_RUN_OP_RETRY:
			return errmsg("permission denied to retry runs of role \"%s\"", role);
		case IDEM_RUN_OP_FAIL:
			return errmsg("permission denied to fail runs of role \"%s\"", role);
		case IDEM_RUN_OP_RESUME:
			return errmsg("permission denied to resume runs of role \"%s\"", role);
		case IDEM_RUN_OP_COMPLETE:
			return errmsg("permission denied to complete runs of role \"%s\"", role);
	}
	return errmsg("permission denied for runs of role \"%s\"", role);
}

/*
 * idem_run_owner_arg
 *		Whose run an operator's call (op) names: the argument, or the
 *		caller's key owner.  Another role's run is for that role's members
 *		and administrators only (42501).
 */
Oid
idem_run_owner_arg(FunctionCallInfo fcinfo, int argno, IdemRunOp op)
{
	Oid			owner;

	if (PG_ARGISNULL(argno))
		return idem_key_owner();
	owner = PG_GETARG_OID(argno);
	if (!has_privs_of_role(GetUserId(), owner) &&
		!idem_run_is_admin(GetUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 owner_denied_msg(op, GetUserNameFromId(owner, false)),
				 errdetail("Only the run's owner, superusers and members of idem_admin may."),
				 idem_errhint(ERRCODE_INSUFFICIENT_PRIVILEGE, "An administrator grants idem_admin.")));
	return owner;
}

/*
 * idem_errmsg_run_status
 *		errmsg() saying what a run that is not running is, by its status:
 *		each status its own message.  Use as an ereport() auxiliary.
 */
int
idem_errmsg_run_status(const char *run_id, const char *status)
{
	if (strcmp(status, "completed") == 0)
		return errmsg("run \"%s\" is completed", run_id);
	if (strcmp(status, "failed") == 0)
		return errmsg("run \"%s\" has failed", run_id);
	if (strcmp(status, "cancelled") == 0)
		return errmsg("run \"%s\" is cancelled", run_id);
	if (strcmp(status, "running") == 0)
		return errmsg("run \"%s\" is running", run_id);
	return errmsg("run \"%s\" has status \"%s\"", run_id, status);
}
