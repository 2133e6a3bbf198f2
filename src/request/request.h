/*-------------------------------------------------------------------------
 *
 * request.h
 *		The request path: statement cache and fingerprint, the statement
 *		runner, cached errors, responses, expiry, derived keys, idem_execute().
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/request.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef IDEM_REQUEST_H
#define IDEM_REQUEST_H

#include "common/common.h"
#include "outbox/outbox.h"
#include "ops/ops.h"

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
extern void idem_statement_check_settings(IdemStatement *stmt,
										  const IdemSessionState *before);
extern bool idem_statement_fingerprint_v2_same(IdemRequest *req);
extern void idem_value_digest(const char *tag, Oid typid, Datum value,
							  uint8 *digest);


/* exec.c: the statement runner */
extern void idem_check_not_inflight(IdemRequest *req);
extern Jsonb *idem_execute_statement(IdemStatement *stmt, IdemRequest *req);
extern bool idem_refused_statement(void);

/* errcache.c: business errors recorded as a key's outcome */
extern bool idem_cache_errors_check(char **newval, void **extra,
									GucSource source);
extern void idem_cache_errors_assign(const char *newval, void *extra);
extern Jsonb *idem_execute_caching_errors(IdemStatement *stmt,
										  IdemRequest *req, bool *cached);


/* response.c: the response document */
extern DestReceiver *idem_response_receiver(void);
extern Jsonb *idem_build_response(const char *command, uint64 processed,
								  DestReceiver *rows);

/* What a jsonb held to idem.max_response_size is: each its own message */
typedef enum IdemResponseKind
{
	IDEM_RESPONSE_EXECUTE,		/* idem_execute()'s response */
	IDEM_RESPONSE_CACHED_ERROR,
	IDEM_RESPONSE_SIGNAL,		/* a signal's payload */
	IDEM_RESPONSE_STEP_RESULT,	/* an external step's result */
	IDEM_RESPONSE_RUN_INPUT
} IdemResponseKind;
extern void idem_check_response_size(Jsonb *response, IdemResponseKind kind,
									 const char *fname);

/* expiry.c: when a new record expires */
extern int	idem_checked_ttl(void);
extern TimestampTz idem_new_record_expiry(Oid owner, const char *key, int ttl);


/* derive.c: keys built from business context */
extern char *idem_derive_key(int nparts, const char *const *parts);


/* execute.c: the parts of a call that workflow steps share */
extern void idem_collect_args(FunctionCallInfo fcinfo, int first,
							  IdemRequest *req);
extern char *idem_sql_arg(FunctionCallInfo fcinfo, int argno, const char *fname);
extern void idem_collect_text_args(FunctionCallInfo fcinfo, int argsarg,
								   IdemRequest *req);
extern void idem_keyed_request(FunctionCallInfo fcinfo, const char *fname,
							   int keyarg, IdemRequest *req);
extern void idem_keyed_array_request(FunctionCallInfo fcinfo, const char *fname,
									 int keyarg, int argsarg, IdemRequest *req);
extern void idem_execute_request(IdemRequest *req, IdemResult *result);
/* the columns of a call's result record */
#define IDEM_RESULT_COLUMNS 3
extern void idem_result_desc_init(TupleDesc d);
extern void idem_result_values(IdemResult *result, Datum *values, bool *nulls);
extern Datum idem_result_datum(IdemResult *result);
extern void idem_check_not_step_key(const char *key, const char *fname);
extern void idem_check_visible(IdemRequest *req, IdemRecord *rec);
extern void idem_report_key_reused(IdemRequest *req, const char *detail);
extern bool idem_record_matches(IdemStatement *stmt, IdemRequest *req,
								IdemRecord *rec, const uint8 *fingerprint);
extern bool idem_find_record(IdemStatement *stmt, IdemRequest *req,
							 const uint8 *fingerprint, TimestampTz now,
							 IdemRecord *rec);
extern char *idem_current_topic(Oid owner);
extern char *idem_check_may_execute(IdemRequest *req);
extern void idem_replay_record(IdemRequest *req, const IdemRecord *rec,
							   IdemResult *result);

/* untyped.c: unknown driver parameters in calls of idem's functions */
extern void idem_untyped_install(void);
/* citus.c: idem under Citus */
extern void idem_citus_require(const char *fname);
extern Oid	idem_citus_keys_relid(void);
extern bool idem_citus_in_distributed_transaction(void);
extern void idem_citus_check_confined(void);
extern void idem_citus_pin_tenant(Oid type, Datum value, uint32 colocation);
extern void idem_citus_lock_shard(int64 shardid);

#endif							/* IDEM_REQUEST_H */
