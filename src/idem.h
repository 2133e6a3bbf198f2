/*-------------------------------------------------------------------------
 *
 * idem.h
 *		Declarations shared by idem's source files: GUC variables,
 *		SQLSTATEs of idem's own, and the entry points of each module.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/idem.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_H
#define IDEM_H

#include "access/htup.h"
#include "fmgr.h"
#include "utils/guc.h"
#include "utils/resowner.h"
#include "executor/spi.h"
#include "utils/array.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"
#include "utils/uuid.h"

struct Latch;

/*
 * SQLSTATEs of idem's own.  Class "ID" is in the implementation-defined
 * range (SQL standard: classes beginning with I-Z) and unused by PostgreSQL.
 */
/* same key, different request: the IETF Idempotency-Key draft's 422 */
#define ERRCODE_IDEM_KEY_REUSED			MAKE_SQLSTATE('I','D','4','2','2')
/* same key still being executed elsewhere: the draft's 409 */
#define ERRCODE_IDEM_IN_PROGRESS		MAKE_SQLSTATE('I','D','4','0','9')
/*
 * outbox: no such event.  Not ID404, which is a run's: a client must tell a
 * consumer's stale event id from an agent's missing run.
 */
#define ERRCODE_IDEM_EVENT_NOT_FOUND	MAKE_SQLSTATE('I','D','E','0','4')
/* outbox: the event was delivered already */
#define ERRCODE_IDEM_EVENT_DELIVERED	MAKE_SQLSTATE('I','D','4','1','0')
/*
 * the lease token is not the current lease of the outbox event or queued
 * run (fenced off: taken over after it expired, ended by a failure, wait,
 * sleep, release or cancel, another's token, or none given for a queued
 * run's step); the call changed nothing
 */
#define ERRCODE_IDEM_LEASE_LOST			MAKE_SQLSTATE('I','D','4','1','2')

/* a call under a key whose own statement is running: HTTP's 508 Loop Detected */
#define ERRCODE_IDEM_NESTED_KEY			MAKE_SQLSTATE('I','D','5','0','8')

/*
 * workflow runs (run.c) and runs on queues (queue.c, claim.c, signal.c,
 * control.c): no such run (for a worker's token: no queued run with the
 * id); an undeclared step; a run that is not running (completed, failed,
 * cancelled: no steps, signals or cancel); a step out of its declared order
 * (or failing a completed one).  Runs on queues also raise ID412 (above),
 * ID422 (a run id begun with another queue or policy, a signal with another
 * payload), 42704 (no such queue), 42710 (the queue exists), 42501 (no
 * produce, work or signal grant; another role's run without idem_admin),
 * 22023 (bounds of leases, waits, timeouts, max_runs, policies) and 0A000
 * (a claim outside READ COMMITTED); doc/runtime.md lists them.
 */
#define ERRCODE_IDEM_RUN_NOT_FOUND		MAKE_SQLSTATE('I','D','4','0','4')
#define ERRCODE_IDEM_STEP_UNDECLARED	MAKE_SQLSTATE('I','D','4','0','0')
#define ERRCODE_IDEM_RUN_NOT_RUNNING	MAKE_SQLSTATE('I','D','4','2','3')
#define ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE MAKE_SQLSTATE('I','D','4','2','5')

/*
 * Citus (request/citus.c, workflow/tenant.c, doc/citus.md): IDC01 Citus or
 * the colocation idem_citus_colocate() declares is missing; IDC02 the call
 * or its statement is not confined to one local transaction on the node of
 * the tenant's shard; IDC03 the tenant value or table does not match the
 * declared colocation; IDC04 one of idem's own tables was made a Citus
 * table by hand.
 */
#define ERRCODE_IDEM_CITUS_NOT_COLOCATED	MAKE_SQLSTATE('I','D','C','0','1')
#define ERRCODE_IDEM_CITUS_NOT_LOCAL		MAKE_SQLSTATE('I','D','C','0','2')
#define ERRCODE_IDEM_CITUS_MISMATCH			MAKE_SQLSTATE('I','D','C','0','3')
#define ERRCODE_IDEM_CITUS_TAKEN_OVER		MAKE_SQLSTATE('I','D','C','0','4')

/* The extension version whose SQL definitions this library serves. */
#define IDEM_SQL_VERSION		"1.2"

