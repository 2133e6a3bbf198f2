/*-------------------------------------------------------------------------
 *
 * catalog.c
 *		idem's own tables (idem.keys, idem.outbox) and the per-key
 *		advisory lock.
 *
 * The tables are reached by OID, cached and reset by a relcache callback, so
 * no search_path can redirect idem's reads or writes.  Access is direct:
 * an index probe for the lookup and heap_insert plus index inserts for the
 * writes.  That is faster than SPI, has no plan to go stale (a generic plan
 * built while the catalog was empty would be a sequential scan forever), and
 * needs no grants to callers, who cannot see the tables at all.  Direct
 * access skips the executor's read-only and permission checks; the callers
 * in execute.c do those themselves.
 *
 * The lookup uses SnapshotSelf: it sees rows committed by anyone up to now
 * and this transaction's own rows, whatever the isolation level, and takes
 * no SSI predicate locks.  Under REPEATABLE READ or SERIALIZABLE the caller
 * must still ask idem_record_visible_to_snapshot() whether the row found is
 * one its snapshot could see.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/catalog.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/htup_details.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/dependency.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_namespace.h"
#include "commands/extension.h"
#include "common/hashfn.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "storage/lmgr.h"
#include "storage/lock.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/uuid.h"

#include "compat.h"
#include "idem.h"

/* Column numbers of idem.keys */
#define Anum_keys_key			1
#define Anum_keys_owner			2
#define Anum_keys_fingerprint	3
#define Anum_keys_response		4
#define Anum_keys_created_at	5
#define Anum_keys_expires_at	6
#define Natts_keys				6

/* Column numbers of idem.outbox */
#define Anum_outbox_event_id	1
#define Anum_outbox_key			2
#define Anum_outbox_owner		3
#define Anum_outbox_topic		4
#define Anum_outbox_payload		5
#define Anum_outbox_created_at	6
#define Natts_outbox			6

/* Seed of the advisory lock hash: part of the on-disk-stable lock space. */
#define IDEM_LOCK_SEED			UINT64CONST(0x6964656d6b657973)

typedef struct IdemCatalog
{
	Oid			keys;
	Oid			keys_pkey;
	Oid			keys_expires;
	Oid			outbox;
} IdemCatalog;

static IdemCatalog catalog;
static bool catalog_valid = false;
static bool catalog_callback_registered = false;

/*
 * Only mark the cache stale: an invalidation can arrive in the middle of an
 * operation (at any lock acquisition), which must keep using the OIDs it
 * resolved.  The next catalog_resolve() looks them up again.
 */
static void
catalog_invalidate(Datum arg, Oid relid)
{
	if (relid == InvalidOid || relid == catalog.keys ||
		relid == catalog.keys_pkey || relid == catalog.keys_expires ||
		relid == catalog.outbox)
		catalog_valid = false;
}

static Oid
catalog_relid(const char *relname, Oid nspid)
{
	Oid			relid = get_relname_relid(relname, nspid);

	if (!OidIsValid(relid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("relation \"idem.%s\" does not exist", relname),
				 errhint("Reinstall the extension with DROP EXTENSION idem; CREATE EXTENSION idem.")));
	return relid;
}

/*
 * Find idem's tables.  The schema must be the one the extension created:
 * a schema named "idem" made by someone else is never used.
 */
static void
catalog_resolve(void)
{
	Oid			extoid;
	Oid			nspid;

	if (catalog_valid)
		return;

	if (!catalog_callback_registered)
	{
		CacheRegisterRelcacheCallback(catalog_invalidate, (Datum) 0);
		catalog_callback_registered = true;
	}

	extoid = get_extension_oid("idem", true);
	if (!OidIsValid(extoid))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("extension \"idem\" is not installed in this database"),
				 errhint("Run CREATE EXTENSION idem.")));

	nspid = get_namespace_oid("idem", true);
	if (!OidIsValid(nspid) ||
		getExtensionOfObject(NamespaceRelationId, nspid) != extoid)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("schema \"idem\" does not belong to extension \"idem\""),
				 errhint("Reinstall the extension with DROP EXTENSION idem; CREATE EXTENSION idem.")));

	catalog.keys_pkey = catalog_relid("keys_pkey", nspid);
	catalog.keys_expires = catalog_relid("keys_expires_at_idx", nspid);
	catalog.outbox = catalog_relid("outbox", nspid);
	catalog.keys = catalog_relid("keys", nspid);
	catalog_valid = true;
}

static void
set_key_locktag(LOCKTAG *tag, const char *key, int keylen)
{
	uint64		h = hash_bytes_extended((const unsigned char *) key, keylen,
										IDEM_LOCK_SEED);

	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (h >> 32), (uint32) h,
						 IDEM_LOCKTAG_CLASS);
}

/*
 * idem_lock_key
 *		Take the key's transaction-scoped advisory lock, waiting or not.
 *
 * The lock only spares a concurrent caller a wasted execution and gives it a
 * clean wait; the unique index on idem.keys stays the ground truth.
 */
