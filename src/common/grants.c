/*-------------------------------------------------------------------------
 *
 * grants.c
 *		Role lists that grant the use of a named object (outbox topics'
 *		publishers and consumers, run queues' producers, workers and
 *		signallers): the membership test, the check of a list argument and
 *		the removal of dropped roles from the lists (and of their runs);
 *		and the role idem_admin, whose members act on every role's runs.
 *
 * idem_admin is found by name, and CREATE ROLE needs only CREATEROLE: a
 * role of that name made before the extension, or after an administrator
 * dropped it, may be someone's way to every role's runs.  It counts only
 * while it cannot log in and only superusers have granted or administer
 * it; otherwise it grants nothing, and an install refuses it.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/grants.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_auth_members.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/catcache.h"
#include "utils/syscache.h"

#include "common/common.h"

PG_FUNCTION_INFO_V1(idem_admin_role_check);

/*
 * idem_role_in
 *		Whether role has the privileges of a role in array (regrole[]):
 *		membership counts, as for a GRANT.
 */
bool
idem_role_in(Oid role, Datum array)
{
	ArrayType  *arr = DatumGetArrayTypeP(array);
	Datum	   *elems;
	bool	   *nulls;
	int			n;

	deconstruct_array(arr, REGROLEOID, sizeof(Oid), true, TYPALIGN_INT,
					  &elems, &nulls, &n);
	for (int i = 0; i < n; i++)
	{
		if (!nulls[i] && has_privs_of_role(role, DatumGetObjectId(elems[i])))
			return true;
	}
	return false;
}

/*
 * idem_check_role_exists
 *		42704 unless role is a role.  A regrole argument accepts any OID
 *		(0::regrole, 12345::regrole); a list that kept one would grant its
 *		privilege to whatever role is created with that OID later.
 */
void
idem_check_role_exists(Oid role)
{
	if (!SearchSysCacheExists1(AUTHOID, ObjectIdGetDatum(role)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("role with OID %u does not exist", role),
				 idem_errhint(ERRCODE_UNDEFINED_OBJECT, "Name an existing role.")));
}

/*
 * idem_roles_arg
 *		A regrole[] argument: not null, one dimension, no null element,
 *		every element a role.  Returns it with each role once, in the order
 *		of its first appearance, as idem_queue_grant() and
 *		idem_outbox_grant() keep a list: a role listed many times would
 *		make every membership test of the list read it as many times.
 */
Datum
idem_roles_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	ArrayType  *arr;
	Datum	   *roles;
	Oid		   *sorted;
	bool	   *kept;
	int			n;
	int			nsorted = 0;
	int			nkept = 0;

	idem_arg_not_null(fcinfo, argno, name);
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 errmsg("%s must be a one-dimensional array", name),
				 idem_errhint(ERRCODE_ARRAY_SUBSCRIPT_ERROR, NULL)));
	if (array_contains_nulls(arr))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not contain nulls", name),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	deconstruct_array(arr, REGROLEOID, sizeof(Oid), true, TYPALIGN_INT,
					  &roles, NULL, &n);
	sorted = palloc(Max(n, 1) * sizeof(Oid));
	for (int i = 0; i < n; i++)
		sorted[i] = DatumGetObjectId(roles[i]);
	qsort(sorted, n, sizeof(Oid), oid_cmp);
	for (int i = 0; i < n; i++)
	{
		CHECK_FOR_INTERRUPTS();
		if (nsorted == 0 || sorted[nsorted - 1] != sorted[i])
		{
			idem_check_role_exists(sorted[i]);
			sorted[nsorted++] = sorted[i];
		}
	}
	if (nsorted == n)
		return PointerGetDatum(arr);

	kept = palloc0(nsorted * sizeof(bool));
	for (int i = 0; i < n; i++)
	{
		Oid			role = DatumGetObjectId(roles[i]);
		Oid		   *at = bsearch(&role, sorted, nsorted, sizeof(Oid), oid_cmp);
		int			k = at - sorted;

		if (!kept[k])
		{
			kept[k] = true;
			roles[nkept++] = roles[i];
		}
	}
	return PointerGetDatum(construct_array(roles, nkept, REGROLEOID,
										   sizeof(Oid), true, TYPALIGN_INT));
}

