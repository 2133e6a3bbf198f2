/*-------------------------------------------------------------------------
 *
 * tenant.c
 *		Tenant calls under Citus.  idem_citus_colocate(): an administrator
 *		declares which distributed table (its colocation group) idem's
 *		tenant key records follow; it creates idem.citus_keys, distributed
 *		by a tenant column of the table's distribution type and co-located
 *		with it, and idem_citus_call() with a tenant argument of that type,
 *		which Citus delegates to the node of the tenant's shard
 *		(create_distributed_function with force_delegation).
 *		idem_citus_call(): the key record and the business write in one
 *		local transaction there; idem_citus_call_outbox() adds the call's
 *		outbox event to that transaction, in the tenant's shard of
 *		idem.citus_outbox (co-located too), from which the consumers of
 *		whichever node holds the shard deliver it (outbox/outbox.c);
 *		idem_citus_call_with() takes idem_call()'s options as arguments,
 *		which Citus carries there as it does not the session's settings.
 *		Tenant runs: idem_citus_run_begin(), idem_citus_step(),
 *		idem_citus_step_with(), idem_citus_step_complete(), the readers
 *		idem_citus_run_status() and idem_citus_run_steps() and the run verbs
 *		(fail, resume, complete, cancel), of the role's own runs or, for an
 *		administrator, another role's (owner), and idem_citus_run_purge()
 *		of finished runs: run.c's runs and steps on a store (IdemRunStore)
 *		that keeps the run in idem.citus_runs and its steps' records in
 *		idem.citus_keys, on the tenant's shards.
 *
 * The tables and the functions are made here rather than by the
 * extension's script because their types come from the distributed table.
 * Declaring the same colocation again changes nothing but to add what a
 * colocation declared by an older build lacks (tenant runs, a function, a
 * parameter) and to bring idem_citus_run_purge() up to date; another is
 * refused while idem.citus_keys or idem.citus_runs holds records (they
 * would stay on the old group's shards).
 *
 * The key record is read and written on the tenant's shard of
 * idem.citus_keys on this node, directly (an index probe and a heap
 * insert, as idem.keys is: callers have no rights on the table, and no
 * executor runs for it) once Citus's shard metadata lock is held, which
 * keeps a shard move from switching the shard to another node until the
 * call commits.  So it commits with the business write in one local
 * transaction and moves with the tenant's shard (citus_move_shard_placement,
 * the rebalancer, splits: Citus moves a colocation group's shards
 * together).  The business statement runs through Citus, pinned to the
 * tenant's distribution value (request/citus.c).
 *
 * Every other shape is refused rather than run with the key and the write
 * on different nodes: a call Citus did not delegate finds no local
 * placement of the tenant's shard (IDC02); a business statement that
 * strays from the tenant's value is refused by Citus's pin (IDC03); one for
 * which Citus still opened a transaction on another node fails the call
 * (IDC02).  Keys are per (role, tenant, key): the tenant is in the primary
 * key and in the lock.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/workflow/tenant.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "catalog/namespace.h"
#include "catalog/pg_class.h"
#include "catalog/pg_collation.h"
#include "catalog/pg_proc.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "parser/parse_func.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/regproc.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"

#include "workflow/workflow.h"

PG_FUNCTION_INFO_V1(idem_citus_colocate);
PG_FUNCTION_INFO_V1(idem_citus_call);
PG_FUNCTION_INFO_V1(idem_citus_call_outbox);
PG_FUNCTION_INFO_V1(idem_citus_call_with);
PG_FUNCTION_INFO_V1(idem_citus_run_begin);
PG_FUNCTION_INFO_V1(idem_citus_step);
PG_FUNCTION_INFO_V1(idem_citus_step_with);
PG_FUNCTION_INFO_V1(idem_citus_step_complete);
PG_FUNCTION_INFO_V1(idem_citus_run_status);
PG_FUNCTION_INFO_V1(idem_citus_run_steps);
PG_FUNCTION_INFO_V1(idem_citus_run_fail);
PG_FUNCTION_INFO_V1(idem_citus_run_resume);
PG_FUNCTION_INFO_V1(idem_citus_run_complete);
PG_FUNCTION_INFO_V1(idem_citus_run_cancel);

static void
run_sql(const char *sql, int nargs, Oid *types, Datum *values, int expect)
{
	int			rc = SPI_execute_with_args(sql, nargs, types, values, NULL,
										   false, 0);

	if (rc != expect)
		elog(ERROR, "SPI_execute_with_args failed: %s (%s)",
			 SPI_result_code_string(rc), sql);
}

/*
 * The distribution column's type, collation and colocation group of a
 * hash-distributed table; false if it is not one.
 */
static bool
distribution_of(Oid relid, Oid *type, Oid *collation, int32 *colocation)
{
	Oid			types[1] = {OIDOID};
	Datum		values[1] = {ObjectIdGetDatum(relid)};
	bool		isnull;

	run_sql("SELECT a.atttypid, p.colocationid, a.attcollation"
			" FROM pg_catalog.pg_dist_partition p"
			" JOIN pg_catalog.pg_attribute a"
			" ON a.attrelid OPERATOR(pg_catalog.=) p.logicalrelid"
			" AND a.attname OPERATOR(pg_catalog.=)"
			" pg_catalog.column_to_column_name(p.logicalrelid, p.partkey)"
			" WHERE p.logicalrelid OPERATOR(pg_catalog.=) $1"
			" AND p.partmethod OPERATOR(pg_catalog.=) 'h'",
			1, types, values, SPI_OK_SELECT);
	if (SPI_processed == 0)
		return false;
	*type = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
										   SPI_tuptable->tupdesc, 1, &isnull));
	*colocation = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 2, &isnull));
	*collation = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
												SPI_tuptable->tupdesc, 3, &isnull));
	return true;
}

/* A collation's name, schema-qualified and quoted. */
static char *
qualified_collation(Oid collation)
{
	HeapTuple	tup = SearchSysCache1(COLLOID, ObjectIdGetDatum(collation));
	Form_pg_collation coll;
	char	   *name;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for collation %u", collation);
	coll = (Form_pg_collation) GETSTRUCT(tup);
	name = quote_qualified_identifier(get_namespace_name(coll->collnamespace),
									  NameStr(coll->collname));
	ReleaseSysCache(tup);
	return name;
}

/* The library file of a C function (its pg_proc.probin). */
static char *
func_probin(Oid fn)
{
	HeapTuple	tup = SearchSysCache1(PROCOID, ObjectIdGetDatum(fn));
	bool		isnull;
	Datum		d;
	char	   *probin;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for function %u", fn);
	d = SysCacheGetAttr(PROCOID, tup, Anum_pg_proc_probin, &isnull);
	if (isnull)
		elog(ERROR, "function %u has no library", fn);
	probin = TextDatumGetCString(d);
	ReleaseSysCache(tup);
	return probin;
}

/* Whether one of idem's tables is empty. */
static bool
citus_table_empty(const char *table)
{
	run_sql(psprintf("SELECT count(*) OPERATOR(pg_catalog.=) 0"
					 " FROM (SELECT 1 FROM %s LIMIT 1) k", table),
			0, NULL, NULL, SPI_OK_SELECT);
	return DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0],
									  SPI_tuptable->tupdesc, 1, &(bool){0}));
}

static Oid
citus_runs_relid(void)
{
	return get_relname_relid("citus_runs", get_namespace_oid("idem", false));
}

static Oid
citus_outbox_relid(void)
{
	return get_relname_relid("citus_outbox", get_namespace_oid("idem", false));
}

/* What a tenant call returns, as idem_execute_ex() does. */
#define CALL_RESULT "OUT response pg_catalog.jsonb, OUT replayed boolean," \
	" OUT first_executed_at timestamptz"

/*
 * The functions idem_citus_colocate() makes, after their tenant argument:
 * a call is made with and without the statement's arguments, and Citus
 * delegates each by its tenant.  A colocation declared before one of them
 * existed, or had its present parameters, gets it when it is declared
 * again; the one it had is dropped, or a call of the old shape would match
 * both.
 */
static const struct
{
	const char *name;
	const char *params;			/* after the tenant, OUT parameters included */
	const char *args;			/* the input parameters' types, for DROP and
								 * regprocedure */
	const char *returns;
	const char *symbol;
	const char *old_args;		/* the input parameters' types it had before,
								 * or NULL */
}			citus_calls[] = {
	{"idem_citus_call", "key text, sql text, " CALL_RESULT, "text, text",
	"record", "idem_citus_call", NULL},
	{"idem_citus_call", "key text, sql text, VARIADIC args \"any\", " CALL_RESULT,
	"text, text, \"any\"", "record", "idem_citus_call", NULL},
	{"idem_citus_call_outbox", "outbox_topic text, key text, sql text, " CALL_RESULT,
	"text, text, text", "record", "idem_citus_call_outbox", NULL},
	{"idem_citus_call_outbox",
		"outbox_topic text, key text, sql text, VARIADIC args \"any\", " CALL_RESULT,
	"text, text, text, \"any\"", "record", "idem_citus_call_outbox", NULL},
	{"idem_citus_call_with",
		"key text, sql text, args text[] DEFAULT '{}', outbox_topic text DEFAULT NULL,"
		" ttl interval DEFAULT NULL, wait boolean DEFAULT NULL, " CALL_RESULT,
	"text, text, text[], text, interval, boolean", "record",
	"idem_citus_call_with", NULL},
	{"idem_citus_run_begin",
		"run_id text, steps text[] DEFAULT NULL, input pg_catalog.jsonb DEFAULT NULL,"
		" OUT status text, OUT next_step text, OUT created boolean,"
		" OUT started_at timestamptz",
	"text, text[], pg_catalog.jsonb", "record", "idem_citus_run_begin", NULL},
	{"idem_citus_step", "run_id text, step text, sql text, " CALL_RESULT,
	"text, text, text", "record", "idem_citus_step", NULL},
	{"idem_citus_step",
		"run_id text, step text, sql text, VARIADIC args \"any\", " CALL_RESULT,
	"text, text, text, \"any\"", "record", "idem_citus_step", NULL},
	{"idem_citus_step_with",
		"run_id text, step text, sql text, args text[] DEFAULT '{}',"
		" outbox_topic text DEFAULT NULL, wait boolean DEFAULT NULL, " CALL_RESULT,
	"text, text, text, text[], text, boolean", "record", "idem_citus_step_with",
	NULL},
	{"idem_citus_step_complete",
		"run_id text, step text, result pg_catalog.jsonb, " CALL_RESULT,
	"text, text, pg_catalog.jsonb", "record", "idem_citus_step_complete", NULL},
	{"idem_citus_run_status",
		"run_id text, owner pg_catalog.regrole DEFAULT NULL, OUT status text,"
		" OUT next_step text, OUT steps_done integer, OUT steps_total integer,"
		" OUT started_at timestamptz, OUT finished_at timestamptz,"
		" OUT last_error text, OUT input pg_catalog.jsonb",
	"text, pg_catalog.regrole", "record", "idem_citus_run_status", "text"},
	{"idem_citus_run_steps",
		"run_id text, owner pg_catalog.regrole DEFAULT NULL, OUT ordinal integer,"
		" OUT step text, OUT state text, OUT response pg_catalog.jsonb,"
		" OUT executed_at timestamptz, OUT attempts integer, OUT step_key text",
	"text, pg_catalog.regrole", "SETOF record", "idem_citus_run_steps", NULL},
	{"idem_citus_run_fail",
		"run_id text, reason text, owner pg_catalog.regrole DEFAULT NULL",
		"text, text, pg_catalog.regrole", "text", "idem_citus_run_fail",
	"text, text"},
	{"idem_citus_run_resume", "run_id text, owner pg_catalog.regrole DEFAULT NULL",
		"text, pg_catalog.regrole", "text", "idem_citus_run_resume",
	"text"},
	{"idem_citus_run_complete",
		"run_id text, owner pg_catalog.regrole DEFAULT NULL",
		"text, pg_catalog.regrole", "text", "idem_citus_run_complete",
	"text"},
	{"idem_citus_run_cancel",
		"run_id text, reason text DEFAULT NULL, owner pg_catalog.regrole DEFAULT NULL",
		"text, text, pg_catalog.regrole", "text", "idem_citus_run_cancel",
	"text, text"},
};

