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

struct Latch;

/*
 * SQLSTATEs of idem's own.  Class "ID" is in the implementation-defined
 * range (SQL standard: classes beginning with I-Z) and unused by PostgreSQL.
 */
/* same key, different request: the IETF Idempotency-Key draft's 422 */
#define ERRCODE_IDEM_KEY_REUSED			MAKE_SQLSTATE('I','D','4','2','2')
/* same key still being executed elsewhere: the draft's 409 */
#define ERRCODE_IDEM_IN_PROGRESS		MAKE_SQLSTATE('I','D','4','0','9')
/* outbox: no such event */
#define ERRCODE_IDEM_EVENT_NOT_FOUND	MAKE_SQLSTATE('I','D','4','0','4')
/* outbox: the event was delivered already */
#define ERRCODE_IDEM_EVENT_DELIVERED	MAKE_SQLSTATE('I','D','4','1','0')
/* outbox: the lease token is not the event's current lease (fenced off) */
#define ERRCODE_IDEM_LEASE_LOST			MAKE_SQLSTATE('I','D','4','1','2')

/* a call under a key whose own statement is running: HTTP's 508 Loop Detected */
#define ERRCODE_IDEM_NESTED_KEY			MAKE_SQLSTATE('I','D','5','0','8')

/* workflow runs (run.c) */
#define ERRCODE_IDEM_RUN_NOT_FOUND		MAKE_SQLSTATE('I','D','4','0','4')
#define ERRCODE_IDEM_STEP_UNDECLARED	MAKE_SQLSTATE('I','D','4','0','0')
#define ERRCODE_IDEM_RUN_NOT_RUNNING	MAKE_SQLSTATE('I','D','4','2','3')
#define ERRCODE_IDEM_STEP_OUT_OF_SEQUENCE MAKE_SQLSTATE('I','D','4','2','5')

/* The extension version whose SQL definitions this library serves. */
#define IDEM_SQL_VERSION		"1.2"

/* Longest key accepted, in bytes (Stripe's limit is 255 characters). */
#define IDEM_MAX_KEY_BYTES		255

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

/* GUCs (idem.c) */
extern int	idem_ttl;
extern int	idem_max_ttl;
extern bool idem_wait;
extern int	idem_max_response_size;
extern char *idem_outbox_topic;
extern int	idem_statement_cache_size;
extern int	idem_statement_cache_memory;
extern bool idem_durable_replay;
extern char *idem_cache_errors;
extern int	idem_outbox_max_attempts;
extern int	idem_outbox_backoff_base;
extern int	idem_outbox_backoff_cap;
extern bool idem_outbox_jitter;
extern int	idem_outbox_max_lease;
extern int	idem_outbox_max_retry_after;
extern int	idem_outbox_retention;
extern bool idem_outbox_logical_message;
extern bool idem_outbox_notify;

/* Column numbers of idem.outbox (catalog.c checks the shape, outbox.c writes) */
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
#define Natts_outbox				16

/* Column numbers of idem.audit (catalog.c checks the shape, audit.c fills) */
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
#define Natts_audit				12

/* Column numbers of idem.outbox_topics */
#define Anum_outbox_topics_topic		1
#define Anum_outbox_topics_publishers	2
#define Anum_outbox_topics_consumers	3
#define Anum_outbox_topics_created_at	4
#define Natts_outbox_topics				4

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

/* execute.c: the parts of a call that workflow steps share */
extern void idem_check_can_write(const char *what);
extern char *idem_name_arg(FunctionCallInfo fcinfo, int argno,
						   const char *what);
extern void idem_collect_args(FunctionCallInfo fcinfo, int first,
							  IdemRequest *req);
extern void idem_collect_array(ArrayType *arr, bool untyped, IdemRequest *req);
extern void idem_check_variadic_dims(ArrayType *arr, const char *what);
extern void idem_keyed_request(FunctionCallInfo fcinfo, const char *fname,
							   IdemRequest *req);
extern void idem_execute_request(IdemRequest *req, IdemResult *result);
extern Datum idem_result_datum(IdemResult *result);
extern int32 idem_purge_batch_arg(FunctionCallInfo fcinfo, const char *fname);
extern void idem_check_not_inflight(IdemRequest *req);
extern void idem_check_visible(IdemRequest *req, IdemRecord *rec);
extern bool idem_record_matches(IdemStatement *stmt, IdemRequest *req,
								IdemRecord *rec, const uint8 *fingerprint);
extern bool idem_find_record(IdemStatement *stmt, IdemRequest *req,
							 const uint8 *fingerprint, TimestampTz now,
							 IdemRecord *rec);
