/*-------------------------------------------------------------------------
 *
 * idem.c
 *		Module entry: PG_MODULE_MAGIC, the idem.* configuration
 *		parameters, and the entry points of SQL definitions older than the
 *		library.
 *
 * idem works without shared_preload_libraries.  However loaded, it installs
 * the parse analysis hook that types untyped driver parameters in calls of
 * its functions (request/untyped.c).  Loaded at server start it
 * also asks for shared memory (stats.c's counters, audit.c's queue) and
 * registers the purge launcher (worker.c); the settings only these use
 * and that cannot change after start (PGC_POSTMASTER) exist only then.
 * The parameters a caller tunes per call are USERSET so that SET LOCAL
 * works; the ceilings that protect the database from a caller
 * (idem.max_ttl, idem.max_response_size, idem.statement_cache_memory) are
 * SUSET: only a superuser, ALTER SYSTEM, or ALTER ROLE/DATABASE ... SET by
 * one, changes them.  So are the outbox's delivery policy (a consumer must
 * not shorten backoff, drop jitter or hold leases longer than allowed) and
 * the change data capture switch (a producer must not hide its events from
 * the WAL stream).
 *
 * Before the library is loaded, PostgreSQL keeps a SET idem.* as an
 * unchecked placeholder, and when the library defines the parameter it
 * drops a value that is out of range or that the role may not set with a
 * mere WARNING.  So the session's own settings (SET, or the client's
 * connection options) and those ALTER ROLE / ALTER DATABASE ... SET gave
 * it are checked again here, and the call that loaded the library fails
 * with the error the SET would have had (22023, 42501, 55P02, or 42602 for
 * a name idem does not define).
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/idem.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <limits.h>

#include "fmgr.h"
#include "miscadmin.h"
#include "nodes/pg_list.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"
#include "utils/guc.h"
#include "utils/memutils.h"

#include "compat.h"
#include "idem.h"
#include "ops/ops.h"
#include "request/request.h"

PG_MODULE_MAGIC;

static const struct config_enum_entry audit_level_options[] = {
	{"off", IDEM_AUDIT_OFF, false},
	{"executions", IDEM_AUDIT_EXECUTIONS, false},
	{"all", IDEM_AUDIT_ALL, false},
	{NULL, 0, false}
};

static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

void		_PG_init(void);

/* A setting the session made while idem.* were placeholders. */
typedef struct EarlySetting
{
	char	   *name;
	char	   *value;
	GucContext	scontext;
	GucSource	source;
	Oid			srole;
} EarlySetting;

/*
 * The 1.0 SQL definitions name these symbols.  A database whose extension
 * is still at 1.0 has 1.0's catalog (keys shared by all roles, version 1
 * fingerprints only) which this library must not write, so its calls are
 * refused until the extension is updated, as pg_stat_statements does for
 * its older definitions.
 */
PG_FUNCTION_INFO_V1(idem_execute);
PG_FUNCTION_INFO_V1(idem_execute_ex);
PG_FUNCTION_INFO_V1(idem_purge);

static void
refuse_old_definitions(void)
{
	idem_report_old_definitions("1.0");
}

Datum
idem_execute(PG_FUNCTION_ARGS)
{
	refuse_old_definitions();
	PG_RETURN_NULL();
}

Datum
idem_execute_ex(PG_FUNCTION_ARGS)
{
	refuse_old_definitions();
	PG_RETURN_NULL();
}

Datum
idem_purge(PG_FUNCTION_ARGS)
{
	refuse_old_definitions();
	PG_RETURN_NULL();
}

/*
 * The idem.* placeholders the session set, or that a role's or a database's
 * settings (ALTER ROLE / ALTER DATABASE ... SET) gave it when it started,
 * copied before the definitions replace them.  PostgreSQL validates such a
 * setting when it is made only if the library is loaded in the session
 * that makes it; made before, by a superuser, it is stored unchecked, and
 * would otherwise be dropped at every load with a mere WARNING (an
 * administrator's idem.audit = 'al' would leave auditing off).  The
 * configuration file's settings keep PostgreSQL's warning: they are the
 * server's, and ALTER SYSTEM refuses a parameter the session does not know.
 */
