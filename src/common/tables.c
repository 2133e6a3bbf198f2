/*-------------------------------------------------------------------------
 *
 * tables.c
 *		idem's own tables (idem.keys, idem.outbox, idem.outbox_topics,
 *		idem.runs, idem.audit) and the per-key advisory lock.  What is
 *		written to the outbox, and when, is outbox.c's.
 *
 * The tables are reached by OID, cached and reset by a relcache callback, so
 * no search_path can redirect idem's reads or writes.  Access is direct:
 * an index probe for the lookup, and for the writes one path
 * (insert_row(), update_row()) that does what the executor would for these
 * tables: CHECK constraints, unique checks, partial-index predicates.
 * That is faster than SPI, has no plan to go stale (a generic plan
 * built while the catalog was empty would be a sequential scan forever), and
 * needs no grants to callers, who cannot see the tables at all.  Direct
 * access skips the executor's read-only and permission checks; the callers
 * in execute.c do those themselves.
 *
 * The lookup uses SnapshotSelf: it sees rows committed by anyone up to now
 * and this transaction's own rows, whatever the isolation level, and takes
 * no SSI predicate locks.  Under REPEATABLE READ or SERIALIZABLE the caller
 * must still ask idem_check_visible() (execute.c) whether the row found is
 * one its snapshot could see.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/tables.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/transam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/index.h"
#include "catalog/pg_am.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_type.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "catalog/pg_operator.h"
#include "commands/extension.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "jit/jit.h"
#include "common/hashfn.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "optimizer/optimizer.h"
#include "optimizer/planner.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "storage/procarray.h"
#include "utils/timestamp.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"

#include "compat.h"
#include "common/common.h"

PG_FUNCTION_INFO_V1(idem_registry_changed);
PG_FUNCTION_INFO_V1(idem_lock_seed_local);

/* Column numbers of idem.keys */
#define Anum_keys_key			1
#define Anum_keys_owner			2
#define Anum_keys_fingerprint	3
#define Anum_keys_response		4
#define Anum_keys_created_at	5
#define Anum_keys_expires_at	6
#define Anum_keys_fpversion		7
#define Natts_keys				7

/* Column numbers of idem.runs */
#define Anum_runs_run_id		1
#define Anum_runs_owner			2
#define Anum_runs_steps			3
#define Anum_runs_input			4
#define Anum_runs_status		5
#define Anum_runs_started_at	6
#define Anum_runs_finished_at	7
#define Anum_runs_last_error	8
#define Anum_runs_done_steps	9
#define Anum_runs_attempts		10
#define Anum_runs_queue			11
#define Anum_runs_queue_state	12
#define Anum_runs_due_at		13
#define Anum_runs_attempt		14
#define Anum_runs_claims		15
#define Anum_runs_lease_token	16
#define Anum_runs_leased_by		17
#define Anum_runs_lease_holder	18
#define Anum_runs_awaiting		19
#define Anum_runs_wait_until	20
#define Anum_runs_started_step	21
#define Anum_runs_started_count	22
#define Anum_runs_max_attempts	23
#define Anum_runs_backoff_base	24
#define Anum_runs_backoff_cap	25
#define Anum_runs_jitter		26
#define Natts_runs				26

/* Column numbers of idem.run_attempts */
#define Anum_run_attempts_owner		1
#define Anum_run_attempts_run_id	2
#define Anum_run_attempts_claim		3
#define Anum_run_attempts_attempt	4
#define Anum_run_attempts_step		5
#define Anum_run_attempts_worker	6
#define Anum_run_attempts_leased_by	7
#define Anum_run_attempts_claimed_at 8
#define Anum_run_attempts_ended_at	9
#define Anum_run_attempts_outcome	10
#define Anum_run_attempts_error		11
#define Natts_run_attempts			11

typedef struct IdemCatalog
{
	Oid			keys;
	Oid			keys_pkey;
	Oid			keys_expires;
	Oid			outbox;
	Oid			outbox_pkey;	/* (event_id) */
	Oid			outbox_due;		/* (topic, next_attempt_at), undelivered */
	Oid			outbox_run;		/* (run_id), undelivered events of runs */
	Oid			outbox_topics;
	Oid			outbox_topics_pkey;
	Oid			queues;
	Oid			queues_pkey;
	Oid			audit;
	Oid			audit_at;
	Oid			lock_seed_rel;
	uint64		lock_seed;		/* keys the hash in each key's lock tag */
	Oid			runs;
	Oid			runs_pkey;
	Oid			runs_due;		/* (queue, due_at), unfinished queued runs */
	Oid			runs_owner_due; /* (queue, owner, due_at), the same runs */
	Oid			run_attempts;
	Oid			run_attempts_pkey;
} IdemCatalog;

/* The shape idem reads and writes: what idem--1.1.sql creates. */
typedef struct ColumnShape
{
	const char *name;
	Oid			type;
	bool		nullable;		/* false: the column must be NOT NULL */
} ColumnShape;

static const ColumnShape keys_shape[Natts_keys] = {
	{"key", TEXTOID}, {"owner", REGROLEOID}, {"fingerprint", BYTEAOID},
	{"response", JSONBOID}, {"created_at", TIMESTAMPTZOID},
	{"expires_at", TIMESTAMPTZOID}, {"fingerprint_version", INT2OID}
};
static const ColumnShape outbox_shape[Natts_outbox] = {
	{"event_id", UUIDOID}, {"key", TEXTOID}, {"owner", REGROLEOID},
	{"topic", TEXTOID}, {"payload", JSONBOID}, {"created_at", TIMESTAMPTZOID},
	{"run_id", TEXTOID, true}, {"step", TEXTOID, true},
	{"state", TEXTOID}, {"attempts", INT4OID},
	{"next_attempt_at", TIMESTAMPTZOID}, {"lease_token", UUIDOID, true},
	{"leased_by", REGROLEOID, true}, {"lease_holder", TEXTOID, true},
	{"last_error", TEXTOID, true}, {"delivered_at", TIMESTAMPTZOID, true},
	{"run_position", INT4OID, true}
};
static const ColumnShape outbox_topics_shape[Natts_outbox_topics] = {
	{"topic", TEXTOID}, {"publishers", REGROLEARRAYOID},
	{"consumers", REGROLEARRAYOID}, {"created_at", TIMESTAMPTZOID}
};
static const int16 outbox_topics_pkey_columns[] = {Anum_outbox_topics_topic};
static const ColumnShape queues_shape[Natts_queues] = {
	{"queue", TEXTOID}, {"producers", REGROLEARRAYOID},
	{"workers", REGROLEARRAYOID}, {"signallers", REGROLEARRAYOID},
	{"concurrency", INT4OID, true}, {"max_attempts", INT4OID},
	{"backoff_base", INTERVALOID}, {"backoff_cap", INTERVALOID},
	{"jitter", TEXTOID}, {"created_at", TIMESTAMPTZOID}
};
static const int16 queues_pkey_columns[] = {Anum_queues_queue};
static const int16 outbox_pkey_columns[] = {Anum_outbox_event_id};
static const int16 outbox_due_columns[] = {Anum_outbox_topic, Anum_outbox_next_attempt_at};
static const int16 outbox_run_columns[] = {Anum_outbox_run_id};
static const ColumnShape lock_seed_shape[1] = {{"seed", INT8OID}};
static const ColumnShape runs_shape[Natts_runs] = {
	{"run_id", TEXTOID}, {"owner", REGROLEOID}, {"steps", TEXTARRAYOID, true},
	{"input", JSONBOID, true}, {"status", TEXTOID},
	{"started_at", TIMESTAMPTZOID}, {"finished_at", TIMESTAMPTZOID, true},
	{"last_error", TEXTOID, true}, {"done_steps", TEXTARRAYOID},
	{"attempts", INT4ARRAYOID}, {"queue", TEXTOID, true},
	{"queue_state", TEXTOID, true}, {"due_at", TIMESTAMPTZOID, true},
	{"attempt", INT4OID}, {"claims", INT4OID}, {"lease_token", UUIDOID, true},
	{"leased_by", REGROLEOID, true}, {"lease_holder", TEXTOID, true},
	{"awaiting", TEXTOID, true}, {"wait_until", TIMESTAMPTZOID, true},
	{"started_step", TEXTOID, true}, {"started_count", INT4OID},
	{"max_attempts", INT4OID, true}, {"backoff_base", INTERVALOID, true},
	{"backoff_cap", INTERVALOID, true}, {"jitter", TEXTOID, true}
};
static const int16 runs_pkey_columns[] = {Anum_runs_owner, Anum_runs_run_id};
static const int16 runs_due_columns[] = {Anum_runs_queue, Anum_runs_due_at};
static const int16 runs_owner_due_columns[] = {Anum_runs_queue, Anum_runs_owner,
Anum_runs_due_at};
static const ColumnShape run_attempts_shape[Natts_run_attempts] = {
	{"owner", REGROLEOID}, {"run_id", TEXTOID}, {"claim", INT4OID},
	{"attempt", INT4OID}, {"step", TEXTOID, true}, {"worker", TEXTOID},
	{"leased_by", REGROLEOID}, {"claimed_at", TIMESTAMPTZOID},
	{"ended_at", TIMESTAMPTZOID, true}, {"outcome", TEXTOID, true},
	{"error", TEXTOID, true}
};
static const int16 run_attempts_pkey_columns[] = {
	Anum_run_attempts_owner, Anum_run_attempts_run_id, Anum_run_attempts_claim
};
static const ColumnShape audit_shape[Natts_audit] = {
	{"at", TIMESTAMPTZOID}, {"key", TEXTOID}, {"owner", REGROLEOID},
	{"run_id", TEXTOID, true}, {"step", TEXTOID, true},
	{"outcome", TEXTOID}, {"fingerprint", BYTEAOID, true},
	{"sqlstate", TEXTOID, true}, {"xid", XID8OID, true},
	{"pid", INT4OID}, {"application_name", TEXTOID, true},
	{"client_addr", INETOID, true}, {"actor", REGROLEOID, true}
};
static const int16 audit_at_columns[] = {1};
static const int16 keys_pkey_columns[] = {Anum_keys_owner, Anum_keys_key};
static const int16 keys_expires_columns[] = {Anum_keys_expires_at};

static IdemCatalog catalog;
static bool catalog_valid = false;
static bool catalog_callback_registered = false;

/*
 * What writing a row of one of idem's tables needs besides the relation:
 * its indexes, each one's IndexInfo and predicate, and the table's CHECK
 * constraints, kept between rows (see insert_row()).  Built for
 * generation catalog_generation.
 */
typedef struct TableWriter
{
	Oid			relid;
	uint64		generation;
	MemoryContext cxt;
	int			nindexes;
	Oid		   *indexoids;
	IndexInfo **infos;
	ExprState **predicates;		/* NULL where the index is not partial */
	int			nchecks;
	ExprState **checks;
	char	  **checknames;
	TupleTableSlot *slot;		/* the row, for predicates and checks */
	ExprContext *econtext;
} TableWriter;

enum
{
	WRITE_KEYS, WRITE_RUNS, WRITE_OUTBOX, WRITE_AUDIT, WRITE_ATTEMPTS,
	WRITE_TABLES
};

static TableWriter writers[WRITE_TABLES];

/* the columns idem writes in each table's rows, all of them but dropped ones */
static const int writer_natts[WRITE_TABLES] = {
	[WRITE_KEYS] = Natts_keys,
	[WRITE_RUNS] = Natts_runs,
	[WRITE_OUTBOX] = Natts_outbox,
	[WRITE_AUDIT] = Natts_audit,
	[WRITE_ATTEMPTS] = Natts_run_attempts
};

/* moves on with every invalidation of one of idem's relations */
static uint64 catalog_generation = 1;

/*
 * Only mark the cache stale: an invalidation can arrive in the middle of an
 * operation (at any lock acquisition), which must keep using the OIDs it
 * resolved.  The next catalog_resolve() looks them up again.
 */
static void shard_writers_invalidate(Oid relid);

static void
catalog_invalidate(Datum arg, Oid relid)
{
	/* one callback for both: a backend has few relcache callback slots */
	shard_writers_invalidate(relid);
	if (relid == InvalidOid || relid == catalog.keys ||
		relid == catalog.keys_pkey || relid == catalog.keys_expires ||
		relid == catalog.outbox || relid == catalog.outbox_pkey ||
		relid == catalog.outbox_due ||
		relid == catalog.outbox_run || relid == catalog.outbox_topics ||
		relid == catalog.outbox_topics_pkey || relid == catalog.lock_seed_rel ||
		relid == catalog.queues || relid == catalog.queues_pkey ||
		relid == catalog.runs || relid == catalog.runs_pkey ||
		relid == catalog.runs_due || relid == catalog.runs_owner_due ||
		relid == catalog.run_attempts || relid == catalog.run_attempts_pkey ||
		relid == catalog.audit || relid == catalog.audit_at)
	{
		catalog_valid = false;
		catalog_generation++;
	}
}

