/*-------------------------------------------------------------------------
 *
 * control.c
 *		Operators' verbs on runs: idem_run_cancel() and idem_run_retry(),
 *		for a run's owner and for administrators (superusers and members
 *		of idem_admin), who name the owner of another role's run; and
 *		idem_queue_drop(), which cancels a queue's unfinished runs with it.
 *
 * Each verb that changes a run is audited (idem_audit_run_action()).
 *
 * A cancelled run executes nothing more: its lease ends (the holder's next
 * call gets ID412), it leaves its queue, and it keeps its completed steps
 * for inspection.  A retry makes a failed queued run, or one that waits,
 * sleeps or backs off, due at once with fresh attempts.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/control.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_run_cancel);
PG_FUNCTION_INFO_V1(idem_run_retry);
PG_FUNCTION_INFO_V1(idem_queue_drop);

/*
 * A queue's runs that are not finished: running, or failed (a retry would
 * put a failed run back on its queue).  Not in the claim's partial
 * indexes, which leave failed runs out: a drop reads the queue's runs.
 */
static IdemQuery q_unfinished = {
	"SELECT owner, run_id FROM idem.runs"
	" WHERE queue OPERATOR(pg_catalog.=) $1"
	"   AND status OPERATOR(pg_catalog.=) ANY ('{running,failed}'::pg_catalog.text[])"
	" ORDER BY owner, run_id",
	1, {TEXTOID}
};

/* Why a finished run cannot be cancelled or retried (op) */
static int
finished_detail(IdemRunRow *run, IdemRunOp op)
{
	bool		cancel = op == IDEM_RUN_OP_CANCEL;

	if (strcmp(run->status, "completed") == 0)
		return cancel ? errdetail("A completed run cannot be cancelled.") :
			errdetail("A completed run cannot be retried.");
	if (strcmp(run->status, "failed") == 0)
		return cancel ? errdetail("A failed run cannot be cancelled.") :
			errdetail("A failed run cannot be retried.");
	return cancel ? errdetail("A cancelled run cannot be cancelled.") :
		errdetail("A cancelled run cannot be retried.");
}

static void
report_finished(IdemRunRow *run, IdemRunOp op)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
			 idem_errmsg_run_status(run->run_id, run->status),
			 finished_detail(run, op),
			 idem_errhint(ERRCODE_IDEM_RUN_NOT_RUNNING, NULL)));
}

/*
 * idem_run_cancel(run_id text, reason text, owner regrole) returns text
 *
 * Cancelling a cancelled run again returns 'cancelled'.
 */
Datum
idem_run_cancel(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	Oid			owner;

	idem_check_can_write("idem_run_cancel()");
	owner = idem_run_owner_arg(fcinfo, 2, IDEM_RUN_OP_CANCEL);
	PG_RETURN_TEXT_P(cstring_to_text(idem_run_cancel_in(&idem_local_runs, owner,
														run_id,
														PG_ARGISNULL(1) ? NULL :
														text_to_cstring(PG_GETARG_TEXT_PP(1)),
														false)));
}

/*
 * idem_run_cancel_in
 *		Cancel owner's run run_id in store, for reason (NULL: "cancelled");
 *		returns its status.  queue_dropped: for idem_queue_drop(), which
 *		cancels a failed run too, passes over one that completed since it
 *		was listed, and keeps the token of a lease it ends, so that the
 *		holder's next call is told its lease is lost (ID412) rather than
 *		that the run does not exist.
 */
char *
idem_run_cancel_in(const IdemRunStore *store, Oid owner, const char *run_id,
				   const char *reason, bool queue_dropped)
{
	IdemRunRow	run;
	TimestampTz now = GetCurrentTimestamp();

	/* the run's last error and its attempt's, as a failed step's error */
	if (reason != NULL)
		idem_check_error_text(IDEM_TEXT_REASON, reason);
	idem_run_lock_in(store, owner, run_id, &run);
	if (strcmp(run.status, "cancelled") == 0 ||
		(queue_dropped && strcmp(run.status, "completed") == 0))
		return run.status;
	if (strcmp(run.status, "running") != 0 &&
		!(queue_dropped && strcmp(run.status, "failed") == 0))
		report_finished(&run, IDEM_RUN_OP_CANCEL);
	run.last_error = reason != NULL ? pstrdup(reason) : "cancelled";
	if (run.queue != NULL)
	{
		bool		keep_token = queue_dropped && run.has_token;

		idem_run_end_lease_for(&run, "cancelled", run.last_error, now);
		run.has_token = keep_token;
		run.queue_state = NULL;
		run.due_at = DT_NOEND;
	}
	run.status = "cancelled";
	run.finished = true;
	run.finished_at = GetCurrentTransactionStartTimestamp();
	store->update_run(store, &run);
	idem_audit_run_action(owner, run_id, "cancelled");
	return run.status;
}

/*
 * idem_run_retry(run_id text, owner regrole) returns text
 *
 * A queued run that failed, or that is ready, waiting or sleeping, is due
 * now with fresh attempts; a leased run is left to its holder.  Returns
 * the run's status.
 */
