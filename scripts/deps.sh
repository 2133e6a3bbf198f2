#!/usr/bin/env bash
# Install what building and testing idem needs, from Debian's archive:
# PostgreSQL 15 with its PGXS build kit (pg_regress, isolationtester, the
# TAP modules), a C compiler and IPC::Run.  Does nothing when all is there.
set -euo pipefail

pgbin=/usr/lib/postgresql/15/bin
pgxs=/usr/lib/postgresql/15/lib/pgxs
need=()
[ -x "$pgbin/postgres" ] || need+=(postgresql-15)
[ -x "$pgbin/pg_config" ] && [ -x "$pgxs/src/test/isolation/isolationtester" ] \
	|| need+=(postgresql-server-dev-15)
command -v gcc >/dev/null && command -v make >/dev/null || need+=(build-essential)
perl -MIPC::Run -e1 2>/dev/null || need+=(libipc-run-perl)
command -v gnuplot >/dev/null || need+=(gnuplot-nox)
command -v runuser >/dev/null || need+=(util-linux)

[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "idem: missing packages: ${need[*]}; run this as root to install them" >&2
	exit 1
fi
echo "idem: installing ${need[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