static void
catalog_damaged(const char *relname, const char *detail)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("relation \"idem.%s\" is not the one extension \"idem\" created",
					relname),
			 errdetail("%s", detail),
			 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "Reinstall the extension with DROP EXTENSION idem; CREATE EXTENSION idem.")));
}

static Oid
catalog_relid(const char *relname, Oid nspid)
{
	Oid			relid = get_relname_relid(relname, nspid);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relation \"idem.%s\" does not exist", relname),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "Reinstall the extension with DROP EXTENSION idem; CREATE EXTENSION idem.")));
	return relid;
}

/*
 * A table idem reads by column number must be the extension's own, with
 * exactly the columns idem expects: a renamed original and a look-alike
 * in its place would otherwise be read through the wrong index or with
 * the wrong types.  Nor may Citus have taken it over: its rows would be on
 * Citus's shards, out of sight of idem's direct reads and writes.
 *
 * Dropped columns after idem's are let through: a column added and
 * dropped again (by an administrator, or by an update script that needed
 * it for a while) leaves one, and nothing short of recreating the table
 * removes it, so refusing it would leave DROP EXTENSION, and the loss of
 * every key and run, as the only way out.  idem's writes form their rows
 * with the relation's own width (idem_form_row()).  A dropped column
 * among idem's would move theirs off the numbers idem reads them by.
 */
static Oid
catalog_table(const char *relname, Oid nspid, Oid extoid,
			  const ColumnShape *shape, int natts)
{
	Oid			relid = catalog_relid(relname, nspid);
	Relation	rel;
	TupleDesc	desc;
	int			live = 0;

	if (getExtensionOfObject(RelationRelationId, relid) != extoid)
		catalog_damaged(relname, "The relation is not a member of the extension.");
	if (idem_citus_owns(relid))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_TAKEN_OVER),
				 errmsg("relation \"idem.%s\" is a Citus table", relname),
				 errdetail("idem reads and writes its own tables on each node directly, where Citus keeps none of a distributed or reference table's rows."),
				 idem_errhint(ERRCODE_IDEM_CITUS_TAKEN_OVER, "Give the table back as idem's Citus documentation says (undistribute_table() refuses an extension's table); idem's key records follow a tenant's shard through idem_citus_colocate().")));

	rel = table_open(relid, AccessShareLock);
	desc = RelationGetDescr(rel);
	if (rel->rd_rel->relkind != RELKIND_RELATION)
		catalog_damaged(relname, "The relation is not an ordinary table.");
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped)
			continue;
		if (i >= natts || live != i ||
			strcmp(NameStr(att->attname), shape[i].name) != 0 ||
			att->atttypid != shape[i].type ||
			att->attnotnull == shape[i].nullable)
			catalog_damaged(relname, "Its columns differ from those the extension defines.");
		live++;
	}
	if (live != natts)
		catalog_damaged(relname, "Its columns differ from those the extension defines.");
	table_close(rel, AccessShareLock);
	return relid;
}

/* The predicate of a partial index of idem's, as its install script made it */
typedef enum IndexPredicate
{
	PRED_NONE,
	PRED_QUEUED_RUN,			/* queue_state IS NOT NULL */
	PRED_UNDELIVERED,			/* state = ANY (ARRAY['pending', 'leased']) */
	PRED_UNDELIVERED_RUN		/* run_id IS NOT NULL AND the same */
} IndexPredicate;

static bool
is_not_null_test(Node *node, AttrNumber attno)
{
	NullTest   *nt = IsA(node, NullTest) ? (NullTest *) node : NULL;

	return nt != NULL && nt->nulltesttype == IS_NOT_NULL &&
		IsA(nt->arg, Var) && ((Var *) nt->arg)->varattno == attno;
}

/* Whether node is "state = ANY (ARRAY['pending', 'leased'])" */
static bool
is_undelivered_test(Node *node)
{
	ScalarArrayOpExpr *sa = IsA(node, ScalarArrayOpExpr) ? (ScalarArrayOpExpr *) node : NULL;
	Node	   *var;
	Const	   *array;
	Datum	   *elems;
	bool	   *elemnulls;
	int			nelems;

	if (sa == NULL || !sa->useOr || sa->opno != TextEqualOperator ||
		list_length(sa->args) != 2)
		return false;
	var = linitial(sa->args);
	array = lsecond(sa->args);
	if (!IsA(var, Var) || ((Var *) var)->varattno != Anum_outbox_state ||
		!IsA(array, Const) || array->constisnull ||
		array->consttype != TEXTARRAYOID)
		return false;
	deconstruct_array(DatumGetArrayTypeP(array->constvalue), TEXTOID, -1,
					  false, TYPALIGN_INT, &elems, &elemnulls, &nelems);
	return nelems == 2 && !elemnulls[0] && !elemnulls[1] &&
		strcmp(TextDatumGetCString(elems[0]), "pending") == 0 &&
		strcmp(TextDatumGetCString(elems[1]), "leased") == 0;
}

static bool
predicate_is(List *pred, IndexPredicate expected)
{
	switch (expected)
	{
		case PRED_NONE:
			return pred == NIL;
		case PRED_QUEUED_RUN:
			return list_length(pred) == 1 &&
				is_not_null_test(linitial(pred), Anum_runs_queue_state);
		case PRED_UNDELIVERED:
			return list_length(pred) == 1 && is_undelivered_test(linitial(pred));
		case PRED_UNDELIVERED_RUN:
			return list_length(pred) == 2 &&
				is_not_null_test(linitial(pred), Anum_outbox_run_id) &&
				is_undelivered_test(lsecond(pred));
	}
	return false;
}

/*
 * The index relname of tableid, checked to be the one the install script
 * made: idem scans some of them itself, and a scan of an index that does
 * not cover the rows idem expects would miss them without a word.
 */
static Oid
catalog_index(const char *relname, Oid nspid, Oid tableid, Oid am,
			  bool unique, const int16 *columns, int ncolumns,
			  IndexPredicate predicate)
{
	Oid			relid = catalog_relid(relname, nspid);
	Relation	idx = index_open(relid, AccessShareLock);
	Form_pg_index form = idx->rd_index;
	bool		ok;

	ok = form->indrelid == tableid && idx->rd_rel->relam == am &&
		form->indisunique == unique && form->indisvalid &&
		form->indnkeyatts == ncolumns && form->indnatts == ncolumns &&
		RelationGetIndexExpressions(idx) == NIL &&
		predicate_is(RelationGetIndexPredicate(idx), predicate);
	for (int i = 0; ok && i < ncolumns; i++)
		ok = form->indkey.values[i] == columns[i];
	index_close(idx, AccessShareLock);
	if (!ok)
		catalog_damaged(relname, "The index is not the one the extension defines on its table.");
	return relid;
}

/*
 * The secret the install script stored in idem.lock_seed.  pg_locks shows
 * every key lock to every role; with a hash keyed by a value no ordinary
 * role can read, a lock does not confirm a guess of another role's key.
 */
static uint64
catalog_lock_seed(Oid relid)
{
	Relation	rel = table_open(relid, AccessShareLock);
	TableScanDesc scan = table_beginscan(rel, SnapshotSelf, 0, NULL);
	HeapTuple	tuple;
	int			rows = 0;
	uint64		seed = 0;

	while ((tuple = heap_getnext(scan, ForwardScanDirection)) != NULL)
	{
		bool		isnull;

		seed = (uint64) DatumGetInt64(heap_getattr(tuple, 1,
												   RelationGetDescr(rel),
												   &isnull));
		rows++;
	}
	table_endscan(scan);
	table_close(rel, AccessShareLock);
	if (rows != 1)
		catalog_damaged("lock_seed", "The table must hold exactly one row.");
	return seed;
}

/*
 * idem_catalog_generation
 *		A number that moves on whenever one of idem's relations may have
 *		changed: what a backend derived from them is stale once it does.
 */
uint64
idem_catalog_generation(void)
{
	return catalog_generation;
}

/*
 * idem_extension_version
 *		The installed version of the extension, or NULL.
 */
char *
idem_extension_version(Oid extoid)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tup;
	char	   *version = NULL;

	ScanKeyInit(&key, Anum_pg_extension_oid, BTEqualStrategyNumber,
				F_OIDEQ, ObjectIdGetDatum(extoid));
	scan = systable_beginscan(rel, ExtensionOidIndexId, true, NULL, 1, &key);
	tup = systable_getnext(scan);
	if (HeapTupleIsValid(tup))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * idem_report_old_definitions
 *		55000: the database's SQL definitions of idem are of another
 *		version than this library's.  Before ALTER EXTENSION idem UPDATE
 *		they would be read with the wrong shapes; the fix is the update,
 *		never a reinstall, which would drop every record.
 */
void
idem_report_old_definitions(const char *version)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("extension \"idem\" must be updated"),
			 errdetail("The extension's SQL definitions are version %s, but the installed library is version %s.",
					   version ? version : "unknown", IDEM_SQL_VERSION),
			 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "Run ALTER EXTENSION idem UPDATE.")));
}

/*
 * Find idem's tables.  The schema must be the one the extension created:
 * a schema named "idem" made by someone else is never used, and neither is
 * a relation that is not the extension's own or has another shape.
 */
static void
catalog_resolve(void)
{
	Oid			extoid;
	Oid			nspid;
	uint64		generation = catalog_generation;

	if (catalog_valid)
		return;

	if (!catalog_callback_registered)
	{
		CacheRegisterRelcacheCallback(catalog_invalidate, (Datum) 0);
		catalog_callback_registered = true;
	}

	extoid = get_extension_oid("idem", true);
	if (!OidIsValid(extoid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"idem\" is not installed in this database"),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "Run CREATE EXTENSION idem.")));

	/* the scripts of earlier versions run with their own version recorded */
	if (!(creating_extension && CurrentExtensionObject == extoid))
	{
		char	   *version = idem_extension_version(extoid);

		if (version == NULL || strcmp(version, IDEM_SQL_VERSION) != 0)
			idem_report_old_definitions(version);
	}

	nspid = get_namespace_oid("idem", true);
	if (!OidIsValid(nspid) ||
		getExtensionOfObject(NamespaceRelationId, nspid) != extoid)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("schema \"idem\" does not belong to extension \"idem\""),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "Reinstall the extension with DROP EXTENSION idem; CREATE EXTENSION idem.")));

	catalog.keys = catalog_table("keys", nspid, extoid, keys_shape, Natts_keys);
	catalog.outbox = catalog_table("outbox", nspid, extoid, outbox_shape,
								   Natts_outbox);
	catalog.outbox_pkey = catalog_index("outbox_pkey", nspid, catalog.outbox,
										BTREE_AM_OID, true, outbox_pkey_columns,
										lengthof(outbox_pkey_columns),
										PRED_NONE);
	catalog.outbox_due = catalog_index("outbox_due_idx", nspid, catalog.outbox,
									   BTREE_AM_OID, false, outbox_due_columns,
									   lengthof(outbox_due_columns),
									   PRED_UNDELIVERED);
	catalog.outbox_run = catalog_index("outbox_run_idx", nspid, catalog.outbox,
									   BTREE_AM_OID, false, outbox_run_columns,
									   lengthof(outbox_run_columns),
									   PRED_UNDELIVERED_RUN);
	catalog.outbox_topics = catalog_table("outbox_topics", nspid, extoid,
										  outbox_topics_shape,
										  Natts_outbox_topics);
	catalog.outbox_topics_pkey = catalog_index("outbox_topics_pkey", nspid,
											   catalog.outbox_topics,
											   BTREE_AM_OID, true,
											   outbox_topics_pkey_columns,
											   lengthof(outbox_topics_pkey_columns),
											   PRED_NONE);
	catalog.queues = catalog_table("queues", nspid, extoid, queues_shape,
								   Natts_queues);
	catalog.queues_pkey = catalog_index("queues_pkey", nspid, catalog.queues,
										BTREE_AM_OID, true, queues_pkey_columns,
										lengthof(queues_pkey_columns),
										PRED_NONE);
	catalog.keys_pkey = catalog_index("keys_pkey", nspid, catalog.keys,
									  BTREE_AM_OID, true,
									  keys_pkey_columns,
									  lengthof(keys_pkey_columns),
									  PRED_NONE);
	catalog.keys_expires = catalog_index("keys_expires_at_idx", nspid,
										 catalog.keys, BTREE_AM_OID, false,
										 keys_expires_columns,
										 lengthof(keys_expires_columns),
										 PRED_NONE);
	catalog.lock_seed_rel = catalog_table("lock_seed", nspid, extoid,
										  lock_seed_shape, 1);
	catalog.lock_seed = catalog_lock_seed(catalog.lock_seed_rel);
	catalog.runs = catalog_table("runs", nspid, extoid, runs_shape, Natts_runs);
	catalog.runs_pkey = catalog_index("runs_pkey", nspid, catalog.runs,
									  BTREE_AM_OID, true,
									  runs_pkey_columns,
									  lengthof(runs_pkey_columns),
									  PRED_NONE);
	catalog.runs_due = catalog_index("runs_due_idx", nspid, catalog.runs,
									 BTREE_AM_OID, false, runs_due_columns,
									 lengthof(runs_due_columns),
									 PRED_QUEUED_RUN);
	catalog.runs_owner_due = catalog_index("runs_owner_due_idx", nspid,
										   catalog.runs, BTREE_AM_OID, false,
										   runs_owner_due_columns,
										   lengthof(runs_owner_due_columns),
										   PRED_QUEUED_RUN);
	catalog.run_attempts = catalog_table("run_attempts", nspid, extoid,
										 run_attempts_shape, Natts_run_attempts);
	catalog.run_attempts_pkey = catalog_index("run_attempts_pkey", nspid,
											  catalog.run_attempts,
											  BTREE_AM_OID, true,
											  run_attempts_pkey_columns,
											  lengthof(run_attempts_pkey_columns),
											  PRED_NONE);
	catalog.audit = catalog_table("audit", nspid, extoid, audit_shape,
								  Natts_audit);
	catalog.audit_at = catalog_index("audit_at_idx", nspid, catalog.audit,
									 BRIN_AM_OID, false, audit_at_columns,
									 lengthof(audit_at_columns),
									 PRED_NONE);

	/*
	 * The lookups open relations, which takes locks and so reads
	 * invalidations: one that names a relation already looked up here
	 * leaves the cache to be built again by the next call, as it would
	 * between calls.
	 */
	catalog_valid = (generation == catalog_generation);
}