/*
 * Drop the functions of an earlier colocation in schema nsp, whatever
 * their tenant's type: those of citus_calls (C functions of idem's library
 * libfile, by name) and idem_citus_run_purge(), none of them the
 * extension's.  An earlier colocation of another type leaves them, and so
 * does DROP EXTENSION idem CASCADE, which drops idem's tables but not the
 * functions (Citus lets no distributed function depend on an extension):
 * they would collide with the functions made now, or take the calls of
 * the old tenant type.
 */
static void
drop_tenant_functions(Oid nsp, const char *libfile)
{
	StringInfoData sql;
	Oid			types[2] = {OIDOID, TEXTOID};
	Datum		values[2];

	initStringInfo(&sql);
	appendStringInfo(&sql,
					 "SELECT p.oid FROM pg_catalog.pg_proc p"
					 " WHERE p.pronamespace OPERATOR(pg_catalog.=) $1"
					 " AND ((p.proname OPERATOR(pg_catalog.=) 'idem_citus_run_purge'"
					 " AND p.proargtypes OPERATOR(pg_catalog.=) '%u'::pg_catalog.oidvector)"
					 " OR (p.probin OPERATOR(pg_catalog.=) $2"
					 " AND p.proname::pg_catalog.text OPERATOR(pg_catalog.=) ANY (ARRAY[",
					 TIMESTAMPTZOID);
	for (int i = 0; i < lengthof(citus_calls); i++)
		appendStringInfo(&sql, "%s%s", i > 0 ? ", " : "",
						 quote_literal_cstr(citus_calls[i].name));
	appendStringInfoString(&sql,
						   "])))"
						   " AND NOT EXISTS (SELECT FROM pg_catalog.pg_depend d"
						   " WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass"
						   " AND d.objid OPERATOR(pg_catalog.=) p.oid"
						   " AND d.deptype OPERATOR(pg_catalog.=) 'e')");
	values[0] = ObjectIdGetDatum(nsp);
	values[1] = CStringGetTextDatum(libfile);
	run_sql(sql.data, 2, types, values, SPI_OK_SELECT);

	/* the statements first: each DROP replaces SPI's result */
	resetStringInfo(&sql);
	for (uint64 i = 0; i < SPI_processed; i++)
	{
		bool		isnull;
		Datum		fn = SPI_getbinval(SPI_tuptable->vals[i],
									   SPI_tuptable->tupdesc, 1, &isnull);

		appendStringInfo(&sql, "DROP FUNCTION %s;",
						 format_procedure_qualified(DatumGetObjectId(fn)));
	}
	if (sql.len > 0)
		run_sql(sql.data, 0, NULL, NULL, SPI_OK_UTILITY);
	pfree(sql.data);
}

/*
 * Create idem.citus_keys, idem.citus_runs and idem.citus_outbox, unless
 * they exist (have_keys, have_runs, have_events), and the functions,
 * co-located with qtable and
 * distributed by a tenant of type typname.  The tables' tenant columns are
 * coltype: typname with the distribution column's collation, which Citus
 * requires of co-located tables.  With have_keys, the colocation is
 * declared again: a function that exists as it is made here is kept (with
 * what was set on it), another one is made.
 */
