/*-------------------------------------------------------------------------
 *
 * lease.c
 *		The one lease implementation of outbox events and queued runs:
 *		lease tokens, the fence a token's holder must pass, the bounds of
 *		a lease and of a wait, and when a failed attempt is retried
 *		(exponential backoff, jitter, a caller's retry_after).
 *
 * A lease is a due time moved to the lease's end and a random token.  The
 * claim that issues it is the only writer of the token; every later call
 * of the holder presents the token, and the fence compares it with the one
 * on the row, locked.  A lease that ran out still holds until another
 * claim takes the row over (a new token): the holder's work happened, and
 * accepting it spares a duplicate.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/lease.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "common/int.h"
#include "datatype/timestamp.h"
#include "utils/uuid.h"

#include "compat.h"
#include "common/common.h"

/*
 * idem_random_uuid
 *		A random (version 4) UUID: event ids and lease tokens.
 */
Datum
idem_random_uuid(void)
{
	pg_uuid_t  *uuid = palloc(UUID_LEN);

	idem_random_id(uuid->data);
	/* RFC 4122 version 4, variant 1 */
	uuid->data[6] = (uuid->data[6] & 0x0f) | 0x40;
	uuid->data[8] = (uuid->data[8] & 0x3f) | 0x80;
	return UUIDPGetDatum(uuid);
}

/*
 * idem_interval_usecs
 *		An interval as microseconds, months as 30 days (as interval
 *		comparison), saturating: an absurd interval must fail the callers'
 *		bounds checks, not wrap around into them.
 */
int64
idem_interval_usecs(Interval *iv)
{
	int64		days;
	int64		us;

	if (pg_mul_s64_overflow((int64) iv->month, DAYS_PER_MONTH, &days) ||
		pg_add_s64_overflow(days, iv->day, &days) ||
		pg_mul_s64_overflow(days, USECS_PER_DAY, &us) ||
		pg_add_s64_overflow(us, iv->time, &us))
		return (iv->month < 0 || (iv->month == 0 && iv->day < 0)) ?
			PG_INT64_MIN : PG_INT64_MAX;
	return us;
}

/*
 * idem_retry_after_usecs
 *		A failure's retry_after in microseconds, within [0,
 *		idem.outbox_max_retry_after]: events and runs share the ceiling.
 */
