/*-------------------------------------------------------------------------
 *
 * common.h
 *		The lowest layer: argument checks, subtransactions, retry advice,
 *		stats counters, idem's own tables and the key lock.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/common.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_COMMON_H
#define IDEM_COMMON_H

#include "access/xact.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "compat.h"
#include "idem.h"

/* advice.c: what a client should do after an error */
extern bool idem_sqlstate_transient(int sqlerrcode);
extern int	idem_errhint(int sqlerrcode, const char *hint);

/* args.c: checks of SQL-callable functions' arguments */
extern void idem_check_can_write(const char *what);
/* What a name idem keeps names: each kind has its own messages (args.c). */
typedef enum IdemNameKind
{
	IDEM_NAME_KEY,				/* an idempotency key */
	IDEM_NAME_RUN_ID,
	IDEM_NAME_STEP,
	IDEM_NAME_EVENT,			/* a run's signal */
	IDEM_NAME_QUEUE,
	IDEM_NAME_TOPIC,
	IDEM_NAME_CONSUMER,
	IDEM_NAME_WORKER
} IdemNameKind;
/* Which failure text a worker or consumer reports */
typedef enum IdemErrorText
{
	IDEM_TEXT_ERROR,			/* a failure's error argument */
	IDEM_TEXT_REASON			/* an operator's reason */
} IdemErrorText;
extern void idem_check_name(IdemNameKind kind, const char *name, int limit,
							const char *hint);
extern void idem_check_error_text(IdemErrorText which, const char *text);
extern void idem_arg_not_null(FunctionCallInfo fcinfo, int argno,
							  const char *param);
extern char *idem_name_arg(FunctionCallInfo fcinfo, int argno,
						   IdemNameKind kind);
extern int32 idem_purge_batch_arg(FunctionCallInfo fcinfo, const char *fname);
extern int	idem_run_purge_batch(int batch_size);
/* What a list passed as an array makes up: names it in messages. */
typedef enum IdemListKind
{
	IDEM_LIST_ARGUMENTS,		/* a statement's arguments */
	IDEM_LIST_KEY_PARTS			/* the parts of a derived key */
} IdemListKind;

extern void idem_check_variadic_list(ArrayType *arr, IdemListKind kind,
									 const char *hint);

/* guc.c: the role and idem.* parameters a business statement must keep */
#define IDEM_OWN_PARAMS_MAX 64
typedef struct IdemSessionState
{
	Oid			user;
	Oid			outer_user;
	Oid			session_user;
	uint64		values[IDEM_OWN_PARAMS_MAX];	/* each idem.* parameter's
												 * value, or its string */
} IdemSessionState;
extern void idem_session_state_save(IdemSessionState *s);
extern const char *idem_session_state_changed(const IdemSessionState *s);
struct config_generic;
extern struct config_generic *idem_own_param(const char *name);
/* citusmeta.c: Citus's catalog, read directly */
extern bool idem_citus_catalog_scan(const char *table, const char *index,
									const char *keycol, RegProcedure eq,
									Datum key, const char *col, uint32 want,
									uint32 *out);
extern bool idem_citus_owns(Oid relid);
extern bool idem_citus_coordinator(void);
extern bool idem_citus_shard_local(int64 shardid);
extern List *idem_citus_local_shards(Oid relid);
extern uint64 idem_citus_generation(Oid relid);

/* grants.c: role lists that grant the use of topics and queues; idem_admin */
extern bool idem_role_in(Oid role, Datum array);
extern Datum idem_roles_arg(FunctionCallInfo fcinfo, int argno,
							const char *name);
extern void idem_check_role_exists(Oid role);
extern Oid	idem_admin_role(void);
extern int64 idem_forget_dropped_roles(int batch_size);

/* lease.c: the lease of outbox events and queued runs */
typedef enum IdemFence
{
	IDEM_FENCE_HELD,			/* the token is the row's current lease */
	IDEM_FENCE_TAKEN_OVER,		/* leased, under another token */
	IDEM_FENCE_NOT_LEASED		/* no lease holds the row */
} IdemFence;
typedef enum IdemJitter
{
	IDEM_JITTER_NONE,
	IDEM_JITTER_FULL,
	IDEM_JITTER_EQUAL
} IdemJitter;
extern Datum idem_random_uuid(void);
extern int64 idem_interval_usecs(Interval *iv);
extern int64 idem_lease_usecs(Interval *lease, int max_s, const char *setting);
extern int64 idem_retry_after_usecs(Interval *retry_after);
extern long idem_wait_ms(Interval *timeout);
extern IdemFence idem_lease_fence(bool leased, bool token_matches);
/*
 * What a lease's holder tried when the fence refused it: each act has its
 * own complete messages (lease.c), which a translation needs.
 */
