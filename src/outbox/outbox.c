/*-------------------------------------------------------------------------
 *
 * outbox.c
 *		Outbox events: who may publish to a topic, writing an event (with
 *		its NOTIFY and, optionally, its logical decoding message), and
 *		delivering it: claim under a lease, ack, fail with backoff and
 *		jitter, dead letters, requeue, and the purge of delivered events.
 *
 * The writer is on idem_execute()'s hot path and reaches idem.outbox and
 * idem.outbox_topics by OID (tables.c), like the key record, and so do the
 * claim and the verbs on a leased event (ack, fail, extend, release,
 * requeue): they find the event by its primary key, lock it and change it
 * in place, in idem.outbox or, under Citus, in a shard of
 * idem.citus_outbox placed on this node (a tenant's events, which move
 * with its shard).  The purge and the topic registry run fixed statements
 * through SPI, prepared once per backend, as the owner of idem.outbox (the
 * callers have no privilege on schema idem) and with every name, operator
 * and function schema-qualified, so that no caller's search_path can reach
 * into them.
 *
 * An event's next_attempt_at is its due time.  A claim moves it to the end
 * of the lease, so leased events fall out of the head of the claim's index
 * scan (outbox_due_idx) instead of being re-read by every later claim, and
 * an expired lease needs no sweeper: the event is simply due again.  Every
 * claim gives the event a new random lease token; ack and fail must present
 * the current one, which fences off a consumer whose lease expired and was
 * taken over.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/outbox/outbox.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <math.h>

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "common/int.h"
#include "catalog/pg_authid.h"
#include "catalog/pg_type.h"
#include "commands/async.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "replication/message.h"
#include "storage/lmgr.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datetime.h"
#include "utils/datum.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/json.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#include "utils/timestamp.h"
#include "utils/tuplestore.h"
#include "utils/uuid.h"

#include "compat.h"
#include "outbox/outbox.h"

PG_FUNCTION_INFO_V1(idem_outbox_claim);
PG_FUNCTION_INFO_V1(idem_outbox_ack);
PG_FUNCTION_INFO_V1(idem_outbox_ack_batch);
PG_FUNCTION_INFO_V1(idem_outbox_fail);
PG_FUNCTION_INFO_V1(idem_outbox_requeue);
PG_FUNCTION_INFO_V1(idem_outbox_extend);
PG_FUNCTION_INFO_V1(idem_outbox_release);
PG_FUNCTION_INFO_V1(idem_outbox_wait);
PG_FUNCTION_INFO_V1(idem_outbox_topics_changed);
PG_FUNCTION_INFO_V1(idem_outbox_purge);
PG_FUNCTION_INFO_V1(idem_outbox_create_topic);
PG_FUNCTION_INFO_V1(idem_outbox_drop_topic);
PG_FUNCTION_INFO_V1(idem_outbox_grant);
PG_FUNCTION_INFO_V1(idem_outbox_revoke);
PG_FUNCTION_INFO_V1(idem_outbox_channel);

/* The prefix of the logical decoding message of an event. */
#define OUTBOX_MESSAGE_PREFIX	"idem.outbox"
/* Longest topic name and consumer label, in bytes (like a key). */
#define OUTBOX_MAX_NAME_BYTES	255
/* Most events one claim may lease. */
#define OUTBOX_MAX_CLAIM		10000

typedef enum TopicPrivilege
{
	TOPIC_PUBLISH,
	TOPIC_CONSUME
} TopicPrivilege;

static const char *const privilege_names[] = {"publish", "consume"};

/*
 * The last check of each privilege that passed, kept across transactions
 * until what it read may have changed: the registry (whose trigger
 * invalidates the table's relcache entry, which moves
 * idem_catalog_generation() on) or any role's membership or
 * attributes (syscache callbacks, as PostgreSQL's own role membership
 * cache has).  A producer's every call, and a consumer's every claim and
 * ack, then skip the registry lookup; a change is seen, as GRANT and
 * REVOKE are, from the next command after it commits (at once in its own
 * transaction).
 */
static struct
{
	bool		valid;
	uint64		catalog_generation;
	uint64		role_generation;
	Oid			role;
	char		topic[OUTBOX_MAX_NAME_BYTES + 1];
} topic_ok[2];

static uint64 role_generation = 1;
static bool role_callbacks_registered = false;

static void
roles_changed(Datum arg, int cacheid, uint32 hashvalue)
{
	role_generation++;
}

/* ------------------------------------------------------------------------
 * Topics
 * ------------------------------------------------------------------------
 */

/* A topic check in progress, for read_topic_row() */
typedef struct TopicCheck
{
	Oid			role;
	TopicPrivilege priv;
	bool		allowed;
} TopicCheck;

static void
read_topic_row(TupleTableSlot *slot, void *arg)
{
	TopicCheck *tc = arg;
	bool		isnull;
	Datum		roles;

	roles = slot_getattr(slot, tc->priv == TOPIC_PUBLISH ?
						 Anum_outbox_topics_publishers :
						 Anum_outbox_topics_consumers, &isnull);
	tc->allowed = superuser_arg(tc->role) ||
		(!isnull && idem_role_in(tc->role, roles));
}

/*
 * Whether the topic is registered, and whether role may use it as asked.
 * A superuser may use every registered topic.
 */
static bool
topic_allows(const char *topic, Oid role, TopicPrivilege priv, bool *exists)
{
	Oid			pkey;
	Oid			relid = idem_catalog_outbox_topics(&pkey);
	TopicCheck	tc = {role, priv, false};

	*exists = idem_registry_probe(relid, pkey, topic, read_topic_row, &tc);
	return tc.allowed;
}

static void
check_topic(const char *topic, Oid role, TopicPrivilege priv)
{
	uint64		catalog_generation;
	uint64		roles_read;
	Oid			pkey;
	bool		exists;

	if (topic_ok[priv].valid && topic_ok[priv].role == role &&
		topic_ok[priv].catalog_generation == idem_catalog_generation() &&
		topic_ok[priv].role_generation == role_generation &&
		strcmp(topic_ok[priv].topic, topic) == 0)
		return;

	if (!role_callbacks_registered)
	{
		CacheRegisterSyscacheCallback(AUTHOID, roles_changed, (Datum) 0);
		CacheRegisterSyscacheCallback(AUTHMEMROLEMEM, roles_changed, (Datum) 0);
		role_callbacks_registered = true;
	}
	/* read first: a change that arrives during the lookup voids its result */
	topic_ok[priv].valid = false;
	(void) idem_catalog_outbox_topics(&pkey);
	catalog_generation = idem_catalog_generation();
	roles_read = role_generation;
	if (!topic_allows(topic, role, priv, &exists))
	{
		if (!exists)
			ereport(ERROR,
					(errcode(ERRCODE_UNDEFINED_OBJECT),
					 errmsg("outbox topic \"%s\" does not exist", topic),
					 idem_errhint(ERRCODE_UNDEFINED_OBJECT, "An administrator registers topics with idem_outbox_create_topic().")));
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 priv == TOPIC_PUBLISH ?
				 errmsg("permission denied to publish outbox topic \"%s\"", topic) :
				 errmsg("permission denied to consume outbox topic \"%s\"", topic),
				 priv == TOPIC_PUBLISH ?
				 errdetail("Role \"%s\" is not among the topic's publishers.",
						   GetUserNameFromId(role, false)) :
				 errdetail("Role \"%s\" is not among the topic's consumers.",
						   GetUserNameFromId(role, false)),
				 idem_errhint(ERRCODE_INSUFFICIENT_PRIVILEGE, psprintf("An administrator grants it with idem_outbox_grant('%s', role, '%s').",
						 topic, privilege_names[priv]))));
	}
	topic_ok[priv].role = role;
	strlcpy(topic_ok[priv].topic, topic, sizeof(topic_ok[priv].topic));
	topic_ok[priv].catalog_generation = catalog_generation;
	topic_ok[priv].role_generation = roles_read;
	topic_ok[priv].valid = true;
}

/*
 * idem_outbox_topics_changed()
 *		The 1.1 name of the registries' statement trigger, on
 *		idem.outbox_topics (tables.c, idem_registry_changed()).
 */
Datum
idem_outbox_topics_changed(PG_FUNCTION_ARGS)
{
	return idem_registry_changed(fcinfo);
}

/*
 * idem_outbox_check_publish
 *		Fail unless role may publish events to topic.
 *
 * Callers check before the business statement runs, so that a refused call
 * writes nothing at all; idem_insert_outbox() checks again (for free after
 * a check in the same transaction), so no path writes an unchecked event.
 */
void
idem_outbox_check_publish(const char *topic, Oid role)
{
	idem_check_name(IDEM_NAME_TOPIC, topic, OUTBOX_MAX_NAME_BYTES, NULL);
	check_topic(topic, role, TOPIC_PUBLISH);
}

/* ------------------------------------------------------------------------
 * Writing an event
 * ------------------------------------------------------------------------
 */

/*
 * Topics this transaction wrote events to, by the subtransaction that
 * wrote them, in TopTransactionContext.  The NOTIFY is sent at PRE_COMMIT,
 * not at the write: PostgreSQL refuses to PREPARE a transaction that has
 * notified, and idem's calls must keep working in prepared transactions
 * (their events then wake nobody; consumers also poll).  A rolled-back
 * subtransaction's topics are forgotten, so only committed events wake.
 * With shared memory the topics are also signalled to idem_outbox_wait()
 * once the commit is visible (wakeup.c), whatever idem.outbox_notify says.
 */
typedef struct NotifyTopic
{
	IdemXactItem item;			/* first: the subtransaction, the next entry */
	char	   *topic;
	char		channel[NAMEDATALEN];	/* its NOTIFY channel (wakeup.c) */
	bool		notify;			/* idem.outbox_notify when written */
} NotifyTopic;

static IdemXactItem *notify_topics = NULL;
static bool notify_callbacks_registered = false;

static void
notify_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	idem_xact_list_subxact(&notify_topics, event, mySubid, parentSubid);
}

static void
notify_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			/* PostgreSQL folds duplicates of one channel and payload */
			for (IdemXactItem *i = notify_topics; i != NULL; i = i->next)
				if (((NotifyTopic *) i)->notify)
					Async_Notify(((NotifyTopic *) i)->channel, NULL);
			break;
		case XACT_EVENT_COMMIT:
			for (IdemXactItem *i = notify_topics; i != NULL; i = i->next)
				idem_wakeup_topic(((NotifyTopic *) i)->topic);
			notify_topics = NULL;
			break;
		case XACT_EVENT_PRE_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PARALLEL_ABORT:
			notify_topics = NULL;
			break;
		default:
			break;
	}
}