static void
create_tenant_objects(const char *nsp, const char *typname, const char *coltype,
					  const char *qtable, const char *probin, bool have_keys,
					  bool have_runs, bool have_events)
{
	StringInfoData sql;
	Oid			types[1] = {TEXTOID};
	Datum		values[1];

	initStringInfo(&sql);
	/* the tenant first: Citus wants it in the primary key */
	if (!have_keys)
		appendStringInfo(&sql,
						 "CREATE TABLE idem.citus_keys ("
						 " tenant %s NOT NULL,"
						 " owner pg_catalog.text COLLATE \"C\" NOT NULL,"
						 " key pg_catalog.text COLLATE \"C\" NOT NULL,"
						 " fingerprint pg_catalog.bytea NOT NULL,"
						 " fingerprint_version pg_catalog.int2 NOT NULL,"
						 " response pg_catalog.jsonb NOT NULL,"
						 " created_at pg_catalog.timestamptz NOT NULL,"
						 " expires_at pg_catalog.timestamptz NOT NULL,"
						 " CONSTRAINT citus_keys_pkey PRIMARY KEY (tenant, owner, key));"
						 "REVOKE ALL ON idem.citus_keys FROM PUBLIC;",
						 coltype);
	/* idem.runs' columns for a run on no queue */
	if (!have_runs)
		appendStringInfo(&sql,
						 "CREATE TABLE idem.citus_runs ("
						 " tenant %s NOT NULL,"
						 " owner pg_catalog.text COLLATE \"C\" NOT NULL,"
						 " run_id pg_catalog.text COLLATE \"C\" NOT NULL,"
						 " steps pg_catalog.text[] COLLATE \"C\","
						 " input pg_catalog.jsonb,"
						 " status pg_catalog.text NOT NULL,"
						 " started_at pg_catalog.timestamptz NOT NULL,"
						 " finished_at pg_catalog.timestamptz,"
						 " last_error pg_catalog.text,"
						 " done_steps pg_catalog.text[] COLLATE \"C\" NOT NULL,"
						 " attempts pg_catalog.int4[] NOT NULL,"
						 " CONSTRAINT citus_runs_pkey PRIMARY KEY (tenant, owner, run_id),"
						 " CONSTRAINT citus_runs_status_check CHECK (status OPERATOR(pg_catalog.=)"
						 " ANY ('{running,completed,failed,cancelled}'::pg_catalog.text[])));"
						 "REVOKE ALL ON idem.citus_runs FROM PUBLIC;",
						 coltype);

	/*
	 * The tenants' outbox events (outbox/outbox.c delivers them): the
	 * columns, indexes and settings of idem.outbox, in its column order
	 * (its code reads both by the same column numbers), then the tenant
	 * and the owner's name.  Citus wants the tenant in the primary key; an
	 * event is found by its id, the key's first column.
	 */
	if (!have_events)
		appendStringInfo(&sql,
						 "CREATE TABLE idem.citus_outbox ("
						 " event_id pg_catalog.uuid NOT NULL,"
						 " key pg_catalog.text COLLATE \"C\" NOT NULL,"
						 " owner pg_catalog.regrole NOT NULL,"
						 " topic pg_catalog.text COLLATE \"C\" NOT NULL,"
						 " payload pg_catalog.jsonb NOT NULL,"
						 " created_at pg_catalog.timestamptz NOT NULL,"
						 " run_id pg_catalog.text COLLATE \"C\","
						 " step pg_catalog.text COLLATE \"C\","
						 " state pg_catalog.text NOT NULL,"
						 " attempts pg_catalog.int4 NOT NULL,"
						 " next_attempt_at pg_catalog.timestamptz NOT NULL,"
						 " lease_token pg_catalog.uuid,"
						 " leased_by pg_catalog.regrole,"
						 " lease_holder pg_catalog.text,"
						 " last_error pg_catalog.text,"
						 " delivered_at pg_catalog.timestamptz,"
						 " run_position pg_catalog.int4,"
						 " tenant %s NOT NULL,"
						 " owner_name pg_catalog.text COLLATE \"C\" NOT NULL,"
						 " CONSTRAINT citus_outbox_pkey PRIMARY KEY (event_id, tenant))"
						 " WITH (autovacuum_vacuum_scale_factor = 0.01,"
						 " autovacuum_vacuum_threshold = 10000);"
						 "CREATE INDEX citus_outbox_due_idx ON idem.citus_outbox"
						 " (topic, next_attempt_at) WITH (deduplicate_items = off)"
						 " WHERE state OPERATOR(pg_catalog.=) ANY"
						 " (ARRAY['pending', 'leased']::pg_catalog.text[]);"
						 "CREATE INDEX citus_outbox_delivered_idx ON idem.citus_outbox"
						 " (delivered_at) WHERE state OPERATOR(pg_catalog.=) 'delivered'::pg_catalog.text;"
						 "CREATE INDEX citus_outbox_run_idx ON idem.citus_outbox (run_id)"
						 " WHERE run_id IS NOT NULL AND state OPERATOR(pg_catalog.=) ANY"
						 " (ARRAY['pending', 'leased']::pg_catalog.text[]);"
						 "REVOKE ALL ON idem.citus_outbox FROM PUBLIC;",
						 coltype);

	/*
	 * idem_run_purge() for tenant runs, an administrator's: the finished
	 * runs, and every run of a role that was dropped (a new role could get
	 * its name, and its runs).  Each run's record and its steps' are on its
	 * tenant's node, where no lock of the run can be tried from here: the
	 * run's row is deleted only if it is still finished once its row lock
	 * is had (a run resumed meanwhile stays), and a verb that loses its run
	 * to the purge finds none (ID404).
	 *
	 * A tenant run's owner is its role's name (see tables.c), so whether
	 * the role exists is asked of the coordinator's roles, which Citus
	 * keeps the same by name on every node.  Citus runs no stable function
	 * of a column in a DELETE, so the runs are found by a SELECT and
	 * deleted one by one, each on its tenant's node.  Several shards, so
	 * Citus commits it in two phases.
	 */
	appendStringInfo(&sql,
					 "CREATE OR REPLACE FUNCTION %s.idem_citus_run_purge(finished_before pg_catalog.timestamptz)"
					 " RETURNS bigint LANGUAGE plpgsql STRICT"
					 " SET search_path = pg_catalog, pg_temp AS $purge$"
					 " DECLARE c record; done text[]; step_keys text[]; n bigint := 0;"
					 "  roles text[] := ARRAY(SELECT a.rolname::pg_catalog.text FROM pg_catalog.pg_roles a);"
					 " BEGIN"
					 "  FOR c IN SELECT r.tenant, r.owner, r.run_id,"
					 "      r.owner OPERATOR(pg_catalog.<>) ALL (roles) AS owner_gone"
					 "    FROM idem.citus_runs r"
					 "    WHERE (r.status OPERATOR(pg_catalog.<>) 'running'"
					 "      AND r.finished_at OPERATOR(pg_catalog.<) finished_before)"
					 "     OR r.owner OPERATOR(pg_catalog.<>) ALL (roles) LOOP"
					 "   DELETE FROM idem.citus_runs r"
					 "    WHERE r.tenant OPERATOR(pg_catalog.=) c.tenant"
					 "      AND r.owner OPERATOR(pg_catalog.=) c.owner"
					 "      AND r.run_id OPERATOR(pg_catalog.=) c.run_id"
					 "      AND (c.owner_gone OR (r.status OPERATOR(pg_catalog.<>) 'running'"
					 "        AND r.finished_at OPERATOR(pg_catalog.<) finished_before))"
					 "    RETURNING r.done_steps INTO done;"
					 "   CONTINUE WHEN NOT FOUND;"
					 "   step_keys := ARRAY(SELECT %s.idem_step_key(c.run_id, s.step)"
					 "     FROM pg_catalog.unnest(done) AS s(step));"
					 "   DELETE FROM idem.citus_keys k"
					 "    WHERE k.tenant OPERATOR(pg_catalog.=) c.tenant"
					 "      AND k.owner OPERATOR(pg_catalog.=) c.owner"
					 "      AND k.key OPERATOR(pg_catalog.=) ANY (step_keys);"
					 "   n := n + 1;"
					 "  END LOOP;"
					 "  RETURN n;"
					 " END $purge$;"
					 "REVOKE ALL ON FUNCTION %s.idem_citus_run_purge(pg_catalog.timestamptz) FROM PUBLIC",
					 nsp, nsp, nsp);
	run_sql(sql.data, 0, NULL, NULL, SPI_OK_UTILITY);

	values[0] = CStringGetTextDatum(qtable);
	if (!have_keys)
		run_sql("SELECT pg_catalog.create_distributed_table('idem.citus_keys', 'tenant',"
				" colocate_with => $1)", 1, types, values, SPI_OK_SELECT);
	if (!have_runs)
		run_sql("SELECT pg_catalog.create_distributed_table('idem.citus_runs', 'tenant',"
				" colocate_with => $1)", 1, types, values, SPI_OK_SELECT);
	if (!have_events)
		run_sql("SELECT pg_catalog.create_distributed_table('idem.citus_outbox', 'tenant',"
				" colocate_with => $1)", 1, types, values, SPI_OK_SELECT);

	/* the C functions serving this one serve the calls too */
	for (int i = 0; i < lengthof(citus_calls); i++)
	{
		char	   *signature = psprintf("%s.%s(%s, %s)", nsp,
										 citus_calls[i].name, typname,
										 citus_calls[i].args);
		char	   *old_signature = NULL;

		values[0] = CStringGetTextDatum(signature);
		if (have_keys && idem_function_exists(signature))
		{
			/*
			 * Kept, but delegated by another colocation group than the
			 * tables' (Citus moved the tables and not the functions, as
			 * Citus 14's citus_finish_citus_upgrade() does for a group
			 * Citus 13 registered under another collation): registered
			 * again, Citus delegates it to the tenant's node again.
			 */
			run_sql("SELECT pg_catalog.create_distributed_function($1::pg_catalog.regprocedure,"
					" 'tenant', colocate_with => 'idem.citus_keys', force_delegation => true)"
					" WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_dist_object o,"
					" pg_catalog.pg_dist_partition p"
					" WHERE o.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass"
					" AND o.objid OPERATOR(pg_catalog.=) $1::pg_catalog.regprocedure"
					" AND p.logicalrelid OPERATOR(pg_catalog.=) 'idem.citus_keys'::pg_catalog.regclass"
					" AND o.colocationid OPERATOR(pg_catalog.=) p.colocationid)",
					1, types, values, SPI_OK_SELECT);
			continue;
		}
		resetStringInfo(&sql);
		if (have_keys && citus_calls[i].old_args != NULL)
			old_signature = psprintf("%s.%s(%s, %s)", nsp, citus_calls[i].name,
									 typname, citus_calls[i].old_args);
		if (old_signature != NULL && idem_function_exists(old_signature))
			appendStringInfo(&sql, "DROP FUNCTION %s;", old_signature);
		appendStringInfo(&sql,
						 "CREATE FUNCTION %s.%s(tenant %s, %s) RETURNS %s"
						 " AS %s, '%s' LANGUAGE C VOLATILE PARALLEL UNSAFE",
						 nsp, citus_calls[i].name, typname,
						 citus_calls[i].params, citus_calls[i].returns,
						 probin, citus_calls[i].symbol);
		run_sql(sql.data, 0, NULL, NULL, SPI_OK_UTILITY);
		run_sql("SELECT pg_catalog.create_distributed_function($1::pg_catalog.regprocedure,"
				" 'tenant', colocate_with => 'idem.citus_keys', force_delegation => true)",
				1, types, values, SPI_OK_SELECT);
	}
}

/*
 * idem_citus_colocate(distributed_table regclass) returns void
 */
Datum
idem_citus_colocate(PG_FUNCTION_ARGS)
{
	const char *fname = "idem_citus_colocate()";
	Oid			table = PG_GETARG_OID(0);
	Oid			keys_rel;
	Oid			runs_rel;
	Oid			events_rel;
	Oid			type;
	Oid			collation;
	int32		colocation;
	Oid			fn_nsp = get_func_namespace(fcinfo->flinfo->fn_oid);
	const char *nsp;
	char	   *typname;
	char	   *coltype;
	char	   *qtable;
	char	   *libfile;
	char	   *probin;
	int			nestlevel;

	idem_citus_require(fname);
	if (!superuser())
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("only a superuser may declare idem's colocation"),
				 errdetail("%s creates a distributed table and a distributed function.", fname),
				 idem_errhint(ERRCODE_INSUFFICIENT_PRIVILEGE, NULL)));

	/*
	 * Citus runs a function's DDL over one connection per node, which a
	 * table distributed in parallel earlier in the transaction has not
	 * used; sequential for this call only.
	 */
	nestlevel = NewGUCNestLevel();
	(void) set_config_option("citus.multi_shard_modify_mode", "sequential",
							 PGC_USERSET, PGC_S_SESSION, GUC_ACTION_SAVE,
							 true, 0, false);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (!distribution_of(table, &type, &collation, &colocation))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_MISMATCH),
				 errmsg("\"%s\" is not a hash-distributed Citus table", get_rel_name(table)),
				 errdetail("idem's records follow a colocation group of tables distributed by a column."),
				 idem_errhint(ERRCODE_IDEM_CITUS_MISMATCH, "Pass a table made with create_distributed_table(table, column).")));

	nsp = quote_identifier(get_namespace_name(fn_nsp));
	typname = format_type_be_qualified(type);
	coltype = typname;
	if (OidIsValid(collation) && collation != get_typcollation(type))
		coltype = psprintf("%s COLLATE %s", typname, qualified_collation(collation));
	qtable = quote_qualified_identifier(get_namespace_name(get_rel_namespace(table)),
										get_rel_name(table));
	libfile = func_probin(fcinfo->flinfo->fn_oid);
	probin = quote_literal_cstr(libfile);

	keys_rel = idem_citus_keys_relid();
	runs_rel = citus_runs_relid();
	events_rel = citus_outbox_relid();
	if (OidIsValid(keys_rel))
	{
		Oid			keys_type;
		Oid			keys_collation;
		int32		keys_colocation;

		if (distribution_of(keys_rel, &keys_type, &keys_collation, &keys_colocation) &&
			keys_colocation == colocation)
		{
			/* declared by an older build: what it lacks follows too */
			create_tenant_objects(nsp, typname, coltype, qtable, probin, true,
								  OidIsValid(runs_rel), OidIsValid(events_rel));
			SPI_finish();
			AtEOXact_GUC(true, nestlevel);
			PG_RETURN_VOID();
		}
		if (!citus_table_empty("idem.citus_keys") ||
			(OidIsValid(runs_rel) && !citus_table_empty("idem.citus_runs")) ||
			(OidIsValid(events_rel) && !citus_table_empty("idem.citus_outbox")))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_CITUS_MISMATCH),
					 errmsg("idem's records already follow another colocation group"),
					 errdetail("idem.citus_keys, idem.citus_runs or idem.citus_outbox holds records of the colocation it was declared with."),
					 idem_errhint(ERRCODE_IDEM_CITUS_MISMATCH, "Keep the declared colocation, or empty idem.citus_keys, idem.citus_runs and idem.citus_outbox first.")));
	}

	if (OidIsValid(keys_rel))
		run_sql("DROP TABLE idem.citus_keys;"
				"DROP TABLE IF EXISTS idem.citus_runs;"
				"DROP TABLE IF EXISTS idem.citus_outbox", 0, NULL, NULL,
				SPI_OK_UTILITY);
	drop_tenant_functions(fn_nsp, libfile);
	create_tenant_objects(nsp, typname, coltype, qtable, probin, false, false,
						  false);

	SPI_finish();
	AtEOXact_GUC(true, nestlevel);
	PG_RETURN_VOID();
}

