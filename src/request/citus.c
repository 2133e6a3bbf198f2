/*-------------------------------------------------------------------------
 *
 * citus.c
 *		idem under Citus: whether Citus is installed, where idem's tenant
 *		key records are (idem.citus_keys, made by idem_citus_colocate() in
 *		workflow/tenant.c), and the refusal of a call whose business
 *		statement Citus distributed.
 *
 * idem_execute() records its key on the node it runs on.  Under Citus a
 * statement that writes a distributed table runs on other nodes in a
 * distributed transaction, which commits apart from that key record (in
 * one phase: a lost reply from a worker, and the retry executes again).
 * Such a call is refused (IDC02) before anything is recorded, so its
 * transaction aborts everywhere.  Whether the transaction has a part on
 * another node is Citus's own state: its list of the connections on which
 * it opened a remote transaction (InProgressTransactions), looked up in
 * Citus's library at the first use.  Citus exports it and there is no SQL
 * equivalent; a statement that Citus executes on a local shard adds none.
 *
 * Built against PostgreSQL 16 or later, Citus's library exports only its
 * SQL-callable functions: PGXS compiles modules with -fvisibility=hidden
 * there, and Citus marks none of its internals for export.  Its symbol
 * table (.symtab) still lists them unless the library was stripped, so
 * that is where idem looks for what the dynamic linker cannot find
 * (citus_symbol()); a stripped library is an error naming what is missing.
 *
 * Copyright (c) 2026, idem authors
 *
 * IDENTIFICATION
 *	  src/request/citus.c
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#ifdef __linux__
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <unistd.h>
#endif

#include "catalog/namespace.h"
#include "commands/extension.h"
#include "fmgr.h"
#include "lib/ilist.h"
#include "nodes/makefuncs.h"
#include "utils/datum.h"
#include "utils/memutils.h"
#include "utils/guc.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"

#include "compat.h"
#include "request/request.h"

/*
 * Citus's InProgressTransactions: the connections to other nodes on which
 * this transaction opened a remote transaction, once looked up.
 */
static dlist_head *citus_remote_transactions = NULL;

/*
 * Citus's AllowedDistributionColumn (distributed/transaction_management.h,
 * the same in Citus 13 and 14): the distribution value a force-delegated
 * function is pinned to.  While it is active, Citus refuses a statement on
 * a distributed table that is not filtered by that value in that
 * colocation group.
 */
typedef struct CitusAllowedValue
{
	Const	   *distributionColumnValue;
	uint32		colocationId;
	bool		isActive;
	int			executorLevel;
} CitusAllowedValue;

static CitusAllowedValue *citus_allowed_value = NULL;
static int *citus_executor_level = NULL;

static bool citus_loaded(void);

/*
 * Citus's CitusHasBeenLoaded(), once looked up; citus_hidden if it is not to
 * be found.
 */
static bool (*citus_has_been_loaded) (void) = NULL;
static bool citus_hidden = false;

#ifdef __linux__
/*
 * The address of name in the loaded library that holds known (an exported
 * symbol of it), from the library file's symbol table: the same offset
 * from known as in the file.  NULL if the file has no symbol table (it was
 * stripped) or does not list name, or if it is not the file that was
 * loaded (replaced since by another build: its offsets would point
 * anywhere), which is when known is not where the file places it or its
 * notes (the build ID) differ from the loaded ones.
 */