/*
 * A key's lock names its owner in full and the key by a 32-bit hash keyed
 * by the database's lock seed, so two roles never share a lock: no wait,
 * timeout or ID409 can tell one role anything about another's keys, and
 * pg_locks does not confirm a guessed key.  Within a role a hash collision
 * only makes two calls wait for each other.  Caller has resolved the
 * catalog.
 */
static void
set_key_locktag(LOCKTAG *tag, Oid owner, const char *key, int keylen)
{
	uint64		h = hash_bytes_extended((const unsigned char *) key, keylen,
										catalog.lock_seed);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, owner, (uint32) (h ^ (h >> 32)),
						 IDEM_LOCKTAG_CLASS);
}

/* ID409: key is held by another transaction, and idem.wait is off. */
static void
report_key_in_use(const char *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_IN_PROGRESS),
			 errmsg("idempotency key \"%s\" is in use by another transaction",
					key),
			 errdetail("A call with this key is still in progress and idem.wait is off."),
			 idem_errhint(ERRCODE_IDEM_IN_PROGRESS, "Retry after the other transaction ends.")));
}

/*
 * Wait for the key's lock (tag), or for the transaction xid when tag is
 * NULL, counted in the stats as a lock wait.
 */
static void
counted_wait(LOCKTAG *tag, TransactionId xid)
{
	/* counted when it starts: a wait may end in an error */
	TimestampTz start = GetCurrentTimestamp();
	long		secs;
	int			usecs;

	idem_stats_count(IDEM_STAT_LOCK_WAITS, 1);
	if (tag != NULL)
		(void) LockAcquire(tag, ExclusiveLock, false, false);
	else
		XactLockTableWait(xid, NULL, NULL, XLTW_None);
	TimestampDifference(start, GetCurrentTimestamp(), &secs, &usecs);
	idem_stats_count(IDEM_STAT_LOCK_WAIT_US, (uint64) secs * 1000000 + usecs);
}

/*
 * idem_lock_key
 *		Take the key's transaction-scoped advisory lock, waiting or not.
 *
 * The lock only spares a concurrent caller a wasted execution and gives it a
 * clean wait; the unique index on idem.keys stays the ground truth.
 */
