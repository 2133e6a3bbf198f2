# Sourced by idem's scripts: the PostgreSQL 15 tools and the unprivileged
# user that clusters run as (initdb refuses root).  PG_CONFIG may name
# another installation (e.g. a relocated copy of Debian's tree, so that
# two work trees can install and test side by side).
export PG_CONFIG=${PG_CONFIG:-/usr/lib/postgresql/15/bin/pg_config}
# pg_config sits in the bindir (and may not exist yet: deps.sh installs it)
PATH=$(dirname "$PG_CONFIG"):$PATH
export PATH
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

# Run a command as the cluster user.
run() { "${IDEM_RUNAS[@]}" "$@"; }

# Make a throwaway cluster in a new directory /tmp/idem-$1.XXXXXX, stored in
# $dir, and remove it (stopping its server) when the calling script exits.
# The caller appends its settings to $dir/data/postgresql.conf and starts it.
idem_throwaway_cluster() {
	dir=$(mktemp -d "/tmp/idem-$1.XXXXXX")
	[ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
	trap 'run pg_ctl -D "$dir/data" -m immediate stop >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
	# the encoding and locale stated: without LANG initdb makes SQL_ASCII
	run initdb -D "$dir/data" -A trust -U postgres --encoding=UTF8 --no-locale >/dev/null
}

# Build and install idem from $1, then copy the tree (without .git) into a
# new directory /tmp/idem-$2.XXXXXX owned by the cluster user, stored in
# $work and removed when the calling script exits.
idem_install_and_copy() {
	"$1/scripts/deps.sh"
	idem_build_install "$1"
	work=$(mktemp -d "/tmp/idem-$2.XXXXXX")
	trap 'rm -rf "$work"' EXIT
	tar -C "$1" --exclude=.git -cf - . | tar -C "$work" -xf -
	[ "$(id -u)" -eq 0 ] && chown -R postgres: "$work"
	return 0
}
