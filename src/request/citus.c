/*-------------------------------------------------------------------------
 *
 * citus.c
 *		idem under Citus: whether Citus is installed, where idem's tenant
 *		key records are (idem.citus_keys, made by idem_citus_colocate() in
 *		workflow/tenant.c), and the refusal of a call whose business
 *		statement Citus distributed.
 *
 * idem_execute() records its key on the node it runs on.  Under Citus a
 * statement that writes a distributed table runs on other nodes in a
 * distributed transaction, which commits apart from that key record (in
 * one phase: a lost reply from a worker, and the retry executes again).
 * Such a call is refused (IDC02) before anything is recorded, so its
 * transaction aborts everywhere.  Whether the transaction has a part on
 * another node is Citus's own state: its list of the connections on which
 * it opened a remote transaction (InProgressTransactions), looked up in
 * Citus's library at the first use.  Citus exports it and there is no SQL
 * equivalent; a statement that Citus executes on a local shard adds none.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/citus.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "commands/extension.h"
#include "fmgr.h"
#include "lib/ilist.h"
#include "nodes/makefuncs.h"
#include "utils/datum.h"
#include "utils/memutils.h"
#include "utils/guc.h"
#include "utils/lsyscache.h"

#include "compat.h"
#include "request/request.h"

/*
 * Citus's InProgressTransactions: the connections to other nodes on which
 * this transaction opened a remote transaction, once looked up.
 */
static dlist_head *citus_remote_transactions = NULL;

/*
 * Citus's AllowedDistributionColumn (distributed/transaction_management.h,
 * the same in Citus 13 and 14): the distribution value a force-delegated
 * function is pinned to.  While it is active, Citus refuses a statement on
 * a distributed table that is not filtered by that value in that
 * colocation group.
 */
typedef struct CitusAllowedValue
{
	Const	   *distributionColumnValue;
	uint32		colocationId;
	bool		isActive;
	int			executorLevel;
} CitusAllowedValue;

static CitusAllowedValue *citus_allowed_value = NULL;
static int *citus_executor_level = NULL;

static bool citus_loaded(void);

/* Citus's CitusHasBeenLoaded(), once looked up */
static bool (*citus_has_been_loaded) (void) = NULL;

/*
 * idem_citus_present
 *		Whether Citus is installed in this database (and so loaded: it
 *		refuses CREATE EXTENSION unless preloaded).
 *
 * Where Citus's library is loaded, Citus's own answer, which it keeps
 * until an invalidation (CREATE, ALTER or DROP EXTENSION citus) and so
 * costs no scan of pg_extension per call; it is also false while the
 * extension's script runs, when Citus's catalog is not complete yet.
 */
bool
idem_citus_present(void)
{
	if (!citus_loaded())
		return OidIsValid(get_extension_oid("citus", true));
	if (citus_has_been_loaded == NULL)
		citus_has_been_loaded = (bool (*) (void))
			load_external_function("citus", "CitusHasBeenLoaded", true, NULL);
	return citus_has_been_loaded();
}

/*
 * idem_citus_require
 *		IDC01 unless Citus is installed in this database.
 */
void
idem_citus_require(const char *fname)
{
	if (!idem_citus_present())
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_NOT_COLOCATED),
				 errmsg("%s needs Citus", fname),
				 errdetail("The citus extension is not installed in this database."),
				 idem_errhint(ERRCODE_IDEM_CITUS_NOT_COLOCATED, "Without Citus, use idem_execute() or idem_call().")));
}

/*
 * idem_citus_keys_relid
 *		idem.citus_keys, or InvalidOid before idem_citus_colocate().
 */
Oid
idem_citus_keys_relid(void)
{
	Oid			nsp = get_namespace_oid("idem", true);

	return OidIsValid(nsp) ? get_relname_relid("citus_keys", nsp) : InvalidOid;
}

/*
 * Whether Citus's library is loaded in this backend.  It must be preloaded
 * (shared_preload_libraries) and cannot be loaded later, so the answer
 * found at the first call holds for the backend's life; one GUC lookup.
 */
static bool
citus_loaded(void)
{
	static int	loaded = -1;

	if (loaded < 0)
		loaded = GetConfigOption("citus.node_conninfo", true, false) != NULL;
	return loaded == 1;
}

/*
 * idem_citus_in_distributed_transaction
 *		Whether this transaction has a part on another node, through Citus
 *		(false without Citus).  Statements Citus executes on a local shard
 *		have none.
 */
bool
idem_citus_in_distributed_transaction(void)
{
	if (!citus_loaded())
		return false;
	if (citus_remote_transactions == NULL)
		citus_remote_transactions = (dlist_head *) (void *)
			load_external_function("citus", "InProgressTransactions", true, NULL);
	return !dlist_is_empty(citus_remote_transactions);
}

/*
 * idem_citus_pin_tenant
 *		Pin the next statement Citus executes in this backend to the
 *		tenant's distribution value in the given colocation group, as Citus
 *		pins a force-delegated function in a transaction block: a statement
 *		on any other value, on several shards or on a table of another
 *		group fails with Citus's "queries must filter by the distribution
 *		argument" (0A000).  Citus unpins when that statement's execution
 *		ends.  Nothing to do if Citus pinned the call already.
 */
void
idem_citus_pin_tenant(Oid type, Datum value, uint32 colocation)
{
	MemoryContext old;
	int16		typlen;
	bool		typbyval;

	if (citus_allowed_value == NULL)
	{
		citus_allowed_value = (CitusAllowedValue *) (void *)
			load_external_function("citus", "AllowedDistributionColumnValue", true, NULL);
		citus_executor_level = (int *) (void *)
			load_external_function("citus", "ExecutorLevel", true, NULL);
	}
	if (citus_allowed_value->isActive)
		return;
	get_typlenbyval(type, &typlen, &typbyval);
	/* Citus frees it, in its transaction's context */
	old = MemoryContextSwitchTo(TopTransactionContext);
	citus_allowed_value->distributionColumnValue =
		makeConst(type, -1, get_typcollation(type), typlen,
				  datumCopy(value, typbyval, typlen), false, typbyval);
	MemoryContextSwitchTo(old);
	citus_allowed_value->colocationId = colocation;
	citus_allowed_value->executorLevel = *citus_executor_level;
	citus_allowed_value->isActive = true;
}

/*
 * idem_citus_check_confined
 *		After a business statement ran, for a record on this node (a key, a
 *		step): IDC02 if Citus opened a distributed transaction for it, whose
 *		commit on the other nodes would be apart from the record's
 *		(one-phase: a lost reply, and the retry executes again).  The
 *		statement runner (exec.c) asks it after every business statement,
 *		so no path records one that Citus distributed.
 */
void
idem_citus_check_confined(void)
{
	if (!idem_citus_in_distributed_transaction())
		return;
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_CITUS_NOT_LOCAL),
			 errmsg("idem cannot record a statement that Citus distributes"),
			 errdetail("Citus opened a distributed transaction for the statement: its write would commit on other nodes apart from idem's record on this one."),
			 idem_errhint(ERRCODE_IDEM_CITUS_NOT_LOCAL, "Declare the tenant's colocation with idem_citus_colocate() and call idem_citus_call(tenant, key, sql, ...).")));
}

