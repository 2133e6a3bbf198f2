/*-------------------------------------------------------------------------
 *
 * signal.c
 *		Signals to runs and sleeps: idem_run_signal(), which stores a
 *		run's signal and wakes the run that waits for it, the payload a
 *		waiting step completes with, and idem_run_sleep().
 *
 * A signal is a row of idem.run_signals, one per run and event, kept until
 * the run is purged: a signal that comes before the await is there when
 * the await asks, and sending it again is a no-op (with another payload,
 * ID422).  A run's owner signals it; other roles need the signal grant of
 * the run's queue, or idem_admin.  The run's lock orders a signal against
 * the await, so a run never waits for a signal it already has: the await
 * looks for the signal with a snapshot taken under the lock, not with its
 * transaction's, which under REPEATABLE READ or SERIALIZABLE may be older
 * than a signal that committed before the lock was granted.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/signal.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_run_signal);
PG_FUNCTION_INFO_V1(idem_run_sleep);

/* The longest sleep of idem_run_sleep(). */
#define RUN_MAX_SLEEP_DAYS	366

static IdemQuery q_signal_get = {
	"SELECT payload FROM idem.run_signals"
	" WHERE owner OPERATOR(pg_catalog.=) $1"
	"   AND run_id OPERATOR(pg_catalog.=) $2"
	"   AND event OPERATOR(pg_catalog.=) $3",
	3, {REGROLEOID, TEXTOID, TEXTOID}
};

static IdemQuery q_signal_insert = {
	"INSERT INTO idem.run_signals"
	"  (owner, run_id, event, payload, signalled_by, signalled_at)"
	" VALUES ($1, $2, $3, $4, $5, $6)"
	" ON CONFLICT (owner, run_id, event) DO NOTHING",
	6, {REGROLEOID, TEXTOID, TEXTOID, JSONBOID, REGROLEOID, TIMESTAMPTZOID}
};

/*
 * idem_run_signal_payload
 *		The payload of the run's signal event, copied into *payload; false
 *		if there is no such signal.  The caller holds the run's lock.
 *
 * Read as committed now, whatever the isolation level, as the run's row
 * is read for its fence.  Sound because a signal is inserted under the
 * run's lock and never changed (only the purge of the run, under the same
 * lock, deletes it): every signal committed before the caller's lock was
 * granted is seen, and any other waits for the lock and then finds the
 * run as the caller leaves it.
 */
bool
idem_run_signal_payload(Oid owner, const char *run_id, const char *event,
						Jsonb **payload)
{
	IdemOwnerSPI spi;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	bool		found;

	values[0] = ObjectIdGetDatum(owner);
	values[1] = CStringGetTextDatum(run_id);
	values[2] = CStringGetTextDatum(event);
	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run_latest(&q_signal_get, values, nulls, 1);
	found = SPI_processed == 1;
	if (found)
	{
		bool		isnull;
		MemoryContext oldcxt = MemoryContextSwitchTo(spi.callercxt);

		*payload = DatumGetJsonbPCopy(SPI_getbinval(SPI_tuptable->vals[0],
													SPI_tuptable->tupdesc, 1,
													&isnull));
		MemoryContextSwitchTo(oldcxt);
	}
	idem_owner_spi_end(&spi);
	return found;
}

/*
 * idem_run_signal(run_id text, event text, payload jsonb, owner regrole)
 *		returns boolean
 *
 * True when the signal is stored, false when the same signal was already
 * there.  A run that waits for event is due at once.
 */