static bool
early_source(GucSource source)
{
	return source == PGC_S_SESSION || source == PGC_S_CLIENT ||
		source == PGC_S_GLOBAL || source == PGC_S_DATABASE ||
		source == PGC_S_USER || source == PGC_S_DATABASE_USER;
}

static List *
early_settings(void)
{
	int			n;
	struct config_generic **vars = idem_guc_variables(&n);
	List	   *found = NIL;

	for (int i = 0; i < n; i++)
	{
		struct config_generic *gen = vars[i];
		EarlySetting *es;

		if (!(gen->flags & GUC_CUSTOM_PLACEHOLDER) ||
			strncmp(gen->name, "idem.", 5) != 0 ||
			!early_source(gen->source))
			continue;
		es = palloc(sizeof(EarlySetting));
		es->name = pstrdup(gen->name);
		es->value = pstrdup(GetConfigOption(gen->name, true, false));
		es->scontext = gen->scontext;
		es->source = gen->source;
		es->srole = idem_guc_setter(gen);
		found = lappend(found, es);
	}
	return found;
}

/*
 * Validate each early setting as its role made it, now that the parameter
 * exists, without changing anything: one PostgreSQL refused raises its
 * error.
 */
static void
early_setting_context(void *arg)
{
	EarlySetting *es = (EarlySetting *) arg;
	const char *where;

	switch (es->source)
	{
		case PGC_S_GLOBAL:
			where = "ALTER ROLE ALL ... SET";
			break;
		case PGC_S_DATABASE:
			where = "ALTER DATABASE ... SET";
			break;
		case PGC_S_USER:
			where = "ALTER ROLE ... SET";
			break;
		case PGC_S_DATABASE_USER:
			where = "ALTER ROLE ... IN DATABASE ... SET";
			break;
		default:
			return;
	}
	errcontext("setting %s = '%s' from %s, made before idem was loaded",
			   es->name, es->value, where);
}

static void
check_early_settings(List *settings)
{
	ListCell   *lc;

	foreach(lc, settings)
	{
		EarlySetting *es = lfirst(lc);
		ErrorContextCallback errcallback;

		errcallback.callback = early_setting_context;
		errcallback.arg = es;
		errcallback.previous = error_context_stack;
		error_context_stack = &errcallback;
		(void) set_config_option_ext(es->name, es->value, es->scontext,
									 es->source, es->srole, GUC_ACTION_SET,
									 false, ERROR, false);
		error_context_stack = errcallback.previous;
	}
}

static void
idem_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(add_size(add_size(idem_stats_shmem_size(),
											 idem_audit_shmem_size()),
									idem_wakeup_shmem_size()));
	RequestNamedLWLockTranche("idem stats", 1);
	RequestNamedLWLockTranche("idem audit queue", 1);
}

static void
idem_shmem_startup(void)
{
	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	idem_stats_shmem_init();
	idem_audit_shmem_init();
	idem_wakeup_shmem_init();
	LWLockRelease(AddinShmemInitLock);
}

