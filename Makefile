# idem/Makefile

EXTENSION	= idem
EXTVERSION	= $(shell sed -n "s/^default_version *= *'\(.*\)'/\1/p" $(EXTENSION).control)
MODULE_big	= idem
OBJS = \
	$(WIN32RES) \
	src/idem.o \
	src/execute.o \
	src/statement.o \
	src/catalog.o \
	src/expiry.o \
	src/response.o
DATA		= $(wildcard $(EXTENSION)--*.sql)
PGFILEDESC	= "idem - idempotent business writes"

PG_CPPFLAGS	= -I$(srcdir)/src
# OpenSSL's SHA-256 (src/compat.h) where the server was built with it
SHLIB_LINK	= $(filter -lcrypto, $(LIBS))
PG_CFLAGS	= -Wall -Wmissing-prototypes -Werror

# pg_regress: one file per feature, sql/<feature>.sql <-> expected/<feature>.out
REGRESS		= install execute fingerprint identity errors atomicity nesting \
			  expiry security tamper outbox plancache upgrade
REGRESS_OPTS = --temp-instance=./tmp_check --temp-config=$(srcdir)/test/idem.conf

# isolationtester specs live in test/specs with their output in test/expected
ISOLATION	= $(patsubst test/specs/%.spec,%,$(sort $(wildcard test/specs/*.spec)))
ISOLATION_OPTS = --inputdir=test --temp-instance=./tmp_check_iso \
			  --temp-config=$(srcdir)/test/idem.conf

TAP_TESTS	= 1
PROVE_TESTS	= test/t/*.pl

EXTRA_CLEAN	= tmp_check tmp_check_iso output_iso results log

PG_CONFIG	?= pg_config
PGXS		:= $(shell $(PG_CONFIG) --pgxs)
include $(PGXS)
