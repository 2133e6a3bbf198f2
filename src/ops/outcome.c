/*-------------------------------------------------------------------------
 *
 * outcome.c
 *		What a call's ending means (executed, replayed, refused, failed),
 *		reported once by the function that ran the call: counted in the
 *		stats and written to the audit trail at the level idem.audit asks.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/ops/outcome.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "ops/ops.h"

static const IdemStatCounter outcome_counter[] = {
	[IDEM_OUTCOME_EXECUTED] = IDEM_STAT_EXECUTIONS,
	[IDEM_OUTCOME_REPLAYED] = IDEM_STAT_REPLAYS,
	[IDEM_OUTCOME_MISMATCH] = IDEM_STAT_MISMATCHES,
	[IDEM_OUTCOME_IN_PROGRESS] = IDEM_STAT_IN_PROGRESS,
	[IDEM_OUTCOME_CONFLICT] = IDEM_STAT_CONFLICTS,
	[IDEM_OUTCOME_SEQUENCING] = IDEM_STAT_SEQUENCING,
	[IDEM_OUTCOME_ERROR] = IDEM_STAT_ERRORS,
};

/*
 * idem_error_outcome
 *		What a call's error means: executing says whether the business
 *		statement had started.  Its errors are the business statement's
 *		own (even an ID422 of a nested call), except conflicts, which mean
 *		"retry" wherever they arise.
 */
IdemOutcome
idem_error_outcome(int sqlerrcode, bool executing)
{
	if (ERRCODE_TO_CATEGORY(sqlerrcode) == ERRCODE_TRANSACTION_ROLLBACK)
		return IDEM_OUTCOME_CONFLICT;
	if (executing)
		return IDEM_OUTCOME_ERROR;
	if (sqlerrcode == ERRCODE_IDEM_KEY_REUSED)
		return IDEM_OUTCOME_MISMATCH;
	/* a nested call with the running key: held, by its own caller */
	if (sqlerrcode == ERRCODE_IDEM_IN_PROGRESS ||
		sqlerrcode == ERRCODE_IDEM_NESTED_KEY)
		return IDEM_OUTCOME_IN_PROGRESS;
	if (sqlerrcode == ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE ||
		sqlerrcode == ERRCODE_IDEM_STEP_UNDECLARED ||
		sqlerrcode == ERRCODE_IDEM_RUN_NOT_RUNNING ||
		sqlerrcode == ERRCODE_IDEM_RUN_NOT_FOUND)
		return IDEM_OUTCOME_SEQUENCING;
	return IDEM_OUTCOME_ERROR;
}

/*
 * Count and audit an outcome; in_error: from the PG_CATCH block of the
 * call's error, where the catalogs must not be read before the error is
 * cleaned up (idem_stats_count_in_error()).
 */
static void
note_outcome(IdemOutcome outcome, const IdemRequest *req,
			 const uint8 *fingerprint, const char *run_id, const char *step,
			 int sqlerrcode, bool in_error)
{
	if (in_error)
		idem_stats_count_in_error(outcome_counter[outcome], 1);
	else
		idem_stats_count(outcome_counter[outcome], 1);
	if (idem_audit_level != IDEM_AUDIT_OFF)
		idem_audit_note(outcome, req, fingerprint, run_id, step, sqlerrcode);
}

/*
 * idem_note_error
 *		Count and audit the outcome of a call whose error is being raised
 *		(from its PG_CATCH block; the caller re-raises it).
 */
void
idem_note_error(const IdemRequest *req, const uint8 *fingerprint,
				const char *run_id, const char *step, bool executing)
{
	int			code = geterrcode();

	note_outcome(idem_error_outcome(code, executing), req, fingerprint,
				 run_id, step, code, true);
}

/* Count and audit the outcome of a call that executed or replayed. */
void
idem_note_done(const IdemRequest *req, const uint8 *fingerprint,
			   const char *run_id, const char *step, bool replayed)
{
	idem_note_outcome(replayed ? IDEM_OUTCOME_REPLAYED : IDEM_OUTCOME_EXECUTED,
					  req, fingerprint, run_id, step, 0);
}

/*
 * idem_note_outcome
 *		Count one call's outcome, and audit it at the level idem.audit asks.
 */
void
idem_note_outcome(IdemOutcome outcome, const IdemRequest *req,
				  const uint8 *fingerprint, const char *run_id,
				  const char *step, int sqlerrcode)
{
	note_outcome(outcome, req, fingerprint, run_id, step, sqlerrcode, false);
}
