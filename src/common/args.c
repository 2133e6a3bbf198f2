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
 * The messages about a name of each kind, each whole, as a translation
 * needs them.
 */
static int
name_null_msg(IdemNameKind kind)
{
	switch (kind)
	{
		case IDEM_NAME_KEY:
			return errmsg("idempotency key must not be null");
		case IDEM_NAME_RUN_ID:
			return errmsg("run id must not be null");
		case IDEM_NAME_STEP:
			return errmsg("step name must not be null");
		case IDEM_NAME_EVENT:
			return errmsg("event must not be null");
		case IDEM_NAME_QUEUE:
			return errmsg("run queue must not be null");
		case IDEM_NAME_TOPIC:
			return errmsg("outbox topic must not be null");
		case IDEM_NAME_CONSUMER:
			return errmsg("consumer must not be null");
		case IDEM_NAME_WORKER:
			return errmsg("worker must not be null");
	}
	return errmsg("name must not be null");
}

static int
name_empty_msg(IdemNameKind kind)
{
	switch (kind)
	{
		case IDEM_NAME_KEY:
			return errmsg("idempotency key must not be empty");
		case IDEM_NAME_RUN_ID:
			return errmsg("run id must not be empty");
		case IDEM_NAME_STEP:
			return errmsg("step name must not be empty");
		case IDEM_NAME_EVENT:
			return errmsg("event must not be empty");
		case IDEM_NAME_QUEUE:
			return errmsg("run queue must not be empty");
		case IDEM_NAME_TOPIC:
			return errmsg("outbox topic must not be empty");
		case IDEM_NAME_CONSUMER:
			return errmsg("consumer must not be empty");
		case IDEM_NAME_WORKER:
			return errmsg("worker must not be empty");
	}
	return errmsg("name must not be empty");
}

static int
name_long_msg(IdemNameKind kind)
{
	switch (kind)
	{
		case IDEM_NAME_KEY:
			return errmsg("idempotency key is too long");
		case IDEM_NAME_RUN_ID:
			return errmsg("run id is too long");
		case IDEM_NAME_STEP:
			return errmsg("step name is too long");
		case IDEM_NAME_EVENT:
			return errmsg("event is too long");
		case IDEM_NAME_QUEUE:
			return errmsg("run queue is too long");
		case IDEM_NAME_TOPIC:
			return errmsg("outbox topic is too long");
		case IDEM_NAME_CONSUMER:
			return errmsg("consumer is too long");
		case IDEM_NAME_WORKER:
			return errmsg("worker is too long");
	}
	return errmsg("name is too long");
}

static int
name_long_detail(IdemNameKind kind, size_t len, int limit)
{
	switch (kind)
	{
		case IDEM_NAME_KEY:
			return errdetail_plural("The idempotency key is %zu byte long; the limit is %d bytes.",
									"The idempotency key is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
		case IDEM_NAME_RUN_ID:
			return errdetail_plural("The run id is %zu byte long; the limit is %d bytes.",
									"The run id is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
		case IDEM_NAME_STEP:
			return errdetail_plural("The step name is %zu byte long; the limit is %d bytes.",
									"The step name is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
		case IDEM_NAME_EVENT:
			return errdetail_plural("The event is %zu byte long; the limit is %d bytes.",
									"The event is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
		case IDEM_NAME_QUEUE:
			return errdetail_plural("The run queue is %zu byte long; the limit is %d bytes.",
									"The run queue is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
		case IDEM_NAME_TOPIC:
			return errdetail_plural("The outbox topic is %zu byte long; the limit is %d bytes.",
									"The outbox topic is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
		case IDEM_NAME_CONSUMER:
			return errdetail_plural("The consumer is %zu byte long; the limit is %d bytes.",
									"The consumer is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
		case IDEM_NAME_WORKER:
			return errdetail_plural("The worker is %zu byte long; the limit is %d bytes.",
									"The worker is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
	}
	return errdetail_plural("The name is %zu byte long; the limit is %d bytes.",
									"The name is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, limit);
}

/*
 * idem_check_name
 *		A name idem keeps (key, run id, step, topic, consumer): not empty, at
 *		most limit bytes.  kind says what it names, in messages; hint, if
 *		not NULL, says what to do about a name that is too long.
 */
void
idem_check_name(IdemNameKind kind, const char *name, int limit, const char *hint)
{
	size_t		len = strlen(name);

	if (len == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 name_empty_msg(kind),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	if (len > limit)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 name_long_msg(kind),
				 name_long_detail(kind, len, limit),
				 idem_errhint(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, hint)));
}

/*
 * idem_check_error_text
 *		A failure's text as a consumer or a worker reports it (an event's
 *		or a run's last error, an operator's reason), kept in the row and
 *		shown in the views: at most IDEM_MAX_ERROR_BYTES, or 22001.
 */
void
idem_check_error_text(IdemErrorText which, const char *text)
{
	size_t		len = strlen(text);

	if (len > IDEM_MAX_ERROR_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_STRING_DATA_RIGHT_TRUNCATION),
				 which == IDEM_TEXT_REASON ?
				 errmsg("reason is too long") :
				 errmsg("error is too long"),
				 which == IDEM_TEXT_REASON ?
				 errdetail_plural("The reason is %zu byte long; the limit is %d bytes.",
									"The reason is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, IDEM_MAX_ERROR_BYTES) :
				 errdetail_plural("The error is %zu byte long; the limit is %d bytes.",
									"The error is %zu bytes long; the limit is %d bytes.",
									(unsigned long) len, len, IDEM_MAX_ERROR_BYTES),
				 idem_errhint(ERRCODE_STRING_DATA_RIGHT_TRUNCATION, "Report a summary; the whole error belongs in the worker's log.")));
}

/*
 * idem_arg_not_null
 *		Refuse a null argument argno, named in the message by its parameter
 *		name (param); idem_name_arg() says what its names are instead.
 */
void
idem_arg_not_null(FunctionCallInfo fcinfo, int argno, const char *param)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", param),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
}

/*
 * idem_name_arg
 *		A key, run id or step name argument (kind): not null, not empty, at
 *		most IDEM_MAX_KEY_BYTES.
 */
char *
idem_name_arg(FunctionCallInfo fcinfo, int argno, IdemNameKind kind)
{
	char	   *name;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 name_null_msg(kind),
				 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	name = text_to_cstring(PG_GETARG_TEXT_PP(argno));
	idem_check_name(kind, name, IDEM_MAX_KEY_BYTES,
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
				 errdetail_plural("The array has %d dimension.",
								  "The array has %d dimensions.",
								  ARR_NDIM(arr), ARR_NDIM(arr)),
				 idem_errhint(ERRCODE_ARRAY_SUBSCRIPT_ERROR, "Pass a multidimensional array as one argument, without VARIADIC.")));
	nitems = ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr));
	if (nitems > IDEM_MAX_ARGS)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 kind == IDEM_LIST_ARGUMENTS ?
				 errmsg("too many arguments") :
				 errmsg("too many key parts"),
				 kind == IDEM_LIST_ARGUMENTS ?
				 errdetail_plural("The array holds %d argument; a statement takes at most %d.",
								  "The array holds %d arguments; a statement takes at most %d.",
								  nitems, nitems, IDEM_MAX_ARGS) :
				 errdetail_plural("The array holds %d key part; a key takes at most %d.",
								  "The array holds %d key parts; a key takes at most %d.",
								  nitems, nitems, IDEM_MAX_ARGS),
				 idem_errhint(ERRCODE_PROGRAM_LIMIT_EXCEEDED, hint)));
}