void
idem_lock_key(Oid owner, const char *key, int keylen, bool wait)
{
	LOCKTAG		tag;

	catalog_resolve();
	set_key_locktag(&tag, owner, key, keylen);
	if (LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
		return;
	if (!wait)
		report_key_in_use(key);
	counted_wait(&tag, InvalidTransactionId);
}

static bool
try_lock_key(Oid owner, const char *key, int keylen)
{
	LOCKTAG		tag;

	set_key_locktag(&tag, owner, key, keylen);
	return LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

/*
 * idem_try_lock_key
 *		Take the key's lock if no other transaction holds it.
 */
bool
idem_try_lock_key(Oid owner, const char *key, int keylen)
{
	catalog_resolve();
	return try_lock_key(owner, key, keylen);
}

static void
unlock_key(Oid owner, const char *key, int keylen)
{
	LOCKTAG		tag;

	set_key_locktag(&tag, owner, key, keylen);
	LockRelease(&tag, ExclusiveLock, false);
}

/*
 * idem_unlock_key
 *		Give back one taking of the key's lock: a lock this transaction
 *		took before, and took again since, stays held.
 */
void
idem_unlock_key(Oid owner, const char *key, int keylen)
{
	catalog_resolve();
	unlock_key(owner, key, keylen);
}

/*
 * Probe a primary key on (owner, text), idem.keys' or idem.runs', with
 * SnapshotSelf; the tuple, if any, is left in slot.
 */
static bool
probe_key(Relation rel, Relation idx, TupleTableSlot *slot, Oid owner,
		  text *keytext)
{
	IndexScanDesc scan;
	ScanKeyData skey[2];
	bool		found;

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(owner));
	ScanKeyInit(&skey[1], 2, BTEqualStrategyNumber, F_TEXTEQ,
				PointerGetDatum(keytext));
	scan = index_beginscan(rel, idx, SnapshotSelf, NULL, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	return found;
}

/*
 * Whether a row found with SnapshotSelf is one the caller's transaction
 * snapshot (REPEATABLE READ or SERIALIZABLE; NULL otherwise) can see.  Own
 * rows are always ours to see; comparing them with the transaction
 * snapshot would misfire on its stale command id.
 */
static bool
visible_to_xact(Relation rel, TupleTableSlot *slot, TransactionId xmin,
				Snapshot xact_snapshot)
{
	return TransactionIdIsCurrentTransactionId(xmin) ||
		xact_snapshot == NULL ||
		table_tuple_satisfies_snapshot(rel, slot, xact_snapshot);
}

/*
 * A probe for one row of idem.keys or idem.runs by (owner, name), open
 * until probe_row_end(): its slot holds the row found, its xact_snapshot
 * is the snapshot a REPEATABLE READ caller reads with (taken already), or
 * NULL.
 */
typedef struct RowProbe
{
	Relation	rel;
	Relation	idx;
	TupleTableSlot *slot;
	text	   *name;
	Snapshot	xact_snapshot;
	HeapTuple	tuple;			/* the row found, or NULL */
	bool		should_free;
} RowProbe;

/*
 * Whether the row version at tid, read with SnapshotSelf, is the run
 * (owner, name): the version a scan found, unless a transaction that held
 * the run's lock updated it since (then it is dead to SnapshotSelf) or
 * VACUUM gave its place to another row.
 */
static bool
probe_run_at(RowProbe *p, ItemPointer tid, Oid owner)
{
	bool		isnull;
	Datum		d;

	if (!table_tuple_fetch_row_version(p->rel, tid, SnapshotSelf, p->slot))
		return false;
	d = slot_getattr(p->slot, Anum_runs_owner, &isnull);
	if (isnull || DatumGetObjectId(d) != owner)
		return false;
	d = slot_getattr(p->slot, Anum_runs_run_id, &isnull);
	return !isnull && DatumGetBool(DirectFunctionCall2Coll(texteq, C_COLLATION_OID,
														   d, PointerGetDatum(p->name)));
}

/*
 * Find the row (owner, name) of idem.runs (runs) or idem.keys; a run at
 * tid, if given, is read there before it is looked up in the index.
 */
static bool
probe_row_begin(RowProbe *p, bool runs, Oid owner, const char *name,
				ItemPointer tid)
{
	catalog_resolve();
	p->xact_snapshot = IsolationUsesXactSnapshot() ? GetTransactionSnapshot() : NULL;
	p->rel = table_open(runs ? catalog.runs : catalog.keys, AccessShareLock);
	p->idx = index_open(runs ? catalog.runs_pkey : catalog.keys_pkey,
						AccessShareLock);
	p->slot = table_slot_create(p->rel, NULL);
	p->name = cstring_to_text(name);
	p->tuple = NULL;
	if (!(runs && tid != NULL && probe_run_at(p, tid, owner)) &&
		!probe_key(p->rel, p->idx, p->slot, owner, p->name))
		return false;
	p->tuple = ExecFetchSlotHeapTuple(p->slot, false, &p->should_free);
	return true;
}

/* Whether the row found is one the caller's transaction snapshot sees. */
static bool
probe_row_visible(RowProbe *p)
{
	return visible_to_xact(p->rel, p->slot,
						   HeapTupleHeaderGetXmin(p->tuple->t_data),
						   p->xact_snapshot);
}

/* Close what a probe or a scan of the table through the index opened. */
static void
close_probe(TupleTableSlot *slot, Relation idx, Relation rel, text *name)
{
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	table_close(rel, AccessShareLock);
	pfree(name);
}

static void
probe_row_end(RowProbe *p)
{
	if (p->tuple != NULL && p->should_free)
		heap_freetuple(p->tuple);
	close_probe(p->slot, p->idx, p->rel, p->name);
}

/* Where a key record's columns are, in idem.keys or a tenant's shard. */
typedef struct RecordColumns
{
	AttrNumber	fingerprint;
	AttrNumber	fpversion;
	AttrNumber	response;
	AttrNumber	created_at;
	AttrNumber	expires_at;
} RecordColumns;

static const RecordColumns keys_record_columns = {
	Anum_keys_fingerprint, Anum_keys_fpversion, Anum_keys_response,
	Anum_keys_created_at, Anum_keys_expires_at
};

/* idem.citus_keys: (tenant, owner, key, fingerprint, fingerprint_version, ...) */
static const RecordColumns tenant_record_columns = {4, 5, 6, 7, 8};

/*
 * Fill rec, but its visibility, from the key record tuple in slot, the
 * response copied into the current memory context.  Returns false if the
 * stored fingerprint has the wrong length; rec's is all zeroes then.
 */
static bool
record_from_slot(TupleTableSlot *slot, HeapTuple tuple,
				 const RecordColumns *cols, IdemRecord *rec)
{
	bool		isnull;
	bytea	   *fp;
	bool		fp_ok;

	rec->tid = tuple->t_self;
	rec->xmin = HeapTupleHeaderGetXmin(tuple->t_data);
	fp = DatumGetByteaPP(slot_getattr(slot, cols->fingerprint, &isnull));
	fp_ok = VARSIZE_ANY_EXHDR(fp) == IDEM_FINGERPRINT_LEN;
	if (fp_ok)
		memcpy(rec->fingerprint, VARDATA_ANY(fp), IDEM_FINGERPRINT_LEN);
	else
		memset(rec->fingerprint, 0, IDEM_FINGERPRINT_LEN);
	rec->fpversion = DatumGetInt16(slot_getattr(slot, cols->fpversion, &isnull));
	rec->response = DatumGetJsonbPCopy(slot_getattr(slot, cols->response, &isnull));
	rec->created_at = DatumGetTimestampTz(slot_getattr(slot, cols->created_at, &isnull));
	rec->expires_at = DatumGetTimestampTz(slot_getattr(slot, cols->expires_at, &isnull));
	return fp_ok;
}

/*
 * idem_lookup_key
 *		Find the live record for (owner, key).  Caller holds the key's lock.
 *
 * Fills rec, with the response copied into the current memory context, and
 * returns true if a record exists.
 */
bool
idem_lookup_key(Oid owner, const char *key, IdemRecord *rec)
{
	RowProbe	p;
	bool		found = probe_row_begin(&p, false, owner, key, NULL);

	if (found)
	{
		/* a fingerprint of another length stays zeroes: it matches nothing */
		(void) record_from_slot(p.slot, p.tuple, &keys_record_columns, rec);
		rec->visible = probe_row_visible(&p);
	}
	probe_row_end(&p);
	return found;
}

/*
 * Delete one catalog row, tolerating a concurrent purge that deleted it
 * first (it may have released the key's lock before committing).
 */
static bool
delete_row(Relation rel, ItemPointer tid)
{
	TM_Result	result;
	TM_FailureData tmfd;

	result = heap_delete(rel, tid, GetCurrentCommandId(true), InvalidSnapshot,
						 true, &tmfd, false);
	switch (result)
	{
		case TM_Ok:
			return true;
		case TM_Deleted:
		case TM_Updated:
			return false;
		case TM_SelfModified:
			/* already deleted by this very transaction */
			return false;
		default:
			elog(ERROR, "unexpected heap_delete status: %u", result);
	}
	return false;
}

/*
 * idem_delete_key
 *		Remove an expired record so the key can be written afresh.
 */
void
idem_delete_key(IdemRecord *rec)
{
	Relation	rel;

	catalog_resolve();
	rel = table_open(catalog.keys, RowExclusiveLock);
	delete_row(rel, &rec->tid);
	table_close(rel, RowExclusiveLock);
	CommandCounterIncrement();
}

/*
 * Build what writing rel's rows needs, from rel's relcache entry, in a
 * context of the writer's own.  The generation is read first: an
 * invalidation that arrives while the indexes are opened makes the next
 * row build it again.
 */
static void
build_writer(TableWriter *tw, Relation rel)
{
	MemoryContext oldcxt;
	List	   *indexoids;
	ListCell   *lc;
	TupleConstr *constr = RelationGetDescr(rel)->constr;
	int			i = 0;

	if (tw->cxt == NULL)
		tw->cxt = AllocSetContextCreate(TopMemoryContext, "idem table writer",
										ALLOCSET_SMALL_SIZES);
	MemoryContextReset(tw->cxt);
	tw->relid = InvalidOid;
	tw->generation = catalog_generation;

	oldcxt = MemoryContextSwitchTo(tw->cxt);
	indexoids = RelationGetIndexList(rel);
	tw->nindexes = list_length(indexoids);
	tw->indexoids = palloc(sizeof(Oid) * tw->nindexes);
	tw->infos = palloc(sizeof(IndexInfo *) * tw->nindexes);
	tw->predicates = palloc0(sizeof(ExprState *) * tw->nindexes);
	/* a copy: a relcache descriptor would be pinned by the transaction */
	tw->slot = MakeSingleTupleTableSlot(CreateTupleDescCopy(RelationGetDescr(rel)),
										&TTSOpsHeapTuple);
	tw->econtext = CreateStandaloneExprContext();
	foreach(lc, indexoids)
	{
		Relation	idx = index_open(lfirst_oid(lc), RowExclusiveLock);
		IndexInfo  *ii = BuildIndexInfo(idx);

		/* idem's own indexes: plain columns, no exclusion constraints */
		if (ii->ii_Expressions != NIL || ii->ii_ExclusionOps != NULL ||
			!idx->rd_index->indimmediate)
			catalog_damaged(RelationGetRelationName(rel),
							"Its indexes must be on plain columns, immediate and without exclusion constraints.");
		if (ii->ii_Predicate != NIL)
			tw->predicates[i] = ExecInitQual((List *) expression_planner((Expr *) ii->ii_Predicate),
											 NULL);
		tw->indexoids[i] = lfirst_oid(lc);
		tw->infos[i] = ii;
		i++;
		index_close(idx, NoLock);
	}
	list_free(indexoids);

	/* every CHECK constraint, NOT VALID ones too, as ExecRelCheck() does */
	tw->nchecks = constr ? constr->num_check : 0;
	tw->checks = palloc(sizeof(ExprState *) * tw->nchecks);
	tw->checknames = palloc(sizeof(char *) * tw->nchecks);
	for (i = 0; i < tw->nchecks; i++)
	{
		Expr	   *expr = stringToNode(constr->check[i].ccbin);

		tw->checks[i] = ExecInitExpr(expression_planner(expr), NULL);
		tw->checknames[i] = pstrdup(constr->check[i].ccname);
	}
	MemoryContextSwitchTo(oldcxt);
	tw->relid = RelationGetRelid(rel);
}

/* tuple into tw's slot, checked against rel's CHECK constraints */
static void
check_row(TableWriter *tw, Relation rel, HeapTuple tuple)
{
	ExecStoreHeapTuple(tuple, tw->slot, false);
	tw->econtext->ecxt_scantuple = tw->slot;
	for (int i = 0; i < tw->nchecks; i++)
	{
		if (!ExecCheck(tw->checks[i], tw->econtext))
			ereport(ERROR,
					(errcode(ERRCODE_CHECK_VIOLATION),
					 errmsg("new row for relation \"%s\" violates check constraint \"%s\"",
							RelationGetRelationName(rel), tw->checknames[i]),
					 errtableconstraint(rel, tw->checknames[i]),
					 idem_errhint(ERRCODE_CHECK_VIOLATION, NULL)));
	}
}

/*
 * The writer of rel, with tuple in its slot, checked against the table's
 * CHECK constraints like an INSERT or UPDATE would be.  Callers do not
 * see idem's tables, so the error does not show the row.
 */
static TableWriter *
writer_for_row(int which, Relation rel, HeapTuple tuple)
{
	TableWriter *tw = &writers[which];

	if (tw->relid != RelationGetRelid(rel) ||
		tw->generation != catalog_generation)
		build_writer(tw, rel);
	check_row(tw, rel, tuple);
	return tw;
}

/*
 * Add the index entries of the row in tw's slot, now stored at
 * tuple->t_self, as ExecInsertIndexTuples() does: unique checks included,
 * only in partial indexes whose predicate it satisfies, and only in the
 * summarizing ones after a HOT update that needs them.  The indexes are
 * locked here, as for any table a transaction writes, and held to its
 * end.
 */
static void
index_row(TableWriter *tw, Relation rel, HeapTuple tuple, bool summarizing_only)
{
	for (int i = 0; i < tw->nindexes; i++)
	{
		IndexInfo  *ii = tw->infos[i];
		Relation	idx;
		Datum		idxvalues[INDEX_MAX_KEYS];
		bool		idxnulls[INDEX_MAX_KEYS];

		if (!ii->ii_ReadyForInserts)
			continue;
		if (summarizing_only && !idem_index_is_summarizing(ii))
			continue;
		if (tw->predicates[i] != NULL &&
			!ExecQual(tw->predicates[i], tw->econtext))
			continue;
		idx = index_open(tw->indexoids[i], RowExclusiveLock);
		FormIndexDatum(ii, tw->slot, NULL, idxvalues, idxnulls);
		(void) index_insert(idx, idxvalues, idxnulls, &tuple->t_self, rel,
							ii->ii_Unique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
							false, ii);
		/* what the executor does at ExecCloseIndices: BRIN's pins go */
		index_insert_cleanup(idx, ii);
		index_close(idx, NoLock);
	}
}

static void
writer_done(TableWriter *tw)
{
	ExecClearTuple(tw->slot);
	ResetExprContext(tw->econtext);
}

/*
 * Insert tuple, checked already and in tw's slot, into rel (opened by the
 * caller, closed here) and its indexes, and make it visible.
 */
static void
store_row(TableWriter *tw, Relation rel, HeapTuple tuple)
{
	simple_heap_insert(rel, tuple);
	index_row(tw, rel, tuple, false);
	writer_done(tw);
	heap_freetuple(tuple);
	table_close(rel, NoLock);
	CommandCounterIncrement();
}

/*
 * idem_form_row
 *		A row of rel, one of idem's tables, from the values and nulls of
 *		its first natts columns, which catalog_table() checked are all but
 *		dropped ones: those come after, and are null in the row, as the
 *		executor makes them.
 */
HeapTuple
idem_form_row(Relation rel, Datum *values, bool *nulls, int natts)
{
	TupleDesc	desc = RelationGetDescr(rel);
	Datum	   *allvalues;
	bool	   *allnulls;
	HeapTuple	tuple;

	if (desc->natts == natts)
		return heap_form_tuple(desc, values, nulls);
	if (desc->natts < natts)
		catalog_damaged(RelationGetRelationName(rel),
						"Its columns differ from those the extension defines.");
	allvalues = palloc0(sizeof(Datum) * desc->natts);
	allnulls = palloc(sizeof(bool) * desc->natts);
	memcpy(allvalues, values, sizeof(Datum) * natts);
	memcpy(allnulls, nulls, sizeof(bool) * natts);
	memset(allnulls + natts, true, sizeof(bool) * (desc->natts - natts));
	tuple = heap_form_tuple(desc, allvalues, allnulls);
	pfree(allvalues);
	pfree(allnulls);
	return tuple;
}

/*
 * Insert a row into one of idem's tables and its indexes, then make it
 * visible to the rest of this transaction: later calls and nested ones
 * must see it.
 *
 * This is what the executor's INSERT does for these tables (CHECK
 * constraints, unique checks, partial-index predicates) without building
 * every index's IndexInfo, predicate, BRIN descriptor and constraint
 * expression afresh per row: they are kept in the table's writer until
 * an invalidation of idem's relations moves catalog_generation on.  No
 * triggers fire, and no foreign key or row security applies.
 */
static void
insert_row(int which, Oid relid, Datum *values, bool *nulls)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	HeapTuple	tuple = idem_form_row(rel, values, nulls, writer_natts[which]);

	store_row(writer_for_row(which, rel, tuple), rel, tuple);
}

/*
 * Replace the row at otid with tuple, checked and indexed as insert_row()
 * does.  The heap decides whether the update is HOT (no indexed or
 * predicate column changed, room on the page); a HOT version needs no new
 * index entries.  Caller holds the row's key or run lock, so no other
 * transaction updates it meanwhile, and makes the new version visible.
 */
static void
update_row_with(TableWriter *tw, Relation rel, ItemPointer otid, HeapTuple tuple)
{
	IdemIndexUpdate update = idem_simple_heap_update(rel, otid, tuple);

	if (update != IDEM_INDEX_NONE)
		index_row(tw, rel, tuple, update == IDEM_INDEX_SUMMARIZING);
	writer_done(tw);
}

static void
update_row(int which, Relation rel, ItemPointer otid, HeapTuple tuple)
{
	update_row_with(writer_for_row(which, rel, tuple), rel, otid, tuple);
}

/*
 * idem_insert_key
 *		Write the key record.  Caller holds the key's lock.
 */
void
idem_insert_key(const char *key, Oid owner, const uint8 *fingerprint,
				Jsonb *response, TimestampTz created_at,
				TimestampTz expires_at)
{
	Datum		values[Natts_keys];
	bool		nulls[Natts_keys] = {0};
	bytea	   *fp = palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);

	catalog_resolve();

	SET_VARSIZE(fp, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	memcpy(VARDATA(fp), fingerprint, IDEM_FINGERPRINT_LEN);

	values[Anum_keys_key - 1] = CStringGetTextDatum(key);
	values[Anum_keys_owner - 1] = ObjectIdGetDatum(owner);
	values[Anum_keys_fingerprint - 1] = PointerGetDatum(fp);
	values[Anum_keys_response - 1] = JsonbPGetDatum(response);
	values[Anum_keys_created_at - 1] = TimestampTzGetDatum(created_at);
	values[Anum_keys_expires_at - 1] = TimestampTzGetDatum(expires_at);
	values[Anum_keys_fpversion - 1] = Int16GetDatum(IDEM_FINGERPRINT_VERSION);

	insert_row(WRITE_KEYS, catalog.keys, values, nulls);
}

/*
 * Tenant key records: rows of a tenant's shard of idem.citus_keys on this
 * node, (tenant, owner, key, fingerprint, fingerprint_version, response,
 * created_at, expires_at) with primary key (tenant, owner, key).  The
 * caller (workflow/tenant.c) found the shard here and holds the lock that
 * keeps it here.  Reached directly, as idem.keys is, for the same reasons:
 * through SPI each probe and write went through the executor, as the
 * table's owner and (for a write) under a GUC nest level that let it
 * change a shard.  What writing a shard needs is kept per shard relation,
 * until Citus or DDL invalidates that relation.
 */
typedef struct ShardWriter
{
	Oid			relid;			/* hash key */
	uint64		invalidations;	/* of the shard's relation, counted */
	uint64		probe_built;	/* invalidations when the probe was built */
	uint64		writer_built;	/* ... and the writer (tw) */
	Oid			pkey;			/* the shard's primary key index */
	RegProcedure tenant_eq;		/* its first column's equality */
	Oid			tenant_collation;
	Oid			owner_collation;
	Oid			key_collation;
	TableWriter tw;
} ShardWriter;

/* most shards' writers kept before all are dropped and built again */
#define MAX_SHARD_WRITERS 256

static HTAB *shard_writers = NULL;

static const ColumnShape tenant_keys_shape[] = {
	{"tenant", InvalidOid}, {"owner", TEXTOID}, {"key", TEXTOID},
	{"fingerprint", BYTEAOID}, {"fingerprint_version", INT2OID},
	{"response", JSONBOID}, {"created_at", TIMESTAMPTZOID},
	{"expires_at", TIMESTAMPTZOID}
};

#define Natts_tenant_keys lengthof(tenant_keys_shape)

/*
 * idem_tenant_owner
 *		What a tenant record (idem.citus_keys, idem.citus_runs) keeps of
 *		its owner: the role's name, not its OID.  Citus knows a role on
 *		every node by its name and gives it each node's own OID, and a
 *		shard move copies the records' bytes to the new node, where the old
 *		OID is another role's or nobody's.
 */
text *
idem_tenant_owner(Oid owner)
{
	return cstring_to_text(GetUserNameFromId(owner, false));
}

/* catalog_invalidate()'s, which catalog_resolve() registers */
static void
shard_writers_invalidate(Oid relid)
{
	ShardWriter *sw;

	if (shard_writers == NULL)
		return;
	if (OidIsValid(relid))
	{
		sw = hash_search(shard_writers, &relid, HASH_FIND, NULL);
		if (sw != NULL)
			sw->invalidations++;
	}
	else
	{
		HASH_SEQ_STATUS status;

		hash_seq_init(&status, shard_writers);
		while ((sw = hash_seq_search(&status)) != NULL)
			sw->invalidations++;
	}
}

static void
shard_damaged(Relation rel)
{
	catalog_damaged(RelationGetRelationName(rel),
					"A shard of idem.citus_keys must have the columns and the primary key (tenant, owner, key) that idem_citus_colocate() made.");
}

/* The shard's shape checked, its primary key and the tenant's equality. */
static void
build_shard_probe(ShardWriter *sw, Relation rel)
{
	uint64		invalidations = sw->invalidations;
	TupleDesc	desc = RelationGetDescr(rel);
	Relation	idx;
	Oid			eqop;

	/* as catalog_table(): columns dropped after idem's are written null */
	if (desc->natts < Natts_tenant_keys)
		shard_damaged(rel);
	for (int i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (i >= Natts_tenant_keys ? !att->attisdropped :
			(att->attisdropped ||
			 strcmp(NameStr(att->attname), tenant_keys_shape[i].name) != 0 ||
			 (OidIsValid(tenant_keys_shape[i].type) &&
			  att->atttypid != tenant_keys_shape[i].type)))
			shard_damaged(rel);
	}
	/* the index list sets rd_pkindex */
	list_free(RelationGetIndexList(rel));
	sw->pkey = rel->rd_pkindex;
	if (!OidIsValid(sw->pkey))
		shard_damaged(rel);
	idx = index_open(sw->pkey, AccessShareLock);
	if (idx->rd_index->indnkeyatts != 3 ||
		idx->rd_index->indkey.values[0] != 1 ||
		idx->rd_index->indkey.values[1] != 2 ||
		idx->rd_index->indkey.values[2] != 3 ||
		idx->rd_rel->relam != BTREE_AM_OID)
		shard_damaged(rel);
	eqop = get_opfamily_member(idx->rd_opfamily[0], idx->rd_opcintype[0],
							   idx->rd_opcintype[0], BTEqualStrategyNumber);
	if (!OidIsValid(eqop))
		elog(ERROR, "no equality operator for the tenant of \"%s\"",
			 RelationGetRelationName(rel));
	sw->tenant_eq = get_opcode(eqop);
	sw->tenant_collation = idx->rd_indcollation[0];
	sw->owner_collation = idx->rd_indcollation[1];
	sw->key_collation = idx->rd_indcollation[2];
	index_close(idx, AccessShareLock);
	sw->probe_built = invalidations;
}

/*
 * What reading rel, a tenant's shard of idem.citus_keys, needs; with
 * write, what writing it needs too.  Each part counts as built for the
 * invalidations of rel counted before it was built: one that arrives
 * meanwhile, or an error, makes the next call build it again.  Without
 * keys, rel is a shard of idem.citus_outbox, whose writer alone is kept
 * here (outbox.c reads it itself).
 */
static ShardWriter *
shard_writer(Relation rel, bool write, bool keys)
{
	Oid			relid = RelationGetRelid(rel);
	ShardWriter *sw;
	bool		found;

	catalog_resolve();
	if (shard_writers != NULL &&
		hash_get_num_entries(shard_writers) >= MAX_SHARD_WRITERS &&
		hash_search(shard_writers, &relid, HASH_FIND, NULL) == NULL)
	{
		HASH_SEQ_STATUS status;

		hash_seq_init(&status, shard_writers);
		while ((sw = hash_seq_search(&status)) != NULL)
			if (sw->tw.cxt != NULL)
				MemoryContextDelete(sw->tw.cxt);
		hash_destroy(shard_writers);
		shard_writers = NULL;
	}
	if (shard_writers == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(ShardWriter);
		ctl.hcxt = TopMemoryContext;
		shard_writers = hash_create("idem tenant shard writers", 16, &ctl,
									HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	sw = hash_search(shard_writers, &relid, HASH_ENTER, &found);
	if (!found)
	{
		memset(&sw->tw, 0, sizeof(sw->tw));
		sw->invalidations = 1;
		sw->probe_built = 0;
		sw->writer_built = 0;
	}
	if (keys && sw->probe_built != sw->invalidations)
		build_shard_probe(sw, rel);
	if (write && sw->writer_built != sw->invalidations)
	{
		uint64		invalidations = sw->invalidations;

		build_writer(&sw->tw, rel);
		sw->writer_built = invalidations;
	}
	return sw;
}

/*
 * idem_lookup_tenant_key
 *		Find the record of (tenant, owner, key) in the shard relation relid:
 *		as idem_lookup_key() finds one in idem.keys (the caller holds the
 *		key's lock), or with as_of_snapshot as the active snapshot sees it
 *		(a reader's), like a query of the table would.
 */
bool
idem_lookup_tenant_key(Oid relid, Datum tenant, Oid owner, const char *key,
					   int keylen, bool as_of_snapshot, IdemRecord *rec)
{
	Relation	rel = table_open(relid, AccessShareLock);
	ShardWriter *sw = shard_writer(rel, false, true);
	Relation	idx = index_open(sw->pkey, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	text	   *keytext = cstring_to_text_with_len(key, keylen);
	text	   *ownertext = idem_tenant_owner(owner);
	Snapshot	xact_snapshot = !as_of_snapshot && IsolationUsesXactSnapshot() ?
		GetTransactionSnapshot() : NULL;
	ScanKeyData skey[3];
	IndexScanDesc scan;
	bool		found;

	ScanKeyEntryInitialize(&skey[0], 0, 1, BTEqualStrategyNumber, InvalidOid,
						   sw->tenant_collation, sw->tenant_eq, tenant);
	ScanKeyEntryInitialize(&skey[1], 0, 2, BTEqualStrategyNumber, InvalidOid,
						   sw->owner_collation, F_TEXTEQ,
						   PointerGetDatum(ownertext));
	ScanKeyEntryInitialize(&skey[2], 0, 3, BTEqualStrategyNumber, InvalidOid,
						   sw->key_collation, F_TEXTEQ,
						   PointerGetDatum(keytext));
	scan = index_beginscan(rel, idx,
						   as_of_snapshot ? GetActiveSnapshot() : SnapshotSelf,
						   NULL, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	if (found)
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);

		memset(rec, 0, sizeof(*rec));
		if (!record_from_slot(slot, tuple, &tenant_record_columns, rec))
			ereport(ERROR,
					(errcode(ERRCODE_DATA_CORRUPTED),
					 errmsg("key record \"%s\" in idem.citus_keys has a fingerprint of the wrong length",
							key),
					 idem_errhint(ERRCODE_DATA_CORRUPTED, NULL)));
		rec->visible = as_of_snapshot ||
			visible_to_xact(rel, slot, rec->xmin, xact_snapshot);
		if (should_free)
			heap_freetuple(tuple);
	}
	close_probe(slot, idx, rel, keytext);
	pfree(ownertext);
	return found;
}

/*
 * idem_delete_tenant_key
 *		Remove an expired record that idem_lookup_tenant_key() found in
 *		the shard relation relid.
 */
void
idem_delete_tenant_key(Oid relid, IdemRecord *rec)
{
	Relation	rel = table_open(relid, RowExclusiveLock);

	delete_row(rel, &rec->tid);
	table_close(rel, RowExclusiveLock);
	CommandCounterIncrement();
}

/*
 * idem_insert_tenant_key
 *		Write the record of (tenant, owner, key) into the shard relation
 *		relid, as insert_row() writes idem's own tables.  Caller holds the
 *		key's lock.
 */
void
idem_insert_tenant_key(Oid relid, Datum tenant, Oid owner, const char *key,
					   int keylen, const uint8 *fingerprint, Jsonb *response,
					   TimestampTz created_at, TimestampTz expires_at)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	ShardWriter *sw = shard_writer(rel, true, true);
	Datum		values[Natts_tenant_keys];
	bool		nulls[Natts_tenant_keys] = {0};
	bytea	   *fp = palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);
	HeapTuple	tuple;

	SET_VARSIZE(fp, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	memcpy(VARDATA(fp), fingerprint, IDEM_FINGERPRINT_LEN);
	values[0] = tenant;
	values[1] = PointerGetDatum(idem_tenant_owner(owner));
	values[2] = PointerGetDatum(cstring_to_text_with_len(key, keylen));
	values[3] = PointerGetDatum(fp);
	values[4] = Int16GetDatum(IDEM_FINGERPRINT_VERSION);
	values[5] = JsonbPGetDatum(response);
	values[6] = TimestampTzGetDatum(created_at);
	values[7] = TimestampTzGetDatum(expires_at);
	tuple = idem_form_row(rel, values, nulls, Natts_tenant_keys);
	check_row(&sw->tw, rel, tuple);
	store_row(&sw->tw, rel, tuple);
}

/*
 * idem_restamp_key
 *		Move the expiry of a record this transaction wrote.
 *
 * Returns false if the transaction has no live record for the key (a
 * rolled-back savepoint took it).
 */
bool
idem_restamp_key(Oid owner, const char *key, TimestampTz expires_at)
{
	Relation	rel;
	Relation	idx;
	TupleTableSlot *slot;
	text	   *keytext = cstring_to_text(key);
	bool		done = false;

	catalog_resolve();
	rel = table_open(catalog.keys, RowExclusiveLock);
	idx = index_open(catalog.keys_pkey, AccessShareLock);
	slot = table_slot_create(rel, NULL);

	if (probe_key(rel, idx, slot, owner, keytext))
	{
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);

		if (TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(tuple->t_data)))
		{
			int			col = Anum_keys_expires_at;
			Datum		value = TimestampTzGetDatum(expires_at);
			bool		isnull = false;
			HeapTuple	newtup;

			newtup = heap_modify_tuple_by_cols(tuple, RelationGetDescr(rel),
											   1, &col, &value, &isnull);
			update_row(WRITE_KEYS, rel, &tuple->t_self, newtup);
			heap_freetuple(newtup);
			done = true;
		}
		if (should_free)
			heap_freetuple(tuple);
	}

	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	table_close(rel, RowExclusiveLock);
	if (done)
		CommandCounterIncrement();
	pfree(keytext);
	return done;
}

