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
 * transaction aborts everywhere.  Whether the statement opened a
 * distributed transaction is Citus's own state, InCoordinatedTransaction(),
 * looked up in Citus's library at the first use: Citus exports it, and
 * there is no SQL equivalent.
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
#include "utils/guc.h"
#include "utils/lsyscache.h"

#include "compat.h"
#include "request/request.h"

typedef bool (*citus_bool_fn) (void);

/* Citus's InCoordinatedTransaction(), once looked up */
static citus_bool_fn in_coordinated_transaction = NULL;

/*
 * idem_citus_present
 *		Whether Citus is installed in this database (and so loaded: it
 *		refuses CREATE EXTENSION unless preloaded).
 */
bool
idem_citus_present(void)
{
	return OidIsValid(get_extension_oid("citus", true));
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
 *		Whether Citus opened a distributed transaction in this one (false
 *		without Citus).
 */
bool
idem_citus_in_distributed_transaction(void)
{
	if (!citus_loaded())
		return false;
	if (in_coordinated_transaction == NULL)
		in_coordinated_transaction = (citus_bool_fn)
			load_external_function("citus", "InCoordinatedTransaction", true, NULL);
	return in_coordinated_transaction();
}

/*
 * idem_citus_check_confined
 *		After a business statement ran under a key recorded on this node:
 *		IDC02 if Citus opened a distributed transaction for it, whose
 *		commit on the other nodes would be apart from the key record's
 *		(one-phase: a lost reply, and the retry executes again).
 */
void
idem_citus_check_confined(const char *fname, bool tenant_call)
{
	if (!idem_citus_in_distributed_transaction())
		return;
	if (tenant_call)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_NOT_LOCAL),
				 errmsg("the statement passed to %s reached beyond the tenant's shard", fname),
				 errdetail("Citus opened a distributed transaction for it: it touched another node or another tenant's shard, so its write could not commit with the key record."),
				 idem_errhint(ERRCODE_IDEM_CITUS_NOT_LOCAL, "Filter every distributed table the statement reads or writes by the tenant's distribution value, in tables co-located with idem's.")));
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_CITUS_NOT_LOCAL),
			 errmsg("%s cannot record a statement that Citus distributes", fname),
			 errdetail("Citus opened a distributed transaction for the statement: its write would commit on other nodes apart from the key record on this one."),
			 idem_errhint(ERRCODE_IDEM_CITUS_NOT_LOCAL, "Declare the tenant's colocation with idem_citus_colocate() and call idem_citus_call(tenant, key, sql, ...).")));
}