/* Longest key accepted, in bytes (Stripe's limit is 255 characters). */
#define IDEM_MAX_KEY_BYTES		255
/* Longest failure text an event or a run keeps (idem_outbox_fail, idem_step_fail). */
#define IDEM_MAX_ERROR_BYTES	65536

/* The longest wait of a claim: it holds a snapshot, as any statement does. */
#define IDEM_MAX_WAIT_S			3600
/* How often a claim with a wait looks again for what became due by time. */
#define IDEM_CLAIM_POLL_MS		200

/*
 * Most arguments a statement is given: what a client can bind in the
 * extended protocol.  Only a VARIADIC array can pass more, and it is
 * refused before it is unpacked.
 */
#define IDEM_MAX_ARGS			65535

/* Most steps a run declares or completes. */
#define IDEM_MAX_RUN_STEPS		1000

/*
 * The first part of every step's key (idem_step_key()): keys that begin
 * with it and ':' belong to runs, and only the run's functions take them.
 */
#define IDEM_STEP_KEY_PART		"idem.step"

/* Fingerprint: SHA-256 of the request. */
#define IDEM_FINGERPRINT_LEN	32

/*
 * Version of the fingerprint new records carry (idem.keys.fingerprint_version).
 * 1: idem 1.0, compared only for records 1.0 wrote; 2: idem 1.1, compared
 * where it equals 3; 3: idem 1.2, which hashes an anonymous record's field
 * names.
 */
#define IDEM_FINGERPRINT_VERSION	3

/*
 * Advisory lock class of idem's own (locktag_field4).  Core uses 1 and 2 for
 * pg_advisory_lock(bigint) and (int, int), Citus 4-10 and 12-15.
 */
#define IDEM_LOCKTAG_CLASS		0x4944	/* "ID" */

/* audit.c: idem.audit */
typedef enum IdemAuditLevel
{
	IDEM_AUDIT_OFF,
	IDEM_AUDIT_EXECUTIONS,
	IDEM_AUDIT_ALL
} IdemAuditLevel;

/* GUCs (common/guc.c; defined by _PG_init() in idem.c) */
extern int	idem_ttl;
extern int	idem_max_ttl;
extern bool idem_wait;
extern int	idem_max_response_size;
extern char *idem_outbox_topic;
extern int	idem_statement_cache_size;
extern int	idem_statement_cache_memory;
extern bool idem_durable_replay;
extern char *idem_cache_errors;
extern char *idem_key_owner_setting;
extern int	idem_outbox_max_attempts;
extern int	idem_outbox_backoff_base;
extern int	idem_outbox_backoff_cap;
extern bool idem_outbox_jitter;
extern int	idem_outbox_max_lease;
extern int	idem_outbox_max_retry_after;
extern int	idem_outbox_retention;
extern bool idem_outbox_logical_message;
extern bool idem_outbox_notify;
extern bool idem_outbox_keep_delivered;
extern int	idem_audit_level;
extern int	idem_audit_retention;
extern int	idem_run_retention;
extern int	idem_audit_queue_size;
extern int	idem_purge_interval;
extern int	idem_purge_batch_size;
extern int	idem_stats_max_databases;
extern int	idem_stats_max_roles;
extern char *idem_lease_token;
extern bool idem_lease_token_check(char **newval, void **extra,
								   GucSource source);
extern int	idem_run_max_lease;

/* Column numbers of idem.outbox (tables.c checks the shape, outbox.c writes) */
#define Anum_outbox_event_id		1
#define Anum_outbox_key				2
#define Anum_outbox_owner			3
#define Anum_outbox_topic			4
#define Anum_outbox_payload			5
#define Anum_outbox_created_at		6
#define Anum_outbox_run_id			7
#define Anum_outbox_step			8
#define Anum_outbox_state			9
#define Anum_outbox_attempts		10
#define Anum_outbox_next_attempt_at	11
#define Anum_outbox_lease_token		12
#define Anum_outbox_leased_by		13
#define Anum_outbox_lease_holder	14
#define Anum_outbox_last_error		15
#define Anum_outbox_delivered_at	16
#define Anum_outbox_run_position	17
#define Natts_outbox				17
/*
 * idem.citus_outbox (workflow/tenant.c makes it): idem.outbox's columns,
 * then the tenant and the owner's name, which is what names the owner
 * once a shard move copied the event to a node where the OID is another
 * role's.
 */
