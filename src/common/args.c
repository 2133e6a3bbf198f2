/*-------------------------------------------------------------------------
 *
 * args.c
 *		Checks every SQL-callable function of idem makes of its arguments
 *		before it writes: a transaction that may write, names within
 *		idem's limits, batch sizes.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/args.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "fmgr.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/builtins.h"

#include "common/common.h"

/*
 * idem_check_can_write
 *		Refuse a call that writes (what names it) where nothing can be
 *		written: during recovery, in a read-only transaction or in parallel
 *		mode.  Left to the write itself, the error would name the statement
 *		idem runs on its own tables, not the call.
 */
void
idem_check_can_write(const char *what)
{
	PreventCommandDuringRecovery(what);
	PreventCommandIfReadOnly(what);
	PreventCommandIfParallelMode(what);
}

/*
 * idem_check_name
 *		A name idem keeps (key, run id, step, topic, consumer): not empty, at
 *		most limit bytes.  what names it in messages; hint, if not NULL, says
 *		what to do about a name that is too long.
 */
void
idem_check_name(const char *what, const char *name, int limit, const char *hint)
{
	size_t		len = strlen(name);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", what),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	if (len > limit)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", what),
				 errdetail("The %s is %zu bytes long; the limit is %d bytes.",
						   what, len, limit),
				 idem_errhint(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, hint)));
}

/*
 * idem_check_error_text
 *		A failure's text as a consumer or a worker reports it (an event's
 *		or a run's last error), kept in the row and shown in the views: at
 *		most IDEM_MAX_ERROR_BYTES, or 22001.
 */
void
idem_check_error_text(const char *what, const char *text)
{
	size_t		len = strlen(text);

	if (len > IDEM_MAX_ERROR_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 errmsg("%s is too long", what),
				 errdetail("The %s is %zu bytes long; the limit is %d bytes.",
						   what, len, IDEM_MAX_ERROR_BYTES),
				 idem_errhint(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, "Report a summary; the whole error belongs in the worker's log.")));
}

/*
 * idem_arg_not_null
 *		Refuse a null argument argno of the callers that name it by a
 *		variable (idem_name_arg()'s "idempotency key", "run id"); a fixed
 *		subject is spelt out in its caller's own message.
 */
void
idem_arg_not_null(FunctionCallInfo fcinfo, int argno, const char *what)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", what),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
}

/*
 * idem_name_arg
 *		A key, run id or step name argument: not null, not empty, at most
 *		IDEM_MAX_KEY_BYTES.  what names it in messages ("idempotency key").
 */
char *
idem_name_arg(FunctionCallInfo fcinfo, int argno, const char *what)
{
	char	   *name;

	idem_arg_not_null(fcinfo, argno, what);

	name = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	idem_check_name(what, name, IDEM_MAX_KEY_BYTES,
					"Build long names with idem_key(), which hashes what does not fit.");
	return name;
}

/*
 * idem_purge_batch_arg
 *		The batch_size argument of a purge function (fname), checked, once
 *		the transaction is known to be able to write.
 */
int32
idem_purge_batch_arg(FunctionCallInfo fcinfo, const char *fname)
{
	int32		batch_size = PG_GETARG_INT32(0);

	if (batch_size <= 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("batch_size must be greater than zero"),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	idem_check_can_write(fname);
	return batch_size;
}

/*
 * idem_run_purge_batch
 *		How many runs one purge transaction removes, for a purge of
 *		batch_size rows: each run keeps its lock until the commit, one slot
 *		of the shared lock table, which holds max_locks_per_transaction of
 *		them per connection.  More would take other sessions' share, and a
 *		batch beyond the table would fail with 53200, every time.
 */
int
idem_run_purge_batch(int batch_size)
{
	return Max(1, Min(batch_size, max_locks_per_xact));
}

/*
 * idem_check_variadic_list
 *		Refuse an array passed for a list of the given kind that has more
 *		than one dimension, or more than IDEM_MAX_ARGS elements.
 *		Flattened, ARRAY[[1, 2], [3, 4]] would be the same request as
 *		ARRAY[1, 2, 3, 4], its shape lost.  The bound comes before anything
 *		is unpacked, so a huge array costs nothing beyond itself; hint says
 *		how to pass a longer list.
 */
void
idem_check_variadic_list(ArrayType *arr, IdemListKind kind, const char *hint)
{
	int			nitems;

	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_ARRAY_SUBSCRIPT_ERROR),
				 kind == IDEM_LIST_ARGUMENTS ?
				 errmsg("arguments passed as an array must be a one-dimensional array") :
				 errmsg("key parts passed as an array must be a one-dimensional array"),
				 errdetail("The array has %d dimensions.", ARR_NDIM(arr)),
				 idem_errhint(ERRCODE_ARRAY_SUBSCRIPT_ERROR, "Pass a multidimensional array as one argument, without VARIADIC.")));
	nitems = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
	if (nitems > IDEM_MAX_ARGS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 kind == IDEM_LIST_ARGUMENTS ?
				 errmsg("too many arguments") :
				 errmsg("too many key parts"),
				 kind == IDEM_LIST_ARGUMENTS ?
				 errdetail("The array holds %d arguments; a statement takes at most %d.",
						   nitems, IDEM_MAX_ARGS) :
				 errdetail("The array holds %d key parts; a key takes at most %d.",
						   nitems, IDEM_MAX_ARGS),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, hint)));
}