Datum
idem_run_signal(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	char	   *event = idem_name_arg(fcinfo, 1, IDEM_NAME_EVENT);
	Jsonb	   *payload;
	Oid			caller = GetUserId();
	Oid			owner;
	IdemRunRow	run;
	IdemOwnerSPI spi;
	Datum		values[6];
	char		nulls[6] = {' ', ' ', ' ', ' ', ' ', ' '};
	bool		inserted;
	Jsonb	   *stored;
	TimestampTz now = GetCurrentTimestamp();

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("payload must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, "Signal an empty payload as '{}'.")));
	payload = PG_GETARG_JSONB_P(2);
	if (JB_ROOT_IS_SCALAR(payload) &&
		strcmp(JsonbToCString(NULL, &payload->root, VARSIZE(payload)), "null") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("payload must not be JSON null"),
				 errdetail("JSON null is what an await that timed out records."),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "Signal an empty payload as '{}'.")));
	idem_check_response_size(payload, IDEM_RESPONSE_SIGNAL, NULL);
	idem_check_can_write("idem_run_signal()");

	/*
	 * Another role's run: its queue's signallers and administrators.  Its
	 * existence is theirs to know only: a run the caller may not signal
	 * is reported as one that does not exist.
	 */
	owner = PG_ARGISNULL(3) ? idem_key_owner() : PG_GETARG_OID(3);
	if (!has_privs_of_role(caller, owner) && !idem_run_is_admin(caller))
	{
		IdemQueue	q;

		if (!idem_lookup_run(owner, run_id, &run) || run.queue == NULL ||
			!idem_queue_allows(run.queue, caller, QUEUE_SIGNAL, &q))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_RUN_NOT_FOUND),
					 errmsg("run \"%s\" of role \"%s\" does not exist",
							run_id, GetUserNameFromId(owner, false)),
					 errdetail("No run with this id was begun by that role on a queue whose signallers include role \"%s\".",
							   GetUserNameFromId(caller, false)),
					 idem_errhint(ERRCODE_IDEM_RUN_NOT_FOUND, "An administrator grants signalling a queue's runs with idem_queue_grant(queue, role, 'signal').")));
	}
	idem_lock_run(owner, run_id, &run);
	/* an await needs a claim's lease: nothing would ever read the signal */
	idem_run_check_queued(&run, "Only a queued run awaits signals.",
						  "Begin the run on a queue to have it wait for signals.");
	/*
	 * A failed run goes on once resumed or retried, and its await then
	 * reads the signal: refused now, it would be lost.
	 */
	if (strcmp(run.status, "running") != 0 &&
		strcmp(run.status, "failed") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
				 idem_errmsg_run_status(run_id, run.status),
				 errdetail("A completed or cancelled run takes no signals."),
				 idem_errhint(ERRCODE_IDEM_RUN_NOT_RUNNING, NULL)));
	/*
	 * A run with declared steps awaits only those: another name would wait
	 * unused.
	 */
	(void) idem_run_step_ordinal(&run, event);

	/*
	 * Nor would a new signal for a step the run completed (its await timed
	 * out, or it was completed otherwise) ever be read: its sender must
	 * learn that it came too late.  The signal that completed the step,
	 * sent again, is still the no-op below.
	 */
	if (idem_run_name_position(run.done_steps, event) > 0 &&
		!idem_run_signal_payload(owner, run_id, event, &stored))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
				 errmsg("step \"%s\" of run \"%s\" is already completed",
						event, run_id),
				 errdetail("A signal for a completed step would never be read."),
				 idem_errhint(ERRCODE_IDEM_RUN_NOT_RUNNING, NULL)));

	values[0] = ObjectIdGetDatum(owner);
	values[1] = CStringGetTextDatum(run_id);
	values[2] = CStringGetTextDatum(event);
	values[3] = JsonbPGetDatum(payload);
	values[4] = ObjectIdGetDatum(caller);
	values[5] = TimestampTzGetDatum(now);
	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run(&q_signal_insert, values, nulls, 0);
	inserted = SPI_processed == 1;
	idem_owner_spi_end(&spi);
	if (!inserted)
	{
		if (idem_run_signal_payload(owner, run_id, event, &stored) &&
			!datumIsEqual(JsonbPGetDatum(stored), JsonbPGetDatum(payload),
						  false, -1))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_KEY_REUSED),
					 errmsg("run \"%s\" was already signalled \"%s\" with another payload",
							run_id, event),
					 errdetail("A run takes one signal per event; the first payload stays."),
					 idem_errhint(ERRCODE_IDEM_KEY_REUSED, NULL)));
		PG_RETURN_BOOL(false);
	}
	if (run.queue_state != NULL && strcmp(run.queue_state, "waiting") == 0 &&
		run.awaiting != NULL && strcmp(run.awaiting, event) == 0)
	{
		run.queue_state = "ready";
		run.due_at = now;
		idem_update_run(&run);
		idem_queue_wake(run.queue);
	}
	idem_stats_count_for(MyDatabaseId, owner, IDEM_STAT_RUN_SIGNALS, 1);
	PG_RETURN_BOOL(true);
}

/*
 * idem_run_sleep(run_id text, lease_token uuid, until timestamptz)
 *		returns boolean
 *
 * True: the lease ends and the run is due at until (the worker stops).
 * False: until has passed, and the worker goes on.  A worker that resumes
 * the run calls again with the same until (from the run's input or a
 * step's result), and goes on.
 */
Datum
idem_run_sleep(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	const pg_uuid_t *token = idem_lease_token_arg(fcinfo, 1, true);
	TimestampTz until;
	TimestampTz now = GetCurrentTimestamp();
	IdemRunRow	run;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("until must not be null"),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	until = PG_GETARG_TIMESTAMPTZ(2);
	if (TIMESTAMP_NOT_FINITE(until) ||
		until > now + (int64) RUN_MAX_SLEEP_DAYS * USECS_PER_DAY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("until must be finite and at most %d days ahead",
						RUN_MAX_SLEEP_DAYS),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	idem_check_can_write("idem_run_sleep()");
	idem_lock_run_leased(run_id, token, IDEM_ACT_RUN_SLEEP, &run);
	if (until <= now)
		PG_RETURN_BOOL(false);
	idem_run_end_lease(&run, "sleeping", NULL, now);
	run.queue_state = "sleeping";
	run.due_at = until;
	idem_update_run(&run);
	PG_RETURN_BOOL(true);
}
