/*-------------------------------------------------------------------------
 *
 * control.c
 *		Operators' verbs on runs: idem_run_cancel() and idem_run_retry(),
 *		for a run's owner and for administrators (superusers and members
 *		of idem_admin), who name the owner of another role's run.
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

#include "fmgr.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "compat.h"
#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_run_cancel);
PG_FUNCTION_INFO_V1(idem_run_retry);

static void
report_finished(IdemRunRow *run, const char *verb)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_RUN_NOT_RUNNING),
			 errmsg("run \"%s\" is %s", run->run_id, run->status),
			 errdetail("A %s run cannot be %s.", run->status, verb),
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
	char	   *run_id = idem_name_arg(fcinfo, 0, "run id");
	Oid			owner;

	idem_check_can_write("idem_run_cancel()");
	owner = idem_run_owner_arg(fcinfo, 2, "cancel");
	PG_RETURN_TEXT_P(cstring_to_text(idem_run_cancel_in(&idem_local_runs, owner,
														run_id,
														PG_ARGISNULL(1) ? NULL :
														text_to_cstring(PG_GETARG_TEXT_PP(1)))));
}

/*
 * idem_run_cancel_in
 *		Cancel owner's run run_id in store, for reason (NULL: "cancelled");
 *		returns its status.
 */
char *
idem_run_cancel_in(const IdemRunStore *store, Oid owner, const char *run_id,
				   const char *reason)
{
	IdemRunRow	run;
	TimestampTz now = GetCurrentTimestamp();

	/* the run's last error and its attempt's, as a failed step's error */
	if (reason != NULL)
		idem_check_error_text("reason", reason);
	idem_run_lock_in(store, owner, run_id, &run);
	if (strcmp(run.status, "cancelled") == 0)
		return run.status;
	if (strcmp(run.status, "running") != 0)
		report_finished(&run, "cancelled");
	run.last_error = reason != NULL ? pstrdup(reason) : "cancelled";
	if (run.queue != NULL)
	{
		idem_run_end_lease_for(&run, "cancelled", run.last_error, now);
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
	char	   *run_id = idem_name_arg(fcinfo, 0, "run id");
	Oid			owner;
	IdemRunRow	run;

	idem_check_can_write("idem_run_retry()");
	owner = idem_run_owner_arg(fcinfo, 1, "retry");
	idem_lock_run(owner, run_id, &run);
	idem_run_check_queued(&run, "Only queued runs are retried.",
						  "Resume a run on no queue with idem_run_resume().");
	if (strcmp(run.status, "failed") == 0)
	{
		run.status = "running";
		run.finished = false;
	}
	else if (strcmp(run.status, "running") != 0)
		report_finished(&run, "retried");
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