static void *
elf_symtab_lookup(void *known, const char *name)
{
	Dl_info		info;
	int			fd;
	Elf64_Ehdr	eh;
	Elf64_Shdr *sh = NULL;
	Elf64_Sym  *syms = NULL;
	char	   *strs = NULL;
	void	   *found = NULL;
	Elf64_Addr	known_value = 0,
				name_value = 0;
	bool		have_known = false,
				have_name = false;

	if (dladdr(known, &info) == 0 || info.dli_fname == NULL || info.dli_sname == NULL)
		return NULL;
	fd = open(info.dli_fname, O_RDONLY | PG_BINARY, 0);
	if (fd < 0)
		return NULL;
	if (pread(fd, &eh, sizeof(eh), 0) != sizeof(eh) ||
		memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
		eh.e_ident[EI_CLASS] != ELFCLASS64 ||
		eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shnum == 0)
		goto done;
	sh = palloc(sizeof(Elf64_Shdr) * eh.e_shnum);
	if (pread(fd, sh, sizeof(Elf64_Shdr) * eh.e_shnum, eh.e_shoff) !=
		(ssize_t) (sizeof(Elf64_Shdr) * eh.e_shnum))
		goto done;
	for (int i = 0; i < eh.e_shnum && !(have_known && have_name); i++)
	{
		Elf64_Shdr *strsh;
		size_t		n;

		if (sh[i].sh_type != SHT_SYMTAB || sh[i].sh_entsize != sizeof(Elf64_Sym) ||
			sh[i].sh_link >= eh.e_shnum)
			continue;
		strsh = &sh[sh[i].sh_link];
		syms = palloc(sh[i].sh_size);
		strs = palloc(strsh->sh_size + 1);
		if (pread(fd, syms, sh[i].sh_size, sh[i].sh_offset) != (ssize_t) sh[i].sh_size ||
			pread(fd, strs, strsh->sh_size, strsh->sh_offset) != (ssize_t) strsh->sh_size)
			goto done;
		strs[strsh->sh_size] = '\0';
		n = sh[i].sh_size / sizeof(Elf64_Sym);
		for (size_t j = 0; j < n; j++)
		{
			const char *sname;

			if (syms[j].st_name >= strsh->sh_size || syms[j].st_shndx == SHN_UNDEF)
				continue;
			sname = strs + syms[j].st_name;
			if (!have_known && strcmp(sname, info.dli_sname) == 0)
			{
				known_value = syms[j].st_value;
				have_known = true;
			}
			else if (!have_name && strcmp(sname, name) == 0)
			{
				name_value = syms[j].st_value;
				have_name = true;
			}
		}
	}
	if (have_known && have_name &&
		(char *) info.dli_saddr - (char *) info.dli_fbase == (ptrdiff_t) known_value)
	{
		bool		same = true;

		/* the loaded notes are where the file's say, below its base */
		for (int i = 0; i < eh.e_shnum && same; i++)
		{
			char	   *note;

			if (sh[i].sh_type != SHT_NOTE || !(sh[i].sh_flags & SHF_ALLOC))
				continue;
			note = palloc(sh[i].sh_size);
			same = pread(fd, note, sh[i].sh_size, sh[i].sh_offset) == (ssize_t) sh[i].sh_size &&
				memcmp(note, (char *) info.dli_fbase + sh[i].sh_addr, sh[i].sh_size) == 0;
			pfree(note);
		}
		if (same)
			found = (char *) info.dli_saddr + (name_value - known_value);
	}
done:
	close(fd);
	if (sh)
		pfree(sh);
	if (syms)
		pfree(syms);
	if (strs)
		pfree(strs);
	return found;
}
#endif

/*
 * citus_symbol
 *		The address of one of Citus's functions or variables: exported
 *		(Citus built against PostgreSQL 15), else from its library's symbol
 *		table.  NULL if neither has it, unless required: then an error.
 */
static void *
citus_symbol(const char *name, bool required)
{
	void	   *p = load_external_function("citus", name, false, NULL);

#ifdef __linux__
	if (p == NULL)
		p = elf_symtab_lookup(load_external_function("citus", "_PG_init", true, NULL),
							  name);
#endif
	if (p == NULL && required)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("idem cannot find Citus's %s", name),
				 errdetail("Citus built against PostgreSQL 16 or later exports only its SQL functions, and its library file lists no such symbol: it was stripped, or it is not the file this server loaded."),
				 idem_errhint(ERRCODE_FEATURE_NOT_SUPPORTED, "Install a Citus library that was not stripped, and restart the server after replacing it.")));
	return p;
}

/*
 * idem_citus_lock_shard
 *		Take Citus's metadata lock of shardid in ShareLock, the lock Citus's
 *		own writers of a shard take: a shard move or split waits for it
 *		before it switches the shard group (Citus locks the metadata of
 *		co-located shards together) to another node, so a placement found
 *		here after the lock stays here until the transaction ends.
 */
void
idem_citus_lock_shard(int64 shardid)
{
	static void (*lock_shard) (int64 shardId, LOCKMODE lockMode) = NULL;

	if (lock_shard == NULL)
		lock_shard = (void (*) (int64, LOCKMODE))
			citus_symbol("LockShardDistributionMetadata", true);
	lock_shard(shardid, ShareLock);
	/* a move or split that committed before the lock was granted */
	AcceptInvalidationMessages();
}

/*
 * citus_present
 *		Whether Citus is installed in this database (and so loaded: it
 *		refuses CREATE EXTENSION unless preloaded).
 *
 * Where Citus's library is loaded, Citus's own answer, which it keeps
 * until an invalidation (CREATE, ALTER or DROP EXTENSION citus) and so
 * costs no scan of pg_extension per call; it is also false while the
 * extension's script runs, when Citus's catalog is not complete yet.
 */