static void
remember_notify(const char *topic, bool notify)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	MemoryContext oldcxt;
	NotifyTopic *n;

	if (!notify_callbacks_registered)
	{
		RegisterXactCallback(notify_xact_callback, NULL);
		RegisterSubXactCallback(notify_subxact_callback, NULL);
		notify_callbacks_registered = true;
	}
	for (IdemXactItem *i = notify_topics; i != NULL; i = i->next)
	{
		n = (NotifyTopic *) i;
		if (i->subid == subid && strcmp(n->topic, topic) == 0)
		{
			n->notify |= notify;
			return;
		}
	}
	oldcxt = MemoryContextSwitchTo(TopTransactionContext);
	n = palloc(sizeof(NotifyTopic));
	n->topic = pstrdup(topic);
	idem_wakeup_channel(topic, n->channel);
	n->notify = notify;
	n->item.subid = subid;
	n->item.next = notify_topics;
	notify_topics = &n->item;
	MemoryContextSwitchTo(oldcxt);
}

static void
json_field(StringInfo buf, const char *name, const char *value, bool first)
{
	if (!first)
		appendStringInfoString(buf, ", ");
	escape_json(buf, name);
	appendStringInfoString(buf, ": ");
	if (value == NULL)
		appendStringInfoString(buf, "null");
	else
		escape_json(buf, value);
}

/*
 * idem_wake_at_commit
 *		Wake idem_wakeup_wait(name) callers when the transaction commits
 *		(with shared memory; a rolled-back subtransaction's call is
 *		forgotten): the run queues' wakeup, on the outbox's.
 */
void
idem_wake_at_commit(const char *name)
{
	if (idem_wakeup_available())
		remember_notify(name, false);
}

/*
 * The event as one JSON object, for the WAL stream: every column a consumer
 * gets from a claim, the timestamp in UTC whatever the session's TimeZone.
 */
static void
emit_logical_message(Datum event_id, const char *key, Oid owner,
					 const char *topic, Jsonb *payload, TimestampTz created_at,
					 const char *run_id, const char *step)
{
	StringInfoData buf;
	char		ts[MAXDATELEN + 1];
	int			utc = 0;

	initStringInfo(&buf);
	appendStringInfoChar(&buf, '{');
	json_field(&buf, "event_id",
			   DatumGetCString(DirectFunctionCall1(uuid_out, event_id)), true);
	json_field(&buf, "key", key, false);
	json_field(&buf, "owner", GetUserNameFromId(owner, false), false);
	json_field(&buf, "topic", topic, false);
	json_field(&buf, "run_id", run_id, false);
	json_field(&buf, "step", step, false);
	JsonEncodeDateTime(ts, TimestampTzGetDatum(created_at), TIMESTAMPTZOID,
					   &utc);
	json_field(&buf, "created_at", ts, false);
	appendStringInfoString(&buf, ", \"payload\": ");
	(void) JsonbToCString(&buf, &payload->root, VARSIZE(payload));
	appendStringInfoChar(&buf, '}');

	LogTransactionalMessage(OUTBOX_MESSAGE_PREFIX, buf.data, buf.len);
	pfree(buf.data);
}

/*
 * idem_insert_outbox
 *		Append an outbox event in the caller's transaction: the row (due at
 *		once), a NOTIFY at commit (one per topic and transaction), and with
 *		idem.outbox_logical_message the logical decoding message.  run_id
 *		and step may be NULL; run_position, the step's place among its
 *		run's completed steps, orders a run's events (0 outside a run).
 *		shard: a tenant's event under Citus, written to the tenant's shard
 *		of idem.citus_outbox here (NULL, or no relation: idem.outbox).
 */
void
idem_insert_outbox(const char *key, Oid owner, const char *topic,
				   Jsonb *payload, TimestampTz created_at,
				   const char *run_id, const char *step, int32 run_position,
				   const IdemEventShard *shard)
{
	Datum		values[Natts_tenant_event];
	bool		nulls[Natts_tenant_event] = {0};

	/*
	 * The lock the insert takes, before the topic is checked:
	 * idem_outbox_drop_topic() holds a lock that conflicts with it until it
	 * commits, and a drop that committed while this waited is seen here
	 * (as a table lock's invalidations are), not after the event was
	 * written to a topic that no longer exists.
	 */
	if (shard == NULL || !OidIsValid(shard->relid))
		LockRelationOid(idem_catalog_outbox(), RowExclusiveLock);
	idem_outbox_check_publish(topic, owner);

	values[Anum_outbox_event_id - 1] = idem_random_uuid();
	values[Anum_outbox_key - 1] = CStringGetTextDatum(key);
	values[Anum_outbox_owner - 1] = ObjectIdGetDatum(owner);
	values[Anum_outbox_topic - 1] = CStringGetTextDatum(topic);
	values[Anum_outbox_payload - 1] = JsonbPGetDatum(payload);
	values[Anum_outbox_created_at - 1] = TimestampTzGetDatum(created_at);
	if (run_id != NULL)
		values[Anum_outbox_run_id - 1] = CStringGetTextDatum(run_id);
	else
		nulls[Anum_outbox_run_id - 1] = true;
	if (step != NULL)
		values[Anum_outbox_step - 1] = CStringGetTextDatum(step);
	else
		nulls[Anum_outbox_step - 1] = true;
	values[Anum_outbox_state - 1] = CStringGetTextDatum("pending");
	values[Anum_outbox_attempts - 1] = Int32GetDatum(0);
	values[Anum_outbox_next_attempt_at - 1] = TimestampTzGetDatum(created_at);
	nulls[Anum_outbox_lease_token - 1] = true;
	nulls[Anum_outbox_leased_by - 1] = true;
	nulls[Anum_outbox_lease_holder - 1] = true;
	nulls[Anum_outbox_last_error - 1] = true;
	nulls[Anum_outbox_delivered_at - 1] = true;
	if (run_id != NULL)
		values[Anum_outbox_run_position - 1] = Int32GetDatum(run_position);
	else
		nulls[Anum_outbox_run_position - 1] = true;

	if (shard != NULL && OidIsValid(shard->relid))
	{
		values[Anum_tenant_event_tenant - 1] = shard->tenant;
		values[Anum_tenant_event_owner_name - 1] =
			PointerGetDatum(idem_tenant_owner(owner));
		idem_insert_tenant_event_row(shard->relid, values, nulls);
	}
	else
		idem_insert_outbox_row(values, nulls);
	idem_stats_count(IDEM_STAT_OUTBOX_WRITTEN, 1);

	if (idem_outbox_notify || idem_wakeup_available())
		remember_notify(topic, idem_outbox_notify);
	if (idem_outbox_logical_message)
		emit_logical_message(values[Anum_outbox_event_id - 1], key, owner,
							 topic, payload, created_at, run_id, step);
}

/* ------------------------------------------------------------------------
 * The relations events are delivered from
 * ------------------------------------------------------------------------
 */

void		(*idem_outbox_lock_shard) (int64 shardid) = NULL;

/*
 * idem.outbox, or under Citus a shard of idem.citus_outbox placed on this
 * node.  A tenant's events are written to its shard, in the transaction of
 * its call on the shard's node, and move with the shard group
 * (citus_move_shard_placement, the rebalancer, splits); every verb of
 * delivery reaches the shards placed on its node as it reaches
 * idem.outbox, so after a move the events are delivered from their new
 * node.  A shard's row has idem.outbox's columns, then the tenant and the
 * owner's name: the owner's OID is that of the node that wrote the event,
 * and a move copies it as it is.
 */
typedef struct OutboxRel
{
	Oid			relid;
	Oid			pkey;
	Oid			due;
	Oid			run;
	Oid			delivered;		/* a shard's delivered events (the purge's) */
	bool		tenant;			/* a shard of idem.citus_outbox */
	int64		shardid;		/* the shard's, if tenant */
	int			natts;
} OutboxRel;

static Oid
shard_index(Oid nsp, const char *index, int64 shardid)
{
	char		name[NAMEDATALEN];
	Oid			indexid;

	/* Citus names a shard's index <index>_<shard id>, as its relation */
	snprintf(name, sizeof(name), "%s_" INT64_FORMAT, index, shardid);
	indexid = get_relname_relid(name, nsp);
	if (!OidIsValid(indexid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("shard " INT64_FORMAT " of idem.citus_outbox has no index \"%s\"",
						shardid, name),
				 errdetail("A shard of idem.citus_outbox must have the indexes that idem_citus_colocate() made."),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, NULL)));
	return indexid;
}

/*
 * What verbs learn of the shards of idem.citus_outbox placed here, kept
 * across them: the shards' relations and indexes, in the order of their
 * ids, read again once idem_citus_generation() says that Citus changed the
 * table's shards or their placements.  Reading them costs two catalog
 * scans per shard of the table (its placement, and this node's group).
 */
typedef struct TenantRels
{
	MemoryContext cxt;			/* the list and its OutboxRels */
	List	   *rels;
	uint64		generation;		/* of the list */
} TenantRels;

static TenantRels tenant_rels = {NULL, NIL, 0};

/*
 * Read the shards of events placed here into tenant_rels.  The list is
 * built in a context of the transaction's, kept only once complete: an
 * error on the way leaves the previous list, to be read again.
 */
