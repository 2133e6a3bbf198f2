/*-------------------------------------------------------------------------
 *
 * exec.c
 *		The statement runner: executes a business statement's cached plan
 *		through SPI and builds its response, keeping the stack of keys
 *		whose statements are running in this backend so that a statement
 *		calling idem_execute() with its own key is refused instead of
 *		waiting on itself.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/exec.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "executor/spi.h"
#include "nodes/params.h"

#include "request/request.h"

/*
 * Keys whose business statement is running in this backend, innermost
 * first.  Nodes live on the C stack of the calls that pushed them.
 */
typedef struct InflightKey
{
	Oid			owner;
	const char *key;
	struct InflightKey *next;
} InflightKey;

static InflightKey *inflight_keys = NULL;

/*
 * True while idem checks a business statement that ran (the settings it
 * may have changed, the shape of its result): an error then is idem's
 * refusal, not the statement's, and must never become a cached outcome.
 */
static bool checking_statement = false;

/*
 * idem_refused_statement
 *		Whether the error being handled was raised by idem's checks after
 *		the business statement ran, rather than by the statement.
 *
 * The answer is consumed: an error of the checks leaves the flag set, and
 * whatever runs next in this backend (the statement around a nested call
 * that caught the refusal, or the next call) must not read it as its own.
 */
bool
idem_refused_statement(void)
{
	bool		refused = checking_statement;

	checking_statement = false;
	return refused;
}

/*
 * Raise ID508 if req's key is the one of a call whose business statement
 * is running (further up this backend's stack).
 */
void
idem_check_not_inflight(IdemRequest *req)
{
	for (InflightKey *k = inflight_keys; k != NULL; k = k->next)
	{
		if (k->owner == req->owner && strcmp(k->key, req->key) == 0)
			ereport(ERROR,
					(errcode(ERRCODE_IDEM_NESTED_KEY),
					 errmsg("idempotency key \"%s\" is already being executed by an enclosing idem_execute() call",
							req->key),
					 errdetail("A business statement called idem_execute() with its own key."),
					 idem_errhint(ERRCODE_IDEM_NESTED_KEY, "Give the inner call a key of its own.")));
	}
}

/*
 * The arguments of req for plan, as SPI_execute_plan() passes them.
 */
static ParamListInfo
plan_params(SPIPlanPtr plan, IdemRequest *req)
{
	int			nargs = SPI_getargcount(plan);
	ParamListInfo params;

	if (nargs == 0)
		return NULL;
	params = makeParamList(nargs);
	for (int i = 0; i < nargs; i++)
	{
		ParamExternData *prm = &params->params[i];

		prm->value = req->values[i];
		prm->isnull = req->nulls != NULL && req->nulls[i] == 'n';
		prm->pflags = PARAM_FLAG_CONST;
		prm->ptype = SPI_getargtypeid(plan, i);
	}
	return params;
}

/*
 * Run the business statement and return its response, built in the
 * caller's memory context.
 */
static Jsonb *
run_statement(IdemStatement *stmt, IdemRequest *req)
{
	MemoryContext callercxt = CurrentMemoryContext;
	DestReceiver *rows = idem_response_receiver();
	SPIExecuteOptions options = {0};
	SPIPlanPtr	plan;
	Jsonb	   *response;
	int			rc;
	IdemSessionState before;

	/*
	 * From here until it has run, an error is the statement's own (a
	 * missing table when it is prepared included), whatever an earlier
	 * call's refusal left behind.
	 */
	checking_statement = false;
	idem_session_state_save(&before);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");

	plan = idem_statement_plan(stmt);
	options.params = plan_params(plan, req);
	options.dest = rows;
	rc = SPI_execute_plan_extended(plan, &options);
	if (rc < 0)
		elog(ERROR, "SPI_execute_plan failed: %s", SPI_result_code_string(rc));
	checking_statement = true;
	idem_citus_check_confined();
	idem_statement_check_settings(stmt, &before);

	MemoryContextSwitchTo(callercxt);
	response = idem_build_response(idem_statement_command(stmt),
								   SPI_processed, rows);
	rows->rDestroy(rows);
	idem_check_response_size(response, IDEM_RESPONSE_EXECUTE, NULL);
	/* a statement around this one (a nested call) goes on running */
	checking_statement = false;

	SPI_finish();
	return response;
}

/*
 * idem_execute_statement
 *		Run req's business statement with its key marked in flight (so a
 *		nested call with the same key fails instead of waiting on itself)
 *		and return the response.
 */
Jsonb *
idem_execute_statement(IdemStatement *stmt, IdemRequest *req)
{
	InflightKey self;
	Jsonb	   *response;

	self.owner = req->owner;
	self.key = req->key;
	self.next = inflight_keys;
	inflight_keys = &self;

	PG_TRY();
	{
		response = run_statement(stmt, req);
	}
	PG_FINALLY();
	{
		inflight_keys = self.next;
	}
	PG_END_TRY();
	return response;
}