void
_PG_init(void)
{
	static bool defined = false;
	List	   *settings;

	/*
	 * An error below leaves the library loaded but not registered, so the
	 * next call runs _PG_init again: everything is already defined then.
	 */
	if (defined)
		return;
	settings = early_settings();

	DefineCustomIntVariable("idem.ttl",
							"How long a key record stays valid after it is written.",
							"An expired record counts as absent: the next call with its key executes again.",
							&idem_ttl,
							86400, 1, INT_MAX,
							PGC_USERSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_ttl",
							"Longest idem.ttl a call may use.",
							"A call whose idem.ttl exceeds it fails; only a superuser can change it.",
							&idem_max_ttl,
							30 * 86400, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.wait",
							 "Whether a call waits for a concurrent call with the same key.",
							 "When off, such a call fails at once with SQLSTATE ID409.",
							 &idem_wait,
							 true,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idem.max_response_size",
							"Largest response, in bytes, that idem stores for a key.",
							NULL,
							&idem_max_response_size,
							1024 * 1024, 1024, MaxAllocSize / 2,
							PGC_SUSET, GUC_UNIT_BYTE,
							NULL, NULL, NULL);

	DefineCustomStringVariable("idem.outbox_topic",
							   "Topic of the outbox event each executed call writes; empty writes none.",
							   NULL,
							   &idem_outbox_topic,
							   "",
							   PGC_USERSET, 0,
							   NULL, NULL, NULL);

	DefineCustomIntVariable("idem.statement_cache_size",
							"How many prepared business statements a backend keeps.",
							"Least recently used statements are dropped beyond this number.",
							&idem_statement_cache_size,
							256, 1, 100000,
							PGC_USERSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.statement_cache_memory",
							"Memory a backend's cache of prepared business statements may hold.",
							"Least recently used statements are dropped beyond this size; a statement larger than all of it is not kept.",
							&idem_statement_cache_memory,
							32 * 1024, 64, MAX_KILOBYTES,
							PGC_SUSET, GUC_UNIT_KB,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.durable_replay",
							 "Whether a replay waits until the original result is durable on synchronous standbys.",
							 "When on, a replay writes one small WAL record, so its commit waits for synchronous replication like any write.",
							 &idem_durable_replay,
							 false,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	DefineCustomStringVariable("idem.cache_errors",
							   "SQLSTATE classes or codes of business errors that idem_execute() records as the key's outcome.",
							   "A comma-separated list such as '23, P0001'; a retry then gets the recorded error instead of running again. Empty: errors are never recorded.",
							   &idem_cache_errors,
							   "",
							   PGC_USERSET, GUC_LIST_INPUT,
							   idem_cache_errors_check, idem_cache_errors_assign,
							   NULL);
	DefineCustomStringVariable("idem.key_owner",
							   "Whose keys a call uses: empty or current_user, session_user, or a role name.",
							   "For SECURITY DEFINER wrappers: session_user keys each call by the role that logged in, not the function's owner. The current user must have the privileges of that role.",
							   &idem_key_owner_setting,
							   "",
							   PGC_USERSET, 0,
							   NULL, NULL, NULL);
	DefineCustomStringVariable("idem.lease_token",
							   "The lease token idem_step() presents for a queued run's step.",
							   "idem_call() and the run functions take it as an argument instead.",
							   &idem_lease_token,
							   "",
							   PGC_USERSET, 0,
							   idem_lease_token_check, NULL, NULL);
	DefineCustomIntVariable("idem.run_max_lease",
							"Longest lease a claim or an extension of a queued run may ask for.",
							NULL,
							&idem_run_max_lease,
							3600, 1, 86400,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);
	DefineCustomIntVariable("idem.outbox_max_attempts",
							"Deliveries of an outbox event before it becomes a dead letter.",
							"A failure or an expired lease on the last attempt moves the event to the dead state.",
							&idem_outbox_max_attempts,
							10, 1, 1000,
							PGC_SUSET, 0,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.outbox_backoff_base",
							"Backoff window after the first failed delivery of an outbox event.",
							"The window doubles with every attempt, up to idem.outbox_backoff_cap.",
							&idem_outbox_backoff_base,
							1000, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.outbox_backoff_cap",
							"Largest backoff window of a failed outbox delivery.",
							NULL,
							&idem_outbox_backoff_cap,
							3600 * 1000, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_MS,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.outbox_jitter",
							 "Whether a retry is scheduled at a random point of its backoff window.",
							 "When off, the retry is due at the end of the window.",
							 &idem_outbox_jitter,
							 true,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idem.outbox_max_lease",
							"Longest lease a claim of outbox events may take.",
							NULL,
							&idem_outbox_max_lease,
							3600, 1, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.outbox_max_retry_after",
							"Longest retry_after a failed outbox delivery may ask for.",
							NULL,
							&idem_outbox_max_retry_after,
							86400, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.outbox_retention",
							"How long delivered outbox events are kept before a purge deletes them.",
							NULL,
							&idem_outbox_retention,
							7 * 86400, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.outbox_logical_message",
							 "Whether each outbox event is also written as a transactional logical decoding message.",
							 "The message has the prefix idem.outbox and the event as JSON.",
							 &idem_outbox_logical_message,
							 false,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);
	/*
	 * Only a superuser (or ALTER ROLE/DATABASE ... SET by one) sets the audit
	 * level, so a role can neither lower the level imposed on it nor switch
	 * an audit on that slows others' calls.
	 */
	DefineCustomEnumVariable("idem.audit",
							 "Which calls idem records in its audit trail.",
							 "off: none; executions: executions and replays; all: also every rejected attempt.",
							 &idem_audit_level,
							 IDEM_AUDIT_OFF, audit_level_options,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("idem.audit_retention",
							"How long audit entries are kept; 0 keeps them forever.",
							"Older entries are removed by the purge worker and by idem_purge_all().",
							&idem_audit_retention,
							0, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.run_retention",
							"How long finished runs are kept; 0 keeps them until idem_run_purge() removes them.",
							"Older finished runs, and the runs of dropped roles, are removed by the purge worker and by idem_purge_all(), tenant runs under Citus too.",
							&idem_run_retention,
							0, 0, INT_MAX,
							PGC_SUSET, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.purge_interval",
							"Time between two purge rounds of idem's background worker.",
							NULL,
							&idem_purge_interval,
							60, 1, 86400,
							PGC_SIGHUP, GUC_UNIT_S,
							NULL, NULL, NULL);

	DefineCustomIntVariable("idem.purge_batch_size",
							"How many rows one purge transaction removes at most.",
							"The background worker and idem_purge_all() commit after each batch.",
							&idem_purge_batch_size,
							10000, 1, 1000000,
							PGC_SIGHUP, 0,
							NULL, NULL, NULL);

	if (process_shared_preload_libraries_in_progress)
	{
		/* can't define PGC_POSTMASTER variables after startup */
		DefineCustomIntVariable("idem.stats_max_databases",
								"How many databases idem keeps statistics for.",
								"Further databases are counted together in one row with no database.",
								&idem_stats_max_databases,
								64, 1, 10000,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);

		DefineCustomIntVariable("idem.stats_max_roles",
								"How many (database, role) pairs idem keeps statistics for.",
								"Further pairs are counted together in one row with no database and no role.",
								&idem_stats_max_roles,
								256, 1, 100000,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);

		DefineCustomIntVariable("idem.audit_queue_size",
								"How many rejected attempts the audit queue holds until the worker writes them.",
								"An attempt that finds the queue full is not recorded; idem_stats counts it as dropped.",
								&idem_audit_queue_size,
								1024, 16, 1024 * 1024,
								PGC_POSTMASTER, 0,
								NULL, NULL, NULL);
	}

	DefineCustomBoolVariable("idem.outbox_notify",
							 "Whether a transaction that wrote outbox events sends NOTIFY on its topics' channels at commit.",
							 "Off by default: PostgreSQL commits notifying transactions one at a time, including their wait for a synchronous standby. Consumers that claim with a wait (shared memory) or poll need no NOTIFY; those that LISTEN need it on.",
							 &idem_outbox_notify,
							 false,
							 PGC_USERSET, 0,
							 NULL, NULL, NULL);

	DefineCustomBoolVariable("idem.outbox_keep_delivered",
							 "Whether an acknowledged outbox event stays in idem.outbox as delivered, for the purge to remove after idem.outbox_retention.",
							 "Off by default: an acknowledgement deletes the event.",
							 &idem_outbox_keep_delivered,
							 false,
							 PGC_SUSET, 0,
							 NULL, NULL, NULL);

	MarkGUCPrefixReserved("idem");

	if (process_shared_preload_libraries_in_progress)
	{
		prev_shmem_request_hook = shmem_request_hook;
		shmem_request_hook = idem_shmem_request;
		prev_shmem_startup_hook = shmem_startup_hook;
		shmem_startup_hook = idem_shmem_startup;
		idem_worker_register();
	}
	idem_untyped_install();
	idem_query_install();
	idem_outbox_lock_shard = idem_citus_lock_shard;
	defined = true;

	check_early_settings(settings);
	list_free_deep(settings);
}
