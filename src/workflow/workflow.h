/*-------------------------------------------------------------------------
 *
 * workflow.h
 *		Workflow runs and their steps, and idem_call(), which reaches them.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/workflow.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_WORKFLOW_H
#define IDEM_WORKFLOW_H

#include "outbox/outbox.h"
#include "request/request.h"

/* queue.c: run queues, their grants and retry policy */
/* Longest queue name, in bytes (like a topic). */
#define QUEUE_MAX_NAME_BYTES	255

typedef enum IdemQueuePrivilege
{
	QUEUE_PRODUCE,
	QUEUE_WORK,
	QUEUE_SIGNAL
} IdemQueuePrivilege;

typedef struct IdemQueue
{
	char	   *queue;
	int32		concurrency;	/* 0: no cap */
	int32		max_attempts;
	int64		backoff_base_us;
	int64		backoff_cap_us;
	IdemJitter	jitter;
} IdemQueue;

extern void idem_queue_read(const char *queue, IdemQueue *q);
extern int32 idem_queue_room(IdemQueue *q, int32 want, TimestampTz now);
extern void idem_queue_room_release(IdemQueue *q);
extern bool idem_queue_allows(const char *queue, Oid role,
							  IdemQueuePrivilege priv, IdemQueue *q);
extern bool idem_queue_may(const char *queue, Oid role,
						   IdemQueuePrivilege priv);
extern void idem_queue_check(const char *queue, Oid role,
							 IdemQueuePrivilege priv, IdemQueue *q);
extern void idem_queue_wake(const char *queue);
extern void idem_queue_check_policy(FunctionCallInfo fcinfo, int attempts_arg,
									int base_arg, int cap_arg,
									int jitter_arg);
extern void idem_queue_channel(const char *queue, char *name, size_t size);
extern bool idem_queue_exists(const char *queue);
extern void idem_queue_remove(const char *queue);

/* runlease.c: a queued run's lease, as its functions see it */
extern int	idem_run_name_position(ArrayType *arr, const char *name);
extern int	idem_run_step_ordinal(IdemRunRow *run, const char *step);
extern char *idem_run_lock_key(const char *run_id);
extern char *idem_run_step_key(const char *run_id, const char *step);
extern void idem_report_run_not_found(const char *run_id);
extern void idem_run_check_queued(IdemRunRow *run, const char *detail,
								  const char *hint);
extern void idem_check_run_visible(IdemRunRow *run);
extern void idem_lock_run(Oid owner, const char *run_id, IdemRunRow *run);
extern const pg_uuid_t *idem_lease_token_arg(FunctionCallInfo fcinfo,
											 int argno, bool required);
extern const pg_uuid_t *idem_lease_token_setting(void);
extern void idem_run_token_owner_note(const pg_uuid_t *token,
									  const char *run_id, Oid owner,
									  const char *queue);
extern Oid	idem_leased_run_owner(const char *run_id, const pg_uuid_t *token,
								  IdemLeaseAct act);
extern void idem_lock_run_fenced(Oid owner, const char *run_id,
								 const pg_uuid_t *token, IdemLeaseAct act,
								 IdemRunRow *run);
extern void idem_lock_run_leased(const char *run_id, const pg_uuid_t *token,
								 IdemLeaseAct act, IdemRunRow *run);
extern void idem_run_fence(IdemRunRow *run, const pg_uuid_t *token,
						   IdemLeaseAct act);
extern void idem_run_check_room(IdemRunRow *run);
extern void idem_run_end_lease(IdemRunRow *run, const char *outcome,
							   const char *error, TimestampTz now);
extern void idem_run_end_lease_expired(IdemRunRow *run, TimestampTz now);
extern void idem_run_end_lease_for(IdemRunRow *run, const char *outcome,
								   const char *error, TimestampTz now);
extern void idem_run_attempt_begin(IdemRunRow *run, const char *step,
								   TimestampTz now);
extern bool idem_run_is_admin(Oid role);
/* what an operator's call does to a run: each has its own messages */
typedef enum IdemRunOp
{
	IDEM_RUN_OP_READ,
	IDEM_RUN_OP_CANCEL,
	IDEM_RUN_OP_RETRY,
	IDEM_RUN_OP_FAIL,
	IDEM_RUN_OP_RESUME,
	IDEM_RUN_OP_COMPLETE
} IdemRunOp;
extern Oid	idem_run_owner_arg(FunctionCallInfo fcinfo, int argno,
							   IdemRunOp op);
extern int	idem_errmsg_run_status(const char *run_id, const char *status);

/* signal.c: signals to runs */
extern bool idem_run_signal_payload(Oid owner, const char *run_id,
									const char *event, Jsonb **payload);

/* call.c: idem_call() and the options a call takes */
extern int	idem_call_options(FunctionCallInfo fcinfo, int topic_arg,
							  int ttl_arg, int wait_arg);