static Oid
rel_owner(Oid relid)
{
	HeapTuple	tup = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Oid			owner;

	if (!HeapTupleIsValid(tup))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	owner = ((Form_pg_class) GETSTRUCT(tup))->relowner;
	ReleaseSysCache(tup);
	return owner;
}

/*
 * The statements on the tenant's shards of idem.citus_runs (the key
 * records in idem.citus_keys are read and written directly, without the
 * executor: common/tables.c's idem_lookup_tenant_key() and
 * idem_insert_tenant_key()).  They name the shard's relation on this node:
 * Citus would plan them as distributed queries and plan the local shard's
 * query again on every call, most of a call's cost.  The shards are safe
 * to use directly once the call holds Citus's shard metadata lock of the
 * tenant's idem.citus_keys shard (what Citus's own writers take), which a
 * move of the colocation group waits for before it switches the group's
 * shards to another node.
 */
typedef enum RunSql
{
	RUNS_LOOKUP, RUNS_INSERT, RUNS_UPDATE,
	RUN_SQL_COUNT
} RunSql;

/* A kept plan: of a statement on one shard relation (or on none). */
typedef struct RunPlanKey
{
	Oid			relid;
	Oid			tenant_type;
	RunSql		which;
} RunPlanKey;

typedef struct RunPlan
{
	RunPlanKey key;
	SPIPlanPtr	plan;
} RunPlan;

/* most shard plans kept before all are dropped and made again */
#define MAX_RUN_PLANS 1024

static HTAB *run_plans = NULL;


/* The tenant's shard of idem.citus_keys, on this node. */
typedef struct TenantShard
{
	int64		shardid;
	uint32		colocation;		/* idem.citus_keys' colocation group */
	Oid			relid;			/* the shard's relation here */
} TenantShard;

/*
 * A hash table kept for the backend's life, keyed by its entries' first
 * bytes.
 */
static HTAB *
backend_hash(const char *name, Size keysize, Size entrysize)
{
	HASHCTL		ctl;

	ctl.keysize = keysize;
	ctl.entrysize = entrysize;
	ctl.hcxt = TopMemoryContext;
	return hash_create(name, 64, &ctl, HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

static SPIPlanPtr
run_plan(RunSql which, Oid relid, Oid tenant_type, int nargs, Oid *types)
{
	RunPlanKey key;
	RunPlan   *entry;
	bool		found;
	StringInfoData sql;
	const char *rel = NULL;
	SPIPlanPtr	plan;

	if (run_plans == NULL || hash_get_num_entries(run_plans) >= MAX_RUN_PLANS)
	{
		if (run_plans != NULL)
		{
			HASH_SEQ_STATUS status;

			hash_seq_init(&status, run_plans);
			while ((entry = hash_seq_search(&status)) != NULL)
				SPI_freeplan(entry->plan);
			hash_destroy(run_plans);
		}
		run_plans = backend_hash("idem citus run plans", sizeof(RunPlanKey),
								 sizeof(RunPlan));
	}
	memset(&key, 0, sizeof(key));
	key.relid = relid;
	key.tenant_type = tenant_type;
	key.which = which;
	entry = hash_search(run_plans, &key, HASH_FIND, NULL);
	if (entry != NULL)
		return entry->plan;

	if (OidIsValid(relid))
		rel = quote_qualified_identifier("idem", get_rel_name(relid));
	initStringInfo(&sql);
	switch (which)
	{
		case RUNS_LOOKUP:
			appendStringInfo(&sql,
							 "SELECT r.steps, r.input, r.status, r.started_at,"
							 " r.finished_at, r.last_error, r.done_steps, r.attempts"
							 " FROM %s r"
							 " WHERE r.tenant OPERATOR(pg_catalog.=) $1"
							 " AND r.owner OPERATOR(pg_catalog.=) $2"
							 " AND r.run_id OPERATOR(pg_catalog.=) $3", rel);
			break;
		case RUNS_INSERT:
			appendStringInfo(&sql,
							 "INSERT INTO %s (tenant, owner, run_id, status,"
							 " finished_at, last_error, done_steps, attempts, steps,"
							 " input, started_at)"
							 " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
							 rel);
			break;
		case RUNS_UPDATE:
			appendStringInfo(&sql,
							 "UPDATE %s r SET status = $4, finished_at = $5,"
							 " last_error = $6, done_steps = $7, attempts = $8"
							 " WHERE r.tenant OPERATOR(pg_catalog.=) $1"
							 " AND r.owner OPERATOR(pg_catalog.=) $2"
							 " AND r.run_id OPERATOR(pg_catalog.=) $3", rel);
			break;
		case RUN_SQL_COUNT:
			elog(ERROR, "unexpected statement");
	}
	plan = SPI_prepare(sql.data, nargs, types);
	if (plan == NULL)
		elog(ERROR, "SPI_prepare failed: %s", SPI_result_code_string(SPI_result));
	if (SPI_keepplan(plan) != 0)
		elog(ERROR, "SPI_keepplan failed");
	pfree(sql.data);
	entry = hash_search(run_plans, &key, HASH_ENTER, &found);
	entry->plan = plan;
	return plan;
}

/*
 * One statement on a shard of idem.citus_runs (relid: the shard's
 * relation), run as the table's owner (idem_citus_colocate() made it):
 * callers have no rights on it.  Writes to a shard are Citus's to make
 * unless citus.enable_manual_changes_to_shards, set for them alone.
 * read_only false takes a new snapshot (READ COMMITTED): the lookup after
 * the run's lock sees a row committed while it waited.
 */
static void
run_shard_sql(RunSql which, Oid relid, Oid keys_owner, Oid tenant_type,
			  int nargs, Oid *types, Datum *values, const char *nulls,
			  bool read_only)
{
	SPIPlanPtr	plan;
	Oid			save_userid;
	int			save_sec;
	int			nestlevel = -1;
	int			rc;

	if (which != RUNS_LOOKUP)
	{
		nestlevel = NewGUCNestLevel();
		(void) set_config_option("citus.enable_manual_changes_to_shards", "on",
								 PGC_SUSET, PGC_S_SESSION, GUC_ACTION_SAVE,
								 true, 0, false);
	}
	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(keys_owner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	PG_TRY();
	{
		/* prepared as the owner too: callers may not even see the schema */
		plan = run_plan(which, relid, tenant_type, nargs, types);
		rc = SPI_execute_plan(plan, values, nulls, read_only, 0);
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(save_userid, save_sec);
	}
	PG_END_TRY();
	if (nestlevel >= 0)
		AtEOXact_GUC(true, nestlevel);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
}

/*
 * What calls learn of Citus's metadata for idem.citus_keys, kept across
 * calls: its colocation group, and for each shard whether its placement is
 * on this node (and its relation here).  Citus invalidates the table's
 * relcache entry whenever its shards or their placements change (triggers
 * on its catalog), which gives it a new idem_citus_generation(); what was
 * learnt under an earlier generation is read again.  A call takes the shard's
 * metadata lock before it processes the invalidations that arrived, so
 * what it uses was true when the lock was granted, and stays true until
 * the call commits: a move waits for the lock before it switches the
 * shard's placement to another node.
 */
typedef struct ShardHere
{
	int64		shardid;
	uint64		generation;
	Oid			relid;			/* the shard's relation, InvalidOid if not here */
} ShardHere;

/* most shards remembered before all are forgotten */
#define MAX_SHARDS_HERE 4096

static HTAB *shards_here = NULL;
static uint64 colocation_generation = 0;
static uint32 keys_colocation = 0;

/*
 * Citus's get_shard_id_for_distribution_column(), called in C, for values
 * of shard_for_value_type; built again, in a context of its own that is
 * reset first, when a call has a tenant of another type.
 */
static FmgrInfo shard_for_value;
static Oid	shard_for_value_type = InvalidOid;
static MemoryContext shard_for_value_cxt = NULL;

/*
 * The tenant's shard of idem.citus_keys (Citus's hash of the value and its
 * shard intervals), as the table's owner: Citus checks that the caller may
 * read the table.  Returns false for a value no shard covers.
 */
static bool
tenant_shard_id(Oid keys_rel, Oid keys_owner, Oid tenant_type, Datum tenant,
				int64 *shardid)
{
	LOCAL_FCINFO(fcinfo, 2);
	Oid			save_userid;
	int			save_sec;
	Datum		d;

	if (shard_for_value_type != tenant_type)
	{
		Oid			argtypes[2] = {REGCLASSOID, ANYOID};
		Oid			fn = LookupFuncName(list_make2(makeString("pg_catalog"),
												   makeString("get_shard_id_for_distribution_column")),
										2, argtypes, false);
		MemoryContext old;

		/* a rebuild that fails leaves no handle that claims to be built */
		shard_for_value_type = InvalidOid;
		if (shard_for_value_cxt == NULL)
			shard_for_value_cxt = AllocSetContextCreate(TopMemoryContext,
														"idem citus shard function",
														ALLOCSET_SMALL_SIZES);
		else
			MemoryContextReset(shard_for_value_cxt);
		old = MemoryContextSwitchTo(shard_for_value_cxt);
		fmgr_info_cxt(fn, &shard_for_value, shard_for_value_cxt);
		/* the function reads the value's type off its call expression */
		shard_for_value.fn_expr = (Node *)
			makeFuncExpr(fn, INT8OID,
						 list_make2(makeNullConst(REGCLASSOID, -1, InvalidOid),
									makeNullConst(tenant_type, -1, InvalidOid)),
						 InvalidOid, InvalidOid, COERCE_EXPLICIT_CALL);
		MemoryContextSwitchTo(old);
		shard_for_value_type = tenant_type;
	}
	InitFunctionCallInfoData(*fcinfo, &shard_for_value, 2, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = ObjectIdGetDatum(keys_rel);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = tenant;
	fcinfo->args[1].isnull = false;
	GetUserIdAndSecContext(&save_userid, &save_sec);
	SetUserIdAndSecContext(keys_owner, save_sec | SECURITY_LOCAL_USERID_CHANGE);
	PG_TRY();
	{
		d = FunctionCallInvoke(fcinfo);
	}
	PG_FINALLY();
	{
		SetUserIdAndSecContext(save_userid, save_sec);
	}
	PG_END_TRY();
	if (fcinfo->isnull)
		return false;
	*shardid = DatumGetInt64(d);
	return true;
}

/*
 * The tenant's shard of idem.citus_keys, if this node holds it: false when
 * Citus did not delegate the call here.  Takes Citus's shard metadata lock
 * before it asks where the shard is, so that no move can take the shard
 * away until this transaction ends.
 */
static bool
tenant_shard_local(Oid keys_rel, Oid keys_owner, Oid tenant_type,
				   Datum tenant, TenantShard *shard)
{
	ShardHere  *here;
	uint64		generation;
	bool		found;
	char		relname[NAMEDATALEN];

	if (!tenant_shard_id(keys_rel, keys_owner, tenant_type, tenant,
						 &shard->shardid))
		return false;
	idem_citus_lock_shard(shard->shardid);

	if (shards_here == NULL || hash_get_num_entries(shards_here) >= MAX_SHARDS_HERE)
	{
		if (shards_here != NULL)
			hash_destroy(shards_here);
		shards_here = backend_hash("idem citus shards here", sizeof(int64),
								   sizeof(ShardHere));
	}

	/* read before the catalog is: a change during the reads voids them */
	generation = idem_citus_generation(keys_rel);
	if (colocation_generation != generation)
	{
		keys_colocation = 0;
		(void) idem_citus_catalog_scan("pg_dist_partition",
									   "pg_dist_partition_logical_relid_index",
									   "logicalrelid", F_OIDEQ,
									   ObjectIdGetDatum(keys_rel),
									   "colocationid", 0, &keys_colocation);
		colocation_generation = generation;
	}
	shard->colocation = keys_colocation;

	here = hash_search(shards_here, &shard->shardid, HASH_FIND, NULL);
	if (here == NULL || here->generation != generation)
	{
		Oid			relid = InvalidOid;

		if (idem_citus_shard_local(shard->shardid))
		{
			/*
			 * Citus names a shard's relation <table>_<shard id>, in the table's
			 * schema.
			 */
			snprintf(relname, sizeof(relname), "citus_keys_" INT64_FORMAT,
					 shard->shardid);
			relid = get_relname_relid(relname, get_namespace_oid("idem", false));
		}
		here = hash_search(shards_here, &shard->shardid, HASH_ENTER, &found);
		here->generation = generation;
		here->relid = relid;
	}
	shard->relid = here->relid;
	return OidIsValid(shard->relid);
}

/*
 * The tenant's record of owner's key, if any (rec filled in the caller's
 * context); read_only: as the caller's snapshot sees it (the run readers),
 * else as committed now, with rec->visible saying whether a REPEATABLE
 * READ snapshot sees it (the calls and steps, which hold the key's lock).
 */
static bool
lookup_tenant_key(TenantShard *shard, Datum tenant, Oid owner,
				  const char *key, int keylen, IdemRecord *rec,
				  MemoryContext cxt, bool read_only)
{
	MemoryContext old = MemoryContextSwitchTo(cxt);
	bool		found = idem_lookup_tenant_key(shard->relid, tenant, owner, key,
											   keylen, read_only, rec);

	MemoryContextSwitchTo(old);
	return found;
}

/* The tenant's record of req's key, on the tenant's shard here. */
static void
write_tenant_key(Datum tenant, TenantShard *shard, IdemRequest *req,
				 const uint8 *fingerprint, Jsonb *response, TimestampTz now,
				 TimestampTz expires)
{
	idem_insert_tenant_key(shard->relid, tenant, req->owner, req->key,
						   req->keylen, fingerprint, response, now, expires);
}

/* how Citus's refusal of a statement not filtered by the tenant begins */
#define CITUS_UNFILTERED_MESSAGE "queries must filter by the distribution argument"

/*
 * Run the business statement pinned to the tenant (idem_citus_pin_tenant()):
 * Citus's refusal of a statement that does not keep to the tenant's value
 * becomes IDC03, and the runner's refusal of one for which Citus opened a
 * transaction on another node (IDC02) says so in a tenant's terms.  cached
 * NULL: a step's statement, whose errors are never recorded.
 */
static Jsonb *
run_tenant_statement(const char *fname, IdemStatement *stmt,
					 IdemRequest *req, bool *cached)
{
	MemoryContext cxt = CurrentMemoryContext;
	Jsonb	   *response = NULL;

	PG_TRY();
	{
		response = cached != NULL ?
			idem_execute_caching_errors(stmt, req, cached) :
			idem_execute_statement(stmt, req);
	}
	PG_CATCH();
	{
		ErrorData  *edata;

		MemoryContextSwitchTo(cxt);
		edata = CopyErrorData();
		if (edata->sqlerrcode == ERRCODE_IDEM_CITUS_NOT_LOCAL)
		{
			FlushErrorState();
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_CITUS_NOT_LOCAL),
					 errmsg("the statement passed to %s reached beyond the tenant's shard", fname),
					 errdetail("Citus opened a distributed transaction for it: it touched another node or another tenant's shard, so its write could not commit with the key record."),
					 idem_errhint(ERRCODE_IDEM_CITUS_NOT_LOCAL, "Filter every distributed table the statement reads or writes by the tenant's distribution value, in tables co-located with idem's.")));
		}
		if (edata->sqlerrcode != ERRCODE_FEATURE_NOT_SUPPORTED ||
			edata->message == NULL ||
			strncmp(edata->message, CITUS_UNFILTERED_MESSAGE,
					sizeof(CITUS_UNFILTERED_MESSAGE) - 1) != 0)
			PG_RE_THROW();
		FlushErrorState();
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_MISMATCH),
				 errmsg("the statement passed to %s does not keep to the tenant", fname),
				 errdetail("Citus refused a part of it that is not filtered by the tenant's distribution value, in idem's colocation group: %s.",
						   edata->message),
				 idem_errhint(ERRCODE_IDEM_CITUS_MISMATCH, "Filter every distributed table the statement reads or writes by the tenant's distribution value, in tables co-located with idem's, and write that value as an argument or as a constant of the distribution column's type: Citus compares a constant as it is written, so an INSERT's VALUES (42, ...) into a bigint column is not the tenant 42::bigint.")));
	}
	PG_END_TRY();
	return response;
}

