/*-------------------------------------------------------------------------
 *
 * guc.c
 *		The variables behind idem's configuration parameters, with their
 *		boot values, and the snapshot of the role and these parameters
 *		that a business statement must leave as it found them.
 *		_PG_init() (idem.c) defines the parameters; every layer reads the
 *		variables, so they live at the bottom.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/guc.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/memutils.h"

#include "compat.h"
#include "common/common.h"

int			idem_ttl = 86400;
int			idem_max_ttl = 30 * 86400;
bool		idem_wait = true;
int			idem_max_response_size = 1024 * 1024;
char	   *idem_outbox_topic = NULL;
int			idem_statement_cache_size = 256;
int			idem_statement_cache_memory = 32 * 1024;
bool		idem_durable_replay = false;
char	   *idem_cache_errors = NULL;
char	   *idem_key_owner_setting = NULL;
int			idem_outbox_max_attempts = 10;
int			idem_outbox_backoff_base = 1000;
int			idem_outbox_backoff_cap = 3600 * 1000;
bool		idem_outbox_jitter = true;
int			idem_outbox_max_lease = 3600;
int			idem_outbox_max_retry_after = 86400;
int			idem_outbox_retention = 7 * 86400;
bool		idem_outbox_logical_message = false;
int			idem_audit_level = IDEM_AUDIT_OFF;
int			idem_audit_retention = 0;
int			idem_audit_queue_size = 1024;
int			idem_purge_interval = 60;
int			idem_purge_batch_size = 10000;

/*
 * The role a call runs as and idem's own parameters, as a business
 * statement found them.  The role decides whose keys a request uses, and
 * the idem.* parameters what idem does with it (its ttl, the error classes
 * it caches, the topic its events go to, whose keys it uses): a statement
 * that changed one with set_config() or SET ROLE would change what every
 * later call of the session means, so request/exec.c compares them after
 * the statement.  Every idem.* parameter the library defines is compared,
 * by value: a parameter added later is covered without a list to keep.
 */
static struct config_generic **own_params = NULL;
static int	own_nparams = 0;

static void
find_own_params(void)
{
	int			n;
	struct config_generic **vars = idem_guc_variables(&n);
	int			count = 0;

	for (int i = 0; i < n; i++)
		if (strncmp(vars[i]->name, "idem.", 5) == 0 &&
			!(vars[i]->flags & GUC_CUSTOM_PLACEHOLDER))
			count++;
	own_params = MemoryContextAlloc(TopMemoryContext,
									Max(count, 1) * sizeof(*own_params));
	for (int i = 0; i < n; i++)
		if (strncmp(vars[i]->name, "idem.", 5) == 0 &&
			!(vars[i]->flags & GUC_CUSTOM_PLACEHOLDER))
			own_params[own_nparams++] = vars[i];
}

/*
 * idem_own_param
 *		The GUC table's entry of one of idem's parameters.
 */
struct config_generic *
idem_own_param(const char *name)
{
	if (own_params == NULL)
		find_own_params();
	for (int i = 0; i < own_nparams; i++)
		if (strcmp(own_params[i]->name, name) == 0)
			return own_params[i];
	elog(ERROR, "parameter \"%s\" is not defined", name);
	return NULL;				/* keep compiler quiet */
}

/* A parameter's value; a string's is copied when saved */
typedef union IdemParamValue
{
	bool		b;
	int			i;
	double		r;
	char	   *s;
} IdemParamValue;

static IdemParamValue
param_value(struct config_generic *gen)
{
	IdemParamValue v;

	memset(&v, 0, sizeof(v));
	switch (gen->vartype)
	{
		case PGC_BOOL:
			v.b = *((struct config_bool *) gen)->variable;
			break;
		case PGC_INT:
			v.i = *((struct config_int *) gen)->variable;
			break;
		case PGC_REAL:
			v.r = *((struct config_real *) gen)->variable;
			break;
		case PGC_ENUM:
			v.i = *((struct config_enum *) gen)->variable;
			break;
		case PGC_STRING:
			v.s = *((struct config_string *) gen)->variable;
			break;
	}
	return v;
}

static bool
param_same(struct config_generic *gen, IdemParamValue a, IdemParamValue b)
{
	switch (gen->vartype)
	{
		case PGC_BOOL:
			return a.b == b.b;
		case PGC_INT:
		case PGC_ENUM:
			return a.i == b.i;
		case PGC_REAL:
			return a.r == b.r;
		case PGC_STRING:
			if (a.s == NULL || b.s == NULL)
				return a.s == b.s;
			return strcmp(a.s, b.s) == 0;
	}
	return true;
}

/*
 * idem_session_state_save
 *		Note the role and idem's parameters, in the current memory context.
 */
void
idem_session_state_save(IdemSessionState *s)
{
	IdemParamValue *values;

	if (own_params == NULL)
		find_own_params();
	s->user = GetUserId();
	s->outer_user = GetOuterUserId();
	s->session_user = GetSessionUserId();
	values = palloc(Max(own_nparams, 1) * sizeof(IdemParamValue));
	for (int i = 0; i < own_nparams; i++)
	{
		values[i] = param_value(own_params[i]);
		/* copied: a string's new value may land at the old one's address */
		if (own_params[i]->vartype == PGC_STRING && values[i].s != NULL)
			values[i].s = pstrdup(values[i].s);
	}
	s->values = values;
}

/*
 * idem_session_state_changed
 *		The name of a setting that changed since s was saved, or NULL.
 */
const char *
idem_session_state_changed(const IdemSessionState *s)
{
	if (s->user != GetUserId() || s->outer_user != GetOuterUserId())
		return "role";
	if (s->session_user != GetSessionUserId())
		return "session_authorization";
	for (int i = 0; i < own_nparams; i++)
		if (!param_same(own_params[i], param_value(own_params[i]),
						s->values[i]))
			return own_params[i]->name;
	return NULL;
}
char	   *idem_lease_token = NULL;
int			idem_run_max_lease = 3600;
bool		idem_outbox_notify = false;
bool		idem_outbox_keep_delivered = false;