static void
read_tenant_rels(Oid nsp, Oid events)
{
	MemoryContext cxt = AllocSetContextCreate(CurrentMemoryContext,
											  "idem outbox shards",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext old = MemoryContextSwitchTo(cxt);
	List	   *rels = NIL;
	ListCell   *lc;

	foreach(lc, idem_citus_local_shards(events))
	{
		int64		shardid = *(int64 *) lfirst(lc);
		char		name[NAMEDATALEN];
		Oid			relid;
		OutboxRel  *r;

		snprintf(name, sizeof(name), "citus_outbox_" INT64_FORMAT, shardid);
		relid = get_relname_relid(name, nsp);
		if (!OidIsValid(relid))
			continue;
		r = palloc0(sizeof(OutboxRel));
		r->shardid = shardid;
		r->relid = relid;
		r->pkey = shard_index(nsp, "citus_outbox_pkey", shardid);
		r->due = shard_index(nsp, "citus_outbox_due_idx", shardid);
		r->run = shard_index(nsp, "citus_outbox_run_idx", shardid);
		r->delivered = shard_index(nsp, "citus_outbox_delivered_idx", shardid);
		r->tenant = true;
		r->natts = Natts_tenant_event;
		rels = lappend(rels, r);
	}
	MemoryContextSwitchTo(old);
	MemoryContextSetParent(cxt, TopMemoryContext);
	if (tenant_rels.cxt != NULL)
		MemoryContextDelete(tenant_rels.cxt);
	tenant_rels.cxt = cxt;
	tenant_rels.rels = rels;
}

/*
 * The relations this node delivers events from: idem.outbox first, then
 * the shards of idem.citus_outbox placed here, in the order of their ids.
 * Each shard's Citus metadata lock is taken, and the invalidations that
 * arrived meanwhile processed, before the list is trusted: a move or split
 * of its shard group waits for this transaction before it switches the
 * group to another node, and one that switched it before the lock was
 * granted has invalidated the list, which is then read again (and the
 * shards it names locked).  So no verb changes an event on a node that no
 * longer holds it (Citus's deferred drop keeps the old shard's relation a
 * while; it is not listed), and a shard moved here since is found by the
 * next verb.
 */
static List *
outbox_rels(void)
{
	OutboxRel  *r = palloc0(sizeof(OutboxRel));
	List	   *rels;
	ListCell   *lc;
	Oid			nsp;
	Oid			events;

	r->relid = idem_catalog_outbox_indexes(&r->pkey, &r->due, &r->run);
	r->natts = Natts_outbox;
	rels = list_make1(r);

	nsp = get_namespace_oid("idem", true);
	events = OidIsValid(nsp) ? get_relname_relid("citus_outbox", nsp) : InvalidOid;
	if (!OidIsValid(events))
		return rels;
	for (;;)
	{
		/* read before the catalog is: a change during the reads voids them */
		uint64		generation = idem_citus_generation(events);

		if (tenant_rels.generation != generation)
		{
			read_tenant_rels(nsp, events);
			tenant_rels.generation = generation;
		}
		foreach(lc, tenant_rels.rels)
			idem_outbox_lock_shard(((OutboxRel *) lfirst(lc))->shardid);
		if (tenant_rels.generation == idem_citus_generation(events))
			break;
	}
	return list_concat(rels, tenant_rels.rels);
}

/* Open r's relation, its shape checked */
static Relation
open_outbox_rel(OutboxRel *r)
{
	Relation	rel = table_open(r->relid, RowExclusiveLock);

	if (r->tenant && RelationGetDescr(rel)->natts != Natts_tenant_event)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("\"%s\" is not a shard of idem.citus_outbox as idem made it",
						RelationGetRelationName(rel)),
				 errdetail("A shard of idem.citus_outbox must have the columns that idem_citus_colocate() made."),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, NULL)));
	return rel;
}

/* ------------------------------------------------------------------------
 * Delivery through SPI
 * ------------------------------------------------------------------------
 */


static IdemQuery q_purge = {
	"DELETE FROM idem.outbox"
	" WHERE ctid OPERATOR(pg_catalog.=) ANY (ARRAY("
	"   SELECT ctid FROM idem.outbox"
	"    WHERE state OPERATOR(pg_catalog.=) 'delivered'"
	"      AND delivered_at OPERATOR(pg_catalog.<=) $1"
	"    ORDER BY delivered_at"
	"    LIMIT $2"
	"    FOR UPDATE SKIP LOCKED))",
	2, {TIMESTAMPTZOID, INT4OID}
};

static IdemQuery q_topic_insert = {
	"INSERT INTO idem.outbox_topics (topic, publishers, consumers, created_at)"
	" VALUES ($1, $2, $3, pg_catalog.now())"
	" ON CONFLICT (topic) DO NOTHING",
	3, {TEXTOID, REGROLEARRAYOID, REGROLEARRAYOID}
};

static IdemQuery q_topic_delete = {
	"DELETE FROM idem.outbox_topics WHERE topic OPERATOR(pg_catalog.=) $1",
	1, {TEXTOID}
};

/* a topic's events that are not delivered: pending, leased and dead */
static IdemQuery q_topic_undelivered = {
	"SELECT pg_catalog.count(*) FROM idem.outbox"
	" WHERE topic OPERATOR(pg_catalog.=) $1"
	"   AND state OPERATOR(pg_catalog.<>) 'delivered'",
	1, {TEXTOID}
};

static IdemQuery q_topic_delete_undelivered = {
	"DELETE FROM idem.outbox"
	" WHERE topic OPERATOR(pg_catalog.=) $1"
	"   AND state OPERATOR(pg_catalog.<>) 'delivered'",
	1, {TEXTOID}
};

static IdemQuery q_topic_grant = {
	"UPDATE idem.outbox_topics"
	"   SET publishers = CASE WHEN $3 AND NOT $2 OPERATOR(pg_catalog.=) ANY (publishers)"
	"                    THEN pg_catalog.array_append(publishers, $2) ELSE publishers END,"
	"       consumers = CASE WHEN NOT $3 AND NOT $2 OPERATOR(pg_catalog.=) ANY (consumers)"
	"                   THEN pg_catalog.array_append(consumers, $2) ELSE consumers END"
	" WHERE topic OPERATOR(pg_catalog.=) $1",
	3, {TEXTOID, REGROLEOID, BOOLOID}
};

static IdemQuery q_topic_revoke = {
	"UPDATE idem.outbox_topics"
	"   SET publishers = CASE WHEN $3 THEN pg_catalog.array_remove(publishers, $2)"
	"                    ELSE publishers END,"
	"       consumers = CASE WHEN NOT $3 THEN pg_catalog.array_remove(consumers, $2)"
	"                   ELSE consumers END"
	" WHERE topic OPERATOR(pg_catalog.=) $1",
	3, {TEXTOID, REGROLEOID, BOOLOID}
};

static void
arg_not_null(FunctionCallInfo fcinfo, int argno, const char *name)
{
	idem_arg_not_null(fcinfo, argno, name);
}

/* ------------------------------------------------------------------------
 * Claim
 * ------------------------------------------------------------------------
 */

/*
 * idem_outbox_claim(topic text, max_events integer, lease interval,
 *					 consumer text) returns setof (event_id, key, owner,
 *					 topic, payload, run_id, step, attempt, lease_token,
 *					 created_at, lease_until)
 */
/* A lease argument in microseconds, within (0, idem.outbox_max_lease]. */
static int64
checked_lease(Interval *lease)
{
	return idem_lease_usecs(lease, idem_outbox_max_lease, "idem.outbox_max_lease");
}

static void
check_can_wait(const char *what)
{
	if (!idem_wakeup_available())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("%s needs shared memory", what),
				 errdetail("idem is not in shared_preload_libraries."),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
							  "Add idem to shared_preload_libraries and restart the server, or claim with a wait (idem_outbox_claim(..., wait => ...)), which polls without it.")));
}

/*
 * The columns of a claim's rows, as idem_outbox_claim() returns them.
 */
#define CLAIM_RESULT_COLS		11

static bool
state_is(Datum state, const char *name)
{
	text	   *t = DatumGetTextPP(state);

	return VARSIZE_ANY_EXHDR(t) == strlen(name) &&
		memcmp(VARDATA_ANY(t), name, VARSIZE_ANY_EXHDR(t)) == 0;
}

/*
 * Whether a workflow run's event (its row in values) waits for an event of
 * the same run and topic that an earlier step wrote and that is pending or
 * leased: a probe of outbox_run_idx, whose entries are the run events not
 * yet delivered (a dead one does not hold the run up).  Earlier is the
 * step's place in the run, the order the steps committed in; the
 * transactions' start times (created_at) can be the other way round.  On a
 * shard of idem.citus_outbox the run is the tenant's, and its owner is
 * known by name (the OIDs are those of the nodes that wrote the events).
 */
static bool
held_back_by_run(OutboxRel *r, Relation rel, Relation runidx, Snapshot snap,
				 TupleTableSlot *probe, Datum *values, bool *nulls)
{
	ScanKeyData skey;
	IndexScanDesc scan;
	bool		held = false;
	Form_pg_attribute tenant_att = NULL;

	if (nulls[Anum_outbox_run_position - 1])
		return false;
	if (r->tenant)
		tenant_att = TupleDescAttr(RelationGetDescr(rel), Anum_tenant_event_tenant - 1);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_TEXTEQ,
				values[Anum_outbox_run_id - 1]);
	scan = index_beginscan(rel, runidx, snap, NULL, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	while (!held && index_getnext_slot(scan, ForwardScanDirection, probe))
	{
		bool		isnull;
		Datum		position;
		Datum		state;

		position = slot_getattr(probe, Anum_outbox_run_position, &isnull);
		if (isnull ||
			DatumGetInt32(position) >= DatumGetInt32(values[Anum_outbox_run_position - 1]))
			continue;
		state = slot_getattr(probe, Anum_outbox_state, &isnull);
		if (!state_is(state, "pending") && !state_is(state, "leased"))
			continue;
		if (r->tenant)
			held = datum_image_eq(slot_getattr(probe, Anum_tenant_event_owner_name, &isnull),
								  values[Anum_tenant_event_owner_name - 1], false, -1) &&
				datum_image_eq(slot_getattr(probe, Anum_tenant_event_tenant, &isnull),
							   values[Anum_tenant_event_tenant - 1],
							   tenant_att->attbyval, tenant_att->attlen);
		else
			held = DatumGetObjectId(slot_getattr(probe, Anum_outbox_owner, &isnull)) ==
				DatumGetObjectId(values[Anum_outbox_owner - 1]);
		held = held &&
			datum_image_eq(slot_getattr(probe, Anum_outbox_topic, &isnull),
						   values[Anum_outbox_topic - 1], false, -1);
	}
	index_endscan(scan);
	return held;
}

/* What one claim leases with, in every relation it claims from */
typedef struct ClaimState
{
	Datum		topictext;
	Datum		holder;
	Datum		lease_error;
	TimestampTz now;
	TimestampTz lease_end;
	Oid			caller;
	int32		max_events;
	uint64		claimed;
	uint64		dead;
	Tuplestorestate *store;
	TupleDesc	tupdesc;
} ClaimState;

/*
 * Lock the event a scan found in slot into locked, unless another
 * transaction holds it (a claim or purge skips it, as SKIP LOCKED would).
 */
static bool
lock_unless_held(Relation rel, TupleTableSlot *slot, Snapshot snap,
				 TupleTableSlot *locked, CommandId cid, int lockflags)
{
	ItemPointerData tid = slot->tts_tid;
	TM_FailureData tmfd;

	return table_tuple_lock(rel, &tid, snap, locked, cid, LockTupleExclusive,
							LockWaitSkip, lockflags, &tmfd) == TM_Ok;
}

