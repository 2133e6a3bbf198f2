/*-------------------------------------------------------------------------
 *
 * worker.c
 *		idem's background workers: the launcher, and the purge worker it
 *		starts for each database in turn.
 *
 * With shared_preload_libraries = 'idem' the postmaster starts one
 * launcher ("idem launcher" in pg_stat_activity.backend_type), connected
 * to no database.  Every idem.purge_interval, or sooner when the audit
 * queue is half full, it lists the databases that accept connections (not
 * templates) and starts one "idem purge worker" per database, one after
 * the other.  The
 * worker connects, does nothing if the extension is not installed there
 * (dropping that database's queued audit entries), and otherwise runs one
 * purge cycle (purge_cycle()) in small transactions, then exits.
 *
 * A worker lives only for its cycle, so no idem process sits in a
 * database between cycles: DROP DATABASE is not refused because of idem
 * (at worst it waits for the batch in progress, after which the worker
 * leaves the rest of its cycle to the next one: database_free()), and
 * DROP/CREATE EXTENSION are seen at the next cycle.  The
 * launcher is restarted by the postmaster if it fails (after 10 s) and
 * after a crash of any process; a purge worker that fails is not
 * restarted, the next cycle starts a new one.  Both exit on SIGTERM, so a
 * shutdown never waits for a purge.
 *
 * The extension or the database may go away during a cycle.  Each batch
 * locks the extension object, so DROP EXTENSION waits for it, and the
 * worker stops at the next one with a line in the log; the launcher looks
 * again for each database just before starting its worker, and skips one
 * dropped since the cycle began.
 *
 * Nothing here ever deletes a live key: purging goes through
 * idem_purge_expired() (tables.c), which only takes expired records and
 * skips any key a running call holds.  A step's record never expires; it
 * goes with its run, once the run finished longer ago than
 * idem.run_retention, which is 0 (never) unless an administrator sets it.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/ops/worker.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "access/stratnum.h"
#include "catalog/pg_database.h"
#include "catalog/pg_extension.h"
#include "commands/extension.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "postmaster/bgworker.h"
#include "postmaster/interrupt.h"
#include "storage/ipc.h"
#include "storage/latch.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "tcop/tcopprot.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"

#include "compat.h"
#include "ops/ops.h"

PGDLLEXPORT void idem_launcher_main(Datum main_arg);
PGDLLEXPORT void idem_purge_worker_main(Datum main_arg);

/*
 * idem_worker_register
 *		Register the launcher; called from _PG_init while preloading.
 */
void
idem_worker_register(void)
{
	BackgroundWorker worker;

	if (IsBinaryUpgrade)
		return;
	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = 10;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_launcher_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idem launcher");
	snprintf(worker.bgw_type, BGW_MAXLEN, "idem launcher");
	RegisterBackgroundWorker(&worker);
}

/*
 * The databases a worker may connect to, from the shared pg_database, and
 * in *all every database there.
 */
