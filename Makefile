# idem/Makefile

EXTENSION	= idem
EXTVERSION	= $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)
MODULE_big	= idem
OBJS = \
	$(WIN32RES) \
	src/idem.o \
	src/common/guc.o \
	src/common/advice.o \
	src/common/stats.o \
	src/common/args.o \
	src/common/subxact.o \
	src/common/tables.o \
	src/common/owner.o \
	src/common/lease.o \
	src/common/grants.o \
	src/common/citusmeta.o \
	src/common/jsonbwrite.o \
	src/request/tokens.o \
	src/request/statement.o \
	src/request/exec.o \
	src/request/errcache.o \
	src/request/response.o \
	src/request/expiry.o \
	src/request/derive.o \
	src/request/execute.o \
	src/request/dryrun.o \
	src/request/untyped.o \
	src/request/citus.o \
	src/workflow/run.o \
	src/workflow/call.o \
	src/workflow/runlease.o \
	src/workflow/queue.o \
	src/workflow/claim.o \
	src/workflow/signal.o \
	src/workflow/control.o \
	src/workflow/tenant.o \
	src/outbox/outbox.o \
	src/outbox/wakeup.o \
	src/ops/audit.o \
	src/ops/outcome.o \
	src/ops/worker.o
DATA		= $(wildcard $(EXTENSION)--*.sql) monitoring/idem_postgres_exporter.yaml
PGFILEDESC	= "idem - idempotent business writes"

PG_CPPFLAGS	= -I$(srcdir)/src
# OpenSSL's SHA-256 (src/compat.h) where the server was built with it
SHLIB_LINK	= $(filter -lcrypto, $(LIBS))
PG_CFLAGS	= -Wall -Wmissing-prototypes -Werror

# pg_regress: one file per feature, test/sql/<feature>.sql <-> test/expected/<feature>.out
REGRESS		= install execute fingerprint tokens identity errors atomicity nesting \
			  expiry security tamper outbox outbox_delivery outbox_ack plancache upgrade \
			  runs derive advice dryrun cache untyped drivers call ops internals \
			  queues run_leases run_signals run_cap run_results run_fold run_settings citus
# Every test cluster states its encoding and locale: initdb would take them
# from the environment, and without LANG (a container's default) the
# cluster is SQL_ASCII, which cannot hold the suite's UTF-8 keys.
TEST_LOCALE_OPTS = --encoding=UTF8 --no-locale
REGRESS_OPTS = --inputdir=test --temp-instance=./tmp_check --temp-config=$(srcdir)/test/idem.conf \
			  $(TEST_LOCALE_OPTS)

# isolationtester specs live in test/specs, their output in test/expected too
ISOLATION	= $(patsubst test/specs/%.spec,%,$(sort $(wildcard test/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test --temp-instance=./tmp_check_iso \
			  --temp-config=$(srcdir)/test/idem.conf $(TEST_LOCALE_OPTS)

TAP_TESTS	= 1
PROVE_TESTS	= test/t/*.pl

EXTRA_CLEAN	= tmp_check tmp_check_iso output_iso results log

PG_CONFIG	?= pg_config
PGXS		:= $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)

# PGXN release zip (make dist): the committed HEAD, as dist/idem-<version>.zip
# with everything under idem-<version>/, <version> being META.json's (PGXN
# wants a semantic version: 1.1.0 for default_version '1.1').  Not a PGXS
# target; needs git and python3.
PGXN_DIST_DIR		= dist
PGXN_DIST_EXCLUDE	= .ci debian scripts/package.sh scripts/fresh-machine.sh \
					  bench/results bench/hotkeys/results
PGXN_VERSION		= $(shell python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["version"])' $(srcdir)/META.json)
PGXN_DIST			= $(EXTENSION)-$(PGXN_VERSION)

.PHONY: dist
dist:
	@test -n "$(PGXN_VERSION)" || { echo "dist: no version in META.json" >&2; exit 1; }
	@mkdir -p $(PGXN_DIST_DIR)
	git -C $(srcdir) archive --format zip --prefix=$(PGXN_DIST)/ -o $(abspath $(PGXN_DIST_DIR))/$(PGXN_DIST).zip HEAD \
		-- . $(foreach d,$(PGXN_DIST_EXCLUDE),':(exclude)$(d)')
	@echo "$(PGXN_DIST_DIR)/$(PGXN_DIST).zip: $(EXTENSION) $(PGXN_VERSION) at $$(git -C $(srcdir) rev-parse --short HEAD)"

# PGXS tracks no header dependencies: the layers' headers share structs,
# so a change to any of them must rebuild every object, bitcode included.
IDEM_OBJS	= $(filter src/%.o,$(OBJS))
$(IDEM_OBJS) $(IDEM_OBJS:.o=.bc): $(wildcard $(srcdir)/src/*.h $(srcdir)/src/*/*.h)