/*
 * idem_catalog_outbox
 *		The OID of idem.outbox, checked.
 */
Oid
idem_catalog_outbox(void)
{
	catalog_resolve();
	return catalog.outbox;
}

/*
 * idem_catalog_outbox_indexes
 *		The OID of idem.outbox and those of its primary key, its due index
 *		and its index of runs' undelivered events, checked.
 */
Oid
idem_catalog_outbox_indexes(Oid *pkey, Oid *due, Oid *run)
{
	catalog_resolve();
	*pkey = catalog.outbox_pkey;
	*due = catalog.outbox_due;
	*run = catalog.outbox_run;
	return catalog.outbox;
}

/*
 * idem_catalog_secret
 *		The database's secret (idem.lock_seed), which no ordinary role can
 *		read: it keys what must not be guessable from names alone.
 */
uint64
idem_catalog_secret(void)
{
	catalog_resolve();
	return catalog.lock_seed;
}

/*
 * idem_catalog_outbox_topics
 *		The OIDs of idem.outbox_topics and its primary key, checked.
 */
Oid
idem_catalog_outbox_topics(Oid *pkey)
{
	catalog_resolve();
	*pkey = catalog.outbox_topics_pkey;
	return catalog.outbox_topics;
}

/*
 * idem_catalog_queues
 *		The OIDs of idem.queues and its primary key, checked.
 */
Oid
idem_catalog_queues(Oid *pkey)
{
	catalog_resolve();
	*pkey = catalog.queues_pkey;
	return catalog.queues;
}

/*
 * idem_registry_probe
 *		Find name's row in a registry of idem's (idem.outbox_topics,
 *		idem.queues: relid, probed through its primary key pkey on the
 *		name), and if there is one, hand it to read() with arg; returns
 *		whether there was.  SnapshotSelf, as the key records' lookups.
 */
bool
idem_registry_probe(Oid relid, Oid pkey, const char *name,
					IdemRegistryReadFn read, void *arg)
{
	Relation	rel = table_open(relid, AccessShareLock);
	Relation	idx = index_open(pkey, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	IndexScanDesc scan;
	ScanKeyData skey;
	text	   *nametext = cstring_to_text(name);
	bool		found;

	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_TEXTEQ,
				PointerGetDatum(nametext));
	scan = index_beginscan(rel, idx, SnapshotSelf, NULL, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	if (found)
		read(slot, arg);
	index_endscan(scan);
	close_probe(slot, idx, rel, nametext);
	return found;
}

/* idem's trigger functions, called some other way (from C) */
static void
require_trigger_call(FunctionCallInfo fcinfo)
{
	if (!CALLED_AS_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("%s() must be called as a trigger",
						get_func_name(fcinfo->flinfo->fn_oid)),
				 idem_errhint(ERRCODE_E_R_I_E_TRIGGER_PROTOCOL_VIOLATED, NULL)));
}

/*
 * idem_registry_changed()
 *		Statement trigger on idem's registries (idem.outbox_topics,
 *		idem.queues): whatever wrote one (idem's functions, or a
 *		superuser's own DML), its relcache entry is invalidated, which moves
 *		idem_catalog_generation() on in every backend once the change
 *		commits, and at once in the writing transaction.  Backends keep
 *		what they read from a registry until then.
 */
