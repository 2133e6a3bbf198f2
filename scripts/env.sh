# Sourced by idem's scripts: the PostgreSQL 15 tools and the unprivileged
# user that clusters run as (initdb refuses root).
export PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config
export PATH=/usr/lib/postgresql/15/bin:$PATH
if [ "$(id -u)" -eq 0 ]; then
	IDEM_RUNAS=(runuser -u postgres --)
else
	IDEM_RUNAS=()
fi

# Build and install idem from the tree at $1 (install needs root).
idem_build_install() {
	make -s -C "$1" PG_CONFIG="$PG_CONFIG"
	if [ "$(id -u)" -eq 0 ]; then
		make -s -C "$1" PG_CONFIG="$PG_CONFIG" install
	else
		sudo -n make -s -C "$1" PG_CONFIG="$PG_CONFIG" install
	fi
}
