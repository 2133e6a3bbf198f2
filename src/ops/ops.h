/*-------------------------------------------------------------------------
 *
 * ops.h
 *		Operations: the outcome of each call (counted and audited), the
 *		audit trail, the purge worker.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/ops/ops.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_OPS_H
#define IDEM_OPS_H

#include "common/common.h"
#include "outbox/outbox.h"

/*
 * What became of one idem_execute() call, counted
 * in shared memory (stats.c) and written to the audit trail (audit.c).
 */
typedef enum IdemOutcome
{
	IDEM_OUTCOME_EXECUTED,		/* the business statement ran and was recorded */
	IDEM_OUTCOME_REPLAYED,		/* the stored response was returned */
	IDEM_OUTCOME_MISMATCH,		/* ID422: the key holds another request */
	IDEM_OUTCOME_IN_PROGRESS,	/* ID409: the key is being executed elsewhere */
	IDEM_OUTCOME_CONFLICT,		/* class 40: serialization failure, deadlock */
	IDEM_OUTCOME_SEQUENCING,	/* a workflow step out of order */
	IDEM_OUTCOME_ERROR			/* the business statement (or recording) failed */
} IdemOutcome;

/*
 * The one hook every outcome of a call goes through: counts it and, at the
 * idem.audit level that asks for it, writes the audit entry.  run_id and
 * step may be NULL (calls outside a workflow), fingerprint too (unknown
 * yet); sqlerrcode is 0 for executions and replays.  For a rejected
 * attempt it is called from a PG_CATCH block: it neither allocates nor
 * raises there.
 */
extern void idem_note_outcome(IdemOutcome outcome, const IdemRequest *req,
							  const uint8 *fingerprint, const char *run_id,
							  const char *step, int sqlerrcode);

extern IdemOutcome idem_error_outcome(int sqlerrcode, bool executing);
extern void idem_note_done(const IdemRequest *req, const uint8 *fingerprint,
						   const char *run_id, const char *step,
						   bool replayed);
extern void idem_note_error(const IdemRequest *req, const uint8 *fingerprint,
							const char *run_id, const char *step,
							bool executing);

/* audit.c: the audit trail and its queue for rejected attempts */
extern void idem_audit_note(IdemOutcome outcome, const IdemRequest *req,
							const uint8 *fingerprint, const char *run_id,
							const char *step, int sqlerrcode);
extern void idem_audit_run_action(Oid owner, const char *run_id,
								  const char *action);
extern Size idem_audit_shmem_size(void);
extern void idem_audit_shmem_init(void);

extern int64 idem_audit_drain(int batch_size);
extern int64 idem_audit_purge_expired(int batch_size);
extern void idem_audit_set_launcher_latch(struct Latch *latch);
extern void idem_audit_discard_other(const Oid *dbids, int ndbs,
									 const Oid *existing, int nexisting);
extern void idem_audit_discard_db(Oid dbid);


/* worker.c: the purge launcher and its per-database workers */
extern void idem_worker_register(void);

#endif							/* IDEM_OPS_H */