Datum
idem_run_retry(PG_FUNCTION_ARGS)
{
	char	   *run_id = idem_name_arg(fcinfo, 0, IDEM_NAME_RUN_ID);
	Oid			owner;
	IdemRunRow	run;

	idem_check_can_write("idem_run_retry()");
	owner = idem_run_owner_arg(fcinfo, 1, IDEM_RUN_OP_RETRY);
	idem_lock_run(owner, run_id, &run);
	idem_run_check_queued(&run, "Only queued runs are retried.",
						  "Resume a run on no queue with idem_run_resume().");
	if (strcmp(run.status, "failed") == 0)
	{
		run.status = "running";
		run.finished = false;
	}
	else if (strcmp(run.status, "running") != 0)
		report_finished(&run, IDEM_RUN_OP_RETRY);
	else if (strcmp(run.queue_state, "leased") == 0)
		PG_RETURN_TEXT_P(cstring_to_text(run.status));
	run.queue_state = "ready";
	run.due_at = GetCurrentTimestamp();
	run.attempt = 1;
	idem_update_run(&run);
	idem_queue_wake(run.queue);
	idem_audit_run_action(owner, run_id, "retried");
	PG_RETURN_TEXT_P(cstring_to_text(run.status));
}

/*
 * idem_queue_drop(queue text, cascade boolean) returns void
 *
 * Refused (2BP01) while runs on the queue are not finished: running, or
 * failed (a retry would put one back on the queue).  With cascade they are
 * cancelled first, each as idem_run_cancel() cancels it for an
 * administrator, and audited.  Finished runs keep the queue's name, for
 * history: none of them is claimed again, nor retried, if a queue of the
 * same name is created later.  The drop waits for the transactions that
 * enqueue on the queue, and keeps later ones from enqueueing until it
 * commits (they then find no queue, 42704).
 */
Datum
idem_queue_drop(PG_FUNCTION_ARGS)
{
	char	   *queue = idem_name_arg(fcinfo, 0, IDEM_NAME_QUEUE);
	bool		cascade;
	IdemOwnerSPI spi;
	Datum		values[1];
	char		nulls[1] = {' '};
	Oid		   *owners;
	char	  **run_ids;
	int			n;
	int			cancelled = 0;
	char	   *reason;
	MemoryContext runcxt;

	idem_arg_not_null(fcinfo, 1, "cascade");
	cascade = PG_GETARG_BOOL(1);
	idem_check_can_write("idem_queue_drop()");
	idem_queue_remove(queue);

	/*
	 * Every run committed so far, whatever the isolation level: the
	 * removal waited for the transactions that were enqueueing, and keeps
	 * new ones out.
	 */
	values[0] = CStringGetTextDatum(queue);
	idem_owner_spi_begin(&spi, idem_catalog_runs());
	idem_query_run_latest(&q_unfinished, values, nulls, 0);
	n = (int) SPI_processed;
	owners = MemoryContextAlloc(spi.callercxt, sizeof(Oid) * Max(n, 1));
	run_ids = MemoryContextAlloc(spi.callercxt, sizeof(char *) * Max(n, 1));
	for (int i = 0; i < n; i++)
	{
		HeapTuple	tup = SPI_tuptable->vals[i];
		bool		isnull;
		MemoryContext old = MemoryContextSwitchTo(spi.callercxt);

		owners[i] = DatumGetObjectId(SPI_getbinval(tup, SPI_tuptable->tupdesc, 1, &isnull));
		run_ids[i] = SPI_getvalue(tup, SPI_tuptable->tupdesc, 2);
		MemoryContextSwitchTo(old);
	}
	idem_owner_spi_end(&spi);
	if (n > 0 && !cascade)
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg_plural("cannot drop run queue \"%s\" because %d run on it is not finished",
							   "cannot drop run queue \"%s\" because %d runs on it are not finished",
							   n, queue, n),
				 errdetail("Running and failed runs keep their queue; run \"%s\" is one of them.",
						   run_ids[0]),
				 idem_errhint(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
							  "Let them finish, or cancel them, or drop the queue with cascade => true, which cancels them.")));
	reason = psprintf("run queue \"%s\" dropped", queue);

	/*
	 * What cancelling one run allocates (its row, the updated version, its
	 * audit entry) goes with it: a drop may cancel a million runs.  So does
	 * the run's lock, once the run is written: held to commit, each would
	 * take a slot of the shared lock table, which a queue of a few thousand
	 * runs fills (53200, and no drop could ever succeed).  The cancelled
	 * version, not yet committed, keeps the run as its lock did: a step, a
	 * verb or a claim that comes for it waits for this transaction (a
	 * claim passes it over), as idem_lock_and_lookup_run() says.  A lock
	 * this transaction held before the drop stays held.
	 */
	runcxt = AllocSetContextCreate(CurrentMemoryContext, "idem_queue_drop run",
								   ALLOCSET_DEFAULT_SIZES);
	for (int i = 0; i < n; i++)
	{
		MemoryContext oldcxt;
		char	   *lockkey;

		CHECK_FOR_INTERRUPTS();
		oldcxt = MemoryContextSwitchTo(runcxt);
		if (strcmp(idem_run_cancel_in(&idem_local_runs, owners[i], run_ids[i],
									  reason, true), "completed") != 0)
			cancelled++;
		lockkey = idem_run_lock_key(run_ids[i]);
		idem_unlock_key(owners[i], lockkey, strlen(lockkey));
		MemoryContextSwitchTo(oldcxt);
		MemoryContextReset(runcxt);
	}
	MemoryContextDelete(runcxt);
	if (cancelled > 0)
		ereport(NOTICE,
				(errmsg_plural("drop cascades to %d unfinished run",
							   "drop cascades to %d unfinished runs",
							   cancelled, cancelled),
				 errdetail("Each was cancelled, as idem_run_cancel() cancels a run.")));
	PG_RETURN_VOID();
}
