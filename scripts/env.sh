# Sourced by idem's scripts: the PostgreSQL 15 tools and the unprivileged
# user that clusters run as (initdb refuses root).
export PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
export PATH=/usr/lib/postgresql/15/bin:$PATH
if [ "$(id -u)" -eq 0 ]; then
	IDEM_RUNAS=(runuser -u postgres --)
else
	IDEM_RUNAS=()
fi