/*
 * The registries' lists without the roles that no longer exist, in their
 * order; and whether a list names one.
 */
#define KEPT_ROLES(col) \
	"ARRAY(SELECT u.r FROM pg_catalog.unnest(" col ") WITH ORDINALITY AS u(r, n)" \
	" WHERE EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) u.r)" \
	" ORDER BY u.n)"
#define NAMES_DROPPED(col) \
	"EXISTS (SELECT FROM pg_catalog.unnest(" col ") AS u(r)" \
	" WHERE NOT EXISTS (SELECT FROM pg_catalog.pg_roles a WHERE a.oid OPERATOR(pg_catalog.=) u.r))"
#define TOPIC_LISTS_NAME_DROPPED \
	NAMES_DROPPED("t.publishers") " OR " NAMES_DROPPED("t.consumers")
#define QUEUE_LISTS_NAME_DROPPED \
	NAMES_DROPPED("q.producers") " OR " NAMES_DROPPED("q.workers") \
	" OR " NAMES_DROPPED("q.signallers")

static IdemQuery q_topics_dropped = {
	"SELECT FROM idem.outbox_topics t WHERE " TOPIC_LISTS_NAME_DROPPED " LIMIT 1"
};

static IdemQuery q_topics_forget = {
	"UPDATE idem.outbox_topics t"
	"   SET publishers = " KEPT_ROLES("t.publishers") ","
	"       consumers = " KEPT_ROLES("t.consumers")
	" WHERE " TOPIC_LISTS_NAME_DROPPED
};

static IdemQuery q_queues_dropped = {
	"SELECT FROM idem.queues q WHERE " QUEUE_LISTS_NAME_DROPPED " LIMIT 1"
};

static IdemQuery q_queues_forget = {
	"UPDATE idem.queues q"
	"   SET producers = " KEPT_ROLES("q.producers") ","
	"       workers = " KEPT_ROLES("q.workers") ","
	"       signallers = " KEPT_ROLES("q.signallers")
	" WHERE " QUEUE_LISTS_NAME_DROPPED
};

/* Take the dropped roles out of one registry's lists; whether it named any. */
static bool
forget_dropped_in(Oid relid, IdemQuery *probe, IdemQuery *update)
{
	IdemOwnerSPI spi;
	bool		found;

	idem_owner_spi_begin(&spi, relid);
	idem_query_run(probe, NULL, NULL, 1);
	/*
	 * Only then written: the registry's trigger makes every backend read
	 * the registry again after any UPDATE, one that changes nothing too
	 */
	found = SPI_processed > 0;
	if (found)
		idem_query_run(update, NULL, NULL, 0);
	idem_owner_spi_end(&spi);
	return found;
}

/*
 * The runs of dropped roles, with their steps' records, signals and
 * attempts, at most limit of them: idem_run_purge() with no finished run
 * old enough, as the extension's owner (the caller of idem_purge() need
 * not have been granted it).  Returns how many.
 */
static int64
purge_dropped_runs(int limit)
{
	IdemOwnerSPI spi;
	bool		isnull;
	int64		n;

	idem_owner_spi_begin(&spi, idem_catalog_runs());
	if (SPI_execute(psprintf("SELECT %s.idem_run_purge('-infinity', %d)",
							 idem_extension_schema(), limit),
					false, 1) != SPI_OK_SELECT || SPI_processed != 1)
		elog(ERROR, "idem_run_purge() failed");
	n = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
									SPI_tuptable->tupdesc, 1, &isnull));
	idem_owner_spi_end(&spi);
	return isnull ? 0 : n;
}

