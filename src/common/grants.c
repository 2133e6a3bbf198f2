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
#include "utils/acl.h"
#include "utils/array.h"

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
 * idem_roles_arg
 *		A regrole[] argument: not null, one dimension, no null element.
 */
Datum
idem_roles_arg(FunctionCallInfo fcinfo, int argno, const char *name)
{
	ArrayType  *arr;

	idem_arg_not_null(fcinfo, argno, name);
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1 || array_contains_nulls(arr))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must be a one-dimensional array without nulls", name),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	return PointerGetDatum(arr);
}