Datum
idem_registry_changed(PG_FUNCTION_ARGS)
{
	require_trigger_call(fcinfo);
	CacheInvalidateRelcache(((TriggerData *) fcinfo->context)->tg_relation);
	return PointerGetDatum(NULL);
}

/*
 * idem_lock_seed_local()
 *		Row trigger before an insert into idem.lock_seed, enabled for
 *		replica sessions only: a logical replication subscriber's table sync
 *		and apply worker would copy the publisher's secret next to the one
 *		this database's CREATE EXTENSION drew, and a second row stops every
 *		call (catalog_lock_seed).  The secret only has to be the same in
 *		every backend of one server, so each keeps its own.
 */
Datum
idem_lock_seed_local(PG_FUNCTION_ARGS)
{
	require_trigger_call(fcinfo);
	return PointerGetDatum(NULL);
}

/*
 * Delete up to limit records that an index scan with skey finds.  A record
 * whose key is locked by a running call is skipped: that call owns it.
 *
 * Each key's lock is released as soon as its row is deleted, before this
 * transaction commits.  Held to commit, the locks of one batch
 * (idem.purge_batch_size keys, 10,000 by default) would exhaust the
 * shared lock table, sized by max_locks_per_transaction; released, a purge
 * of any size holds at most one advisory lock.  The key's lock is not what
 * protects the record here: the row is.  The interleaving this allows:
 *
 *	purge P: lock K, delete its expired record R (uncommitted), unlock K
 *	caller C: lock K, look R up
 *	P: commit or abort
 *
 * C's lookup uses SnapshotSelf, which still sees R while P's delete is
 * uncommitted.  R expired before P's transaction began, so a call that
 * began after that finds R expired and deletes it itself: heap_delete
 * waits for P; if P commits, delete_row() tolerates the row already gone,
 * and if P aborts, C's own delete goes through.  Either way C then
 * executes once and inserts the key's only record (the unique index no
 * longer sees R).  A call that began before P's transaction may still
 * count R as live, and replays it: what it would have done had it come
 * first.  test/specs/purge_race.spec runs these orders.
 */
static int64
purge_scan(Relation rel, Oid indexoid, ScanKey skey, int64 limit)
{
	Relation	idx = index_open(indexoid, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	IndexScanDesc scan = index_beginscan(rel, idx, SnapshotSelf, NULL, 1, 0);
	int64		deleted = 0;

	index_rescan(scan, skey, 1, NULL, 0);
	while (deleted < limit &&
		   index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Oid			owner;
		char	   *key;
		int			keylen;

		CHECK_FOR_INTERRUPTS();

		owner = DatumGetObjectId(slot_getattr(slot, Anum_keys_owner, &isnull));
		key = TextDatumGetCString(slot_getattr(slot, Anum_keys_key, &isnull));
		keylen = strlen(key);

		/*
		 * Releasing drops only this acquisition: if an earlier call in this
		 * transaction holds the key, its hold stays.
		 */
		if (try_lock_key(owner, key, keylen))
		{
			if (delete_row(rel, &slot->tts_tid))
				deleted++;
			unlock_key(owner, key, keylen);
		}
		pfree(key);
	}

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	return deleted;
}

/*
 * The smallest owner in rel above after, or InvalidOid: one step of a
 * loose scan of the index indexid, whose first column is the owner
 * (column owner_att of rel).
 */
static Oid
next_owner(Relation rel, Oid indexid, AttrNumber owner_att, Oid after)
{
	Relation	idx = index_open(indexid, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	IndexScanDesc scan = index_beginscan(rel, idx, SnapshotSelf, NULL, 1, 0);
	ScanKeyData skey;
	Oid			owner = InvalidOid;

	ScanKeyInit(&skey, 1, BTGreaterStrategyNumber, F_OIDGT,
				ObjectIdGetDatum(after));
	index_rescan(scan, &skey, 1, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;

		owner = DatumGetObjectId(slot_getattr(slot, owner_att, &isnull));
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	return owner;
}

/*
 * idem_purge_expired
 *		Delete up to batch_size expired key records, and records whose
 *		owner role no longer exists; return how many.
 *
 * A dropped role's records block no other role (keys are per role), but
 * they would be served to a new role that got the same OID.
 */
int64
idem_purge_expired(int batch_size)
{
	Relation	rel;
	ScanKeyData skey;
	int64		deleted;
	Oid			owner = InvalidOid;
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	catalog_resolve();

	rel = table_open(catalog.keys, RowExclusiveLock);
	ScanKeyInit(&skey, 1, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(now));
	deleted = purge_scan(rel, catalog.keys_expires, &skey, batch_size);

	while (deleted < batch_size &&
		   OidIsValid(owner = next_owner(rel, catalog.keys_pkey,
												  Anum_keys_owner, owner)))
	{
		if (SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(owner)))
			continue;
		ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_OIDEQ,
					ObjectIdGetDatum(owner));
		deleted += purge_scan(rel, catalog.keys_pkey, &skey,
							  batch_size - deleted);
	}

	table_close(rel, RowExclusiveLock);
	CommandCounterIncrement();
	idem_stats_count(IDEM_STAT_PURGED_KEYS, deleted);
	return deleted;
}

/*
 * idem_runs_of_dropped_roles
 *		Whether idem.runs holds a run of a role that no longer exists: one
 *		probe of the primary key per role that has runs.
 */
bool
idem_runs_of_dropped_roles(void)
{
	Relation	rel;
	Oid			owner = InvalidOid;
	bool		found = false;

	catalog_resolve();
	rel = table_open(catalog.runs, AccessShareLock);
	while (!found &&
		   OidIsValid(owner = next_owner(rel, catalog.runs_pkey,
										 Anum_runs_owner, owner)))
		found = !SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(owner));
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * The transaction other than this one whose update or delete of the run's
 * row version in p replaced it, if it is still in progress or committed
 * since the version was read; InvalidTransactionId if none did, or it
 * aborted.  A row lock (FOR UPDATE, a claim's scan) replaces nothing.
 */
static TransactionId
run_replaced_by(RowProbe *p)
{
	HeapTupleHeader tup = p->tuple->t_data;
	Buffer		buf = InvalidBuffer;
	TransactionId xmax = InvalidTransactionId;

	if (TTS_IS_BUFFERTUPLE(p->slot))
		buf = ((BufferHeapTupleTableSlot *) p->slot)->buffer;
	if (BufferIsValid(buf))
		LockBuffer(buf, BUFFER_LOCK_SHARE);
	if (!(tup->t_infomask & HEAP_XMAX_INVALID) &&
		!HEAP_XMAX_IS_LOCKED_ONLY(tup->t_infomask))
		xmax = HeapTupleHeaderGetUpdateXid(tup);
	if (BufferIsValid(buf))
		LockBuffer(buf, BUFFER_LOCK_UNLOCK);
	if (!TransactionIdIsValid(xmax) || TransactionIdIsCurrentTransactionId(xmax))
		return InvalidTransactionId;
	if (TransactionIdIsInProgress(xmax) || TransactionIdDidCommit(xmax))
		return xmax;
	return InvalidTransactionId;
}

static bool lookup_run(Oid owner, const char *run_id, ItemPointer tid,
					   IdemRunRow *row, TransactionId *replaced_by);

/*
 * idem_lookup_run
 *		Find the run (owner, run_id), the latest committed version or this
 *		transaction's own, as idem_lookup_key() finds keys.  Caller only
 *		reads.
 *
 * Fills row, with copies in the current memory context, and returns true
 * if the run exists.
 */
bool
idem_lookup_run(Oid owner, const char *run_id, IdemRunRow *row)
{
	return lookup_run(owner, run_id, NULL, row, NULL);
}

/*
 * idem_lock_and_lookup_run
 *		Take the run's lock, its key lockkey, waiting or not as
 *		idem_lock_key() does, and find the run's latest version, as the
 *		caller may act on it.
 *
 * Whoever changes a run holds its lock until its transaction ends, but
 * idem_queue_drop() and idem_run_claim(), which give back each run's lock
 * once they have written the run (cancelled; leased or failed), so that
 * they take no slot of the shared lock table per run.  A run whose version
 * another transaction replaced and has not yet committed is waited for as
 * its lock would be, without holding the lock meanwhile (the writer may
 * come back for it), and read again.
 */
bool
idem_lock_and_lookup_run(Oid owner, const char *run_id, const char *lockkey,
						 bool wait, IdemRunRow *row)
{
	int			keylen = strlen(lockkey);

	for (;;)
	{
		TransactionId writer;

		idem_lock_key(owner, lockkey, keylen, wait);
		if (!lookup_run(owner, run_id, NULL, row, &writer))
			return false;
		if (!TransactionIdIsValid(writer))
			return true;
		unlock_key(owner, lockkey, keylen);
		if (!TransactionIdIsInProgress(writer))
			continue;
		if (!wait)
			report_key_in_use(lockkey);
		counted_wait(NULL, writer);
	}
}

/*
 * idem_lookup_run_at
 *		idem_lookup_run(), for a claim that found the run in an index scan
 *		at tid and took the run's lock: the version there is read without a
 *		second index lookup if it is still the latest.  False also when
 *		another transaction replaced the version and has not committed
 *		(a drop, another claim): the run is passed over, as one whose lock
 *		another transaction holds.
 */
bool
idem_lookup_run_at(Oid owner, const char *run_id, ItemPointer tid,
				   IdemRunRow *row)
{
	TransactionId writer;

	return lookup_run(owner, run_id, tid, row, &writer) &&
		!TransactionIdIsValid(writer);
}

/*
 * idem_run_replaced
 *		Whether another transaction replaced the run's latest version and
 *		has not committed (or committed since it was read), for
 *		idem_run_try_lock(): a run idem_queue_drop() cancelled or a claim
 *		failed gave its lock back, and is still theirs.
 */
bool
idem_run_replaced(Oid owner, const char *run_id)
{
	RowProbe	p;
	bool		replaced = false;

	if (probe_row_begin(&p, true, owner, run_id, NULL))
		replaced = TransactionIdIsValid(run_replaced_by(&p));
	probe_row_end(&p);
	return replaced;
}

/*
 * Fill row from the run (owner, run_id), read at tid if that is still its
 * latest version; with replaced_by, also say which transaction replaced
 * the version read (run_replaced_by()).
 */
static bool
lookup_run(Oid owner, const char *run_id, ItemPointer tid, IdemRunRow *row,
		   TransactionId *replaced_by)
{
	RowProbe	p;
	bool		found = probe_row_begin(&p, true, owner, run_id, tid);

	if (found && replaced_by != NULL)
		*replaced_by = run_replaced_by(&p);
	if (found)
	{
		TupleTableSlot *slot = p.slot;
		bool		isnull;
		Datum		d;

		row->owner = owner;
		row->run_id = pstrdup(run_id);
		row->tid = p.tuple->t_self;
		d = slot_getattr(slot, Anum_runs_steps, &isnull);
		row->steps = isnull ? NULL : DatumGetArrayTypePCopy(d);
		d = slot_getattr(slot, Anum_runs_input, &isnull);
		row->input = isnull ? NULL : DatumGetJsonbPCopy(d);
		row->status = TextDatumGetCString(slot_getattr(slot, Anum_runs_status, &isnull));
		row->started_at = DatumGetTimestampTz(slot_getattr(slot, Anum_runs_started_at, &isnull));
		d = slot_getattr(slot, Anum_runs_finished_at, &isnull);
		row->finished = !isnull;
		row->finished_at = isnull ? 0 : DatumGetTimestampTz(d);
		d = slot_getattr(slot, Anum_runs_last_error, &isnull);
		row->last_error = isnull ? NULL : TextDatumGetCString(d);
		row->done_steps = DatumGetArrayTypePCopy(slot_getattr(slot, Anum_runs_done_steps, &isnull));
		row->attempts = DatumGetArrayTypePCopy(slot_getattr(slot, Anum_runs_attempts, &isnull));
		d = slot_getattr(slot, Anum_runs_queue, &isnull);
		row->queue = isnull ? NULL : TextDatumGetCString(d);
		d = slot_getattr(slot, Anum_runs_queue_state, &isnull);
		row->queue_state = isnull ? NULL : TextDatumGetCString(d);
		d = slot_getattr(slot, Anum_runs_due_at, &isnull);
		row->due_at = isnull ? DT_NOEND : DatumGetTimestampTz(d);
		row->attempt = DatumGetInt32(slot_getattr(slot, Anum_runs_attempt, &isnull));
		row->claims = DatumGetInt32(slot_getattr(slot, Anum_runs_claims, &isnull));
		d = slot_getattr(slot, Anum_runs_lease_token, &isnull);
		row->has_token = !isnull;
		if (!isnull)
			memcpy(&row->lease_token, DatumGetUUIDP(d), UUID_LEN);
		d = slot_getattr(slot, Anum_runs_leased_by, &isnull);
		row->leased_by = isnull ? InvalidOid : DatumGetObjectId(d);
		d = slot_getattr(slot, Anum_runs_lease_holder, &isnull);
		row->lease_holder = isnull ? NULL : TextDatumGetCString(d);
		d = slot_getattr(slot, Anum_runs_awaiting, &isnull);
		row->awaiting = isnull ? NULL : TextDatumGetCString(d);
		d = slot_getattr(slot, Anum_runs_wait_until, &isnull);
		row->wait_until = isnull ? DT_NOEND : DatumGetTimestampTz(d);
		d = slot_getattr(slot, Anum_runs_started_step, &isnull);
		row->started_step = isnull ? NULL : TextDatumGetCString(d);
		row->started_count = DatumGetInt32(slot_getattr(slot, Anum_runs_started_count, &isnull));
		d = slot_getattr(slot, Anum_runs_max_attempts, &isnull);
		row->max_attempts = isnull ? 0 : DatumGetInt32(d);
		d = slot_getattr(slot, Anum_runs_backoff_base, &isnull);
		row->backoff_base = isnull ? NULL : DatumGetIntervalP(datumCopy(d, false, sizeof(Interval)));
		d = slot_getattr(slot, Anum_runs_backoff_cap, &isnull);
		row->backoff_cap = isnull ? NULL : DatumGetIntervalP(datumCopy(d, false, sizeof(Interval)));
		d = slot_getattr(slot, Anum_runs_jitter, &isnull);
		row->jitter = isnull ? NULL : TextDatumGetCString(d);
		row->visible = probe_row_visible(&p);
	}
	probe_row_end(&p);
	if (found)
		idem_check_run_lists(row, "idem.runs");
	return found;
}

/* Why a step list is not one dimension from subscript 1 without nulls, or NULL. */
static const char *
malformed_list(ArrayType *arr)
{
	if (ARR_NDIM(arr) == 0)
		return NULL;
	if (ARR_NDIM(arr) > 1)
		return "has more than one dimension";
	if (ARR_LBOUND(arr)[0] != 1)
		return "does not start at subscript 1";
	if (array_contains_nulls(arr))
		return "has a null element";
	return NULL;
}

/*
 * idem_check_run_lists
 *		XX001 unless a run's step lists (steps, done_steps, attempts) are
 *		what the run's functions write: one dimension from subscript 1,
 *		without nulls.  The code indexes them by a step's ordinal, and a row
 *		changed by hand into another shape would be read past its end.  An
 *		attempt count missing for a completed step reads as 0 (run.c).
 */
void
idem_check_run_lists(const IdemRunRow *row, const char *table)
{
	const char *column = NULL;
	const char *why = NULL;

	if (row->steps != NULL && (why = malformed_list(row->steps)) != NULL)
		column = "steps";
	else if ((why = malformed_list(row->done_steps)) != NULL)
		column = "done_steps";
	else if ((why = malformed_list(row->attempts)) != NULL)
		column = "attempts";
	if (column != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("run \"%s\" in %s has malformed step lists",
						row->run_id, table),
				 errdetail("Its column %s %s.", column, why),
				 idem_errhint(ERRCODE_DATA_CORRUPTED, NULL)));
}

/*
 * A scan of a queue's entries in runs_owner_due_idx, the claim's partial
 * index of unfinished queued runs (queue, owner, due_at).
 *
 * No plan: the index's own order is the claim's, so there is none that a
 * backend made while idem.runs was empty (a sequential scan and a sort)
 * and kept.  SnapshotSelf, as the lookups: a run another claim leased and
 * committed is no longer due, and a claim re-reads each run under its
 * lock before leasing it.
 */
typedef struct DueScan
{
	IndexScanDesc scan;
	TupleTableSlot *slot;
	text	   *queue;
} DueScan;

/*
 * Start a scan at the head of the queue's entries or, with above_owner
 * valid, at those of the roles after it, in rel through idx, which the
 * caller opened and closes after due_scan_end().
 */
static void
due_scan_begin(DueScan *ds, const char *queue, Relation rel, Relation idx,
			   Oid above_owner)
{
	ScanKeyData skey[2];
	int			nkeys = OidIsValid(above_owner) ? 2 : 1;

	ds->queue = cstring_to_text(queue);
	ds->slot = table_slot_create(rel, NULL);
	ds->scan = index_beginscan(rel, idx, SnapshotSelf, NULL, nkeys, 0);
	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_TEXTEQ,
				PointerGetDatum(ds->queue));
	ScanKeyInit(&skey[1], 2, BTGreaterStrategyNumber, F_OIDGT,
				ObjectIdGetDatum(above_owner));
	index_rescan(ds->scan, skey, nkeys, NULL, 0);
}

