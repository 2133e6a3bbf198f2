/*-------------------------------------------------------------------------
 *
 * subxact.c
 *		Internal subtransactions for the places idem must survive an error
 *		and go on (cached errors, the statement's type inference): begin,
 *		commit or roll back, and take the error out of the error state,
 *		leaving the caller's memory context and resource owner as they were.
 *		Also the lists of what a transaction must do at its commit (expiry
 *		restamps, outbox wakeups), whose entries go with a rolled-back
 *		savepoint.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/common/subxact.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/memutils.h"
#include "utils/resowner.h"

#include "common/common.h"

/*
 * idem_subxact_begin, idem_subxact_end, idem_subxact_abort
 *		An internal subtransaction that leaves the caller's memory context
 *		and resource owner as they were.  idem_subxact_abort() is for a
 *		PG_CATCH block: it takes the error out of the error state, rolls the
 *		subtransaction back (always, so an enclosing handler finds its own
 *		subtransaction current) and returns the error, to be raised again
 *		with ReThrowError() or handled.
 */
void
idem_subxact_begin(IdemSubxact *sx)
{
	sx->cxt = CurrentMemoryContext;
	sx->owner = CurrentResourceOwner;
	BeginInternalSubTransaction(NULL);
	MemoryContextSwitchTo(sx->cxt);
}

void
idem_subxact_end(IdemSubxact *sx, bool commit)
{
	if (commit)
		ReleaseCurrentSubTransaction();
	else
		RollbackAndReleaseCurrentSubTransaction();
	MemoryContextSwitchTo(sx->cxt);
	CurrentResourceOwner = sx->owner;
}

ErrorData *
idem_subxact_abort(IdemSubxact *sx)
{
	ErrorData  *edata;

	MemoryContextSwitchTo(sx->cxt);
	edata = CopyErrorData();
	FlushErrorState();
	idem_subxact_end(sx, false);
	return edata;
}

/*
 * idem_xact_list_subxact
 *		Keep a list of entries made by this transaction in step with its
 *		savepoints: at a subtransaction's abort its entries leave the list
 *		(what they were made for was rolled back with it); at its commit
 *		they pass to the parent.  For a SubXactCallback.
 */
void
idem_xact_list_subxact(IdemXactItem **head, SubXactEvent event,
					   SubTransactionId mySubid, SubTransactionId parentSubid)
{
	IdemXactItem **link = head;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	while (*link != NULL)
	{
		IdemXactItem *item = *link;

		if (item->subid == mySubid && event == SUBXACT_EVENT_ABORT_SUB)
		{
			*link = item->next;
			continue;
		}
		if (item->subid == mySubid)
			item->subid = parentSubid;
		link = &item->next;
	}
}
