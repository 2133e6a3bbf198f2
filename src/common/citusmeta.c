/*-------------------------------------------------------------------------
 *
 * citusmeta.c
 *		Citus's catalog tables (pg_dist_partition, pg_dist_placement,
 *		pg_dist_local_group), read directly: whether Citus has taken one of
 *		idem's own tables over, where a tenant's shard is, and whether this
 *		node is the coordinator.
 *
 * Those tables have no syscache, and going through Citus's SQL functions
 * would plan a query per read; an index scan with a catalog snapshot is
 * what Citus itself does.  Nothing here needs Citus's library: without
 * Citus the tables do not exist and the answers are "no".
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/citusmeta.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "catalog/pg_namespace.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"

#include "common/common.h"

/*
 * idem_citus_catalog_scan
 *		A scan of one of Citus's catalog tables in pg_catalog, by column
 *		keycol through index (or all rows, without one).  Without out,
 *		whether a row has column col equal to want; with it, the first
 *		row's col into *out.  Both integer columns.
 */
bool
idem_citus_catalog_scan(const char *table, const char *index,
						const char *keycol, RegProcedure eq, Datum key,
						const char *col, uint32 want, uint32 *out)
{
	Oid			relid = get_relname_relid(table, PG_CATALOG_NAMESPACE);
	Oid			indexid = index ? get_relname_relid(index, PG_CATALOG_NAMESPACE) : InvalidOid;
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData skey;
	HeapTuple	tup;
	AttrNumber	attnum;
	bool		found = false;

	if (!OidIsValid(relid) || (index != NULL && !OidIsValid(indexid)))
		elog(ERROR, "Citus catalog table \"%s\" or its index is missing", table);
	rel = table_open(relid, AccessShareLock);
	attnum = get_attnum(relid, col);
	if (attnum == InvalidAttrNumber)
		elog(ERROR, "Citus catalog table \"%s\" has no column \"%s\"", table, col);
	if (index != NULL)
		ScanKeyInit(&skey, get_attnum(relid, keycol), BTEqualStrategyNumber,
					eq, key);
	scan = systable_beginscan(rel, indexid, index != NULL, NULL,
							  index != NULL ? 1 : 0, &skey);
	while (!found && HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, attnum, RelationGetDescr(rel), &isnull);

		if (isnull)
			continue;
		if (out != NULL)
		{
			*out = DatumGetUInt32(d);
			found = true;
		}
		else
			found = DatumGetUInt32(d) == want;
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return found;
}

/*
 * idem_citus_owns
 *		Whether Citus lists relid among its tables (distributed, reference
 *		or Citus local).  Citus invalidates such a table's relcache entry
 *		when it takes it over or gives it back.
 */
bool
idem_citus_owns(Oid relid)
{
	uint32		colocation;

	if (!OidIsValid(get_relname_relid("pg_dist_partition", PG_CATALOG_NAMESPACE)))
		return false;
	return idem_citus_catalog_scan("pg_dist_partition",
								   "pg_dist_partition_logical_relid_index",
								   "logicalrelid", F_OIDEQ,
								   ObjectIdGetDatum(relid), "colocationid", 0,
								   &colocation);
}

/*
 * idem_citus_coordinator
 *		Whether this database is a Citus coordinator: its node's group is
 *		group 0.
 */
bool
idem_citus_coordinator(void)
{
	if (!OidIsValid(get_relname_relid("pg_dist_local_group", PG_CATALOG_NAMESPACE)))
		return false;
	return idem_citus_catalog_scan("pg_dist_local_group", NULL, NULL,
								   InvalidOid, 0, "groupid", 0, NULL);
}

static int
shardid_cmp(const ListCell *a, const ListCell *b)
{
	int64		x = *(int64 *) lfirst(a);
	int64		y = *(int64 *) lfirst(b);

	return x < y ? -1 : x > y ? 1 : 0;
}

/*
 * idem_citus_shard_local
 *		Whether Citus places shardid on this node's group.
 */
bool
idem_citus_shard_local(int64 shardid)
{
	uint32		group = 0;

	if (!idem_citus_catalog_scan("pg_dist_local_group", NULL, NULL,
								 InvalidOid, 0, "groupid", 0, &group))
		return false;
	return idem_citus_catalog_scan("pg_dist_placement",
								   "pg_dist_placement_shardid_index",
								   "shardid", F_INT8EQ, Int64GetDatum(shardid),
								   "groupid", group, NULL);
}