typedef enum IdemLeaseAct
{
	IDEM_ACT_EVENT_ACK,
	IDEM_ACT_EVENT_FAIL,
	IDEM_ACT_EVENT_EXTEND,
	IDEM_ACT_EVENT_RELEASE,
	IDEM_ACT_RUN_WORK,			/* a step's statement or result */
	IDEM_ACT_RUN_START_STEP,
	IDEM_ACT_RUN_AWAIT,
	IDEM_ACT_RUN_FAIL_STEP,
	IDEM_ACT_RUN_EXTEND,
	IDEM_ACT_RUN_RELEASE,
	IDEM_ACT_RUN_SLEEP
} IdemLeaseAct;
extern pg_noreturn void idem_lease_lost(IdemFence fence, IdemLeaseAct act,
										const char *id, const char *state,
										const char *holder);
extern TimestampTz idem_backoff_next(TimestampTz now, int32 attempts,
									 int base_ms, int cap_ms,
									 IdemJitter jitter, int64 retry_after_us);
extern IdemJitter idem_jitter_from_name(const char *name);

/* jsonbwrite.c: jsonb written from jsonb values, without unpacking them */
typedef struct IdemJsonbWriter
{
	StringInfo	buf;
	int			start;			/* where the container, with its padding, begins */
	int			entries;		/* where its JEntries are */
	uint64		nentries;
	uint64		next;			/* the next child's */
	Size		total;			/* its children's data so far */
	bool		object;			/* an object (else an array), for errors */
} IdemJsonbWriter;
extern void idem_jsonb_begin(StringInfo buf, Size size);
extern Jsonb *idem_jsonb_end(StringInfo buf);
extern void idem_jsonb_open(IdemJsonbWriter *w, StringInfo buf, bool object,
							uint64 n);
extern void idem_jsonb_add_string(IdemJsonbWriter *w, const char *str, int len);
extern void idem_jsonb_add_numeric(IdemJsonbWriter *w, Numeric num);
extern void idem_jsonb_add_jsonb(IdemJsonbWriter *w, Jsonb *value);
extern void idem_jsonb_close(IdemJsonbWriter *w, IdemJsonbWriter *parent);
extern int	idem_jsonb_key_cmp(const void *a, const void *b);

/* owner.c: whose keys a call uses (idem.key_owner) */
extern Oid	idem_key_owner(void);

/* subxact.c: internal subtransactions */
typedef struct IdemSubxact
{
	MemoryContext cxt;
	ResourceOwner owner;
} IdemSubxact;
extern void idem_subxact_begin(IdemSubxact *sx);
extern void idem_subxact_end(IdemSubxact *sx, bool commit);
extern ErrorData *idem_subxact_abort(IdemSubxact *sx);

/*
 * An entry of a list a transaction keeps for its commit, made in a
 * subtransaction: the first member of each list's entry struct.
 */
typedef struct IdemXactItem
{
	SubTransactionId subid;
	struct IdemXactItem *next;
} IdemXactItem;
extern void idem_xact_list_subxact(IdemXactItem **head, SubXactEvent event,
								   SubTransactionId mySubid,
								   SubTransactionId parentSubid);

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
	IDEM_STAT_RUNS_CLAIMED,
	IDEM_STAT_RUN_LEASE_EXPIRIES,
	IDEM_STAT_RUN_RETRIES,
	IDEM_STAT_RUN_SIGNALS,
	IDEM_STAT_RUNS_FAILED,
	IDEM_STAT_NCOUNTERS
} IdemStatCounter;

/* stats.c: counters per database and role in shared memory */
extern bool idem_stats_active(void);
extern void idem_stats_database_only(void);
extern void idem_stats_count(IdemStatCounter counter, uint64 n);
extern void idem_stats_count_in_error(IdemStatCounter counter, uint64 n);
extern void idem_stats_count_db(Oid dbid, IdemStatCounter counter, uint64 n);
extern void idem_stats_count_for(Oid dbid, Oid roleid, IdemStatCounter counter,
								 uint64 n);
extern Size idem_stats_shmem_size(void);
extern void idem_stats_shmem_init(void);


/* tables.c: idem's tables and the key lock */
extern void idem_lock_key(Oid owner, const char *key, int keylen, bool wait);
extern bool idem_try_lock_key(Oid owner, const char *key, int keylen);
extern void idem_unlock_key(Oid owner, const char *key, int keylen);
extern bool idem_lookup_key(Oid owner, const char *key, IdemRecord *rec);
extern void idem_delete_key(IdemRecord *rec);
extern void idem_insert_key(const char *key, Oid owner,
							const uint8 *fingerprint, Jsonb *response,
							TimestampTz created_at, TimestampTz expires_at);