/*
 * The claim's work in one relation, until cs->max_events are leased.
 *
 * What "SELECT ... ORDER BY next_attempt_at FOR UPDATE SKIP LOCKED" and an
 * UPDATE of the rows it locked would do, without the executor: the due
 * events of the topic are read off outbox_due_idx, oldest due first; each
 * is locked without waiting (one another claim or an ack holds is
 * skipped), in READ COMMITTED in its latest version, which is checked
 * again as the executor's recheck would (still undelivered and due, and
 * not held back by its run); then leased: due time moved to the end of the
 * lease, attempt counted, a new token.  An event whose last allowed
 * attempt ended with an expired lease becomes a dead letter instead.  A
 * pending event is always leased, even past a lowered
 * idem.outbox_max_attempts: the limit is applied when an attempt fails,
 * and the event's last error is its consumer's, not a lease's.
 */
static void
claim_rel(ClaimState *cs, OutboxRel *r)
{
	Relation	rel;
	Relation	dueidx;
	Relation	runidx = NULL;
	TupleTableSlot *slot;
	TupleTableSlot *locked;
	TupleTableSlot *probe = NULL;
	IndexScanDesc scan;
	ScanKeyData skey[2];
	Snapshot	snap;
	Snapshot	runsnap = NULL;
	CommandId	cid;
	int			lockflags;
	MemoryContext rowcxt;

	rel = open_outbox_rel(r);
	dueidx = index_open(r->due, AccessShareLock);
	CommandCounterIncrement();
	snap = RegisterSnapshot(GetTransactionSnapshot());
	cid = GetCurrentCommandId(true);
	lockflags = IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
	slot = table_slot_create(rel, NULL);
	locked = table_slot_create(rel, NULL);
	rowcxt = AllocSetContextCreate(CurrentMemoryContext, "idem outbox claim",
								   ALLOCSET_SMALL_SIZES);

	ScanKeyInit(&skey[0], 1, BTEqualStrategyNumber, F_TEXTEQ, cs->topictext);
	ScanKeyInit(&skey[1], 2, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(cs->now));
	scan = index_beginscan(rel, dueidx, snap, NULL, 2, 0);
	index_rescan(scan, skey, 2, NULL, 0);
	while (cs->claimed < (uint64) cs->max_events &&
		   index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		MemoryContext oldcxt;
		Datum		values[Natts_tenant_event];
		bool		nulls[Natts_tenant_event];
		bool		leased;
		bool		to_dead;
		HeapTuple	newtup;

		CHECK_FOR_INTERRUPTS();
		if (!lock_unless_held(rel, slot, snap, locked, cid, lockflags))
			continue;

		MemoryContextReset(rowcxt);
		oldcxt = MemoryContextSwitchTo(rowcxt);
		slot_getallattrs(locked);
		memcpy(values, locked->tts_values, sizeof(Datum) * r->natts);
		memcpy(nulls, locked->tts_isnull, sizeof(bool) * r->natts);
		leased = state_is(values[Anum_outbox_state - 1], "leased");
		if ((!leased && !state_is(values[Anum_outbox_state - 1], "pending")) ||
			DatumGetTimestampTz(values[Anum_outbox_next_attempt_at - 1]) > cs->now ||
			!datum_image_eq(values[Anum_outbox_topic - 1], cs->topictext, false, -1))
		{
			MemoryContextSwitchTo(oldcxt);
			continue;
		}
		if (!nulls[Anum_outbox_run_id - 1])
		{
			if (runidx == NULL)
			{
				/* as long as the scan, not the row */
				MemoryContextSwitchTo(oldcxt);
				runidx = index_open(r->run, AccessShareLock);
				probe = table_slot_create(rel, NULL);

				/*
				 * The run's earlier events as committed now, at every
				 * isolation level: a transaction snapshot taken before a
				 * dead letter was requeued would not see it pending, and
				 * the claim would lease its successors ahead of it.
				 */
				runsnap = IsolationUsesXactSnapshot() ?
					RegisterSnapshot(GetLatestSnapshot()) : snap;
				MemoryContextSwitchTo(rowcxt);
			}
			if (held_back_by_run(r, rel, runidx, runsnap, probe, values, nulls))
			{
				MemoryContextSwitchTo(oldcxt);
				continue;
			}
		}

		/* the claim that finds a last lease expired makes it a dead letter */
		to_dead = leased &&
			DatumGetInt32(values[Anum_outbox_attempts - 1]) >= idem_outbox_max_attempts;
		values[Anum_outbox_state - 1] = CStringGetTextDatum(to_dead ? "dead" : "leased");
		if (!to_dead)
			values[Anum_outbox_attempts - 1] =
				Int32GetDatum(DatumGetInt32(values[Anum_outbox_attempts - 1]) + 1);
		values[Anum_outbox_next_attempt_at - 1] = TimestampTzGetDatum(cs->lease_end);
		values[Anum_outbox_lease_token - 1] = to_dead ? (Datum) 0 : idem_random_uuid();
		nulls[Anum_outbox_lease_token - 1] = to_dead;
		values[Anum_outbox_leased_by - 1] = ObjectIdGetDatum(cs->caller);
		nulls[Anum_outbox_leased_by - 1] = false;
		values[Anum_outbox_lease_holder - 1] = cs->holder;
		nulls[Anum_outbox_lease_holder - 1] = false;
		if (to_dead)
		{
			values[Anum_outbox_last_error - 1] = cs->lease_error;
			nulls[Anum_outbox_last_error - 1] = false;
		}
		newtup = idem_form_row(rel, values, nulls, r->natts);
		idem_update_outbox_row(rel, &locked->tts_tid, newtup);

		if (to_dead)
			cs->dead++;
		else
		{
			Datum		row[CLAIM_RESULT_COLS];
			bool		rownulls[CLAIM_RESULT_COLS];
			static const AttrNumber columns[CLAIM_RESULT_COLS] = {
				Anum_outbox_event_id, Anum_outbox_key, Anum_outbox_owner,
				Anum_outbox_topic, Anum_outbox_payload, Anum_outbox_run_id,
				Anum_outbox_step, Anum_outbox_attempts,
				Anum_outbox_lease_token, Anum_outbox_created_at,
				Anum_outbox_next_attempt_at
			};

			for (int i = 0; i < CLAIM_RESULT_COLS; i++)
			{
				row[i] = values[columns[i] - 1];
				rownulls[i] = nulls[columns[i] - 1];
			}
			/* the role of that name here (none if it was dropped) */
			if (r->tenant)
				row[2] = ObjectIdGetDatum(get_role_oid(TextDatumGetCString(values[Anum_tenant_event_owner_name - 1]),
													   true));
			tuplestore_putvalues(cs->store, cs->tupdesc, row, rownulls);
			cs->claimed++;
		}
		MemoryContextSwitchTo(oldcxt);
	}
	index_endscan(scan);
	UnregisterSnapshot(snap);
	ExecDropSingleTupleTableSlot(slot);
	ExecDropSingleTupleTableSlot(locked);
	if (runidx != NULL)
	{
		if (runsnap != snap)
			UnregisterSnapshot(runsnap);
		ExecDropSingleTupleTableSlot(probe);
		index_close(runidx, NoLock);
	}
	index_close(dueidx, NoLock);
	table_close(rel, NoLock);
	MemoryContextDelete(rowcxt);
	/* the leases are seen by the rest of the transaction */
	CommandCounterIncrement();
}

/*
 * One claim of topic by caller into store: leases from now, from
 * idem.outbox and then the shards of idem.citus_outbox placed here (the
 * order is oldest due first within each, not across them).  Returns the
 * events leased (dead letters made on the way are counted, not returned).
 *
 * A claim is a few index probes and row updates; a statement doing the
 * same costs every claim its planning locks, executor start-up and
 * expression set-up, several times the work itself for a small batch.  In
 * REPEATABLE READ and SERIALIZABLE an event changed since the snapshot is
 * skipped, where the statement would fail with a serialization error.
 */
static uint64
claim_into(const char *topic, int32 max_events, int64 lease_us, Oid caller,
		   const char *consumer, Tuplestorestate *store, TupleDesc tupdesc,
		   uint64 *dead)
{
	ClaimState	cs;
	ListCell   *lc;

	cs.topictext = PointerGetDatum(cstring_to_text(topic));
	cs.holder = PointerGetDatum(cstring_to_text(consumer));
	cs.lease_error = PointerGetDatum(cstring_to_text("lease expired on the last attempt"));

	/*
	 * Clock time, not the transaction's start: a consumer loop in one
	 * procedure call must see events that became due since, and its lease
	 * must run from now.
	 */
	cs.now = GetCurrentTimestamp();
	cs.lease_end = cs.now + lease_us;
	cs.caller = caller;
	cs.max_events = max_events;
	cs.claimed = 0;
	cs.dead = 0;
	cs.store = store;
	cs.tupdesc = tupdesc;

	idem_wakeup_note_claim(topic);
	foreach(lc, outbox_rels())
	{
		if (cs.claimed >= (uint64) max_events)
			break;
		claim_rel(&cs, lfirst(lc));
	}

	idem_stats_count(IDEM_STAT_OUTBOX_CLAIMED, cs.claimed);
	idem_stats_count(IDEM_STAT_OUTBOX_DEAD, cs.dead);
	if (dead != NULL)
		*dead = cs.dead;
	return cs.claimed;
}

/*
 * A claim with a wait: passes of claim_into() until one leases events or
 * the wait has passed, sleeping between them until the topic is woken
 * (with shared memory) or IDEM_CLAIM_POLL_MS pass, for events that became
 * due by time and for a server without shared memory.
 *
 * Each pass is a subtransaction, rolled back when it leased nothing and
 * made no dead letter: an empty pass may still hold an event it locked and
 * skipped (taken by another consumer after its snapshot, or held back by
 * its run), whose holder's ack must not wait for this claim's wait to end.
 * A pass that made dead letters ends the claim, which commits them rather
 * than keep them locked.  Every pass after the first is checked as a new
 * claim would be: a consumer whose grant was revoked (or whose topic was
 * dropped) while it waited leases nothing more.
 */