/*
 * idem_citus_local_shards
 *		The shards of the distributed table relid that Citus places on this
 *		node's group, as palloc'd int64s in ascending order (so that every
 *		backend locks them in one order).  Each read sees Citus's catalog as
 *		committed now: its tables have no syscache, so every scan takes a
 *		new catalog snapshot.
 */
List *
idem_citus_local_shards(Oid relid)
{
	Oid			shard_rel = get_relname_relid("pg_dist_shard", PG_CATALOG_NAMESPACE);
	Oid			shard_idx = get_relname_relid("pg_dist_shard_logical_relid_index",
											  PG_CATALOG_NAMESPACE);
	Relation	rel;
	SysScanDesc scan;
	ScanKeyData skey;
	HeapTuple	tup;
	AttrNumber	attnum;
	List	   *all = NIL;
	List	   *here = NIL;
	ListCell   *lc;

	if (!OidIsValid(shard_rel) || !OidIsValid(shard_idx))
		return NIL;
	rel = table_open(shard_rel, AccessShareLock);
	attnum = get_attnum(shard_rel, "shardid");
	if (attnum == InvalidAttrNumber)
		elog(ERROR, "Citus catalog table \"pg_dist_shard\" has no column \"shardid\"");
	ScanKeyInit(&skey, get_attnum(shard_rel, "logicalrelid"),
				BTEqualStrategyNumber, F_OIDEQ, ObjectIdGetDatum(relid));
	scan = systable_beginscan(rel, shard_idx, true, NULL, 1, &skey);
	while (HeapTupleIsValid(tup = systable_getnext(scan)))
	{
		bool		isnull;
		Datum		d = heap_getattr(tup, attnum, RelationGetDescr(rel), &isnull);
		int64	   *id;

		if (isnull)
			continue;
		id = palloc(sizeof(int64));
		*id = DatumGetInt64(d);
		all = lappend(all, id);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);

	foreach(lc, all)
	{
		if (idem_citus_shard_local(*(int64 *) lfirst(lc)))
			here = lappend(here, lfirst(lc));
	}
	list_free(all);
	list_sort(here, shardid_cmp);
	return here;
}

/*
 * What idem_citus_generation() watches: a few of idem's Citus tables, each
 * with the number of its present state.
 */
#define CITUS_WATCHED 4

typedef struct CitusWatched
{
	Oid			relid;
	uint64		generation;
} CitusWatched;

static CitusWatched citus_watched[CITUS_WATCHED];
static uint64 citus_generations = 0;
static bool citus_watch_callback = false;

static void
citus_relcache_changed(Datum arg, Oid relid)
{
	for (int i = 0; i < CITUS_WATCHED; i++)
	{
		if (OidIsValid(citus_watched[i].relid) &&
			(relid == InvalidOid || relid == citus_watched[i].relid))
			citus_watched[i].generation = ++citus_generations;
	}
}

/*
 * idem_citus_generation
 *		A number for the present state of the shards of the distributed
 *		table relid and of their placements, as far as this backend has
 *		processed invalidations: Citus invalidates the table's relcache
 *		entry whenever its rows in pg_dist_shard or pg_dist_placement
 *		change (triggers on its catalog), which gives it a new number.
 *		What was read of those under another number is to be read again.
 *		A number is never given twice, to any relation.
 *
 * One relcache callback serves every caller: PostgreSQL has room for ten,
 * which Citus shares.
 */
uint64
idem_citus_generation(Oid relid)
{
	int			slot = -1;

	if (!citus_watch_callback)
	{
		CacheRegisterRelcacheCallback(citus_relcache_changed, (Datum) 0);
		citus_watch_callback = true;
	}
	for (int i = 0; i < CITUS_WATCHED; i++)
	{
		if (citus_watched[i].relid == relid)
			return citus_watched[i].generation;
		if (slot < 0 && !OidIsValid(citus_watched[i].relid))
			slot = i;
	}
	if (slot < 0)
	{
		/* all taken (tables dropped and made again): forget them all */
		memset(citus_watched, 0, sizeof(citus_watched));
		slot = 0;
	}
	citus_watched[slot].relid = relid;
	citus_watched[slot].generation = ++citus_generations;
	return citus_watched[slot].generation;
}