/*
 * run.c: where a run and its steps' records are kept.  run.c's own store
 * is idem.runs and idem.keys on this node; a tenant's runs under Citus are
 * kept on the tenant's shard (tenant.c), with the same sequencing.
 */
typedef struct IdemRunStore IdemRunStore;
struct IdemRunStore
{
	/* take the lock of owner's run run_id, and read it: false if none */
	bool		(*lock_and_read) (const IdemRunStore *store, Oid owner,
								  const char *run_id, IdemRunRow *run);
	void		(*insert_run) (const IdemRunStore *store, IdemRunRow *run);
	void		(*update_run) (const IdemRunStore *store, IdemRunRow *run);
	/* idem_find_record() on the store's key records */
	bool		(*find_record) (const IdemRunStore *store, IdemStatement *stmt,
								IdemRequest *req, const uint8 *fingerprint,
								TimestampTz now, IdemRecord *rec);
	/* a step's record: it never expires */
	void		(*insert_key) (const IdemRunStore *store, IdemRequest *req,
							   const uint8 *fingerprint, Jsonb *response,
							   TimestampTz now);
	Jsonb	   *(*execute) (const IdemRunStore *store, IdemStatement *stmt,
							IdemRequest *req);
	/* a step's record as the caller's snapshot sees it, unlocked: false if none */
	bool		(*read_record) (const IdemRunStore *store, Oid owner,
								const char *key, IdemRecord *rec);
	const char *keys_table;		/* where the steps' records are, for errors */
	const IdemEventShard *events;	/* where the steps' events go (NULL:
									 * idem.outbox) */
	void	   *arg;
};

/*
 * run.c: a run that one call acts on more than once (idem_call()'s
 * completion of the external step before its step, the step, and the start
 * of the external step after it): the first act takes the run's lock and
 * reads the row, and passes it on with every write made through it.
 * Zeroed (held false) before the first act.
 */
typedef struct IdemHeldRun
{
	bool		held;			/* row is the run's latest version, locked */
	IdemRunRow	row;
} IdemHeldRun;

/* run.c: workflow steps, also for idem_call() and tenant runs */
extern const IdemRunStore idem_local_runs;
extern void idem_run_lock_in(const IdemRunStore *store, Oid owner,
							 const char *run_id, IdemRunRow *run);
extern char *idem_run_set_status_in(const IdemRunStore *store,
									FunctionCallInfo fcinfo, const char *verb,
									Oid owner, const char *run_id,
									int reason_arg);
extern void idem_step_key_request(const char *run_id, const char *step,
								  const pg_uuid_t *token, IdemRequest *req);
extern void idem_step_args(FunctionCallInfo fcinfo, int first,
						   const char *fname, const pg_uuid_t *token,
						   bool text_args, IdemRequest *req, char **run_id,
						   char **step);
extern void idem_step_request(IdemRequest *req, const char *run_id,
							  const char *step, const pg_uuid_t *token,
							  IdemHeldRun *held, IdemResult *result);
extern void idem_step_request_in(const IdemRunStore *store, IdemRequest *req,
								 const char *run_id, const char *step,
								 const pg_uuid_t *token, IdemResult *result);
extern Jsonb *idem_step_result_arg(FunctionCallInfo fcinfo, int argno,
								   const char *fname);
extern void idem_step_complete_in(const IdemRunStore *store, IdemRequest *req,
								  const char *run_id, const char *step,
								  const pg_uuid_t *token, Jsonb *result,
								  IdemResult *out);
extern Jsonb *idem_step_complete_leased(const char *run_id, const char *step,
										const pg_uuid_t *token, Jsonb *result,
										IdemHeldRun *held);
extern int	idem_step_start_leased(const char *run_id, const char *step,
								   const pg_uuid_t *token, Jsonb **done,
								   IdemHeldRun *held);
extern void idem_run_init_unqueued(IdemRunRow *run);
extern void idem_run_begin_args(FunctionCallInfo fcinfo, int first,
								IdemRunRow *asked);
extern bool idem_run_begin_in(const IdemRunStore *store, Oid owner,
							  IdemRunRow *asked, IdemRunRow *run);
extern Datum idem_run_begin_result(FunctionCallInfo fcinfo, IdemRunRow *run,
								   bool created);
extern void idem_run_status_values(IdemRunRow *run, Datum *values,
								   bool *nulls);
extern void idem_run_steps_rows(const IdemRunStore *store,
								ReturnSetInfo *rsinfo, IdemRunRow *run);
extern char *idem_run_next_step(IdemRunRow *run);

/* control.c: operators' verbs */
extern char *idem_run_cancel_in(const IdemRunStore *store, Oid owner,
								const char *run_id, const char *reason,
								bool queue_dropped);

#endif							/* IDEM_WORKFLOW_H */
