#!/usr/bin/env bash
# scripts/pg-local.sh: a throwaway PostgreSQL (Debian's postgresql package)
# in a directory, on a Unix socket only (no TCP port), for the tests and
# benchmarks of kiln-api on PostgreSQL.
#
#   scripts/pg-local.sh start|stop|url|restart DIR
#
# start    initdb (trust authentication, superuser "kiln") into DIR/data on
#          first use, starts the server with its socket in DIR (the socket
#          is DIR/.s.PGSQL.5432), creates the database "kiln", and prints
#          its URI on stdout (as url does). Already running: prints it.
# url      Prints postgresql:///kiln?host=DIR&user=kiln
# stop     Stops the server (fast, then immediate after 20 s); not running:
#          nothing to do. The caller removes DIR.
# restart  stop, then start (the data stays): for outage tests.
#
# PostgreSQL refuses to run as root: as root, the server runs as the
# "postgres" user and DIR is handed to it. The server keeps fsync and
# synchronous_commit on (durability is what the tests check). Its log is
# DIR/log. Progress and errors go to stderr.
set -euo pipefail

[ $# -eq 2 ] || { echo "usage: $0 start|stop|url|restart DIR" >&2; exit 2; }
cmd=$1
DIR=$2
BIN=${KILN_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
[ -x "$BIN/pg_ctl" ] || { echo "pg-local: no PostgreSQL server found (scripts/deps.sh: postgresql)" >&2; exit 1; }

as_pg() {
	if [ "$(id -u)" -eq 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

url() { echo "postgresql:///kiln?host=$DIR&user=kiln"; }

running() { [ -f "$DIR/data/postmaster.pid" ] && as_pg "$BIN/pg_ctl" -D "$DIR/data" status > /dev/null 2>&1; }

start() {
	mkdir -p "$DIR"
	[ "$(id -u)" -ne 0 ] || chown postgres: "$DIR"
	chmod 700 "$DIR"
	if running; then
		url
		return 0
	fi
	if [ ! -f "$DIR/data/PG_VERSION" ]; then
		as_pg "$BIN/initdb" -D "$DIR/data" -A trust -U kiln -E UTF8 --no-sync > "$DIR/initdb.log" 2>&1 ||
			{ cat "$DIR/initdb.log" >&2; exit 1; }
	fi
	as_pg "$BIN/pg_ctl" -D "$DIR/data" -l "$DIR/log" -w -t 60 \
		-o "-k $DIR -c listen_addresses='' -c max_connections=200 -c fsync=on -c synchronous_commit=on" \
		start > /dev/null || { tail -20 "$DIR/log" >&2; exit 1; }
	as_pg "$BIN/psql" -h "$DIR" -U kiln -d postgres -Atqc "SELECT 1 FROM pg_database WHERE datname = 'kiln'" |
		grep -q 1 || as_pg "$BIN/createdb" -h "$DIR" -U kiln kiln
	url
}

stop() {
	[ -d "$DIR/data" ] || return 0
	running || return 0
	as_pg "$BIN/pg_ctl" -D "$DIR/data" -m fast -w -t 20 stop > /dev/null 2>&1 ||
		as_pg "$BIN/pg_ctl" -D "$DIR/data" -m immediate -w -t 20 stop > /dev/null 2>&1 || true
}

case $cmd in
start) start ;;
stop) stop ;;
url) url ;;
restart) stop; start ;;
*) echo "usage: $0 start|stop|url|restart DIR" >&2; exit 2 ;;
esac