extern text *idem_tenant_owner(Oid owner);
extern bool idem_lookup_tenant_key(Oid relid, Datum tenant, Oid owner,
								   const char *key, int keylen,
								   bool as_of_snapshot, IdemRecord *rec);
extern void idem_delete_tenant_key(Oid relid, IdemRecord *rec);
extern void idem_insert_tenant_key(Oid relid, Datum tenant, Oid owner,
								   const char *key, int keylen,
								   const uint8 *fingerprint, Jsonb *response,
								   TimestampTz created_at,
								   TimestampTz expires_at);
extern Oid	idem_catalog_outbox(void);
extern Oid	idem_catalog_runs(void);
extern Oid	idem_catalog_outbox_topics(Oid *pkey);
extern Oid	idem_catalog_queues(Oid *pkey);
extern Datum idem_registry_changed(PG_FUNCTION_ARGS);
extern Datum idem_lock_seed_local(PG_FUNCTION_ARGS);
/* reads the row idem_registry_probe() found, in the slot */
typedef void (*IdemRegistryReadFn) (TupleTableSlot *slot, void *arg);
extern bool idem_registry_probe(Oid relid, Oid pkey, const char *name,
								IdemRegistryReadFn read, void *arg);
extern uint64 idem_catalog_secret(void);
extern uint64 idem_catalog_generation(void);
extern char *idem_extension_version(Oid extoid);
extern void idem_report_old_definitions(const char *version);
extern bool idem_restamp_key(Oid owner, const char *key,
							 TimestampTz expires_at);
extern int64 idem_purge_expired(int batch_size);
extern bool idem_runs_of_dropped_roles(void);
extern bool idem_lookup_run(Oid owner, const char *run_id, IdemRunRow *row);
extern bool idem_run_replaced(Oid owner, const char *run_id);
extern bool idem_lock_and_lookup_run(Oid owner, const char *run_id,
									 const char *lockkey, bool wait,
									 IdemRunRow *row);
extern void idem_check_run_lists(const IdemRunRow *row, const char *table);
extern bool idem_lookup_run_at(Oid owner, const char *run_id, ItemPointer tid,
							   IdemRunRow *row);
extern void idem_insert_run(IdemRunRow *row);
extern void idem_update_run(IdemRunRow *row);
extern uint64 idem_run_writes;
/* offered a due run by idem_scan_due_runs(); false when it wants no more */
typedef bool (*IdemDueRunFn) (Oid owner, const char *run_id, ItemPointer tid,
							  void *arg);
extern bool idem_scan_due_runs(const char *queue, TimestampTz now,
							   IdemDueRunFn take, void *arg);
extern void idem_insert_run_attempt(Oid owner, const char *run_id,
									int32 claim, int32 attempt,
									const char *step, const char *worker,
									Oid leased_by, TimestampTz claimed_at);
extern void idem_end_run_attempt(Oid owner, const char *run_id, int32 claim,
								 TimestampTz ended_at, const char *outcome,
								 const char *error);

/*
 * tables.c: SQL on idem's tables, as the owner of a table (callers have
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
	Oid			argtypes[10];
	int			cursor_options;
	SPIPlanPtr	plan;
} IdemQuery;

extern void idem_owner_spi_begin(IdemOwnerSPI *s, Oid relid);
extern void idem_owner_spi_end(IdemOwnerSPI *s);
extern Oid	idem_catalog_outbox_indexes(Oid *pkey, Oid *due, Oid *run);
extern HeapTuple idem_form_row(Relation rel, Datum *values, bool *nulls,
							   int natts);
extern void idem_delete_outbox_row(Relation rel, ItemPointer tid);
extern void idem_update_outbox_row(Relation rel, ItemPointer otid,
								   HeapTuple tuple);
extern void idem_query_install(void);
extern bool idem_function_exists(const char *signature);
extern char *idem_extension_schema(void);
extern int	idem_query_run(IdemQuery *q, Datum *values, const char *nulls,
						   long limit);
extern int	idem_query_run_latest(IdemQuery *q, Datum *values,
								  const char *nulls, long limit);


/* tables.c: rows of idem.audit and idem.outbox, for audit.c and outbox.c */
extern Oid	idem_audit_relid(void);
extern void idem_insert_audit_row(Datum *values, bool *nulls);
extern void idem_insert_outbox_row(Datum *values, bool *nulls);
extern void idem_insert_tenant_event_row(Oid relid, Datum *values, bool *nulls);

#endif							/* IDEM_COMMON_H */
