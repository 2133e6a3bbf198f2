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
int			idem_run_retention = 0;
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

/*
 * Where each parameter's value lives, and its size: 0 for a string, whose
 * value is compared by content (a new value may land at the old one's
 * address).  Kept apart from the GUC table so that the snapshot a
 * statement takes is a few word copies.
 */
typedef struct OwnParam
{
	void	   *variable;
	int			size;
} OwnParam;

static OwnParam *own_vars = NULL;

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
	if (count > IDEM_OWN_PARAMS_MAX)
		elog(ERROR, "idem defines %d parameters, more than %d", count,
			 IDEM_OWN_PARAMS_MAX);
	own_params = MemoryContextAlloc(TopMemoryContext,
									Max(count, 1) * sizeof(*own_params));
	own_vars = MemoryContextAlloc(TopMemoryContext,
								  Max(count, 1) * sizeof(*own_vars));
	for (int i = 0; i < n; i++)
	{
		struct config_generic *gen = vars[i];
		OwnParam   *v = &own_vars[own_nparams];

		if (strncmp(gen->name, "idem.", 5) != 0 ||
			(gen->flags & GUC_CUSTOM_PLACEHOLDER))
			continue;
		switch (gen->vartype)
		{
			case PGC_BOOL:
				v->variable = ((struct config_bool *) gen)->variable;
				v->size = sizeof(bool);
				break;
			case PGC_INT:
				v->variable = ((struct config_int *) gen)->variable;
				v->size = sizeof(int);
				break;
			case PGC_REAL:
				v->variable = ((struct config_real *) gen)->variable;
				v->size = sizeof(double);
				break;
			case PGC_ENUM:
				v->variable = ((struct config_enum *) gen)->variable;
				v->size = sizeof(int);
				break;
			case PGC_STRING:
				v->variable = ((struct config_string *) gen)->variable;
				v->size = 0;
				break;
		}
		own_params[own_nparams++] = gen;
	}
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

/* A non-string parameter's value as a word (sizes are constants: inlined) */
static inline uint64
param_word(const OwnParam *v)
{
	uint64		w = 0;

	if (v->size == sizeof(bool))
		w = *(bool *) v->variable;
	else if (v->size == sizeof(int))
		w = (uint32) *(int *) v->variable;
	else
		memcpy(&w, v->variable, sizeof(double));
	return w;
}

/*
 * idem_session_state_save
 *		Note the role and idem's parameters; a non-empty string is copied
 *		in the current memory context.
 */
void
idem_session_state_save(IdemSessionState *s)
{
	if (own_params == NULL)
		find_own_params();
	s->user = GetUserId();
	s->outer_user = GetOuterUserId();
	s->session_user = GetSessionUserId();
	for (int i = 0; i < own_nparams; i++)
	{
		const OwnParam *v = &own_vars[i];

		if (v->size > 0)
			s->values[i] = param_word(v);
		else
		{
			const char *str = *(char **) v->variable;

			s->values[i] = (uintptr_t) (str == NULL ? NULL :
										str[0] == '\0' ? "" : pstrdup(str));
		}
	}
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
	{
		const OwnParam *v = &own_vars[i];
		bool		same;

		if (v->size > 0)
			same = (param_word(v) == s->values[i]);
		else
		{
			const char *now = *(char **) v->variable;
			const char *then = (const char *) (uintptr_t) s->values[i];

			if (now == NULL || then == NULL)
				same = (now == then);
			else
				same = (strcmp(now, then) == 0);
		}
		if (!same)
			return own_params[i]->name;
	}
	return NULL;
}
char	   *idem_lease_token = NULL;
int			idem_run_max_lease = 3600;
bool		idem_outbox_notify = false;
bool		idem_outbox_keep_delivered = false;

/*
 * idem_lease_token_check
 *		idem.lease_token is empty or a UUID in a form uuid_in() accepts
 *		(32 hex digits, a hyphen allowed after any group of four, braces
 *		around it all), so that a mistyped token is refused by the SET, not
 *		by the first step that presents it.
 */
bool
idem_lease_token_check(char **newval, void **extra, GucSource source)
{
	const char *p = *newval;
	size_t		len = strlen(p);
	int			digits = 0;
	bool		hyphen = false;

	if (len == 0)
		return true;
	if (p[0] == '{')
	{
		if (len < 2 || p[len - 1] != '}')
			goto bad;
		p++;
		len -= 2;
	}
	for (size_t i = 0; i < len; i++)
	{
		if (isxdigit((unsigned char) p[i]))
		{
			digits++;
			hyphen = false;
		}
		else if (p[i] == '-' && !hyphen && digits > 0 && digits % 4 == 0 &&
				 digits < 32 && i + 1 < len)
			hyphen = true;
		else
			goto bad;
	}
	if (digits == 32)
		return true;
bad:
	GUC_check_errdetail("A lease token is a UUID, as idem_run_claim() returns it.");
	return false;
}