int64
idem_retry_after_usecs(Interval *retry_after)
{
	int64		us = idem_interval_usecs(retry_after);

	if (us < 0 || us > (int64) idem_outbox_max_retry_after * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("retry_after must be between zero and idem.outbox_max_retry_after"),
				 errdetail_plural("idem.outbox_max_retry_after is %d second.",
								  "idem.outbox_max_retry_after is %d seconds.",
								  idem_outbox_max_retry_after,
								  idem_outbox_max_retry_after),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	return us;
}

/*
 * idem_lease_usecs
 *		A lease argument in microseconds, within (0, max_s seconds]; setting
 *		names the parameter that sets max_s.
 */
int64
idem_lease_usecs(Interval *lease, int max_s, const char *setting)
{
	int64		lease_us = idem_interval_usecs(lease);

	if (lease_us <= 0 || lease_us > (int64) max_s * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("lease must be greater than zero and at most %s", setting),
				 errdetail_plural("%s is %d second.", "%s is %d seconds.", max_s,
								  setting, max_s),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	return lease_us;
}

/*
 * idem_wait_ms
 *		A wait's timeout as milliseconds, within [0, IDEM_MAX_WAIT_S].
 */
long
idem_wait_ms(Interval *timeout)
{
	int64		timeout_us = idem_interval_usecs(timeout);

	if (timeout_us < 0 || timeout_us > (int64) IDEM_MAX_WAIT_S * USECS_PER_SEC)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("timeout must be between 0 and %d seconds", IDEM_MAX_WAIT_S),
				 errdetail("A waiting statement holds its snapshot, which keeps VACUUM from removing rows deleted since it began."),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	return (long) (timeout_us / 1000);
}

/*
 * idem_lease_fence
 *		Whether a token holds a row: leased says the row is under a lease
 *		(whether or not it ran out), token_matches that the presented token
 *		is the row's.
 */
IdemFence
idem_lease_fence(bool leased, bool token_matches)
{
	if (leased && token_matches)
		return IDEM_FENCE_HELD;
	return leased ? IDEM_FENCE_TAKEN_OVER : IDEM_FENCE_NOT_LEASED;
}

/* The hint of a holder whose lease was taken over, for what it tried */
static int
taken_over_hint(IdemLeaseAct act)
{
	switch (act)
	{
		case IDEM_ACT_EVENT_ACK:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not acknowledge the event; its current holder delivers it.");
		case IDEM_ACT_EVENT_FAIL:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not fail the event; its current holder delivers it.");
		case IDEM_ACT_EVENT_EXTEND:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not extend the event; its current holder delivers it.");
		case IDEM_ACT_EVENT_RELEASE:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not release the event; its current holder delivers it.");
		case IDEM_ACT_RUN_WORK:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not work on the run; its current holder runs it.");
		case IDEM_ACT_RUN_START_STEP:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not start a step of the run; its current holder runs it.");
		case IDEM_ACT_RUN_AWAIT:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not await an event of the run; its current holder runs it.");
		case IDEM_ACT_RUN_FAIL_STEP:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not fail a step of the run; its current holder runs it.");
		case IDEM_ACT_RUN_EXTEND:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not extend the run; its current holder runs it.");
		case IDEM_ACT_RUN_RELEASE:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not release the run; its current holder runs it.");
		case IDEM_ACT_RUN_SLEEP:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Do not put the run to sleep; its current holder runs it.");
	}
	return idem_errhint(ERRCODE_IDEM_LEASE_LOST, NULL);
}

/* The hint of a holder whose row no lease holds, for what it tried */
static int
not_leased_hint(IdemLeaseAct act)
{
	switch (act)
	{
		case IDEM_ACT_EVENT_ACK:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the event again before you acknowledge it.");
		case IDEM_ACT_EVENT_FAIL:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the event again before you fail it.");
		case IDEM_ACT_EVENT_EXTEND:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the event again before you extend it.");
		case IDEM_ACT_EVENT_RELEASE:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the event again before you release it.");
		case IDEM_ACT_RUN_WORK:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the run again before you work on it.");
		case IDEM_ACT_RUN_START_STEP:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the run again before you start a step of it.");
		case IDEM_ACT_RUN_AWAIT:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the run again before you await an event of it.");
		case IDEM_ACT_RUN_FAIL_STEP:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the run again before you fail a step of it.");
		case IDEM_ACT_RUN_EXTEND:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the run again before you extend it.");
		case IDEM_ACT_RUN_RELEASE:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the run again before you release it.");
		case IDEM_ACT_RUN_SLEEP:
			return idem_errhint(ERRCODE_IDEM_LEASE_LOST, "Claim the run again before you put it to sleep.");
	}
	return idem_errhint(ERRCODE_IDEM_LEASE_LOST, NULL);
}

/*
 * The detail of a row no lease holds, by its state: an event's, or a
 * queued run's queue state (its status once it left the queue).
 */
static int
not_leased_detail(bool run, const char *state)
{
	if (!run)
	{
		if (strcmp(state, "pending") == 0)
			return errdetail("The event is pending: no lease holds it.");
		if (strcmp(state, "dead") == 0)
			return errdetail("The event is dead: no lease holds it.");
		return errdetail("The event is in state \"%s\": no lease holds it.", state);
	}
	if (strcmp(state, "ready") == 0)
		return errdetail("The run is ready: no lease holds it.");
	if (strcmp(state, "waiting") == 0)
		return errdetail("The run is waiting: no lease holds it.");
	if (strcmp(state, "sleeping") == 0)
		return errdetail("The run is sleeping: no lease holds it.");
	if (strcmp(state, "completed") == 0)
		return errdetail("The run is completed: no lease holds it.");
	if (strcmp(state, "failed") == 0)
		return errdetail("The run has failed: no lease holds it.");
	if (strcmp(state, "cancelled") == 0)
		return errdetail("The run is cancelled: no lease holds it.");
	return errdetail("The run is in state \"%s\": no lease holds it.", state);
}

/*
 * idem_lease_lost
 *		Raise ID412 for a token the fence refused when its holder tried
 *		act: id names the row (an event's id, a run's id), state is what
 *		the row is now and holder who holds it now (or NULL).
 */
void
idem_lease_lost(IdemFence fence, IdemLeaseAct act, const char *id,
				const char *state, const char *holder)
{
	bool		run = act >= IDEM_ACT_RUN_WORK;

	Assert(fence != IDEM_FENCE_HELD);
	if (fence == IDEM_FENCE_TAKEN_OVER && !run)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_LOST),
				 errmsg("lease token does not hold outbox event %s", id),
				 holder == NULL ?
				 errdetail("The event is leased under another token: the lease was taken over after it expired, or the token is not one a claim returned.") :
				 errdetail("The event is leased to %s under another token: the lease was taken over after it expired, or the token is not one a claim returned.",
						   holder),
				 taken_over_hint(act)));
	if (fence == IDEM_FENCE_TAKEN_OVER)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_LOST),
				 errmsg("lease token does not hold run \"%s\"", id),
				 holder == NULL ?
				 errdetail("The run is leased under another token: the lease was taken over after it expired, or the token is not one a claim returned.") :
				 errdetail("The run is leased to %s under another token: the lease was taken over after it expired, or the token is not one a claim returned.",
						   holder),
				 taken_over_hint(act)));
	if (!run)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_LEASE_LOST),
				 errmsg("lease token does not hold outbox event %s", id),
				 not_leased_detail(false, state),
				 not_leased_hint(act)));
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_LEASE_LOST),
			 errmsg("lease token does not hold run \"%s\"", id),
			 not_leased_detail(true, state),
			 not_leased_hint(act)));
}