static Oid *
list_databases(int *ndbs, Oid **all, int *nall)
{
	Relation	rel;
	TableScanDesc scan;
	HeapTuple	tup;
	int			n = 0;
	int			nevery = 0;
	int			cap = 16;
	Oid		   *dbs;
	Oid		   *every;
	MemoryContext cxt = CurrentMemoryContext;

	dbs = palloc(cap * sizeof(Oid));
	every = palloc(cap * sizeof(Oid));
	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	rel = table_open(DatabaseRelationId, AccessShareLock);
	scan = table_beginscan_catalog(rel, 0, NULL);
	while ((tup = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		if (nevery == cap)
		{
			MemoryContext old = MemoryContextSwitchTo(cxt);

			cap *= 2;
			dbs = repalloc(dbs, cap * sizeof(Oid));
			every = repalloc(every, cap * sizeof(Oid));
			MemoryContextSwitchTo(old);
		}
		every[nevery++] = db->oid;

		/*
		 * Not templates: a connection to one makes CREATE DATABASE from it
		 * fail, and nobody calls idem there.
		 */
		if (!db->datallowconn || db->datistemplate ||
			db->datconnlimit == DATCONNLIMIT_INVALID_DB)
			continue;
		dbs[n++] = db->oid;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	/* the commit leaves TopMemoryContext current: back to the cycle's */
	MemoryContextSwitchTo(cxt);
	*ndbs = n;
	*all = every;
	*nall = nevery;
	return dbs;
}

/*
 * Whether the database is still there to connect to.  The list was made
 * at the start of the cycle, and a database dropped since would make its
 * worker fail to connect, with a FATAL error.  Only the moments between
 * this look and the worker's connection are left to such a drop.
 */
static bool
database_still_exists(Oid dbid)
{
	Relation	rel;
	ScanKeyData key;
	TableScanDesc scan;
	HeapTuple	tup;
	bool		exists = false;

	StartTransactionCommand();
	(void) GetTransactionSnapshot();
	/* a heap scan: the launcher, in no database, cannot open the index */
	rel = table_open(DatabaseRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_database_oid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(dbid));
	scan = table_beginscan_catalog(rel, 1, &key);
	tup = heap_getnext(scan, ForwardScanDirection);
	if (HeapTupleIsValid(tup))
	{
		Form_pg_database db = (Form_pg_database) GETSTRUCT(tup);

		exists = db->datallowconn && !db->datistemplate &&
			db->datconnlimit != DATCONNLIMIT_INVALID_DB;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	CommitTransactionCommand();
	return exists;
}

/* Start the purge worker for one database and wait until it is done. */
static void
run_purge_worker(Oid dbid)
{
	BackgroundWorker worker;
	BackgroundWorkerHandle *handle;
	pid_t		pid;
	MemoryContext cxt = CurrentMemoryContext;
	bool		exists = database_still_exists(dbid);

	MemoryContextSwitchTo(cxt);
	if (!exists)
	{
		ereport(LOG,
				(errmsg("idem launcher skipped database %u: it was dropped or closed to connections since the cycle began",
						dbid)));
		return;
	}

	memset(&worker, 0, sizeof(worker));
	worker.bgw_flags = BGWORKER_SHMEM_ACCESS | BGWORKER_BACKEND_DATABASE_CONNECTION;
	worker.bgw_start_time = BgWorkerStart_RecoveryFinished;
	worker.bgw_restart_time = BGW_NEVER_RESTART;
	snprintf(worker.bgw_library_name, BGW_MAXLEN, "idem");
	snprintf(worker.bgw_function_name, BGW_MAXLEN, "idem_purge_worker_main");
	snprintf(worker.bgw_name, BGW_MAXLEN, "idem purge worker for database %u", dbid);
	snprintf(worker.bgw_type, BGW_MAXLEN, "idem purge worker");
	worker.bgw_main_arg = ObjectIdGetDatum(dbid);
	worker.bgw_notify_pid = MyProcPid;

	if (!RegisterDynamicBackgroundWorker(&worker, &handle))
	{
		ereport(LOG,
				(errmsg("idem launcher could not start a purge worker"),
				 errhint("Raise max_worker_processes.")));
		return;
	}
	if (WaitForBackgroundWorkerStartup(handle, &pid) == BGWH_STARTED)
		(void) WaitForBackgroundWorkerShutdown(handle);
	pfree(handle);
}

void
idem_launcher_main(Datum main_arg)
{
	MemoryContext cycle_cxt;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	BackgroundWorkerInitializeConnection(NULL, NULL, 0);
	pgstat_report_appname("idem launcher");
	idem_audit_set_launcher_latch(MyLatch);

	cycle_cxt = AllocSetContextCreate(TopMemoryContext, "idem launcher cycle",
									  ALLOCSET_DEFAULT_SIZES);
	for (;;)
	{
		Oid		   *dbs;
		int			ndbs;
		Oid		   *all;
		int			nall;
		MemoryContext old;

		CHECK_FOR_INTERRUPTS();
		if (ConfigReloadPending)
		{
			ConfigReloadPending = false;
			ProcessConfigFile(PGC_SIGHUP);
		}

		old = MemoryContextSwitchTo(cycle_cxt);
		dbs = list_databases(&ndbs, &all, &nall);
		idem_audit_discard_other(dbs, ndbs, all, nall);
		for (int i = 0; i < ndbs; i++)
		{
			CHECK_FOR_INTERRUPTS();
			run_purge_worker(dbs[i]);
		}
		MemoryContextSwitchTo(old);
		MemoryContextReset(cycle_cxt);

		(void) WaitLatch(MyLatch,
						 WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH,
						 (long) idem_purge_interval * 1000L, PG_WAIT_EXTENSION);
		ResetLatch(MyLatch);
	}
}


/*
 * Whether the extension is installed here and usable (pg_cron's test), at
 * the version this library writes: a database at an older version lacks
 * tables or columns a cycle touches, and is left alone until it is
 * updated.
 */
static bool
extension_ready(void)
{
	Oid			extoid;
	char	   *version;

	if (RecoveryInProgress())
		return false;
	extoid = get_extension_oid("idem", true);
	if (!OidIsValid(extoid))
		return false;
	if (creating_extension && CurrentExtensionObject == extoid)
		return false;
	version = idem_extension_version(extoid);
	return version != NULL && strcmp(version, IDEM_SQL_VERSION) == 0;
}

/*
 * Whether the extension is still installed and ready (extension_ready()),
 * with its object locked until the end of the transaction.  DROP
 * EXTENSION locks that object before anything else it drops, so it waits
 * for the batch in progress, and a batch never finds idem's tables gone
 * under it ("could not open relation with OID ...").  The lock is taken
 * before the look: a DROP that committed while we waited is seen.
 */
static bool
extension_locked(void)
{
	Oid			extoid = get_extension_oid("idem", true);

	if (!OidIsValid(extoid))
		return false;
	/* also takes in the invalidations of whatever we waited for */
	LockDatabaseObject(ExtensionRelationId, extoid, 0, AccessShareLock);
	return get_extension_oid("idem", true) == extoid && extension_ready();
}

/*
 * Whether no other session needs this database to itself, with the
 * database locked as a connecting session locks it, until the end of the
 * transaction.  DROP DATABASE, ALTER DATABASE ... RENAME or SET TABLESPACE
 * and CREATE DATABASE from it as a template lock the database, then give
 * its other sessions five seconds to leave and fail if one is still
 * there; a cycle may last longer.  With this lock held for each batch,
 * such a command waits for the batch in progress, and the worker gives
 * way before the next one.
 */
static bool
database_free(void)
{
	LOCKTAG		tag;

	SET_LOCKTAG_OBJECT(tag, InvalidOid, DatabaseRelationId, MyDatabaseId, 0);
	return LockAcquire(&tag, RowExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

typedef int64 (*PurgeStep) (int batch_size);

/* How a purge ended. */
typedef enum PurgeEnd
{
	PURGE_DONE,					/* a batch came back short */
	PURGE_NO_EXTENSION,			/* the extension was dropped */
	PURGE_DATABASE_WANTED		/* another session needs the database */
} PurgeEnd;

/*
 * Run one kind of purge in transactions of at most batch rows until a
 * batch comes back short.  Stops, having done nothing more, if the
 * extension was dropped meanwhile or another session needs the database.
 */
static PurgeEnd
purge_in_batches(const char *what, PurgeStep step, int batch)
{
	int64		n;

	do
	{
		PurgeEnd	end = PURGE_DONE;

		CHECK_FOR_INTERRUPTS();
		SetCurrentStatementStartTimestamp();
		StartTransactionCommand();
		PushActiveSnapshot(GetTransactionSnapshot());
		pgstat_report_activity(STATE_RUNNING, what);
		if (!database_free())
			end = PURGE_DATABASE_WANTED;
		else if (!extension_locked())
			end = PURGE_NO_EXTENSION;
		n = end == PURGE_DONE ? step(batch) : 0;
		PopActiveSnapshot();
		CommitTransactionCommand();
		pgstat_report_stat(false);
		if (end != PURGE_DONE)
			return end;
	} while (n >= batch);
	pgstat_report_activity(STATE_IDLE, NULL);
	return PURGE_DONE;
}

/*
 * Call fn, one of the extension's SQL purge functions, with args, if it
 * exists (idem_citus_colocate() makes those of tenant runs); returns its
 * count.  The SQL function is called rather than the layer that made it,
 * which sits above this one.
 */
static int64
purge_function(const char *fn, const char *argtypes, const char *args)
{
	char	   *nsp;
	bool		isnull;
	int64		n = 0;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	nsp = idem_extension_schema();
	if (idem_function_exists(psprintf("%s.%s(%s)", nsp, fn, argtypes)))
	{
		if (SPI_execute(psprintf("SELECT %s.%s(%s)", nsp, fn, args),
						false, 1) != SPI_OK_SELECT || SPI_processed != 1)
			elog(ERROR, "%s() failed", fn);
		n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
										SPI_tuptable->tupdesc, 1, &isnull));
		if (isnull)
			n = 0;
	}
	SPI_finish();
	return n;
}

/*
 * Expired tenant key records under Citus (idem.citus_keys), from the
 * coordinator only: idem_citus_purge() is one DELETE, which Citus runs on
 * every shard's node.
 */
static int64
purge_citus_keys(int batch_size)
{
	if (!idem_citus_coordinator())
		return 0;
	return purge_function("idem_citus_purge", "", "");
}

/* now() less idem.run_retention, as SQL: the runs that finished before it go. */
static char *
run_retention_cutoff(void)
{
	return psprintf("pg_catalog.now() OPERATOR(pg_catalog.-)"
					" pg_catalog.make_interval(secs => %d)", idem_run_retention);
}

/*
 * Up to batch_size runs finished longer than idem.run_retention ago, and
 * those of dropped roles, with their steps' records, when a retention is
 * set: idem_run_purge().
 */
static int64
purge_runs(int batch_size)
{
	if (idem_run_retention <= 0)
		return 0;
	return purge_function("idem_run_purge", "timestamptz, integer",
						  psprintf("%s, %d", run_retention_cutoff(), batch_size));
}

/*
 * The same of tenant runs under Citus (idem.citus_runs), from the
 * coordinator only, as the tenant key records: idem_citus_run_purge()
 * deletes on every shard's node.
 */
static int64
purge_citus_runs(int batch_size)
{
	if (idem_run_retention <= 0 || !idem_citus_coordinator())
		return 0;
	return purge_function("idem_citus_run_purge", "timestamptz",
						  run_retention_cutoff());
}

/*
 * One cycle of the purge worker in its database, each kind in turn,
 * unless a purge stops early.
 *
 * The audit queue is drained first, so that no entry waits behind a long
 * purge.
 */
static PurgeEnd
purge_cycle(void)
{
	/*
	 * locks: the purge keeps a lock per row until its transaction commits
	 * (a run's), so its batches are bounded by the lock table too
	 */
	static const struct
	{
		const char *what;
		PurgeStep	step;
		bool		locks;
	}			purges[] = {
		{"idem: writing queued audit entries", idem_audit_drain, false},
		{"idem: purging expired keys", idem_purge_expired, false},
		{"idem: removing dropped roles from topics and queues",
		idem_forget_dropped_roles, true},
		{"idem: purging audit entries past idem.audit_retention",
		idem_audit_purge_expired, false},
		{"idem: purging delivered outbox events", idem_outbox_purge_delivered,
		false},
		{"idem: purging expired Citus tenant keys", purge_citus_keys, false},
		{"idem: purging runs finished before idem.run_retention", purge_runs,
		true},
		{"idem: purging Citus tenant runs finished before idem.run_retention",
		purge_citus_runs, false},
	};

	for (int i = 0; i < lengthof(purges); i++)
	{
		int			batch = purges[i].locks ?
		idem_run_purge_batch(idem_purge_batch_size) : idem_purge_batch_size;
		PurgeEnd	end = purge_in_batches(purges[i].what, purges[i].step,
										   batch);

		if (end != PURGE_DONE)
			return end;
	}
	return PURGE_DONE;
}

void
idem_purge_worker_main(Datum main_arg)
{
	Oid			dbid = DatumGetObjectId(main_arg);
	bool		ready;

	pqsignal(SIGHUP, SignalHandlerForConfigReload);
	pqsignal(SIGTERM, die);
	BackgroundWorkerUnblockSignals();
	/*
	 * FATAL, and no restart, if the database was dropped in the moment
	 * since the launcher looked for it
	 */
	BackgroundWorkerInitializeConnectionByOid(dbid, InvalidOid, 0);
	pgstat_report_appname("idem purge worker");
	idem_stats_database_only();

	/*
	 * Maintenance, as autovacuum's: a database whose sessions are made
	 * read-only still has its expired records purged and its queued audit
	 * entries written, rather than a worker failing every cycle (and, the
	 * key purge writing below the executor, half a cycle done).
	 */
	SetConfigOption("default_transaction_read_only", "off", PGC_SUSET,
					PGC_S_OVERRIDE);

	StartTransactionCommand();
	ready = extension_ready();
	CommitTransactionCommand();

	if (ready)
	{
		switch (purge_cycle())
		{
			case PURGE_DONE:
				break;
			case PURGE_NO_EXTENSION:
				ereport(LOG,
						(errmsg("idem purge worker stopped: extension \"idem\" was dropped from database %u during its cycle",
								dbid)));
				ready = false;
				break;
			case PURGE_DATABASE_WANTED:
				/* the next cycle does the rest, if the database is still there */
				ereport(LOG,
						(errmsg("idem purge worker stopped its cycle in database %u: another session needs the database to itself",
								dbid)));
				break;
		}
	}
	if (!ready)
		idem_audit_discard_db(dbid);
	proc_exit(0);
}