static void
claim_waiting(const char *topic, int32 max_events, int64 lease_us, Oid caller,
			  const char *consumer, Tuplestorestate *store,
			  TupleDesc tupdesc, long wait_ms)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(),
													   wait_ms);
	MemoryContext passcxt;

	passcxt = AllocSetContextCreate(CurrentMemoryContext, "idem_outbox_claim pass",
									ALLOCSET_DEFAULT_SIZES);
	for (int pass = 0;; pass++)
	{
		IdemSubxact sx;
		MemoryContext oldcxt;
		uint64		claimed;
		uint64		dead;
		TimestampTz now;

		if (pass > 0)
		{
			AcceptInvalidationMessages();
			check_topic(topic, caller, TOPIC_CONSUME);
		}
		idem_subxact_begin(&sx);
		oldcxt = MemoryContextSwitchTo(passcxt);
		PG_TRY();
		{
			claimed = claim_into(topic, max_events, lease_us, caller, consumer,
								 store, tupdesc, &dead);
		}
		PG_CATCH();
		{
			ReThrowError(idem_subxact_abort(&sx));
		}
		PG_END_TRY();
		MemoryContextSwitchTo(oldcxt);
		idem_subxact_end(&sx, claimed > 0 || dead > 0);
		MemoryContextReset(passcxt);
		if (claimed > 0 || dead > 0)
			break;
		now = GetCurrentTimestamp();
		if (now >= deadline)
			break;
		idem_wakeup_sleep(topic, (long) ((deadline - now) / 1000));
	}
	MemoryContextDelete(passcxt);
}

Datum
idem_outbox_claim(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	Oid			caller = GetUserId();
	char	   *topic;
	int32		max_events;
	Interval   *lease;
	int64		lease_us;
	char	   *consumer;
	long		wait_ms;
	TupleDesc	tupdesc;
	Tuplestorestate *store;
	MemoryContext oldcxt;

	if (rsinfo == NULL || !IsA(rsinfo, ReturnSetInfo) ||
		(rsinfo->allowedModes & SFRM_Materialize) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem_outbox_claim() must be called in a context that accepts a set"),
				 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, NULL)));

	arg_not_null(fcinfo, 0, "topic");
	arg_not_null(fcinfo, 1, "max_events");
	arg_not_null(fcinfo, 2, "lease");
	topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	max_events = PG_GETARG_INT32(1);
	lease = PG_GETARG_INTERVAL_P(2);
	consumer = PG_ARGISNULL(3) ? psprintf("pid %d", MyProcPid) :
		text_to_cstring(PG_GETARG_TEXT_PP(3));
	wait_ms = PG_ARGISNULL(4) ? 0 : idem_wait_ms(PG_GETARG_INTERVAL_P(4));

	if (max_events <= 0 || max_events > OUTBOX_MAX_CLAIM)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_events must be between 1 and %d", OUTBOX_MAX_CLAIM),
				 errdetail("max_events is %d.", max_events),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	lease_us = checked_lease(lease);
	idem_check_name(IDEM_NAME_CONSUMER, consumer, OUTBOX_MAX_NAME_BYTES, NULL);
	idem_check_name(IDEM_NAME_TOPIC, topic, OUTBOX_MAX_NAME_BYTES, NULL);
	idem_check_can_write("idem_outbox_claim()");
	check_topic(topic, caller, TOPIC_CONSUME);
	if (!PG_ARGISNULL(4))
	{
		/* its second claim would see what its first saw */
		if (IsolationUsesXactSnapshot())
			ereport(ERROR,
					(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
					 errmsg("idem_outbox_claim() with a wait needs READ COMMITTED"),
					 errdetail("The transaction's isolation level is %s.",
							   IsolationIsSerializable() ? "SERIALIZABLE" : "REPEATABLE READ"),
					 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, "Claim without a wait, or in a READ COMMITTED transaction.")));
	}

	/*
	 * The row type the caller expects, where it says (a function scan
	 * does), spares building it from the catalog at every claim.
	 */
	if (rsinfo->expectedDesc != NULL &&
		rsinfo->expectedDesc->natts == CLAIM_RESULT_COLS)
		tupdesc = rsinfo->expectedDesc;
	else if (get_call_result_type(fcinfo, NULL, &tupdesc) != TYPEFUNC_COMPOSITE)
		elog(ERROR, "return type must be a row type");

	oldcxt = MemoryContextSwitchTo(rsinfo->econtext->ecxt_per_query_memory);
	tupdesc = CreateTupleDescCopy(tupdesc);
	store = tuplestore_begin_heap(true, false, work_mem);
	MemoryContextSwitchTo(oldcxt);

	if (wait_ms == 0)
		(void) claim_into(topic, max_events, lease_us, caller, consumer, store,
						  tupdesc, NULL);
	else
		claim_waiting(topic, max_events, lease_us, caller, consumer, store,
					  tupdesc, wait_ms);

	rsinfo->returnMode = SFRM_Materialize;
	rsinfo->setResult = store;
	rsinfo->setDesc = tupdesc;
	return (Datum) 0;
}

/* ------------------------------------------------------------------------
 * Ack, fail, requeue
 * ------------------------------------------------------------------------
 */

/*
 * The relations of this node's events, opened as a verb needs them, with
 * a snapshot and slots, for one event or a batch.
 *
 * Like the claim, a verb reaches its event by OID and index, without a
 * statement: found by its id (the primary key of idem.outbox, then of each
 * shard of idem.citus_outbox here), locked as UPDATE or DELETE would lock
 * it (waiting for a claim or another verb that holds it; then, in READ
 * COMMITTED, its latest version is the one checked, and in REPEATABLE READ
 * or SERIALIZABLE a version changed since the snapshot is a serialization
 * failure, as it would be for the statement), then changed in place.  An
 * ack delivers the event if the token leases it: deleted, or with
 * idem.outbox_keep_delivered made delivered (for the purge to delete after
 * idem.outbox_retention).  Deleting is what makes delivery cheap: no new
 * row version, no index entries for it, nothing left for the purge and
 * VACUUM to find; a row kept costs both, and is an option.
 */
typedef struct EventRel
{
	OutboxRel  *r;
	Relation	rel;			/* NULL until needed */
	Relation	pkey;
	TupleTableSlot *slot;
	TupleTableSlot *locked;
} EventRel;

typedef struct EventScan
{
	int			nrels;
	EventRel   *rels;
	Snapshot	snap;
	CommandId	cid;
	int			lockflags;
	TimestampTz now;
} EventScan;

typedef struct LockedEvent
{
	char	   *state;
	bool		token_matches;
	int32		attempts;
	char	   *topic;
	EventRel   *er;				/* where it is, its tuple in er->locked */
} LockedEvent;

typedef enum AckOutcome
{
	ACK_DONE,
	ACK_NOT_FOUND,
	ACK_NOT_LEASED,				/* the LockedEvent says why */
	ACK_TWICE					/* acknowledged earlier in this batch */
} AckOutcome;

static void
event_begin(EventScan *a)
{
	List	   *rels = outbox_rels();
	ListCell   *lc;

	a->nrels = list_length(rels);
	a->rels = palloc0(sizeof(EventRel) * a->nrels);
	foreach(lc, rels)
		a->rels[foreach_current_index(lc)].r = lfirst(lc);
	CommandCounterIncrement();
	a->snap = RegisterSnapshot(GetTransactionSnapshot());
	a->cid = GetCurrentCommandId(true);
	a->lockflags = IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
	a->now = GetCurrentTimestamp();
}

static void
event_end(EventScan *a)
{
	for (int i = 0; i < a->nrels; i++)
	{
		EventRel   *er = &a->rels[i];

		if (er->rel == NULL)
			continue;
		ExecDropSingleTupleTableSlot(er->slot);
		ExecDropSingleTupleTableSlot(er->locked);
		index_close(er->pkey, NoLock);
		table_close(er->rel, NoLock);
	}
	UnregisterSnapshot(a->snap);
	/* the changes are seen by the rest of the transaction */
	CommandCounterIncrement();
}

/*
 * Find event_id in this node's relations and lock it: ACK_DONE with ev
 * filled (token null: no token to match), or ACK_NOT_FOUND, or ACK_TWICE
 * for an event this very command changed (a batch naming it twice).
 */
static AckOutcome
event_lock(EventScan *a, Datum event_id, Datum token, bool token_null,
		   LockedEvent *ev)
{
	ScanKeyData skey;
	IndexScanDesc scan;
	ItemPointerData tid;
	TM_FailureData tmfd;
	TM_Result	result;
	EventRel   *er = NULL;
	bool		isnull;
	Datum		d;

	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_UUID_EQ, event_id);
	for (int i = 0; i < a->nrels && er == NULL; i++)
	{
		bool		found;

		if (a->rels[i].rel == NULL)
		{
			a->rels[i].rel = open_outbox_rel(a->rels[i].r);
			a->rels[i].pkey = index_open(a->rels[i].r->pkey, AccessShareLock);
			a->rels[i].slot = table_slot_create(a->rels[i].rel, NULL);
			a->rels[i].locked = table_slot_create(a->rels[i].rel, NULL);
		}
		scan = index_beginscan(a->rels[i].rel, a->rels[i].pkey, a->snap, NULL, 1, 0);
		index_rescan(scan, &skey, 1, NULL, 0);
		found = index_getnext_slot(scan, ForwardScanDirection, a->rels[i].slot);
		if (found)
		{
			tid = a->rels[i].slot->tts_tid;
			er = &a->rels[i];
		}
		index_endscan(scan);
	}
	if (er == NULL)
		return ACK_NOT_FOUND;

	result = table_tuple_lock(er->rel, &tid, a->snap, er->locked, a->cid,
							  LockTupleExclusive, LockWaitBlock, a->lockflags,
							  &tmfd);
	switch (result)
	{
		case TM_Ok:
			break;
		case TM_SelfModified:
			return ACK_TWICE;
		case TM_Deleted:
			if (IsolationUsesXactSnapshot())
				ereport(ERROR,
						(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
						 errmsg("could not serialize access due to concurrent delete of an outbox event"),
						 errdetail("Another transaction acknowledged or purged the event after this transaction's snapshot was taken."),
						 idem_errhint(ERRCODE_T_R_SERIALIZATION_FAILURE, "Retry the transaction: the retry sees the event's state.")));
			return ACK_NOT_FOUND;
		case TM_Updated:
			/* READ COMMITTED follows the update: only a snapshot's level */
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to concurrent update of an outbox event"),
					 errdetail("Another transaction changed the event after this transaction's snapshot was taken."),
					 idem_errhint(ERRCODE_T_R_SERIALIZATION_FAILURE, "Retry the transaction: the retry sees the event's state.")));
			break;
		default:
			elog(ERROR, "unexpected table_tuple_lock status: %u", result);
	}

	ev->er = er;
	ev->state = TextDatumGetCString(slot_getattr(er->locked, Anum_outbox_state, &isnull));
	d = slot_getattr(er->locked, Anum_outbox_lease_token, &isnull);
	ev->token_matches = !token_null && !isnull &&
		memcmp(DatumGetUUIDP(d), DatumGetUUIDP(token), UUID_LEN) == 0;
	ev->attempts = DatumGetInt32(slot_getattr(er->locked, Anum_outbox_attempts, &isnull));
	ev->topic = TextDatumGetCString(slot_getattr(er->locked, Anum_outbox_topic, &isnull));
	return ACK_DONE;
}