/*
 * idem_backoff_next
 *		When the next attempt after the failure of attempt number attempts
 *		is due: the backoff window is min(cap, base * 2^(attempts-1)); full
 *		jitter takes a random point of it, equal jitter a random point of
 *		its second half, none its end.  Never before retry_after.
 */
TimestampTz
idem_backoff_next(TimestampTz now, int32 attempts, int base_ms, int cap_ms,
				  IdemJitter jitter, int64 retry_after_us)
{
	double		window_ms;
	double		delay_ms;
	int64		delay_us;

	window_ms = (double) base_ms * pow(2.0, (double) Max(attempts - 1, 0));
	window_ms = Min(window_ms, (double) cap_ms);
	switch (jitter)
	{
		case IDEM_JITTER_FULL:
			delay_ms = idem_random_double() * window_ms;
			break;
		case IDEM_JITTER_EQUAL:
			delay_ms = window_ms / 2.0 + idem_random_double() * window_ms / 2.0;
			break;
		default:
			delay_ms = window_ms;
			break;
	}
	delay_us = (int64) (delay_ms * 1000.0);
	delay_us = Max(delay_us, retry_after_us);
	return now + delay_us;
}

/*
 * idem_jitter_from_name
 *		"full", "equal" or "none"; an error for anything else.
 */
IdemJitter
idem_jitter_from_name(const char *name)
{
	if (strcmp(name, "full") == 0)
		return IDEM_JITTER_FULL;
	if (strcmp(name, "equal") == 0)
		return IDEM_JITTER_EQUAL;
	if (strcmp(name, "none") == 0)
		return IDEM_JITTER_NONE;
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("unrecognized jitter \"%s\"", name),
			 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "The jitters are \"full\", \"equal\" and \"none\".")));
	return IDEM_JITTER_NONE;	/* keep compiler quiet */
}