/*
 * idem_forget_dropped_roles
 *		Take the roles that no longer exist out of the topics' and queues'
 *		role lists, and remove up to idem_run_purge_batch(batch_size) of
 *		their runs; return how many registries changed and runs went.
 *		Needs a transaction with a snapshot.
 *
 * DROP ROLE cannot see these (a regrole records no dependency), so a
 * dropped role's OID stays in them, and would give its privileges and its
 * runs (their input, their steps' results) to whichever role gets that OID
 * later: after the OID counter wraps around, or in the cluster a dump is
 * restored into, since pg_dump writes a role that no longer exists as its
 * number.  idem_purge() and the purge worker call this, as they remove a
 * dropped role's key records; idem.run_retention does not hold these runs
 * back.  The lists are short and go at once; a dropped role may have had
 * any number of runs, each locked until the commit, so they go in
 * batches, as idem_run_purge() removes runs.
 */
int64
idem_forget_dropped_roles(int batch_size)
{
	Oid			pkey;
	int64		changed = 0;

	changed += forget_dropped_in(idem_catalog_outbox_topics(&pkey),
								 &q_topics_dropped, &q_topics_forget);
	changed += forget_dropped_in(idem_catalog_queues(&pkey),
								 &q_queues_dropped, &q_queues_forget);
	if (idem_runs_of_dropped_roles())
		changed += purge_dropped_runs(idem_run_purge_batch(batch_size));
	return changed;
}

/*
 * Why the role idem_admin (role) cannot be trusted, or NULL if it can.
 */
static char *
admin_role_distrust(Oid role)
{
	HeapTuple	tup;
	CatCList   *members;
	char	   *why = NULL;

	tup = SearchSysCache1(AUTHOID, ObjectIdGetDatum(role));
	if (!HeapTupleIsValid(tup))
		return NULL;
	if (((Form_pg_authid) GETSTRUCT(tup))->rolcanlogin)
		why = pstrdup("The role can log in.");
	ReleaseSysCache(tup);
	if (why != NULL)
		return why;

	members = SearchSysCacheList1(AUTHMEMROLEMEM, ObjectIdGetDatum(role));
	for (int i = 0; i < members->n_members && why == NULL; i++)
	{
		Form_pg_auth_members m =
			(Form_pg_auth_members) GETSTRUCT(&members->members[i]->tuple);

		/* a dropped grantor (possible before PostgreSQL 16) is no superuser */
		if (m->admin_option && !superuser_arg(m->member))
			why = psprintf("Role \"%s\" administers it and is not a superuser.",
						   GetUserNameFromId(m->member, false));
		else if (!superuser_arg(m->grantor))
			why = psprintf("Role \"%s\" was granted it by a role that is not a superuser.",
						   GetUserNameFromId(m->member, false));
	}
	ReleaseSysCacheList(members);
	return why;
}

/*
 * idem_admin_role
 *		The role idem_admin, or InvalidOid when there is none or it cannot
 *		be trusted (see the file header).
 */
Oid
idem_admin_role(void)
{
	Oid			role = get_role_oid("idem_admin", true);

	if (!OidIsValid(role) || admin_role_distrust(role) != NULL)
		return InvalidOid;
	return role;
}

/*
 * idem_admin_role_check() returns void
 *
 * Called by the install script when a role idem_admin exists already:
 * refuses to adopt one that cannot be trusted (55000).
 */
Datum
idem_admin_role_check(PG_FUNCTION_ARGS)
{
	Oid			role = get_role_oid("idem_admin", true);
	char	   *why = OidIsValid(role) ? admin_role_distrust(role) : NULL;

	if (why != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("role \"idem_admin\" exists and cannot be trusted"),
				 errdetail_internal("%s", why),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
							  "Its members act on every role's runs, so only superusers may grant or administer it, and it may not log in. Drop the role, or revoke what a role other than a superuser granted or holds, and try again.")));
	PG_RETURN_VOID();
}