extern Jsonb *idem_execute_statement(IdemStatement *stmt, IdemRequest *req);
extern void idem_check_response_size(Jsonb *response, const char *what);
extern char *idem_current_topic(Oid owner);
extern void idem_make_replay_durable(IdemRequest *req);

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
} IdemRunRow;

/* statement.c: per-backend cache of business statements */
extern IdemStatement *idem_statement_acquire(const char *sql, int nargs,
											 Oid *argtypes);
extern void idem_statement_release(IdemStatement *stmt);
extern SPIPlanPtr idem_statement_plan(IdemStatement *stmt);
extern const char *idem_statement_command(IdemStatement *stmt);
extern void idem_statement_fingerprint(IdemStatement *stmt, IdemRequest *req,
									   uint8 *fingerprint);
extern bool idem_statement_fingerprint_v1(IdemStatement *stmt,
										  IdemRequest *req,
										  uint8 *fingerprint);
extern void idem_statement_infer_types(const char *sql, int nargs,
									   Oid *types);
extern void idem_statement_check_settings(IdemStatement *stmt);
extern bool idem_statement_fingerprint_v2_same(IdemRequest *req);
extern void idem_value_digest(const char *tag, Oid typid, Datum value,
							  uint8 *digest);

/* cache.c: business errors recorded as a key's outcome; subtransactions */
typedef struct IdemSubxact
{
	MemoryContext cxt;
	ResourceOwner owner;
} IdemSubxact;
extern void idem_subxact_begin(IdemSubxact *sx);
extern void idem_subxact_end(IdemSubxact *sx, bool commit);
extern ErrorData *idem_subxact_abort(IdemSubxact *sx);
extern bool idem_cache_errors_check(char **newval, void **extra,
									GucSource source);
extern void idem_cache_errors_assign(const char *newval, void *extra);
extern Jsonb *idem_execute_caching_errors(IdemStatement *stmt,
										  IdemRequest *req, bool *cached);

/* run.c: workflow steps, also for idem_call() */
extern void idem_step_key_request(const char *run_id, const char *step,
								  IdemRequest *req);
extern void idem_step_request(IdemRequest *req, const char *run_id,
							  const char *step, IdemResult *result);

/* advice.c: what a client should do after an error */
extern const char *idem_retry_advice_for(int sqlerrcode);
extern int	idem_errhint(int sqlerrcode, const char *hint);

/* derive.c: keys built from business context */
extern char *idem_derive_key(int nparts, const char *const *parts);

/* catalog.c: idem's tables and the key lock */
extern void idem_lock_key(Oid owner, const char *key, int keylen, bool wait);
extern bool idem_try_lock_key(Oid owner, const char *key, int keylen);
extern bool idem_lookup_key(Oid owner, const char *key, IdemRecord *rec);
extern void idem_delete_key(IdemRecord *rec);
extern void idem_insert_key(const char *key, Oid owner,
							const uint8 *fingerprint, Jsonb *response,
							TimestampTz created_at, TimestampTz expires_at);
extern Oid	idem_catalog_outbox(void);
extern Oid	idem_catalog_outbox_topics(Oid *pkey);
extern uint64 idem_catalog_generation(void);
extern bool idem_restamp_key(Oid owner, const char *key,
							 TimestampTz expires_at);
extern int64 idem_purge_expired(int batch_size);
extern bool idem_lookup_run(Oid owner, const char *run_id, IdemRunRow *row);
extern void idem_insert_run(IdemRunRow *row);
extern void idem_update_run(IdemRunRow *row);

/*
 * catalog.c: SQL on idem's tables, as the owner of a table (callers have
 * no privileges on schema idem), with plans kept for the backend's life.
 */
typedef struct IdemOwnerSPI
{
	MemoryContext callercxt;	/* for results that outlive the connection */
	Oid			save_userid;
	int			save_sec_context;
} IdemOwnerSPI;

typedef struct IdemQuery
{
	const char *sql;
	int			nargs;
	Oid			argtypes[8];
	int			cursor_options;
	SPIPlanPtr	plan;
} IdemQuery;

extern void idem_owner_spi_begin(IdemOwnerSPI *s, Oid relid);
extern void idem_owner_spi_end(IdemOwnerSPI *s);
extern int	idem_query_run(IdemQuery *q, Datum *values, const char *nulls,
						   long limit);

/* outbox.c: outbox events, topics, delivery */
extern void idem_outbox_check_publish(const char *topic, Oid role);
extern void idem_insert_outbox(const char *key, Oid owner, const char *topic,
							   Jsonb *payload, TimestampTz created_at,
							   const char *run_id, const char *step);
extern int64 idem_outbox_purge_delivered(int batch_size);

/* expiry.c: when a new record expires */
extern int	idem_checked_ttl(void);
extern TimestampTz idem_new_record_expiry(Oid owner, const char *key, int ttl);