static void
due_scan_end(DueScan *ds)
{
	index_endscan(ds->scan);
	ExecDropSingleTupleTableSlot(ds->slot);
	pfree(ds->queue);
}

/*
 * idem_scan_due_runs
 *		If the unfinished runs of queue are all one role's (or there are
 *		none), offer those due by now to take(), oldest due first, until it
 *		returns false or none is left, and return true; if they are several
 *		roles', offer none and return false: the caller shares the claim
 *		among the roles.
 *
 * One scan of runs_owner_due_idx and one probe: the scan, from the lowest
 * owner on, finds that owner's runs in due order, and the probe, keyed
 * past that owner, descends straight to where another role's runs would
 * be, so a queue of one role (the common case) pays next to nothing for
 * the share among roles (a probe of the queue's last entries would read
 * their whole leaf page, the dead leases of finished runs included).
 * take() may update the run it is offered (a lease moves due_at past now,
 * behind this scan).
 */
bool
idem_scan_due_runs(const char *queue, TimestampTz now, IdemDueRunFn take,
				   void *arg)
{
	Relation	rel;
	Relation	idx;
	DueScan		ds;
	Oid			lowest;
	bool		isnull;
	bool		one_role = true;

	catalog_resolve();
	rel = table_open(catalog.runs, AccessShareLock);
	idx = index_open(catalog.runs_owner_due, AccessShareLock);
	due_scan_begin(&ds, queue, rel, idx, InvalidOid);
	if (index_getnext_slot(ds.scan, ForwardScanDirection, ds.slot))
	{
		DueScan		others;

		lowest = DatumGetObjectId(slot_getattr(ds.slot, Anum_runs_owner, &isnull));
		due_scan_begin(&others, queue, rel, idx, lowest);
		one_role = !index_getnext_slot(others.scan, ForwardScanDirection,
									   others.slot);
		due_scan_end(&others);
	}
	else
		lowest = InvalidOid;	/* no run */

	while (one_role && OidIsValid(lowest))
	{
		Datum		due;
		char	   *run_id;
		bool		more;

		CHECK_FOR_INTERRUPTS();
		/* another role's run, enqueued since the probe: the next claim's */
		if (DatumGetObjectId(slot_getattr(ds.slot, Anum_runs_owner, &isnull)) != lowest)
			break;
		/* due_at sorts nulls (a wait for a signal alone) last */
		due = slot_getattr(ds.slot, Anum_runs_due_at, &isnull);
		if (isnull || DatumGetTimestampTz(due) > now)
			break;
		run_id = TextDatumGetCString(slot_getattr(ds.slot, Anum_runs_run_id, &isnull));
		more = take(lowest, run_id, &ds.slot->tts_tid, arg);
		pfree(run_id);
		if (!more ||
			!index_getnext_slot(ds.scan, ForwardScanDirection, ds.slot))
			break;
	}
	due_scan_end(&ds);
	index_close(idx, AccessShareLock);
	table_close(rel, AccessShareLock);
	return one_role;
}

static void
run_values(IdemRunRow *row, Datum *values, bool *nulls)
{
	values[Anum_runs_run_id - 1] = CStringGetTextDatum(row->run_id);
	values[Anum_runs_owner - 1] = ObjectIdGetDatum(row->owner);
	nulls[Anum_runs_steps - 1] = row->steps == NULL;
	values[Anum_runs_steps - 1] = PointerGetDatum(row->steps);
	nulls[Anum_runs_input - 1] = row->input == NULL;
	values[Anum_runs_input - 1] = PointerGetDatum(row->input);
	values[Anum_runs_status - 1] = CStringGetTextDatum(row->status);
	values[Anum_runs_started_at - 1] = TimestampTzGetDatum(row->started_at);
	nulls[Anum_runs_finished_at - 1] = !row->finished;
	values[Anum_runs_finished_at - 1] = TimestampTzGetDatum(row->finished_at);
	nulls[Anum_runs_last_error - 1] = row->last_error == NULL;
	values[Anum_runs_last_error - 1] =
		row->last_error ? CStringGetTextDatum(row->last_error) : (Datum) 0;
	values[Anum_runs_done_steps - 1] = PointerGetDatum(row->done_steps);
	values[Anum_runs_attempts - 1] = PointerGetDatum(row->attempts);
	nulls[Anum_runs_queue - 1] = row->queue == NULL;
	values[Anum_runs_queue - 1] =
		row->queue ? CStringGetTextDatum(row->queue) : (Datum) 0;
	nulls[Anum_runs_queue_state - 1] = row->queue_state == NULL;
	values[Anum_runs_queue_state - 1] =
		row->queue_state ? CStringGetTextDatum(row->queue_state) : (Datum) 0;
	nulls[Anum_runs_due_at - 1] = TIMESTAMP_IS_NOEND(row->due_at);
	values[Anum_runs_due_at - 1] = TimestampTzGetDatum(row->due_at);
	values[Anum_runs_attempt - 1] = Int32GetDatum(row->attempt);
	values[Anum_runs_claims - 1] = Int32GetDatum(row->claims);
	nulls[Anum_runs_lease_token - 1] = !row->has_token;
	values[Anum_runs_lease_token - 1] = UUIDPGetDatum(&row->lease_token);
	nulls[Anum_runs_leased_by - 1] = !OidIsValid(row->leased_by);
	values[Anum_runs_leased_by - 1] = ObjectIdGetDatum(row->leased_by);
	nulls[Anum_runs_lease_holder - 1] = row->lease_holder == NULL;
	values[Anum_runs_lease_holder - 1] =
		row->lease_holder ? CStringGetTextDatum(row->lease_holder) : (Datum) 0;
	nulls[Anum_runs_awaiting - 1] = row->awaiting == NULL;
	values[Anum_runs_awaiting - 1] =
		row->awaiting ? CStringGetTextDatum(row->awaiting) : (Datum) 0;
	nulls[Anum_runs_wait_until - 1] = TIMESTAMP_IS_NOEND(row->wait_until);
	values[Anum_runs_wait_until - 1] = TimestampTzGetDatum(row->wait_until);
	nulls[Anum_runs_started_step - 1] = row->started_step == NULL;
	values[Anum_runs_started_step - 1] =
		row->started_step ? CStringGetTextDatum(row->started_step) : (Datum) 0;
	values[Anum_runs_started_count - 1] = Int32GetDatum(row->started_count);
	nulls[Anum_runs_max_attempts - 1] = row->max_attempts == 0;
	values[Anum_runs_max_attempts - 1] = Int32GetDatum(row->max_attempts);
	nulls[Anum_runs_backoff_base - 1] = row->backoff_base == NULL;
	values[Anum_runs_backoff_base - 1] = IntervalPGetDatum(row->backoff_base);
	nulls[Anum_runs_backoff_cap - 1] = row->backoff_cap == NULL;
	values[Anum_runs_backoff_cap - 1] = IntervalPGetDatum(row->backoff_cap);
	nulls[Anum_runs_jitter - 1] = row->jitter == NULL;
	values[Anum_runs_jitter - 1] =
		row->jitter ? CStringGetTextDatum(row->jitter) : (Datum) 0;
}

/*
 * idem_insert_run
 *		Write a new run.  Caller holds the run's lock.
 */
void
idem_insert_run(IdemRunRow *row)
{
	Datum		values[Natts_runs];
	bool		nulls[Natts_runs] = {0};

	catalog_resolve();
	run_values(row, values, nulls);
	insert_row(WRITE_RUNS, catalog.runs, values, nulls);
}

/*
 * How many runs' rows this backend wrote: a step sees whether its statement
 * wrote one.
 */
uint64		idem_run_writes = 0;

/*
 * idem_update_run
 *		Write the run's new status and progress in place of the version
 *		idem_lookup_run() found.  Caller holds the run's lock, so no other
 *		call changes the row meanwhile; the columns changed are not in
 *		idem's indexes, so the update is HOT where the page has room and no
 *		index or predicate an administrator added covers them.
 */
void
idem_update_run(IdemRunRow *row)
{
	Relation	rel;
	HeapTuple	tuple;
	Datum		values[Natts_runs];
	bool		nulls[Natts_runs] = {0};

	catalog_resolve();
	rel = table_open(catalog.runs, RowExclusiveLock);
	run_values(row, values, nulls);
	tuple = idem_form_row(rel, values, nulls, Natts_runs);
	update_row(WRITE_RUNS, rel, &row->tid, tuple);
	idem_run_writes++;
	row->tid = tuple->t_self;
	heap_freetuple(tuple);
	table_close(rel, RowExclusiveLock);
	CommandCounterIncrement();
}