/*
 * The lock that serializes the calls of one (role, tenant, key), and the
 * steps of one (role, tenant, run) under the run's lock key: calls of a
 * tenant all run on the node of its shard.
 */
static void
lock_tenant_key(Oid tenant_type, Datum tenant, Oid owner, const char *key,
				int keylen)
{
	Oid			outfn;
	bool		varlena;
	char	   *out;
	StringInfoData buf;

	getTypeOutputInfo(tenant_type, &outfn, &varlena);
	out = OidOutputFunctionCall(outfn, tenant);
	initStringInfo(&buf);
	/* length-prefixed: no tenant and key pair spells another's */
	appendStringInfo(&buf, "citus:%zu:%s:", strlen(out), out);
	appendBinaryStringInfo(&buf, key, keylen);
	idem_lock_key(owner, buf.data, buf.len, idem_wait);
	pfree(buf.data);
	pfree(out);
}

/* How a tenant call's arguments are laid out, after its tenant. */
typedef enum CitusCallShape
{
	CALL_VARIADIC,				/* key, sql [, VARIADIC args] */
	CALL_OUTBOX,				/* outbox_topic, key, sql [, VARIADIC args] */
	CALL_WITH					/* key, sql, args text[], outbox_topic, ttl,
								 * wait */
} CitusCallShape;

/* idem_citus_call_with()'s arguments */
enum
{
	WITH_KEY = 1,
	WITH_SQL,
	WITH_ARGS,
	WITH_OUTBOX_TOPIC,
	WITH_TTL,
	WITH_WAIT
};

/*
 * The request of a tenant call of the given shape, and the topic its
 * event goes to (NULL: none).  The outbox shape names its topic; the
 * others write to idem.outbox_topic as the shard's node has it (set by
 * idem_citus_call_with()'s option, or on the function), as idem_execute()
 * does.
 */
static char *
tenant_request(FunctionCallInfo fcinfo, const char *fname,
			   CitusCallShape shape, IdemRequest *req)
{
	if (shape != CALL_WITH)
	{
		int			keyarg = shape == CALL_OUTBOX ? 2 : 1;

		idem_keyed_request(fcinfo, fname, keyarg, req);
		if (shape == CALL_OUTBOX)
			return PG_ARGISNULL(1) ? NULL : text_to_cstring(PG_GETARG_TEXT_PP(1));
		return NULL;
	}
	idem_keyed_array_request(fcinfo, fname, WITH_KEY, WITH_ARGS, req);
	return NULL;
}

/* A tenant's call on the node of its shard, once it is found there. */
typedef struct TenantCall
{
	const char *fname;
	Oid			fn_oid;			/* the called function */
	Oid			keys_rel;
	Oid			keys_owner;		/* of idem.citus_keys and idem.citus_runs */
	Oid			tenant_type;
	Datum		tenant;
	TenantShard shard;			/* of idem.citus_keys */
	Oid			runs_relid;		/* the tenant's shard of idem.citus_runs here */
	IdemEventShard events;		/* its shard of idem.citus_outbox here */
	MemoryContext callercxt;	/* outlives the call's SPI connection */
} TenantCall;