/* The locked event's columns, to change and store with event_store() */
static void
event_values(LockedEvent *ev, Datum *values, bool *nulls)
{
	slot_getallattrs(ev->er->locked);
	memcpy(values, ev->er->locked->tts_values, sizeof(Datum) * ev->er->r->natts);
	memcpy(nulls, ev->er->locked->tts_isnull, sizeof(bool) * ev->er->r->natts);
}

static void
event_store(LockedEvent *ev, Datum *values, bool *nulls)
{
	HeapTuple	newtup = idem_form_row(ev->er->rel, values, nulls, ev->er->r->natts);

	idem_update_outbox_row(ev->er->rel, &ev->er->locked->tts_tid, newtup);
	heap_freetuple(newtup);
}

/*
 * Under Citus, a tenant's event that was leased here before its shard
 * moved is not here any more: the new node delivers it again once the
 * lease runs out (an ack cannot reach it there).
 */
static void
report_not_found(Datum event_id)
{
	Oid			nsp = get_namespace_oid("idem", true);
	bool		tenants = OidIsValid(nsp) &&
		OidIsValid(get_relname_relid("citus_outbox", nsp));

	ereport(ERROR,
			(errcode(ERRCODE_IDEM_EVENT_NOT_FOUND),
			 errmsg("outbox event %s does not exist",
					DatumGetCString(DirectFunctionCall1(uuid_out, event_id))),
			 tenants ?
			 errdetail("It was never written, or it was delivered and purged, or its topic was dropped, or it is a tenant's event whose shard moved to another node, which delivers it again.") :
			 errdetail("It was never written, or it was delivered and purged, or its topic was dropped."),
			 idem_errhint(ERRCODE_IDEM_EVENT_NOT_FOUND, NULL)));
}

/*
 * Why the lease token does not (or no longer) give the right to ack or
 * fail the event; the event is left as it is.
 */
static void
report_not_leased(Datum event_id, LockedEvent *ev, IdemLeaseAct act)
{
	char	   *id = DatumGetCString(DirectFunctionCall1(uuid_out, event_id));

	if (strcmp(ev->state, "delivered") == 0)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_EVENT_DELIVERED),
				 errmsg("outbox event %s was already delivered", id),
				 errdetail(ev->token_matches ?
						   "It was acknowledged under this lease." :
						   "It was acknowledged under another lease."),
				 idem_errhint(ERRCODE_IDEM_EVENT_DELIVERED, NULL)));
	idem_lease_lost(idem_lease_fence(strcmp(ev->state, "leased") == 0,
									 ev->token_matches),
					act, id, ev->state, NULL);
}

/*
 * Lock the event that arguments 0 and 1 (event id, lease token) name and
 * check that the token leases it; raise the error that says why not.
 */
static void
lock_leased(EventScan *a, FunctionCallInfo fcinfo, IdemLeaseAct act,
			LockedEvent *ev)
{
	AckOutcome	outcome = event_lock(a, PG_GETARG_DATUM(0), PG_GETARG_DATUM(1),
									 false, ev);

	if (outcome == ACK_TWICE)
		elog(ERROR, "outbox event changed twice by one command");
	if (outcome == ACK_NOT_FOUND)
	{
		event_end(a);
		report_not_found(PG_GETARG_DATUM(0));
	}
	if (idem_lease_fence(strcmp(ev->state, "leased") == 0,
						 ev->token_matches) != IDEM_FENCE_HELD)
	{
		event_end(a);
		check_topic(ev->topic, GetUserId(), TOPIC_CONSUME);
		report_not_leased(PG_GETARG_DATUM(0), ev, act);
	}
}

static AckOutcome
ack_event(EventScan *a, Datum event_id, Datum token, LockedEvent *ev)
{
	AckOutcome	outcome = event_lock(a, event_id, token, false, ev);

	if (outcome != ACK_DONE)
		return outcome;
	if (idem_lease_fence(strcmp(ev->state, "leased") == 0,
						 ev->token_matches) != IDEM_FENCE_HELD)
		return ACK_NOT_LEASED;

	if (idem_outbox_keep_delivered)
	{
		Datum		values[Natts_tenant_event];
		bool		nulls[Natts_tenant_event];

		event_values(ev, values, nulls);
		values[Anum_outbox_state - 1] = CStringGetTextDatum("delivered");
		values[Anum_outbox_delivered_at - 1] = TimestampTzGetDatum(a->now);
		nulls[Anum_outbox_delivered_at - 1] = false;
		event_store(ev, values, nulls);
	}
	else
		idem_delete_outbox_row(ev->er->rel, &ev->er->locked->tts_tid);
	return ACK_DONE;
}

/* The error of an ack that found its event not leased, or no event */
static void
report_ack_failure(AckOutcome outcome, Datum event_id, LockedEvent *ev)
{
	if (outcome == ACK_NOT_FOUND)
		report_not_found(event_id);
	check_topic(ev->topic, GetUserId(), TOPIC_CONSUME);
	report_not_leased(event_id, ev, IDEM_ACT_EVENT_ACK);
}

/*
 * idem_outbox_ack(event_id uuid, lease_token uuid) returns void
 *
 * A lease that expired but was not taken over still holds: the delivery
 * happened, and accepting it spares a duplicate.
 */
Datum
idem_outbox_ack(PG_FUNCTION_ARGS)
{
	EventScan	a;
	AckOutcome	outcome;
	LockedEvent ev;

	arg_not_null(fcinfo, 0, "event_id");
	arg_not_null(fcinfo, 1, "lease_token");
	idem_check_can_write("idem_outbox_ack()");

	event_begin(&a);
	outcome = ack_event(&a, PG_GETARG_DATUM(0), PG_GETARG_DATUM(1), &ev);
	event_end(&a);
	if (outcome != ACK_DONE)
		report_ack_failure(outcome, PG_GETARG_DATUM(0), &ev);
	/* an error here rolls the ack back with the caller's transaction */
	check_topic(ev.topic, GetUserId(), TOPIC_CONSUME);
	idem_stats_count(IDEM_STAT_OUTBOX_ACKED, 1);
	PG_RETURN_VOID();
}

/*
 * A uuid[] argument of at most OUTBOX_MAX_CLAIM elements, counted from its
 * dimensions before it is unpacked: unpacked, an array of millions of
 * elements takes a pointer and a flag per element before the limit could
 * refuse it.
 */
static Datum *
uuid_array_arg(FunctionCallInfo fcinfo, int argno, const char *name, int *n)
{
	ArrayType  *arr;
	Datum	   *elems;
	bool	   *nulls;

	arg_not_null(fcinfo, argno, name);
	arr = PG_GETARG_ARRAYTYPE_P(argno);
	if (ARR_NDIM(arr) > 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be a one-dimensional array", name),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	if (ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr)) > OUTBOX_MAX_CLAIM)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("at most %d events can be acknowledged at once",
						OUTBOX_MAX_CLAIM),
				 errdetail_plural("%s has %d element.", "%s has %d elements.",
								  ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr)),
								  name, ArrayGetNItems(ARR_NDIM(arr), ARR_DIMS(arr))),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	deconstruct_array(arr, UUIDOID, UUID_LEN, false, TYPALIGN_CHAR,
					  &elems, &nulls, n);
	for (int i = 0; i < *n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("%s must not contain nulls", name),
					 idem_errhint(ERRCODE_NULL_VALUE_NOT_ALLOWED, NULL)));
	}
	return elems;
}

/* A pair of a batch ack, and where the caller put it */
typedef struct AckPair
{
	Datum		event_id;
	Datum		token;
	int			pos;
} AckPair;

static int
ack_pair_cmp(const void *a, const void *b)
{
	const AckPair *pa = a;
	const AckPair *pb = b;
	int			c = memcmp(DatumGetUUIDP(pa->event_id),
						   DatumGetUUIDP(pb->event_id), UUID_LEN);

	if (c != 0)
		return c;
	return (pa->pos > pb->pos) - (pa->pos < pb->pos);
}

/*
 * idem_outbox_ack(event_ids uuid[], lease_tokens uuid[]) returns integer
 *
 * The acks of a batch in one statement, all or nothing: if any pair's
 * lease does not hold, the error is the one the single ack would raise for
 * the first such pair, and nothing is delivered.  Returns how many.
 *
 * The events are locked in the order of their ids, whatever the caller's
 * order: two batches that share events then wait for each other rather
 * than deadlock.  So the first pair that fails in the caller's order is
 * not the first one met; the pairs after it in the caller's order are not
 * looked at once it is met (it is rolled back, so locking them would only
 * wait on their holders for nothing).
 */
Datum
idem_outbox_ack_batch(PG_FUNCTION_ARGS)
{
	Datum	   *ids;
	Datum	   *tokens;
	int			nids;
	int			ntokens;
	EventScan	a;
	AckPair    *pairs;
	int			failed = -1;
	AckOutcome	failure = ACK_DONE;
	LockedEvent failed_ev = {0};
	bool		twice = false;
	List	   *topics = NIL;
	ListCell   *lc;

	ids = uuid_array_arg(fcinfo, 0, "event_ids", &nids);
	tokens = uuid_array_arg(fcinfo, 1, "lease_tokens", &ntokens);
	if (nids != ntokens)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event_ids and lease_tokens must have the same length"),
				 errdetail_plural("event_ids has %d element; lease_tokens has %d.",
								  "event_ids has %d elements; lease_tokens has %d.",
								  nids, nids, ntokens),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	idem_check_can_write("idem_outbox_ack()");
	if (nids == 0)
		PG_RETURN_INT32(0);

	pairs = palloc(sizeof(AckPair) * nids);
	for (int i = 0; i < nids; i++)
	{
		pairs[i].event_id = ids[i];
		pairs[i].token = tokens[i];
		pairs[i].pos = i;
	}
	qsort(pairs, nids, sizeof(AckPair), ack_pair_cmp);

	event_begin(&a);
	for (int i = 0; i < nids; i++)
	{
		LockedEvent ev = {0};
		AckOutcome	outcome;

		CHECK_FOR_INTERRUPTS();
		if (failed >= 0 && pairs[i].pos > failed)
			continue;
		outcome = ack_event(&a, pairs[i].event_id, pairs[i].token, &ev);
		if (outcome == ACK_TWICE)
			twice = true;
		else if (outcome != ACK_DONE)
		{
			/* state and topic are copies, which outlive the scan */
			failed = pairs[i].pos;
			failure = outcome;
			failed_ev = ev;
		}
		/* a batch is mostly of one topic: each is checked once below */
		else if (topics == NIL || strcmp(llast(topics), ev.topic) != 0)
			topics = lappend(topics, ev.topic);
	}
	event_end(&a);
	/* the first pair in the caller's order that was not delivered says why */
	if (failed >= 0)
		report_ack_failure(failure, ids[failed], &failed_ev);
	if (twice)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("event_ids must not contain an event twice"),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, NULL)));
	foreach(lc, topics)
		check_topic(lfirst(lc), GetUserId(), TOPIC_CONSUME);
	idem_stats_count(IDEM_STAT_OUTBOX_ACKED, nids);
	PG_RETURN_INT32(nids);
}