/* response.c */
extern Jsonb *idem_build_response(const char *command, uint64 processed,
								  SPITupleTable *tuptable);

/*
 * Operations (issue 11): what became of one idem_execute() call, counted
 * in shared memory (stats.c) and written to the audit trail (audit.c).
 */
typedef enum IdemOutcome
{
	IDEM_OUTCOME_EXECUTED,		/* the business statement ran and was recorded */
	IDEM_OUTCOME_REPLAYED,		/* the stored response was returned */
	IDEM_OUTCOME_MISMATCH,		/* ID422: the key holds another request */
	IDEM_OUTCOME_IN_PROGRESS,	/* ID409: the key is being executed elsewhere */
	IDEM_OUTCOME_CONFLICT,		/* class 40: serialization failure, deadlock */
	IDEM_OUTCOME_SEQUENCING,	/* a workflow step out of order (issue 9) */
	IDEM_OUTCOME_ERROR			/* the business statement (or recording) failed */
} IdemOutcome;

/* Counters of idem_stats besides the outcomes' (stats.c) */
typedef enum IdemStatCounter
{
	IDEM_STAT_EXECUTIONS,
	IDEM_STAT_REPLAYS,
	IDEM_STAT_MISMATCHES,
	IDEM_STAT_IN_PROGRESS,
	IDEM_STAT_CONFLICTS,
	IDEM_STAT_SEQUENCING,
	IDEM_STAT_ERRORS,
	IDEM_STAT_LOCK_WAITS,
	IDEM_STAT_LOCK_WAIT_US,
	IDEM_STAT_PURGED_KEYS,
	IDEM_STAT_PURGED_AUDIT,
	IDEM_STAT_OUTBOX_WRITTEN,
	IDEM_STAT_OUTBOX_CLAIMED,
	IDEM_STAT_OUTBOX_ACKED,
	IDEM_STAT_OUTBOX_FAILED,
	IDEM_STAT_OUTBOX_DEAD,
	IDEM_STAT_PURGED_OUTBOX,
	IDEM_STAT_AUDIT_WRITTEN,
	IDEM_STAT_AUDIT_QUEUED,
	IDEM_STAT_AUDIT_DROPPED,
	IDEM_STAT_NCOUNTERS
} IdemStatCounter;

/* audit.c: idem.audit */
typedef enum IdemAuditLevel
{
	IDEM_AUDIT_OFF,
	IDEM_AUDIT_EXECUTIONS,
	IDEM_AUDIT_ALL
} IdemAuditLevel;

extern int	idem_audit_level;
extern int	idem_audit_retention;
extern int	idem_audit_queue_size;
extern int	idem_purge_interval;
extern int	idem_purge_batch_size;
extern int	idem_stats_max_databases;
extern int	idem_stats_max_roles;

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

/* stats.c: counters per database in shared memory */
extern IdemOutcome idem_error_outcome(int sqlerrcode, bool executing);
extern bool idem_stats_active(void);
extern void idem_stats_count(IdemStatCounter counter, uint64 n);
extern void idem_stats_count_db(Oid dbid, IdemStatCounter counter, uint64 n);
extern Size idem_stats_shmem_size(void);
extern void idem_stats_shmem_init(void);

/* audit.c: the audit trail and its queue for rejected attempts */
extern void idem_audit_note(IdemOutcome outcome, const IdemRequest *req,
							const uint8 *fingerprint, const char *run_id,
							const char *step, int sqlerrcode);
extern Size idem_audit_shmem_size(void);
extern void idem_audit_shmem_init(void);

/* wakeup.c: the outbox's wakeup in shared memory */
extern Size idem_wakeup_shmem_size(void);
extern void idem_wakeup_shmem_init(void);
extern bool idem_wakeup_available(void);
extern void idem_wakeup_topic(const char *topic);
extern void idem_wakeup_note_claim(const char *topic);
extern bool idem_wakeup_wait(const char *topic, long timeout_ms);
extern int64 idem_audit_drain(int batch_size);
extern int64 idem_audit_purge_expired(int batch_size);
extern void idem_audit_set_launcher_latch(struct Latch *latch);
extern void idem_audit_discard_other(const Oid *dbids, int ndbs);
extern void idem_audit_discard_db(Oid dbid);

/* worker.c: the purge launcher and its per-database workers */
extern void idem_worker_register(void);

/* catalog.c: idem.audit, for audit.c */
extern Oid	idem_audit_relid(void);
extern void idem_insert_audit_row(Datum *values, bool *nulls);
extern void idem_insert_outbox_row(Datum *values, bool *nulls);

#endif							/* IDEM_H */