void
idem_lock_key(const char *key, int keylen, bool wait)
{
	LOCKTAG		tag;

	set_key_locktag(&tag, key, keylen);
	if (LockAcquire(&tag, ExclusiveLock, false, !wait) == LOCKACQUIRE_NOT_AVAIL)
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_IN_PROGRESS),
				 errmsg("idempotency key \"%s\" is in use by another transaction",
						key),
				 errdetail("A call with this key is still in progress and idem.wait is off."),
				 errhint("Retry after the other transaction ends.")));
}

static bool
try_lock_key(const char *key, int keylen)
{
	LOCKTAG		tag;

	set_key_locktag(&tag, key, keylen);
	return LockAcquire(&tag, ExclusiveLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

static void
unlock_key(const char *key, int keylen)
{
	LOCKTAG		tag;

	set_key_locktag(&tag, key, keylen);
	LockRelease(&tag, ExclusiveLock, false);
}

/*
 * idem_lookup_key
 *		Find the live record for key.  Caller holds the key's lock.
 *
 * Fills rec, with the response copied into the current memory context, and
 * returns true if a record exists.
 */
bool
idem_lookup_key(const char *key, IdemRecord *rec)
{
	Relation	rel;
	Relation	idx;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData skey;
	text	   *keytext = cstring_to_text(key);
	bool		found = false;
	Snapshot	xact_snapshot = NULL;

	catalog_resolve();

	/* the snapshot a REPEATABLE READ caller reads with (taken already) */
	if (IsolationUsesXactSnapshot())
		xact_snapshot = GetTransactionSnapshot();

	rel = table_open(catalog.keys, AccessShareLock);
	idx = index_open(catalog.keys_pkey, AccessShareLock);
	ScanKeyInit(&skey, 1, BTEqualStrategyNumber, F_TEXTEQ,
				PointerGetDatum(keytext));
	slot = table_slot_create(rel, NULL);
	scan = index_beginscan(rel, idx, SnapshotSelf, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);

	if (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		bool		should_free;
		HeapTuple	tuple = ExecFetchSlotHeapTuple(slot, false, &should_free);
		bytea	   *fp;

		found = true;
		rec->tid = tuple->t_self;
		rec->xmin = HeapTupleHeaderGetXmin(tuple->t_data);
		rec->owner = DatumGetObjectId(slot_getattr(slot, Anum_keys_owner, &isnull));
		fp = DatumGetByteaPP(slot_getattr(slot, Anum_keys_fingerprint, &isnull));
		if (VARSIZE_ANY_EXHDR(fp) == IDEM_FINGERPRINT_LEN)
			memcpy(rec->fingerprint, VARDATA_ANY(fp), IDEM_FINGERPRINT_LEN);
		else
			memset(rec->fingerprint, 0, IDEM_FINGERPRINT_LEN);
		rec->response = DatumGetJsonbPCopy(slot_getattr(slot, Anum_keys_response, &isnull));
		rec->created_at = DatumGetTimestampTz(slot_getattr(slot, Anum_keys_created_at, &isnull));
		rec->expires_at = DatumGetTimestampTz(slot_getattr(slot, Anum_keys_expires_at, &isnull));

		/*
		 * Own rows are always ours to see; comparing them with the
		 * transaction snapshot would misfire on its stale command id.
		 */
		rec->visible = TransactionIdIsCurrentTransactionId(rec->xmin) ||
			xact_snapshot == NULL ||
			table_tuple_satisfies_snapshot(rel, slot, xact_snapshot);
		if (should_free)
			heap_freetuple(tuple);
	}

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	table_close(rel, AccessShareLock);
	pfree(keytext);
	return found;
}

/*
 * Delete one catalog row, tolerating a concurrent purge that deleted it
 * first (it may have released the key's lock before committing).
 */
static bool
delete_row(Relation rel, ItemPointer tid)
{
	TM_Result	result;
	TM_FailureData tmfd;

	result = heap_delete(rel, tid, GetCurrentCommandId(true), InvalidSnapshot,
						 true, &tmfd, false);
	switch (result)
	{
		case TM_Ok:
			return true;
		case TM_Deleted:
		case TM_Updated:
			return false;
		case TM_SelfModified:
			/* already deleted by this very transaction */
			return false;
		default:
			elog(ERROR, "unexpected heap_delete status: %u", result);
	}
	return false;
}

/*
 * idem_delete_key
 *		Remove an expired record so the key can be written afresh.
 */
void
idem_delete_key(IdemRecord *rec)
{
	Relation	rel;

	catalog_resolve();
	rel = table_open(catalog.keys, RowExclusiveLock);
	delete_row(rel, &rec->tid);
	table_close(rel, RowExclusiveLock);
	CommandCounterIncrement();
}

/*
 * Insert a row into one of idem's tables and its indexes (unique checks
 * included), then make it visible to the rest of this transaction: later
 * calls and nested ones must see it.
 */
static void
insert_row(Oid relid, Datum *values, bool *nulls)
{
	Relation	rel = table_open(relid, RowExclusiveLock);
	HeapTuple	tuple = heap_form_tuple(RelationGetDescr(rel), values, nulls);

	CatalogTupleInsert(rel, tuple);
	heap_freetuple(tuple);
	table_close(rel, RowExclusiveLock);
	CommandCounterIncrement();
}

/*
 * idem_insert_key
 *		Write the key record.  Caller holds the key's lock.
 */
void
idem_insert_key(const char *key, Oid owner, const uint8 *fingerprint,
				Jsonb *response, TimestampTz created_at,
				TimestampTz expires_at)
{
	Datum		values[Natts_keys];
	bool		nulls[Natts_keys] = {0};
	bytea	   *fp = palloc(VARHDRSZ + IDEM_FINGERPRINT_LEN);

	catalog_resolve();

	SET_VARSIZE(fp, VARHDRSZ + IDEM_FINGERPRINT_LEN);
	memcpy(VARDATA(fp), fingerprint, IDEM_FINGERPRINT_LEN);

	values[Anum_keys_key - 1] = CStringGetTextDatum(key);
	values[Anum_keys_owner - 1] = ObjectIdGetDatum(owner);
	values[Anum_keys_fingerprint - 1] = PointerGetDatum(fp);
	values[Anum_keys_response - 1] = JsonbPGetDatum(response);
	values[Anum_keys_created_at - 1] = TimestampTzGetDatum(created_at);
	values[Anum_keys_expires_at - 1] = TimestampTzGetDatum(expires_at);

	insert_row(catalog.keys, values, nulls);
}

static Datum
random_uuid(void)
{
	pg_uuid_t  *uuid = palloc(UUID_LEN);

	idem_random_id(uuid->data);
	/* RFC 4122 version 4, variant 1 */
	uuid->data[6] = (uuid->data[6] & 0x0f) | 0x40;
	uuid->data[8] = (uuid->data[8] & 0x3f) | 0x80;
	return UUIDPGetDatum(uuid);
}

/*
 * idem_insert_outbox
 *		Append an outbox event in the caller's transaction.
 */
void
idem_insert_outbox(const char *key, Oid owner, const char *topic,
				   Jsonb *payload, TimestampTz created_at)
{
	Datum		values[Natts_outbox];
	bool		nulls[Natts_outbox] = {0};

	catalog_resolve();

	values[Anum_outbox_event_id - 1] = random_uuid();
	values[Anum_outbox_key - 1] = CStringGetTextDatum(key);
	values[Anum_outbox_owner - 1] = ObjectIdGetDatum(owner);
	values[Anum_outbox_topic - 1] = CStringGetTextDatum(topic);
	values[Anum_outbox_payload - 1] = JsonbPGetDatum(payload);
	values[Anum_outbox_created_at - 1] = TimestampTzGetDatum(created_at);

	insert_row(catalog.outbox, values, nulls);
}

/*
 * idem_purge_expired
 *		Delete up to batch_size expired key records; return how many.
 *
 * A record whose key is locked by a running call is skipped: that call owns
 * it.  Each key's lock is released as soon as its row is deleted, so a
 * purge of any size holds at most one advisory lock; a caller that takes the
 * key in between waits on the row instead and then finds it gone.
 */
int64
idem_purge_expired(int batch_size)
{
	Relation	rel;
	Relation	idx;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	ScanKeyData skey;
	int64		deleted = 0;
	TimestampTz now = GetCurrentTransactionStartTimestamp();

	catalog_resolve();

	rel = table_open(catalog.keys, RowExclusiveLock);
	idx = index_open(catalog.keys_expires, AccessShareLock);
	ScanKeyInit(&skey, 1, BTLessEqualStrategyNumber, F_TIMESTAMPTZ_LE,
				TimestampTzGetDatum(now));
	slot = table_slot_create(rel, NULL);
	scan = index_beginscan(rel, idx, SnapshotSelf, 1, 0);
	index_rescan(scan, &skey, 1, NULL, 0);

	while (deleted < batch_size &&
		   index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		bool		isnull;
		text	   *keytext;
		char	   *key;
		int			keylen;

		CHECK_FOR_INTERRUPTS();

		keytext = DatumGetTextPP(slot_getattr(slot, Anum_keys_key, &isnull));
		key = text_to_cstring(keytext);
		keylen = strlen(key);

		/*
		 * Releasing drops only this acquisition: if an earlier call in this
		 * transaction holds the key, its hold stays.
		 */
		if (try_lock_key(key, keylen))
		{
			if (delete_row(rel, &slot->tts_tid))
				deleted++;
			unlock_key(key, keylen);
		}
		pfree(key);
	}

	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(idx, AccessShareLock);
	table_close(rel, RowExclusiveLock);
	CommandCounterIncrement();
	return deleted;
}