/*
 * idem_outbox_fail(event_id uuid, lease_token uuid, error text,
 *					retry_after interval) returns timestamptz
 *
 * Returns when the event is due again, or NULL if it became a dead letter.
 */
Datum
idem_outbox_fail(PG_FUNCTION_ARGS)
{
	Oid			caller = GetUserId();
	int64		retry_after_us = 0;
	char	   *error;
	TimestampTz now = GetCurrentTimestamp();
	TimestampTz next = 0;
	bool		dead;
	EventScan	a;
	LockedEvent ev;
	Datum		values[Natts_tenant_event];
	bool		nulls[Natts_tenant_event];

	arg_not_null(fcinfo, 0, "event_id");
	arg_not_null(fcinfo, 1, "lease_token");
	arg_not_null(fcinfo, 2, "error");
	error = text_to_cstring(PG_GETARG_TEXT_PP(2));
	idem_check_error_text(IDEM_TEXT_ERROR, error);
	if (!PG_ARGISNULL(3))
		retry_after_us = idem_retry_after_usecs(PG_GETARG_INTERVAL_P(3));
	idem_check_can_write("idem_outbox_fail()");

	event_begin(&a);
	lock_leased(&a, fcinfo, IDEM_ACT_EVENT_FAIL, &ev);

	dead = ev.attempts >= idem_outbox_max_attempts;
	if (!dead)
		next = idem_backoff_next(now, ev.attempts, idem_outbox_backoff_base,
								 idem_outbox_backoff_cap,
								 idem_outbox_jitter ? IDEM_JITTER_FULL : IDEM_JITTER_NONE,
								 retry_after_us);
	event_values(&ev, values, nulls);
	values[Anum_outbox_state - 1] = CStringGetTextDatum(dead ? "dead" : "pending");
	if (!dead)
		values[Anum_outbox_next_attempt_at - 1] = TimestampTzGetDatum(next);
	nulls[Anum_outbox_lease_token - 1] = true;
	values[Anum_outbox_last_error - 1] = CStringGetTextDatum(error);
	nulls[Anum_outbox_last_error - 1] = false;
	event_store(&ev, values, nulls);
	event_end(&a);
	check_topic(ev.topic, caller, TOPIC_CONSUME);

	idem_stats_count(dead ? IDEM_STAT_OUTBOX_DEAD : IDEM_STAT_OUTBOX_FAILED, 1);
	if (dead)
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(next);
}

/*
 * idem_outbox_requeue(event_id uuid) returns void
 *
 * A dead letter becomes pending and due now, with a fresh attempt count;
 * its last error stays for the record.
 */
Datum
idem_outbox_requeue(PG_FUNCTION_ARGS)
{
	EventScan	a;
	LockedEvent ev;
	Datum		values[Natts_tenant_event];
	bool		nulls[Natts_tenant_event];

	arg_not_null(fcinfo, 0, "event_id");
	idem_check_can_write("idem_outbox_requeue()");

	event_begin(&a);
	if (event_lock(&a, PG_GETARG_DATUM(0), (Datum) 0, true, &ev) != ACK_DONE)
	{
		event_end(&a);
		report_not_found(PG_GETARG_DATUM(0));
	}
	if (strcmp(ev.state, "dead") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("outbox event %s is not a dead letter",
						DatumGetCString(DirectFunctionCall1(uuid_out, PG_GETARG_DATUM(0)))),
				 strcmp(ev.state, "pending") == 0 ?
				 errdetail("The event is pending.") :
				 strcmp(ev.state, "leased") == 0 ?
				 errdetail("The event is leased.") :
				 strcmp(ev.state, "delivered") == 0 ?
				 errdetail("The event was delivered.") :
				 errdetail("The event is in state \"%s\".", ev.state),
				 idem_errhint(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE, "Only dead events are requeued.")));
	event_values(&ev, values, nulls);
	values[Anum_outbox_state - 1] = CStringGetTextDatum("pending");
	values[Anum_outbox_attempts - 1] = Int32GetDatum(0);
	values[Anum_outbox_next_attempt_at - 1] = TimestampTzGetDatum(GetCurrentTimestamp());
	nulls[Anum_outbox_lease_token - 1] = true;
	event_store(&ev, values, nulls);
	event_end(&a);
	PG_RETURN_VOID();
}

/*
 * idem_outbox_extend(event_id uuid, lease_token uuid, lease interval)
 *		returns timestamptz
 *
 * A handler that needs longer than its lease keeps the event: the lease
 * runs on from now.  Fenced like an ack: only the token of the current
 * lease extends it, including one that ran out and nobody took over.
 * Returns the new end of the lease.
 */
Datum
idem_outbox_extend(PG_FUNCTION_ARGS)
{
	EventScan	a;
	LockedEvent ev;
	Datum		values[Natts_tenant_event];
	bool		nulls[Natts_tenant_event];
	int64		lease_us;
	TimestampTz until;

	arg_not_null(fcinfo, 0, "event_id");
	arg_not_null(fcinfo, 1, "lease_token");
	arg_not_null(fcinfo, 2, "lease");
	lease_us = checked_lease(PG_GETARG_INTERVAL_P(2));
	idem_check_can_write("idem_outbox_extend()");

	event_begin(&a);
	lock_leased(&a, fcinfo, IDEM_ACT_EVENT_EXTEND, &ev);
	until = GetCurrentTimestamp() + lease_us;
	event_values(&ev, values, nulls);
	values[Anum_outbox_next_attempt_at - 1] = TimestampTzGetDatum(until);
	event_store(&ev, values, nulls);
	event_end(&a);
	check_topic(ev.topic, GetUserId(), TOPIC_CONSUME);
	PG_RETURN_TIMESTAMPTZ(until);
}

/*
 * idem_outbox_release(event_id uuid, lease_token uuid) returns void
 *
 * A consumer hands back an event it has not delivered (it is stopping, or
 * will not get to it): pending and due now, and the claim's attempt not
 * counted, so another consumer takes it at once and no failure is
 * recorded.
 */
Datum
idem_outbox_release(PG_FUNCTION_ARGS)
{
	EventScan	a;
	LockedEvent ev;
	Datum		values[Natts_tenant_event];
	bool		nulls[Natts_tenant_event];

	arg_not_null(fcinfo, 0, "event_id");
	arg_not_null(fcinfo, 1, "lease_token");
	idem_check_can_write("idem_outbox_release()");

	event_begin(&a);
	lock_leased(&a, fcinfo, IDEM_ACT_EVENT_RELEASE, &ev);
	event_values(&ev, values, nulls);
	values[Anum_outbox_state - 1] = CStringGetTextDatum("pending");
	values[Anum_outbox_next_attempt_at - 1] = TimestampTzGetDatum(GetCurrentTimestamp());
	nulls[Anum_outbox_lease_token - 1] = true;
	values[Anum_outbox_attempts - 1] = Int32GetDatum(ev.attempts - 1);
	event_store(&ev, values, nulls);
	event_end(&a);
	check_topic(ev.topic, GetUserId(), TOPIC_CONSUME);
	PG_RETURN_VOID();
}

/*
 * idem_outbox_wait
 *		Sleep until an event of topic is committed after this session's
 *		last claim of it, or timeout passes; true if an event came.
 *
 * The wakeup without NOTIFY (wakeup.c), so it needs shared memory.  A
 * claim in READ COMMITTED notes where it stands; after a claim in
 * REPEATABLE READ or SERIALIZABLE, or with no claim, the wait is for
 * events committed after it begins.
 */
Datum
idem_outbox_wait(PG_FUNCTION_ARGS)
{
	char	   *topic;
	long		timeout_ms;

	arg_not_null(fcinfo, 0, "topic");
	arg_not_null(fcinfo, 1, "timeout");
	topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	timeout_ms = idem_wait_ms(PG_GETARG_INTERVAL_P(1));
	idem_check_name(IDEM_NAME_TOPIC, topic, OUTBOX_MAX_NAME_BYTES, NULL);

	/*
	 * Events replayed from the primary never wake a standby's wait, so it
	 * would always sleep its whole timeout, and the claim it leads to cannot
	 * lease there: refuse at once, as that claim does.
	 */
	PreventCommandDuringRecovery("idem_outbox_wait()");
	check_topic(topic, GetUserId(), TOPIC_CONSUME);
	check_can_wait("idem_outbox_wait()");

	PG_RETURN_BOOL(idem_wakeup_wait(topic, timeout_ms));
}

/*
 * idem_outbox_channel(topic text) returns text: the channel to LISTEN on
 * for topic's events, for its consumers only (wakeup.c says why).
 */
Datum
idem_outbox_channel(PG_FUNCTION_ARGS)
{
	char	   *topic;
	char		channel[NAMEDATALEN];

	arg_not_null(fcinfo, 0, "topic");
	topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	idem_check_name(IDEM_NAME_TOPIC, topic, OUTBOX_MAX_NAME_BYTES, NULL);
	check_topic(topic, GetUserId(), TOPIC_CONSUME);
	idem_wakeup_channel(topic, channel);
	PG_RETURN_TEXT_P(cstring_to_text(channel));
}

/* ------------------------------------------------------------------------
 * Purge
 * ------------------------------------------------------------------------
 */

/*
 * Delete up to limit events of r, a shard of idem.citus_outbox placed
 * here, delivered at or before cutoff, the oldest first, skipping those
 * another transaction holds, as q_purge does in idem.outbox.  Citus
 * refuses a statement on a shard's relation, so the rows are deleted as
 * an ack deletes them.
 */
