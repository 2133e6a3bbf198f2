/*-------------------------------------------------------------------------
 *
 * grants.c
 *		Role lists that grant the use of a named object (outbox topics'
 *		publishers and consumers, run queues' producers, workers and
 *		signallers): the membership test and the check of a list argument.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/grants.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "miscadmin.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/syscache.h"

#include "common/common.h"

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