/*
 * idem_insert_run_attempt
 *		Record a claim of a run: its attempt, the step it starts at, who
 *		holds it.  Caller holds the run's lock.  Written directly, as the
 *		run's row is: no plan to go stale while the table grows from empty
 *		(the foreign key's cascade from idem.runs still applies).
 */
void
idem_insert_run_attempt(Oid owner, const char *run_id, int32 claim,
						int32 attempt, const char *step, const char *worker,
						Oid leased_by, TimestampTz claimed_at)
{
	Datum		values[Natts_run_attempts];
	bool		nulls[Natts_run_attempts] = {0};

	catalog_resolve();
	values[Anum_run_attempts_owner - 1] = ObjectIdGetDatum(owner);
	values[Anum_run_attempts_run_id - 1] = CStringGetTextDatum(run_id);
	values[Anum_run_attempts_claim - 1] = Int32GetDatum(claim);
	values[Anum_run_attempts_attempt - 1] = Int32GetDatum(attempt);
	nulls[Anum_run_attempts_step - 1] = step == NULL;
	values[Anum_run_attempts_step - 1] = step ? CStringGetTextDatum(step) : (Datum) 0;
	values[Anum_run_attempts_worker - 1] = CStringGetTextDatum(worker);
	values[Anum_run_attempts_leased_by - 1] = ObjectIdGetDatum(leased_by);
	values[Anum_run_attempts_claimed_at - 1] = TimestampTzGetDatum(claimed_at);
	nulls[Anum_run_attempts_ended_at - 1] = true;
	nulls[Anum_run_attempts_outcome - 1] = true;
	nulls[Anum_run_attempts_error - 1] = true;
	insert_row(WRITE_ATTEMPTS, catalog.run_attempts, values, nulls);
}

/*
 * idem_end_run_attempt
 *		Say how the claim numbered claim of the run ended, unless it has
 *		ended already.  Caller holds the run's lock.
 */
void
idem_end_run_attempt(Oid owner, const char *run_id, int32 claim,
					 TimestampTz ended_at, const char *outcome,
					 const char *error)
{
	Relation	rel;
	Relation	idx;
	TupleTableSlot *slot;
	IndexScanDesc scan;
	ScanKeyData skey[3];
	text	   *runtext = cstring_to_text(run_id);

	catalog_resolve();
	rel = table_open(catalog.run_attempts, RowExclusiveLock);
	idx = index_open(catalog.run_attempts_pkey, AccessShareLock);
	slot = table_slot_create(rel, NULL);
	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_OIDEQ,
				ObjectIdGetDatum(owner));
	ScanKeyInit(&skey[1], 2, BTEqualStrategyNumber, F_TEXTEQ,
				PointerGetDatum(runtext));
	ScanKeyInit(&skey[2], 3, BTEqualStrategyNumber, F_INT4EQ,
				Int32GetDatum(claim));
	scan = index_beginscan(rel, idx, SnapshotSelf, NULL, 3, 0);
	index_rescan(scan, skey, 3, NULL, 0);
	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;

		(void) slot_getattr(slot, Anum_run_attempts_outcome, &isnull);
		if (isnull)
		{
			bool		should_free;
			HeapTuple	old = ExecFetchSlotHeapTuple(slot, false, &should_free);
			int			cols[3] = {Anum_run_attempts_ended_at,
			Anum_run_attempts_outcome, Anum_run_attempts_error};
			Datum		values[3];
			bool		nulls[3] = {false, false, error == NULL};
			HeapTuple	tuple;

			values[0] = TimestampTzGetDatum(ended_at);
			values[1] = CStringGetTextDatum(outcome);
			values[2] = error ? CStringGetTextDatum(error) : (Datum) 0;
			tuple = heap_modify_tuple_by_cols(old, RelationGetDescr(rel), 3,
											  cols, values, nulls);
			update_row(WRITE_ATTEMPTS, rel, &old->t_self, tuple);
			heap_freetuple(tuple);
			if (should_free)
				heap_freetuple(old);
		}
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	table_close(rel, RowExclusiveLock);
	pfree(runtext);
	CommandCounterIncrement();
}

/*
 * idem_catalog_runs
 *		idem.runs, checked like the other tables: the relation whose owner
 *		runs SQL on the runtime's tables.
 */
Oid
idem_catalog_runs(void)
{
	catalog_resolve();
	return catalog.runs;
}

/*
 * idem_audit_relid
 *		idem.audit, checked like the other tables.
 */
Oid
idem_audit_relid(void)
{
	catalog_resolve();
	return catalog.audit;
}

/*
 * idem_insert_audit_row
 *		Append one audit entry in the current transaction.
 *
 * Audited replays write nothing else, so this is their whole cost of
 * writing.  The index on at is BRIN, whose insert into a range not yet
 * summarized does almost nothing, but only with its descriptor kept
 * between inserts (in the IndexInfo's AM cache), which insert_row() does.
 */
void
idem_insert_audit_row(Datum *values, bool *nulls)
{
	catalog_resolve();
	insert_row(WRITE_AUDIT, catalog.audit, values, nulls);
}

/*
 * idem_insert_outbox_row
 *		Append one outbox event in the current transaction.
 */
void
idem_insert_outbox_row(Datum *values, bool *nulls)
{
	catalog_resolve();
	insert_row(WRITE_OUTBOX, catalog.outbox, values, nulls);
}

/*
 * The writer of rel, idem.outbox or a shard of idem.citus_outbox, with
 * tuple checked in its slot.  A shard's is kept with the shard's (one per
 * shard relation, until an invalidation of it): a node's calls and claims
 * go from shard to shard, and one writer for all would be built again at
 * every change of relation.
 */
static TableWriter *
outbox_writer(Relation rel, HeapTuple tuple)
{
	TableWriter *tw;

	catalog_resolve();
	if (RelationGetRelid(rel) == catalog.outbox)
		return writer_for_row(WRITE_OUTBOX, rel, tuple);
	tw = &shard_writer(rel, true, false)->tw;
	check_row(tw, rel, tuple);
	return tw;
}

/*
 * idem_insert_tenant_event_row
 *		Append one tenant outbox event (Natts_tenant_event columns) to
 *		relid, the tenant's shard of idem.citus_outbox on this node, which
 *		the caller found here and holds the lock that keeps it here.
 */
void
idem_insert_tenant_event_row(Oid relid, Datum *values, bool *nulls)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	HeapTuple	tuple;

	if (RelationGetDescr(rel)->natts != Natts_tenant_event)
		catalog_damaged(RelationGetRelationName(rel),
						"A shard of idem.citus_outbox must have the columns that idem_citus_colocate() made.");
	tuple = idem_form_row(rel, values, nulls, Natts_tenant_event);
	store_row(outbox_writer(rel, tuple), rel, tuple);
}

/*
 * idem_delete_outbox_row
 *		Delete the event at tid, whose tuple lock the caller holds.
 */
void
idem_delete_outbox_row(Relation rel, ItemPointer tid)
{
	if (!delete_row(rel, tid))
		elog(ERROR, "outbox event at (%u,%u) changed under its tuple lock",
			 ItemPointerGetBlockNumber(tid), ItemPointerGetOffsetNumber(tid));
}

/*
 * idem_update_outbox_row
 *		Replace the event at otid with tuple, as idem_update_run() does a
 *		run.  Caller holds the row's tuple lock and makes the new version
 *		visible.
 */
void
idem_update_outbox_row(Relation rel, ItemPointer otid, HeapTuple tuple)
{
	update_row_with(outbox_writer(rel, tuple), rel, otid, tuple);
}

/* ---------------------------------------------------------------------
 * SQL on idem's tables (the outbox's delivery, the audit trail's purge)
 * ---------------------------------------------------------------------
 */

/*
 * idem_owner_spi_begin
 *		Connect to SPI and become the owner of relid (restricted: no
 *		temporary objects, no SET ROLE), which the callers are not.
 *
 * An error before idem_owner_spi_end() leaves the transaction or
 * subtransaction abort to restore the user.
 */
void
idem_owner_spi_begin(IdemOwnerSPI *s, Oid relid)
{
	HeapTuple	tuple;
	Oid			owner;

	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	ReleaseSysCache(tuple);

	s->callercxt = CurrentMemoryContext;
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	GetUserIdAndSecContext(&s->save_userid, &s->save_sec_context);
	SetUserIdAndSecContext(owner, s->save_sec_context |
						   SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
}

void
idem_owner_spi_end(IdemOwnerSPI *s)
{
	SetUserIdAndSecContext(s->save_userid, s->save_sec_context);
	SPI_finish();
}

/*
 * idem_query_run
 *		Execute q, prepared and kept on its first use.  Inside an SPI
 *		connection.
 *
 * Planned without JIT.  idem's queries are index probes of a few rows, but
 * a generic plan estimates "LIMIT $n" at a tenth of what the scan under it
 * may return, so on a large outbox the claim's estimate crosses
 * jit_above_cost, and JIT then compiles its expressions at every
 * execution, which costs far more than the few rows the claim reads.
 * Whether a plan is compiled is decided when it is made (its jitFlags),
 * and a cached plan is made again whenever an invalidation arrives, which
 * may be while it is being revalidated for this very execution; so the
 * planner hook clears jitFlags of every plan made while one of idem's
 * queries runs (code the query runs, such as a trigger an administrator
 * put on a table, is planned as if jit were off).  Setting jit off around
 * each execution would do the same through the GUC machinery, at the price
 * of a GUC nest level per query, which before PostgreSQL 16 visits every
 * setting when it is popped.
 */
static int	own_query_depth = 0;
static planner_hook_type prev_planner_hook = NULL;

static PlannedStmt *
own_query_planner(Query *parse, const char *query_string, int cursorOptions,
				  ParamListInfo boundParams)
{
	PlannedStmt *result;

	if (prev_planner_hook)
		result = prev_planner_hook(parse, query_string, cursorOptions,
								   boundParams);
	else
		result = standard_planner(parse, query_string, cursorOptions,
								  boundParams);
	if (own_query_depth > 0)
		result->jitFlags = PGJIT_NONE;
	return result;
}

/*
 * idem_query_install
 *		Install the planner hook; called once, when the library is loaded.
 */
void
idem_query_install(void)
{
	prev_planner_hook = planner_hook;
	planner_hook = own_query_planner;
}

static int
query_run(IdemQuery *q, Datum *values, const char *nulls, long limit,
		  Snapshot snapshot)
{
	int			rc;

	own_query_depth++;
	PG_TRY();
	{
		if (q->plan == NULL)
		{
			SPIPlanPtr	plan = SPI_prepare_cursor(q->sql, q->nargs, q->argtypes,
												  q->cursor_options);

			if (plan == NULL)
				elog(ERROR, "SPI_prepare failed: %s",
					 SPI_result_code_string(SPI_result));
			if (SPI_keepplan(plan) != 0)
				elog(ERROR, "SPI_keepplan failed");
			q->plan = plan;
		}
		rc = SPI_execute_snapshot(q->plan, values, nulls, snapshot,
								  InvalidSnapshot, false, true, limit);
	}
	PG_FINALLY();
	{
		own_query_depth--;
	}
	PG_END_TRY();
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	return rc;
}

/*
 * idem_function_exists
 *		Whether a function of signature ("schema.name(types)") exists, as
 *		to_regprocedure() says; inside the caller's SPI connection, seeing
 *		what the caller's transaction did so far.
 */
bool
idem_function_exists(const char *signature)
{
	Oid			types[1] = {TEXTOID};
	Datum		values[1] = {CStringGetTextDatum(signature)};
	bool		isnull;

	if (SPI_execute_with_args("SELECT pg_catalog.to_regprocedure($1) IS NOT NULL",
							  1, types, values, NULL, false, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not look up function %s", signature);
	return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * idem_extension_schema
 *		The schema of the extension's functions, quoted for SQL; inside the
 *		caller's SPI connection, in its memory.
 */
char *
idem_extension_schema(void)
{
	if (SPI_execute("SELECT pg_catalog.quote_ident(n.nspname)"
					"  FROM pg_catalog.pg_extension e"
					"  JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
					" WHERE e.extname OPERATOR(pg_catalog.=) 'idem'", true, 1) != SPI_OK_SELECT ||
		SPI_processed != 1)
		elog(ERROR, "could not find the schema of extension \"idem\"");
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
}

int
idem_query_run(IdemQuery *q, Datum *values, const char *nulls, long limit)
{
	return query_run(q, values, nulls, limit, InvalidSnapshot);
}

/*
 * idem_query_run_latest
 *		idem_query_run() with a snapshot taken now, not the transaction's:
 *		what every transaction committed so far, at any isolation level.
 *		Only for rows that a lock the caller holds keeps from changing
 *		until it commits, so that what it read stays true.
 */
int
idem_query_run_latest(IdemQuery *q, Datum *values, const char *nulls,
					  long limit)
{
	return query_run(q, values, nulls, limit, GetLatestSnapshot());
}