static int64
purge_shard(OutboxRel *r, TimestampTz cutoff, int64 limit)
{
	Relation	rel = open_outbox_rel(r);
	Relation	idx = index_open(r->delivered, AccessShareLock);
	TupleTableSlot *slot = table_slot_create(rel, NULL);
	TupleTableSlot *locked = table_slot_create(rel, NULL);
	IndexScanDesc scan;
	ScanKeyData skey;
	Snapshot	snap;
	CommandId	cid;
	int			lockflags;
	int64		deleted = 0;

	CommandCounterIncrement();
	snap = RegisterSnapshot(GetTransactionSnapshot());
	cid = GetCurrentCommandId(true);
	lockflags = IsolationUsesXactSnapshot() ? 0 : TUPLE_LOCK_FLAG_FIND_LAST_VERSION;
	ScanKeyInit(&skey, 1, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(cutoff));
	scan = index_beginscan(rel, idx, snap, NULL, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);
	while (deleted < limit && index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		Datum		at;

		CHECK_FOR_INTERRUPTS();
		if (!lock_unless_held(rel, slot, snap, locked, cid, lockflags))
			continue;
		/* the version locked, which a requeue may have changed since */
		at = slot_getattr(locked, Anum_outbox_delivered_at, &isnull);
		if (isnull || DatumGetTimestampTz(at) > cutoff ||
			!state_is(slot_getattr(locked, Anum_outbox_state, &isnull), "delivered"))
			continue;
		idem_delete_outbox_row(rel, &locked->tts_tid);
		deleted++;
	}
	index_endscan(scan);
	UnregisterSnapshot(snap);
	ExecDropSingleTupleTableSlot(slot);
	ExecDropSingleTupleTableSlot(locked);
	index_close(idx, NoLock);
	table_close(rel, NoLock);
	CommandCounterIncrement();
	return deleted;
}

/*
 * idem_outbox_purge_delivered
 *		Delete up to batch_size events delivered more than
 *		idem.outbox_retention ago; return how many.
 *
 * From idem.outbox, and then from the shards of idem.citus_outbox placed
 * on this node, under their metadata locks as a claim takes them: a
 * node's purge (and its purge worker) keeps the tenants' delivered events
 * there in check as it does its own.  Pending, leased and dead events are
 * never purged.  Rows another purge has locked are skipped, so concurrent
 * purges share the work.  Needs a transaction with a snapshot, as any SPI
 * caller.
 */
int64
idem_outbox_purge_delivered(int batch_size)
{
	IdemOwnerSPI	spi;
	TimestampTz cutoff = GetCurrentTimestamp() -
		(int64) idem_outbox_retention * USECS_PER_SEC;
	Datum		values[2];
	char		nulls[2] = {' ', ' '};
	int64		deleted;
	ListCell   *lc;

	values[0] = TimestampTzGetDatum(cutoff);
	values[1] = Int32GetDatum(batch_size);
	idem_owner_spi_begin(&spi, idem_catalog_outbox());
	idem_query_run(&q_purge, values, nulls, 0);
	deleted = (int64) SPI_processed;
	idem_owner_spi_end(&spi);
	foreach(lc, outbox_rels())
	{
		OutboxRel  *r = lfirst(lc);

		if (deleted >= batch_size)
			break;
		if (r->tenant)
			deleted += purge_shard(r, cutoff, batch_size - deleted);
	}
	idem_stats_count(IDEM_STAT_PURGED_OUTBOX, deleted);
	return deleted;
}

/*
 * idem_outbox_purge(batch_size integer) returns bigint
 */
Datum
idem_outbox_purge(PG_FUNCTION_ARGS)
{
	PG_RETURN_INT64(idem_outbox_purge_delivered(idem_purge_batch_arg(fcinfo, "idem_outbox_purge()")));
}

/* ------------------------------------------------------------------------
 * Topic administration
 * ------------------------------------------------------------------------
 */

/*
 * idem_outbox_create_topic(topic text, publishers regrole[],
 *							consumers regrole[]) returns void
 */
Datum
idem_outbox_create_topic(PG_FUNCTION_ARGS)
{
	IdemOwnerSPI	spi;
	char	   *topic;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	uint64		inserted;

	arg_not_null(fcinfo, 0, "topic");
	topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	idem_check_name(IDEM_NAME_TOPIC, topic, OUTBOX_MAX_NAME_BYTES, NULL);
	values[0] = PointerGetDatum(cstring_to_text(topic));
	values[1] = idem_roles_arg(fcinfo, 1, "publishers");
	values[2] = idem_roles_arg(fcinfo, 2, "consumers");
	idem_check_can_write("idem_outbox_create_topic()");

	idem_owner_spi_begin(&spi, idem_catalog_outbox());
	idem_query_run(&q_topic_insert, values, nulls, 0);
	inserted = SPI_processed;
	idem_owner_spi_end(&spi);
	if (inserted == 0)
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("outbox topic \"%s\" already exists", topic),
				 idem_errhint(ERRCODE_DUPLICATE_OBJECT, "Use idem_outbox_grant() to add roles to it.")));
	PG_RETURN_VOID();
}

/*
 * idem_outbox_drop_topic(topic text, cascade boolean) returns void
 *
 * Refused (2BP01) while the topic has events that are not delivered:
 * pending, leased, or dead letters (a requeue would deliver one again).
 * With cascade they are deleted; a consumer's ack of one then finds no
 * event (IDE04).  Delivered events kept by idem.outbox_keep_delivered stay
 * until the purge, for history.  The lock on idem.outbox waits for the
 * transactions that write events and keeps new writers out until the drop
 * commits, when a producer of the topic finds it gone (42704): no event is
 * left behind on a topic that does not exist.  Tenant events under Citus,
 * in idem.citus_outbox, are not looked at.
 */
Datum
idem_outbox_drop_topic(PG_FUNCTION_ARGS)
{
	IdemOwnerSPI	spi;
	char	   *topic;
	bool		cascade;
	Datum		values[1];
	char		nulls[1] = {' '};
	bool		isnull;
	uint64		deleted;
	int64		undelivered;

	arg_not_null(fcinfo, 0, "topic");
	arg_not_null(fcinfo, 1, "cascade");
	topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	idem_check_name(IDEM_NAME_TOPIC, topic, OUTBOX_MAX_NAME_BYTES, NULL);
	cascade = PG_GETARG_BOOL(1);
	idem_check_can_write("idem_outbox_drop_topic()");
	values[0] = PointerGetDatum(cstring_to_text(topic));

	LockRelationOid(idem_catalog_outbox(), ShareLock);
	idem_owner_spi_begin(&spi, idem_catalog_outbox());
	idem_query_run(&q_topic_delete, values, nulls, 0);
	deleted = SPI_processed;
	if (deleted == 0)
	{
		idem_owner_spi_end(&spi);
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("outbox topic \"%s\" does not exist", topic),
				 idem_errhint(ERRCODE_UNDEFINED_OBJECT, "An administrator registers topics with idem_outbox_create_topic().")));
	}

	/*
	 * Every event committed so far, whatever the isolation level: the lock
	 * keeps events from being written or changed until this commits.
	 */
	idem_query_run_latest(&q_topic_undelivered, values, nulls, 0);
	undelivered = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0],
											  SPI_tuptable->tupdesc, 1, &isnull));
	if (undelivered > 0 && !cascade)
	{
		idem_owner_spi_end(&spi);
		ereport(ERROR,
				(errcode(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST),
				 errmsg_plural("cannot drop outbox topic \"%s\" because it has %lld undelivered event",
							   "cannot drop outbox topic \"%s\" because it has %lld undelivered events",
							   (unsigned long) Min(undelivered, LONG_MAX),
							   topic, (long long) undelivered),
				 errdetail("Pending, leased and dead events keep their topic."),
				 idem_errhint(ERRCODE_DEPENDENT_OBJECTS_STILL_EXIST,
							  "Let them be delivered, or drop the topic with cascade => true, which deletes them.")));
	}
	deleted = 0;
	if (undelivered > 0)
	{
		idem_query_run_latest(&q_topic_delete_undelivered, values, nulls, 0);
		deleted = SPI_processed;
	}
	idem_owner_spi_end(&spi);
	/* the consumers that wait on it find it gone */
	if (idem_outbox_notify || idem_wakeup_available())
		remember_notify(topic, idem_outbox_notify);
	if (deleted > 0)
		ereport(NOTICE,
				(errmsg_plural("drop cascades to %llu undelivered event",
							   "drop cascades to %llu undelivered events",
							   (unsigned long) Min(deleted, LONG_MAX),
							   (unsigned long long) deleted),
				 errdetail("The events were deleted; their consumers' acks find no event.")));
	PG_RETURN_VOID();
}

static void
change_topic(FunctionCallInfo fcinfo, IdemQuery *q, const char *what)
{
	IdemOwnerSPI	spi;
	char	   *topic;
	char	   *privilege;
	Datum		values[3];
	char		nulls[3] = {' ', ' ', ' '};
	uint64		updated;

	arg_not_null(fcinfo, 0, "topic");
	arg_not_null(fcinfo, 1, "role");
	arg_not_null(fcinfo, 2, "privilege");
	topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	privilege = text_to_cstring(PG_GETARG_TEXT_PP(2));
	if (strcmp(privilege, "publish") != 0 && strcmp(privilege, "consume") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("unrecognized outbox topic privilege \"%s\"", privilege),
				 idem_errhint(ERRCODE_INVALID_PARAMETER_VALUE, "The privileges are \"publish\" and \"consume\".")));
	idem_check_can_write(what);
	/* a dropped role's OID may still be revoked */
	if (q == &q_topic_grant)
		idem_check_role_exists(PG_GETARG_OID(1));
	values[0] = PointerGetDatum(cstring_to_text(topic));
	values[1] = PG_GETARG_DATUM(1);
	values[2] = BoolGetDatum(strcmp(privilege, "publish") == 0);

	idem_owner_spi_begin(&spi, idem_catalog_outbox());
	idem_query_run(q, values, nulls, 0);
	updated = SPI_processed;
	idem_owner_spi_end(&spi);
	if (updated == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("outbox topic \"%s\" does not exist", topic),
				 idem_errhint(ERRCODE_UNDEFINED_OBJECT, "An administrator registers topics with idem_outbox_create_topic().")));
}

/*
 * idem_outbox_grant(topic text, role regrole, privilege text) returns void
 */
Datum
idem_outbox_grant(PG_FUNCTION_ARGS)
{
	change_topic(fcinfo, &q_topic_grant, "idem_outbox_grant()");
	PG_RETURN_VOID();
}

/*
 * idem_outbox_revoke(topic text, role regrole, privilege text) returns void
 */
Datum
idem_outbox_revoke(PG_FUNCTION_ARGS)
{
	change_topic(fcinfo, &q_topic_revoke, "idem_outbox_revoke()");
	PG_RETURN_VOID();
}