#define Anum_tenant_event_tenant	(Natts_outbox + 1)
#define Anum_tenant_event_owner_name (Natts_outbox + 2)
#define Natts_tenant_event			(Natts_outbox + 2)

/* Column numbers of idem.audit (tables.c checks the shape, audit.c fills) */
#define Anum_audit_at			1
#define Anum_audit_key			2
#define Anum_audit_owner		3
#define Anum_audit_run_id		4
#define Anum_audit_step			5
#define Anum_audit_outcome		6
#define Anum_audit_fingerprint	7
#define Anum_audit_sqlstate		8
#define Anum_audit_xid			9
#define Anum_audit_pid			10
#define Anum_audit_appname		11
#define Anum_audit_client_addr	12
#define Anum_audit_actor		13
#define Natts_audit				13

/* Column numbers of idem.outbox_topics */
#define Anum_outbox_topics_topic		1
#define Anum_outbox_topics_publishers	2
#define Anum_outbox_topics_consumers	3
#define Anum_outbox_topics_created_at	4
#define Natts_outbox_topics				4

/* Column numbers of idem.queues */
#define Anum_queues_queue			1
#define Anum_queues_producers		2
#define Anum_queues_workers			3
#define Anum_queues_signallers		4
#define Anum_queues_concurrency		5
#define Anum_queues_max_attempts	6
#define Anum_queues_backoff_base	7
#define Anum_queues_backoff_cap		8
#define Anum_queues_jitter			9
#define Anum_queues_created_at		10
#define Natts_queues				10

/*
 * A business statement as idem_execute() received it.  A key's identity is
 * (owner, key): the same text under two roles names two independent keys.
 */
typedef struct IdemRequest
{
	Oid			owner;			/* the calling role */
	int			ttl;			/* idem.ttl at the call, within idem.max_ttl */
	const char *key;			/* NUL-terminated, validated */
	int			keylen;
	char	   *sql;
	int			nargs;
	Oid		   *argtypes;
	Datum	   *values;
	char	   *nulls;			/* SPI convention: ' ' or 'n' */
} IdemRequest;

/* A key record as found in idem.keys. */
typedef struct IdemRecord
{
	ItemPointerData tid;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	Jsonb	   *response;		/* detoasted copy, caller's context */
	TimestampTz created_at;
	TimestampTz expires_at;
	int16		fpversion;		/* IDEM_FINGERPRINT_VERSION or 1 */
	TransactionId xmin;
	bool		visible;		/* to the caller's transaction snapshot */
} IdemRecord;

typedef struct IdemStatement IdemStatement;

/* What a call returns. */
typedef struct IdemResult
{
	Jsonb	   *response;
	bool		replayed;
	TimestampTz first_executed_at;
} IdemResult;

/* A run as found in idem.runs (arrays and strings copied). */
typedef struct IdemRunRow
{
	ItemPointerData tid;
	bool		visible;		/* to the caller's transaction snapshot */
	Oid			owner;
	char	   *run_id;
	ArrayType  *steps;			/* declared steps (text[]), or NULL */
	Jsonb	   *input;			/* or NULL */
	char	   *status;			/* running, completed, failed */
	TimestampTz started_at;
	bool		finished;
	TimestampTz finished_at;	/* if finished */
	char	   *last_error;		/* or NULL */
	ArrayType  *done_steps;		/* text[]: completed steps, in order */
	ArrayType  *attempts;		/* int4[]: per completed step */
	/* on a queue (all NULL, zero or DT_NOEND otherwise) */
	char	   *queue;
	char	   *queue_state;	/* ready, leased, waiting, sleeping; NULL */
	TimestampTz due_at;			/* DT_NOEND: NULL */
	int32		attempt;		/* of the current step */
	int32		claims;			/* rows of idem.run_attempts */
	bool		has_token;
	pg_uuid_t	lease_token;
	Oid			leased_by;
	char	   *lease_holder;
	char	   *awaiting;		/* event a waiting run waits for */
	TimestampTz wait_until;		/* its deadline; DT_NOEND: none */
	char	   *started_step;	/* external step started, not completed */
	int32		started_count;
	int32		max_attempts;	/* the run's own policy; 0: the queue's */
	Interval   *backoff_base;	/* or NULL */
	Interval   *backoff_cap;	/* or NULL */
	char	   *jitter;			/* or NULL */
} IdemRunRow;

#endif							/* IDEM_H */