/* The tenant argument of a tenant call, checked against idem's colocation. */
static void
tenant_arg(FunctionCallInfo fcinfo, const char *fname, TenantCall *tc)
{
	tc->fname = fname;
	tc->fn_oid = fcinfo->flinfo->fn_oid;
	tc->shard.colocation = 0;
	tc->callercxt = CurrentMemoryContext;
	tc->runs_relid = InvalidOid;
	tc->events.relid = InvalidOid;
	idem_citus_require(fname);
	tc->keys_rel = idem_citus_keys_relid();
	if (!OidIsValid(tc->keys_rel))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_NOT_COLOCATED),
				 errmsg("%s needs idem's colocation declared", fname),
				 errdetail("idem.citus_keys does not exist."),
				 idem_errhint(ERRCODE_IDEM_CITUS_NOT_COLOCATED, "An administrator declares it with idem_citus_colocate('<distributed table>').")));
	tc->tenant_type = get_fn_expr_argtype(fcinfo->flinfo, 0);
	if (tc->tenant_type != get_atttype(tc->keys_rel, 1))
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_MISMATCH),
				 errmsg("tenant of type %s does not match idem's colocation",
						format_type_be(tc->tenant_type)),
				 errdetail("idem.citus_keys is distributed by a column of type %s.",
						   format_type_be(get_atttype(tc->keys_rel, 1))),
				 idem_errhint(ERRCODE_IDEM_CITUS_MISMATCH, "Pass the tenant as the distribution column's type.")));
	if (PG_ARGISNULL(0))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("tenant passed to %s must not be null", fname),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	tc->tenant = PG_GETARG_DATUM(0);
	tc->keys_owner = rel_owner(tc->keys_rel);
}

/*
 * The tenant's shard of idem.citus_outbox here, where its events go, into
 * tc->events: co-located with its shard of idem.citus_keys, so on this node
 * and kept here by that shard's lock, which tenant_here() took.  Its relid
 * stays invalid where the colocation was declared by a build without
 * idem.citus_outbox: the events go to idem.outbox, as they did then, until
 * the colocation is declared again.
 */
static void
tenant_events(TenantCall *tc)
{
	Oid			nsp = get_namespace_oid("idem", false);
	Oid			events_rel = citus_outbox_relid();
	int64		shardid;
	char		relname[NAMEDATALEN];

	if (!OidIsValid(events_rel) || OidIsValid(tc->events.relid))
		return;
	if (tenant_shard_id(events_rel, tc->keys_owner, tc->tenant_type,
						tc->tenant, &shardid))
	{
		snprintf(relname, sizeof(relname), "citus_outbox_" INT64_FORMAT,
				 shardid);
		tc->events.relid = get_relname_relid(relname, nsp);
	}
	if (!OidIsValid(tc->events.relid))
		elog(ERROR, "the tenant's shard of idem.citus_outbox is not on this node");
	tc->events.tenant = tc->tenant;
}

/*
 * A call that is not on its tenant's node: IDC01 if Citus delegates the
 * function by another colocation group than idem.citus_keys' (tc->shard's,
 * read by tenant_shard_local()).  Citus then runs it where it was called,
 * for every statement shape: the tables moved to another group and the
 * functions stayed (Citus 14's citus_finish_citus_upgrade() moves a group
 * that Citus 13 registered under another collation than its distribution
 * column's), which declaring the colocation again repairs.
 */
static void
check_delegation(TenantCall *tc)
{
	Oid			types[1] = {OIDOID};
	Datum		values[1] = {ObjectIdGetDatum(tc->fn_oid)};
	bool		isnull;
	Datum		d;

	run_sql("SELECT colocationid FROM pg_catalog.pg_dist_object"
			" WHERE classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass"
			" AND objid OPERATOR(pg_catalog.=) $1",
			1, types, values, SPI_OK_SELECT);
	if (SPI_processed == 0)
		return;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	if (isnull || tc->shard.colocation == 0 ||
		DatumGetUInt32(d) == tc->shard.colocation)
		return;
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_CITUS_NOT_COLOCATED),
			 errmsg("%s needs idem's colocation declared again", tc->fname),
			 errdetail("Citus delegates the function by colocation group %u, but idem.citus_keys is in group %u.",
					   DatumGetUInt32(d), tc->shard.colocation),
			 idem_errhint(ERRCODE_IDEM_CITUS_NOT_COLOCATED, "An administrator declares the same colocation again with idem_citus_colocate('<distributed table>'); the records stay.")));
}

/*
 * Connect to SPI (the caller finishes) and find the tenant's shard on this
 * node, locked; with runs, its shard of idem.citus_runs too (co-located:
 * on this node, and kept here by the same lock), and of idem.citus_outbox.
 */
static void
tenant_here(TenantCall *tc, bool runs)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (!tenant_shard_local(tc->keys_rel, tc->keys_owner, tc->tenant_type,
							tc->tenant, &tc->shard))
	{
		check_delegation(tc);
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_NOT_LOCAL),
				 errmsg("%s was not delegated to the node of the tenant's shard", tc->fname),
				 errdetail("Citus delegates a statement that is a lone SELECT of the function or SELECT * FROM it, with constant arguments, not one with other output columns, a CTE, a subquery or INSERT ... SELECT."),
				 idem_errhint(ERRCODE_IDEM_CITUS_NOT_LOCAL, "Send the call as a statement of its own.")));
	}
	if (idem_citus_in_distributed_transaction())
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_NOT_LOCAL),
				 errmsg("%s cannot run in a distributed transaction", tc->fname),
				 errdetail("This transaction already opened a transaction on another node through Citus (a write, or a read in a transaction block), which would commit apart from the key record."),
				 idem_errhint(ERRCODE_IDEM_CITUS_NOT_LOCAL, "Send the call as a statement of its own, or before the statements that reach other nodes.")));
	if (runs)
	{
		Oid			runs_rel = citus_runs_relid();
		int64		shardid;
		char		relname[NAMEDATALEN];

		if (!OidIsValid(runs_rel))
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_CITUS_NOT_COLOCATED),
					 errmsg("%s needs idem's colocation declared again", tc->fname),
					 errdetail("idem.citus_runs does not exist: the colocation was declared by a version of idem without tenant runs."),
					 idem_errhint(ERRCODE_IDEM_CITUS_NOT_COLOCATED, "An administrator declares the same colocation again with idem_citus_colocate('<distributed table>'); the key records stay.")));
		if (tenant_shard_id(runs_rel, tc->keys_owner, tc->tenant_type,
							tc->tenant, &shardid))
		{
			snprintf(relname, sizeof(relname), "citus_runs_" INT64_FORMAT,
					 shardid);
			tc->runs_relid = get_relname_relid(relname,
											   get_namespace_oid("idem", false));
		}
		if (!OidIsValid(tc->runs_relid))
			elog(ERROR, "the tenant's shard of idem.citus_runs is not on this node");
		tenant_events(tc);
	}
}

/*
 * Lock req's key for the tenant and look its record up: true if a live
 * record of this very request exists (rec filled in the caller's context),
 * false if the key is free; ID422 for another request's record.
 */
static bool
find_tenant_record(TenantCall *tc, IdemStatement *stmt, IdemRequest *req,
				   const uint8 *fingerprint, TimestampTz now, IdemRecord *rec)
{
	bool		found;

	idem_check_not_inflight(req);
	lock_tenant_key(tc->tenant_type, tc->tenant, req->owner, req->key,
					req->keylen);
	found = lookup_tenant_key(&tc->shard, tc->tenant, req->owner, req->key,
							  req->keylen, rec, tc->callercxt, false);
	if (found)
		idem_check_visible(req, rec);
	if (found && rec->expires_at <= now)
	{
		idem_delete_tenant_key(tc->shard.relid, rec);
		found = false;
	}
	if (found && !idem_record_matches(stmt, req, rec, fingerprint))
		idem_report_key_reused(req, "The statement text, the settings that change its meaning, or the arguments differ from the request first recorded under this key for this tenant.");
	return found;
}

/*
 * A tenant call: the key record and the business write in one local
 * transaction on the node of the tenant's shard.
 */
static void
citus_call(FunctionCallInfo fcinfo, const char *fname, CitusCallShape shape,
		   IdemRequest *req, IdemResult *result)
{
	char	   *topic;
	TenantCall	tc;
	IdemStatement *stmt;
	uint8		fingerprint[IDEM_FINGERPRINT_LEN];
	TimestampTz now = GetCurrentTransactionStartTimestamp();
	volatile bool fingerprinted = false;
	volatile bool executing = false;

	tenant_arg(fcinfo, fname, &tc);
	topic = tenant_request(fcinfo, fname, shape, req);
	tenant_here(&tc, false);

	stmt = idem_statement_acquire(req->sql, req->nargs, req->argtypes);
	PG_TRY();
	{
		IdemRecord	rec;

		idem_statement_fingerprint(stmt, req, fingerprint);
		fingerprinted = true;
		if (find_tenant_record(&tc, stmt, req, fingerprint, now, &rec))
			idem_replay_record(req, &rec, result);
		else
		{
			bool		cached;
			MemoryContext old;

			/* a topic the role may not publish to fails before anything runs */
			if (shape == CALL_OUTBOX && topic != NULL)
				idem_outbox_check_publish(topic, req->owner);
			else if (shape != CALL_OUTBOX)
				topic = idem_current_topic(req->owner);
			executing = true;
			old = MemoryContextSwitchTo(tc.callercxt);
			idem_citus_pin_tenant(tc.tenant_type, tc.tenant, tc.shard.colocation);
			result->response = run_tenant_statement(fname, stmt, req, &cached);
			MemoryContextSwitchTo(old);
			write_tenant_key(tc.tenant, &tc.shard, req, fingerprint,
							 result->response, now,
							 idem_new_record_expiry(req->owner, req->key, req->ttl));
			/* a failed statement had no effect to announce */
			if (topic != NULL && !cached)
			{
				tenant_events(&tc);
				idem_insert_outbox(req->key, req->owner, topic,
								   result->response, now, NULL, NULL, 0,
								   &tc.events);
			}
			result->replayed = false;
			result->first_executed_at = now;
		}
	}
	PG_CATCH();
	{
		idem_note_error(req, fingerprinted ? fingerprint : NULL, NULL, NULL,
						executing);
		idem_statement_release(stmt);
		PG_RE_THROW();
	}
	PG_END_TRY();
	idem_statement_release(stmt);
	SPI_finish();
	idem_note_done(req, fingerprint, NULL, NULL, result->replayed);
}

/*
 * idem_citus_call(tenant <distribution type>, key text, sql text
 *		[, VARIADIC args "any"])
 *		returns (response jsonb, replayed boolean, first_executed_at timestamptz)
 *
 * Created by idem_citus_colocate() with the tenant's type.
 */