static bool
citus_present(void)
{
	if (citus_loaded() && citus_has_been_loaded == NULL && !citus_hidden)
	{
		citus_has_been_loaded = (bool (*) (void))
			citus_symbol("CitusHasBeenLoaded", false);
		citus_hidden = citus_has_been_loaded == NULL;
	}
	if (citus_has_been_loaded == NULL)
	{
		Oid			citus = get_extension_oid("citus", true);

		/* as Citus answers while its own script runs */
		return OidIsValid(citus) &&
			!(creating_extension && CurrentExtensionObject == citus);
	}
	return citus_has_been_loaded();
}

/*
 * idem_citus_require
 *		IDC01 unless Citus is installed in this database.
 */
void
idem_citus_require(const char *fname)
{
	if (!citus_present())
		ereport(ERROR,
				(errcode(ERRCODE_IDEM_CITUS_NOT_COLOCATED),
				 errmsg("%s needs Citus", fname),
				 errdetail("The citus extension is not installed in this database."),
				 idem_errhint(ERRCODE_IDEM_CITUS_NOT_COLOCATED, "Without Citus, use idem_execute() or idem_call().")));
}

/*
 * idem_citus_keys_relid
 *		idem.citus_keys, or InvalidOid before idem_citus_colocate().
 */
Oid
idem_citus_keys_relid(void)
{
	Oid			nsp = get_namespace_oid("idem", true);

	return OidIsValid(nsp) ? get_relname_relid("citus_keys", nsp) : InvalidOid;
}

/*
 * Whether Citus's library is loaded in this backend.  It must be preloaded
 * (shared_preload_libraries) and cannot be loaded later, so the answer
 * found at the first call holds for the backend's life; one GUC lookup.
 */
static bool
citus_loaded(void)
{
	static int	loaded = -1;

	if (loaded < 0)
		loaded = GetConfigOption("citus.node_conninfo", true, false) != NULL;
	return loaded == 1;
}

/*
 * idem_citus_in_distributed_transaction
 *		Whether this transaction has a part on another node, through Citus
 *		(false without Citus).  Statements Citus executes on a local shard
 *		have none.
 */
bool
idem_citus_in_distributed_transaction(void)
{
	if (!citus_loaded())
		return false;
	if (citus_remote_transactions == NULL)
		citus_remote_transactions = (dlist_head *)
			citus_symbol("InProgressTransactions", true);
	return !dlist_is_empty(citus_remote_transactions);
}

/*
 * idem_citus_pin_tenant
 *		Pin the next statement Citus executes in this backend to the
 *		tenant's distribution value in the given colocation group, as Citus
 *		pins a force-delegated function in a transaction block: a statement
 *		on any other value, on several shards or on a table of another
 *		group fails with Citus's "queries must filter by the distribution
 *		argument" (0A000).  Citus unpins when that statement's execution
 *		ends.  Nothing to do if Citus pinned the call already.
 */
void
idem_citus_pin_tenant(Oid type, Datum value, uint32 colocation)
{
	MemoryContext old;
	int16		typlen;
	bool		typbyval;

	if (citus_allowed_value == NULL)
	{
		citus_executor_level = (int *) citus_symbol("ExecutorLevel", true);
		citus_allowed_value = (CitusAllowedValue *)
			citus_symbol("AllowedDistributionColumnValue", true);
	}
	if (citus_allowed_value->isActive)
		return;
	get_typlenbyval(type, &typlen, &typbyval);
	/* Citus frees it, in its transaction's context */
	old = MemoryContextSwitchTo(TopTransactionContext);
	citus_allowed_value->distributionColumnValue =
		makeConst(type, -1, get_typcollation(type), typlen,
				  datumCopy(value, typbyval, typlen), false, typbyval);
	MemoryContextSwitchTo(old);
	citus_allowed_value->colocationId = colocation;
	citus_allowed_value->executorLevel = *citus_executor_level;
	citus_allowed_value->isActive = true;
}

/*
 * idem_citus_check_confined
 *		After a business statement ran, for a record on this node (a key, a
 *		step): IDC02 if Citus opened a distributed transaction for it, whose
 *		commit on the other nodes would be apart from the record's
 *		(one-phase: a lost reply, and the retry executes again).  The
 *		statement runner (exec.c) asks it after every business statement,
 *		so no path records one that Citus distributed.
 */
void
idem_citus_check_confined(void)
{
	if (!idem_citus_in_distributed_transaction())
		return;
	ereport(ERROR,
			(errcode(ERRCODE_IDEM_CITUS_NOT_LOCAL),
			 errmsg("idem cannot record a statement that Citus distributes"),
			 errdetail("Citus opened a distributed transaction for the statement: its write would commit on other nodes apart from idem's record on this one."),
			 idem_errhint(ERRCODE_IDEM_CITUS_NOT_LOCAL, "Declare the tenant's colocation with idem_citus_colocate() and call idem_citus_call(tenant, key, sql, ...).")));
}

