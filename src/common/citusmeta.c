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
#include "catalog/namespace.h"
#include "catalog/pg_namespace.h"
#include "utils/fmgroids.h"
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