Datum
idem_citus_call(PG_FUNCTION_ARGS)
{
	IdemRequest req;
	IdemResult	result;

	citus_call(fcinfo, "idem_citus_call()", CALL_VARIADIC, &req, &result);
	PG_RETURN_DATUM(idem_result_datum(&result));
}

/*
 * idem_citus_call_outbox(tenant <distribution type>, outbox_topic text,
 *		key text, sql text [, VARIADIC args "any"])
 *		returns (response jsonb, replayed boolean, first_executed_at timestamptz)
 *
 * idem_citus_call() whose execution also writes its response as an event
 * of outbox_topic (none if NULL) to idem.outbox on the shard's node, in the
 * same local transaction; that node's consumers deliver it.  The topic is
 * not part of the request, as idem.outbox_topic is not for idem_execute().
 */
Datum
idem_citus_call_outbox(PG_FUNCTION_ARGS)
{
	IdemRequest req;
	IdemResult	result;

	citus_call(fcinfo, "idem_citus_call_outbox()", CALL_OUTBOX, &req, &result);
	PG_RETURN_DATUM(idem_result_datum(&result));
}

/*
 * idem_citus_call_with(tenant <distribution type>, key text, sql text,
 *		args text[] DEFAULT '{}', outbox_topic text DEFAULT NULL,
 *		ttl interval DEFAULT NULL, wait boolean DEFAULT NULL)
 *		returns (response jsonb, replayed boolean, first_executed_at timestamptz)
 *
 * idem_call() for a tenant: the arguments as text typed by the statement,
 * and the options as arguments, which Citus carries to the shard's node
 * (it does not carry the session's settings).
 */
Datum
idem_citus_call_with(PG_FUNCTION_ARGS)
{
	IdemRequest req;
	IdemResult	result;
	int			nestlevel = idem_call_options(fcinfo, WITH_OUTBOX_TOPIC,
											  WITH_TTL, WITH_WAIT);

	citus_call(fcinfo, "idem_citus_call_with()", CALL_WITH, &req, &result);
	AtEOXact_GUC(true, nestlevel);
	PG_RETURN_DATUM(idem_result_datum(&result));
}

/*
 * Tenant runs: run.c's sequencing, on a store that keeps the run in the
 * tenant's shard of idem.citus_runs and its steps' records in the tenant's
 * shard of idem.citus_keys, on the node where the call was delegated.  The
 * step's business statement, its record and the run's progress commit in
 * one local transaction there, and move with the tenant's shards.
 */

/* The run's parameters: (tenant, owner, run_id) */
static void
run_params(TenantCall *tc, Oid owner, const char *run_id, Oid *types,
		   Datum *values)
{
	types[0] = tc->tenant_type;
	types[1] = TEXTOID;
	types[2] = TEXTOID;
	values[0] = tc->tenant;
	values[1] = PointerGetDatum(idem_tenant_owner(owner));
	values[2] = CStringGetTextDatum(run_id);
}

/* The run's row, copied: read_only false sees what committed meanwhile. */
static bool
lookup_tenant_run(TenantCall *tc, Oid owner, const char *run_id,
				  IdemRunRow *run, bool read_only)
{
	Oid			types[3];
	Datum		values[3];
	HeapTuple	tup;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	run_params(tc, owner, run_id, types, values);
	run_shard_sql(RUNS_LOOKUP, tc->runs_relid, tc->keys_owner, tc->tenant_type,
				 3, types, values, NULL, read_only);
	if (SPI_processed == 0)
		return false;
	tup = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	memset(run, 0, sizeof(*run));
	idem_run_init_unqueued(run);
	/* the statement's snapshot is the transaction's: it saw the row */
	run->visible = true;
	run->owner = owner;
	run->run_id = pstrdup(run_id);
	d = SPI_getbinval(tup, desc, 1, &isnull);
	run->steps = isnull ? NULL : DatumGetArrayTypePCopy(d);
	d = SPI_getbinval(tup, desc, 2, &isnull);
	run->input = isnull ? NULL : DatumGetJsonbPCopy(d);
	run->status = TextDatumGetCString(SPI_getbinval(tup, desc, 3, &isnull));
	run->started_at = DatumGetTimestampTz(SPI_getbinval(tup, desc, 4, &isnull));
	d = SPI_getbinval(tup, desc, 5, &isnull);
	run->finished = !isnull;
	run->finished_at = isnull ? 0 : DatumGetTimestampTz(d);
	d = SPI_getbinval(tup, desc, 6, &isnull);
	run->last_error = isnull ? NULL : TextDatumGetCString(d);
	run->done_steps = DatumGetArrayTypePCopy(SPI_getbinval(tup, desc, 7, &isnull));
	run->attempts = DatumGetArrayTypePCopy(SPI_getbinval(tup, desc, 8, &isnull));
	idem_check_run_lists(run, "idem.citus_runs");
	return true;
}

/* Insert (RUNS_INSERT) or update (RUNS_UPDATE) the run's row. */
static void
write_tenant_run(TenantCall *tc, RunSql which, IdemRunRow *run)
{
	Oid			types[11];
	Datum		values[11];
	char		nulls[11];
	int			nargs = which == RUNS_INSERT ? 11 : 8;

	memset(nulls, ' ', sizeof(nulls));
	run_params(tc, run->owner, run->run_id, types, values);
	types[3] = TEXTOID;
	values[3] = CStringGetTextDatum(run->status);
	types[4] = TIMESTAMPTZOID;
	values[4] = TimestampTzGetDatum(run->finished_at);
	nulls[4] = run->finished ? ' ' : 'n';
	types[5] = TEXTOID;
	values[5] = run->last_error ? CStringGetTextDatum(run->last_error) : (Datum) 0;
	nulls[5] = run->last_error ? ' ' : 'n';
	types[6] = TEXTARRAYOID;
	values[6] = PointerGetDatum(run->done_steps);
	types[7] = INT4ARRAYOID;
	values[7] = PointerGetDatum(run->attempts);
	types[8] = TEXTARRAYOID;
	values[8] = PointerGetDatum(run->steps);
	nulls[8] = run->steps ? ' ' : 'n';
	types[9] = JSONBOID;
	values[9] = PointerGetDatum(run->input);
	nulls[9] = run->input ? ' ' : 'n';
	types[10] = TIMESTAMPTZOID;
	values[10] = TimestampTzGetDatum(run->started_at);
	run_shard_sql(which, tc->runs_relid, tc->keys_owner, tc->tenant_type,
				 nargs, types, values, nulls, false);
	/* idem_citus_run_purge() deleted the finished run after it was read */
	if (SPI_processed != 1 && which == RUNS_UPDATE)
		idem_report_run_not_found(run->run_id);
	if (SPI_processed != 1)
		elog(ERROR, "run \"%s\" of idem.citus_runs was not written", run->run_id);
}

static bool
tenant_lock_and_read(const IdemRunStore *store, Oid owner, const char *run_id,
					 IdemRunRow *run)
{
	TenantCall *tc = store->arg;
	char	   *lockkey = idem_run_lock_key(run_id);

	lock_tenant_key(tc->tenant_type, tc->tenant, owner, lockkey,
					strlen(lockkey));
	return lookup_tenant_run(tc, owner, run_id, run, false);
}

static void
tenant_insert_run(const IdemRunStore *store, IdemRunRow *run)
{
	write_tenant_run(store->arg, RUNS_INSERT, run);
}

static void
tenant_update_run(const IdemRunStore *store, IdemRunRow *run)
{
	write_tenant_run(store->arg, RUNS_UPDATE, run);
}

static bool
tenant_find_record(const IdemRunStore *store, IdemStatement *stmt,
				   IdemRequest *req, const uint8 *fingerprint, TimestampTz now,
				   IdemRecord *rec)
{
	return find_tenant_record(store->arg, stmt, req, fingerprint, now, rec);
}

static void
tenant_insert_key(const IdemRunStore *store, IdemRequest *req,
				  const uint8 *fingerprint, Jsonb *response, TimestampTz now)
{
	TenantCall *tc = store->arg;

	write_tenant_key(tc->tenant, &tc->shard, req, fingerprint, response, now,
					 DT_NOEND);
}

static Jsonb *
tenant_execute(const IdemRunStore *store, IdemStatement *stmt,
			   IdemRequest *req)
{
	TenantCall *tc = store->arg;

	idem_citus_pin_tenant(tc->tenant_type, tc->tenant, tc->shard.colocation);
	return run_tenant_statement(tc->fname, stmt, req, NULL);
}

/* For the readers: the caller's snapshot, as the run's row was read. */
static bool
tenant_read_record(const IdemRunStore *store, Oid owner, const char *key,
				   IdemRecord *rec)
{
	TenantCall *tc = store->arg;

	return lookup_tenant_key(&tc->shard, tc->tenant, owner, key, strlen(key),
							 rec, CurrentMemoryContext, true);
}

static const IdemRunStore tenant_store = {
	tenant_lock_and_read, tenant_insert_run, tenant_update_run,
	tenant_find_record, tenant_insert_key, tenant_execute,
	tenant_read_record, "idem.citus_keys", NULL
};

/* The tenant's run store, for a call to a run function of the tenant. */
static void
tenant_run_store(FunctionCallInfo fcinfo, const char *fname, TenantCall *tc,
				 IdemRunStore *store)
{
	*store = tenant_store;
	store->arg = tc;
	store->events = &tc->events;
	tenant_arg(fcinfo, fname, tc);
	idem_check_can_write(fname);
}

/*
 * idem_citus_run_begin(tenant <distribution type>, run_id text,
 *		steps text[] DEFAULT NULL, input jsonb DEFAULT NULL)
 *		returns (status text, next_step text, created boolean,
 *		started_at timestamptz)
 *
 * idem_run_begin() for a tenant, on no queue: the run is the role's under
 * (tenant, run_id), on the tenant's shard.
 */
Datum
idem_citus_run_begin(PG_FUNCTION_ARGS)
{
	const char *fname = "idem_citus_run_begin()";
	TenantCall	tc;
	IdemRunStore store;
	IdemRunRow	asked;
	IdemRunRow	run;
	bool		created;
	Datum		result;
	MemoryContext old;

	tenant_run_store(fcinfo, fname, &tc, &store);
	idem_run_begin_args(fcinfo, 1, &asked);
	tenant_here(&tc, true);
	created = idem_run_begin_in(&store, idem_key_owner(), &asked, &run);
	old = MemoryContextSwitchTo(tc.callercxt);
	result = idem_run_begin_result(fcinfo, &run, created);
	MemoryContextSwitchTo(old);
	SPI_finish();
	PG_RETURN_DATUM(result);
}

