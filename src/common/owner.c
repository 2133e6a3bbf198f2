/*-------------------------------------------------------------------------
 *
 * owner.c
 *		Whose keys a call uses: idem.key_owner.
 *
 * A key belongs to a role, by default the current user.  Inside a
 * SECURITY DEFINER function that is the function's owner, so every caller
 * of such a wrapper shares one namespace: one caller's key replays for
 * another, and a mismatch tells one caller what another has sent.  A
 * wrapper that serves several roles sets idem.key_owner = 'session_user'
 * in its SET clause (or names a role) to key each call by the role that
 * logged in instead.
 *
 * Keying as a role reads that role's recorded responses and can occupy its
 * keys, which is what that role could do itself: so the current user must
 * have the privileges of that role (be it, or a member of it that inherits
 * them, as SET ROLE would allow), and anything else is refused with
 * 42501.  A superuser's wrapper may key by any caller; another owner needs
 * each calling role granted to it.
 *
 * The setting is the wrapper author's, never the caller's.  Inside a
 * SECURITY DEFINER function (the current user is not the session's outer
 * role) a value counts only if the current user set it while the session
 * ran: the function's SET clause, or a set_config() in its body.  A value
 * the caller brought (SET, ALTER ROLE ... SET, a connection option) is
 * ignored there and the call is keyed by the current user, as if it were
 * unset.  PostgreSQL records a value from ALTER ROLE or ALTER DATABASE as
 * set by the bootstrap superuser, the usual owner of wrappers, so the
 * setter alone does not tell them apart: the value's source must be the
 * session too.  Otherwise a
 * caller could SET idem.key_owner to a role the wrapper's owner has been
 * granted and read or occupy that role's keys through the wrapper (a
 * replay of its response, a mismatch as an oracle), or leave the shared
 * namespace a wrapper without the setting was written for.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/owner.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/acl.h"

#include "compat.h"
#include "common/common.h"

/* idem.key_owner's entry in the GUC table, for the role that set it */
static struct config_generic *key_owner_param = NULL;

/*
 * Whether role set idem.key_owner's current value while the session ran
 * (SET, set_config(), a function's SET clause, which runs as the
 * function's owner), rather than the configuration, ALTER ROLE, ALTER
 * DATABASE or the connection, which PostgreSQL records as set by the
 * bootstrap superuser.
 */
static bool
key_owner_set_by(Oid role)
{
	if (key_owner_param == NULL)
		key_owner_param = idem_own_param("idem.key_owner");
	return key_owner_param->source == PGC_S_SESSION &&
		idem_guc_setter(key_owner_param) == role;
}

/*
 * idem_key_owner
 *		The role whose keys the current call uses.
 */
Oid
idem_key_owner(void)
{
	const char *setting = idem_key_owner_setting;
	Oid			user = GetUserId();
	Oid			owner;

	if (likely(setting == NULL || setting[0] == '\0') ||
		strcmp(setting, "current_user") == 0)
		return user;
	if (user != GetOuterUserId() && !key_owner_set_by(user))
		return user;
	if (strcmp(setting, "session_user") == 0)
		owner = GetSessionUserId();
	else
	{
		owner = get_role_oid(setting, true);
		if (!OidIsValid(owner))
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("role \"%s\" named by idem.key_owner does not exist",
							setting),
					 idem_errhint(ERRCODE_UNDEFINED_OBJECT, "Set idem.key_owner to an existing role, session_user or current_user.")));
	}
	if (owner != user && !has_privs_of_role(user, owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to use the keys of role \"%s\"",
						GetUserNameFromId(owner, false)),
				 errdetail("idem.key_owner is \"%s\"; only a role with the privileges of role \"%s\" may use its keys.",
						   setting, GetUserNameFromId(owner, false)),
				 idem_errhint(ERRCODE_INSUFFICIENT_PRIVILEGE,
							  psprintf("Grant role \"%s\" to role \"%s\", or reset idem.key_owner.",
									   GetUserNameFromId(owner, false),
									   GetUserNameFromId(user, false)))));
	return owner;
}
