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

#include "common/common.h"

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
	if (strcmp(setting, "session_user") == 0)
		owner = GetSessionUserId();
	else
		owner = get_role_oid(setting, false);
	if (owner != user && !has_privs_of_role(user, owner))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to use the keys of role \"%s\"",
						GetUserNameFromId(owner, false)),
				 errdetail("idem.key_owner is \"%s\"; only a role with the privileges of role \"%s\" may use its keys.",
						   setting, GetUserNameFromId(owner, false)),
				 errhint("Grant role \"%s\" to role \"%s\", or reset idem.key_owner.",
						 GetUserNameFromId(owner, false),
						 GetUserNameFromId(user, false))));
	return owner;
}