/* A step's result, its response copied out of the call's SPI connection. */
static Datum
tenant_step_result(TenantCall *tc, IdemResult *result)
{
	MemoryContext old = MemoryContextSwitchTo(tc->callercxt);
	Datum		d;

	result->response = DatumGetJsonbPCopy(JsonbPGetDatum(result->response));
	d = idem_result_datum(result);
	MemoryContextSwitchTo(old);
	SPI_finish();
	return d;
}

/* idem_citus_step_with()'s options */
enum
{
	STEP_WITH_OUTBOX_TOPIC = 5,
	STEP_WITH_WAIT
};

/* A statement step of the tenant's run; with: idem_citus_step_with()'s. */
static Datum
tenant_step(FunctionCallInfo fcinfo, const char *fname, bool with)
{
	TenantCall	tc;
	IdemRunStore store;
	IdemRequest req;
	IdemResult	result;
	char	   *run_id;
	char	   *step;
	int			nestlevel = -1;
	Datum		d;

	tenant_run_store(fcinfo, fname, &tc, &store);
	if (with)
		nestlevel = idem_call_options(fcinfo, STEP_WITH_OUTBOX_TOPIC, -1,
									  STEP_WITH_WAIT);
	idem_step_args(fcinfo, 1, fname, NULL, with, &req, &run_id, &step);
	tenant_here(&tc, true);
	idem_step_request_in(&store, &req, run_id, step, NULL, &result);
	d = tenant_step_result(&tc, &result);
	if (nestlevel >= 0)
		AtEOXact_GUC(true, nestlevel);
	return d;
}

/*
 * idem_citus_step(tenant <distribution type>, run_id text, step text,
 *		sql text [, VARIADIC args "any"])
 *		returns (response jsonb, replayed boolean, first_executed_at timestamptz)
 *
 * idem_step() for the tenant's run: the business statement (pinned to the
 * tenant, as idem_citus_call()'s), the step's record in idem.citus_keys
 * and the run's progress in one local transaction on the tenant's node.
 */
Datum
idem_citus_step(PG_FUNCTION_ARGS)
{
	return tenant_step(fcinfo, "idem_citus_step()", false);
}

/*
 * idem_citus_step_with(tenant <distribution type>, run_id text, step text,
 *		sql text, args text[] DEFAULT '{}', outbox_topic text DEFAULT NULL,
 *		wait boolean DEFAULT NULL)
 *		returns (response jsonb, replayed boolean, first_executed_at timestamptz)
 *
 * idem_citus_step() as idem_call() takes a step: the arguments as text
 * typed by the statement, and the options as arguments, which Citus
 * carries to the shard's node (it does not carry the session's settings).
 */
Datum
idem_citus_step_with(PG_FUNCTION_ARGS)
{
	return tenant_step(fcinfo, "idem_citus_step_with()", true);
}

/*
 * idem_citus_step_complete(tenant <distribution type>, run_id text,
 *		step text, result jsonb)
 *		returns (response jsonb, replayed boolean, first_executed_at timestamptz)
 *
 * idem_step_complete() for the tenant's run.
 */
Datum
idem_citus_step_complete(PG_FUNCTION_ARGS)
{
	const char *fname = "idem_citus_step_complete()";
	TenantCall	tc;
	IdemRunStore store;
	IdemRequest req;
	IdemResult	result;
	char	   *run_id;
	char	   *step;
	Jsonb	   *done;

	tenant_run_store(fcinfo, fname, &tc, &store);
	run_id = idem_name_arg(fcinfo, 1, IDEM_NAME_RUN_ID);
	step = idem_name_arg(fcinfo, 2, IDEM_NAME_STEP);
	idem_step_key_request(run_id, step, NULL, &req);
	done = idem_step_result_arg(fcinfo, 3, fname);
	tenant_here(&tc, true);
	idem_step_complete_in(&store, &req, run_id, step, NULL, done, &result);
	PG_RETURN_DATUM(tenant_step_result(&tc, &result));
}

/*
 * Whose run a tenant run function names: argument argno (owner), by
 * idem_run_owner_arg()'s rule, or the caller's key owner.  A function made
 * by a colocation declared before the argument existed has fewer
 * arguments, until the colocation is declared again.
 */
static Oid
tenant_run_owner(FunctionCallInfo fcinfo, int argno, IdemRunOp op)
{
	if (PG_NARGS() <= argno)
		return idem_key_owner();
	return idem_run_owner_arg(fcinfo, argno, op);
}

/*
 * idem_citus_run_status(tenant <distribution type>, run_id text,
 *		owner regrole DEFAULT NULL)
 *		returns (status, next_step, steps_done, steps_total, started_at,
 *		finished_at, last_error, input)
 *
 * idem_run_status()'s row for the tenant's run; ID404 if the role has
 * none under (tenant, run_id).
 */
Datum
idem_citus_run_status(PG_FUNCTION_ARGS)
{
	const char *fname = "idem_citus_run_status()";
	TenantCall	tc;
	char	   *run_id;
	Oid			owner;
	IdemRunRow	run;
	TupleDesc	tupdesc;
	Datum		values[8];
	bool		nulls[8];
	Datum		result;
	MemoryContext old;

	tenant_arg(fcinfo, fname, &tc);
	run_id = idem_name_arg(fcinfo, 1, IDEM_NAME_RUN_ID);
	owner = tenant_run_owner(fcinfo, 2, IDEM_RUN_OP_READ);
	if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");
	tenant_here(&tc, true);
	if (!lookup_tenant_run(&tc, owner, run_id, &run, true))
		idem_report_run_not_found(run_id);
	old = MemoryContextSwitchTo(tc.callercxt);
	idem_run_status_values(&run, values, nulls);
	result = HeapTupleGetDatum(heap_form_tuple(BlessTupleDesc(tupdesc),
											   values, nulls));
	MemoryContextSwitchTo(old);
	SPI_finish();
	PG_RETURN_DATUM(result);
}

/*
 * idem_citus_run_steps(tenant <distribution type>, run_id text,
 *		owner regrole DEFAULT NULL)
 *		returns setof (ordinal, step, state, response, executed_at,
 *		attempts, step_key)
 *
 * idem_run_steps()'s rows for the tenant's run, its steps' records read
 * on the tenant's shard as its row is; ID404 if the role has no run under
 * (tenant, run_id).
 */
Datum
idem_citus_run_steps(PG_FUNCTION_ARGS)
{
	const char *fname = "idem_citus_run_steps()";
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	TenantCall	tc;
	IdemRunStore store;
	char	   *run_id;
	Oid			owner;
	IdemRunRow	run;

	tenant_arg(fcinfo, fname, &tc);
	run_id = idem_name_arg(fcinfo, 1, IDEM_NAME_RUN_ID);
	owner = tenant_run_owner(fcinfo, 2, IDEM_RUN_OP_READ);
	InitMaterializedSRF(fcinfo, 0);
	tenant_here(&tc, true);
	if (!lookup_tenant_run(&tc, owner, run_id, &run, true))
		idem_report_run_not_found(run_id);
	store = tenant_store;
	store.arg = &tc;
	idem_run_steps_rows(&store, rsinfo, &run);
	SPI_finish();
	return (Datum) 0;
}

/*
 * A run verb on the tenant's run (argument 1) of the role, or of the
 * owner an administrator names (the last argument): fail, resume,
 * complete or cancel, with the reason in argument 2 for fail and cancel.
 * Returns the run's status.
 */
static Datum
tenant_run_verb(FunctionCallInfo fcinfo, const char *verb, IdemRunOp op)
{
	const char *fname = psprintf("idem_citus_run_%s()", verb);
	bool		reasoned = op == IDEM_RUN_OP_FAIL || op == IDEM_RUN_OP_CANCEL;
	TenantCall	tc;
	IdemRunStore store;
	char	   *run_id;
	Oid			owner;
	char	   *status;
	Datum		result;
	MemoryContext old;

	tenant_run_store(fcinfo, fname, &tc, &store);
	run_id = idem_name_arg(fcinfo, 1, IDEM_NAME_RUN_ID);
	owner = tenant_run_owner(fcinfo, reasoned ? 3 : 2, op);
	tenant_here(&tc, true);
	if (op == IDEM_RUN_OP_CANCEL)
		status = idem_run_cancel_in(&store, owner, run_id,
									PG_ARGISNULL(2) ? NULL :
									text_to_cstring(PG_GETARG_TEXT_PP(2)),
									false);
	else
		status = idem_run_set_status_in(&store, fcinfo, verb, owner, run_id, 2);
	old = MemoryContextSwitchTo(tc.callercxt);
	result = PointerGetDatum(cstring_to_text(status));
	MemoryContextSwitchTo(old);
	SPI_finish();
	return result;
}

/*
 * idem_citus_run_fail(tenant <distribution type>, run_id text, reason text,
 *		owner regrole DEFAULT NULL) returns text
 */
Datum
idem_citus_run_fail(PG_FUNCTION_ARGS)
{
	return tenant_run_verb(fcinfo, "fail", IDEM_RUN_OP_FAIL);
}

/*
 * idem_citus_run_resume(tenant <distribution type>, run_id text,
 *		owner regrole DEFAULT NULL) returns text
 */
Datum
idem_citus_run_resume(PG_FUNCTION_ARGS)
{
	return tenant_run_verb(fcinfo, "resume", IDEM_RUN_OP_RESUME);
}

/*
 * idem_citus_run_complete(tenant <distribution type>, run_id text,
 *		owner regrole DEFAULT NULL) returns text
 */
Datum
idem_citus_run_complete(PG_FUNCTION_ARGS)
{
	return tenant_run_verb(fcinfo, "complete", IDEM_RUN_OP_COMPLETE);
}

/*
 * idem_citus_run_cancel(tenant <distribution type>, run_id text,
 *		reason text DEFAULT NULL, owner regrole DEFAULT NULL) returns text
 */
Datum
idem_citus_run_cancel(PG_FUNCTION_ARGS)
{
	return tenant_run_verb(fcinfo, "cancel", IDEM_RUN_OP_CANCEL);
}
