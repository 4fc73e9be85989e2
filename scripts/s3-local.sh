#!/usr/bin/env bash
# scripts/s3-local.sh: a local S3 server (OpenStack Swift + its s3api
# middleware) on loopback, for `kiln up` and the tests. It checks SigV4
# signatures and multipart rules the way AWS does, so a signing bug fails here.
#
#   scripts/s3-local.sh start|stop|env|status [DIR]
#
# DIR holds everything of one instance: etc/ (configs, rings), node/d1/
# (objects), run/ (pid files), log/ (one log per server). Default:
# $KILN_S3_DIR, else /var/lib/kiln/s3-local. Instances in different DIRs are
# independent and can run side by side.
#
# start   Starts memcached and swift-{account,container,object,proxy}-server
#         from DIR (configs and rings are written on first start), waits until
#         every server answers (bounded by $KILN_S3_START_TIMEOUT, default
#         60 s) and prints the env lines (below) on stdout. Creates no bucket.
#         Already running: prints the env lines and does nothing else. Partly
#         running (a server died): stops the rest and starts afresh.
# env     Prints the env lines; exits 1 when the instance is not running:
#           S3_ENDPOINT=http://127.0.0.1:PORT
#           S3_REGION=us-east-1
#           S3_ACCESS_KEY=test:tester
#           S3_SECRET_KEY=testing
#         (use as: eval "$(scripts/s3-local.sh env DIR)")
#         A second account with its own buckets and keys, for tests of a
#         customer's own destination (not printed): access key cust:alice,
#         secret key alicesecret (Swift account AUTH_cust; it cannot see
#         test:tester's buckets, nor test:tester its).
# stop    Stops exactly the processes start started (pid files, each checked
#         to still be that process), SIGTERM then SIGKILL after 10 s, and
#         waits until they are gone. Not running: nothing to do, exit 0.
# status  One line per server on stdout; exit 0 when all run and answer,
#         3 when none runs, 1 when partly.
#
# Ports: a block of six from a base port P, all on 127.0.0.1: P proxy (the S3
# endpoint), P+1 object, P+2 container, P+3 account, P+4 memcached, P+5 UDP
# log sink (the servers' syslog copy goes there and is dropped; their logs
# are in DIR/log). P is $KILN_S3_PORT when set (start fails if that block is
# taken); otherwise the block DIR used last time if it is still free, else the
# first free block of 8780, 8790, ... 9270.
# Objects persist in DIR/node across stop and start (also when the ports
# change); remove DIR after stop to start empty. start and stop hold
# DIR/lock, so concurrent calls on one DIR are serialised. Each server is one
# process (workers = 0) detached in its own session; ~270 MB RSS in all.
# KILN_S3_BIND (default 127.0.0.1): the address the S3 endpoint (the proxy)
# listens on, e.g. a bridge address that hosts in network namespaces reach;
# the backend servers and memcached stay on 127.0.0.1.
# Progress and errors go to stderr. Needs the Debian packages swift,
# swift-proxy, swift-account, swift-container, swift-object, memcached, curl
# (scripts/deps.sh).
set -euo pipefail

usage() {
	echo "usage: $0 start|stop|env|status [DIR]" >&2
	exit 2
}

[ $# -ge 1 ] && [ $# -le 2 ] || usage
cmd=$1
DIR=${2:-${KILN_S3_DIR:-/var/lib/kiln/s3-local}}
case $cmd in start | stop | env | status) ;; *) usage ;; esac
DIR=$(realpath -m -- "$DIR")
ETC=$DIR/etc
RUN=$DIR/run
LOG=$DIR/log
SERVERS=(memcached account container object proxy)
START_TIMEOUT=${KILN_S3_START_TIMEOUT:-60}
STOP_TIMEOUT=10
# The endpoint's address: as given to `start`, remembered for `env`/`status`.
if [ "$cmd" = start ]; then BIND=${KILN_S3_BIND:-127.0.0.1}; else BIND=$(cat "$DIR/run/bind" 2>/dev/null || echo 127.0.0.1); fi
# The interpreter Swift is installed for (Debian's), whatever python3 is first
# in PATH.
SWIFT_PY=$(sed -n '1s/^#! *\([^ ]*\).*/\1/p' "$(command -v swift-proxy-server 2>/dev/null || echo /dev/null)" 2>/dev/null)
SWIFT_PY=${SWIFT_PY:-/usr/bin/python3}

say() { echo "s3-local: $*" >&2; }
die() {
	say "$*"
	exit 1
}

# ---- processes ---------------------------------------------------------------

pid_of() { # server -> pid from its pid file, or nothing
	local p
	p=$(cat "$RUN/$1.pid" 2>/dev/null) || return 0
	[[ $p =~ ^[0-9]+$ ]] && echo "$p"
	return 0
}

# True when pid is a live (not zombie) process whose command line names DIR:
# a pid file left by a crash may name a pid the kernel has reused since.
ours() { # pid
	local pid=$1 state cmdline
	[ -n "$pid" ] && [ -r "/proc/$pid/stat" ] || return 1
	state=$(sed 's/^.*) \(.\).*$/\1/' "/proc/$pid/stat" 2>/dev/null) || return 1
	[ "$state" != Z ] || return 1
	cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
	[[ $cmdline == *"$DIR/"* ]]
}

running_count() {
	local s n=0
	for s in "${SERVERS[@]}"; do
		if ours "$(pid_of "$s")"; then n=$((n + 1)); fi
	done
	echo "$n"
}

# Stop every server whose pid file names a live process of this instance and
# wait for all of them to be gone; remove the pid files.
stop_all() {
	local s pid pids=() deadline
	for s in "${SERVERS[@]}"; do
		pid=$(pid_of "$s")
		if ours "$pid"; then
			kill -TERM "$pid" 2>/dev/null || true
			pids+=("$pid")
		fi
	done
	deadline=$((SECONDS + STOP_TIMEOUT))
	for pid in ${pids[@]+"${pids[@]}"}; do
		while ours "$pid" && [ $SECONDS -lt $deadline ]; do sleep 0.05; done
		if ours "$pid"; then
			say "pid $pid still alive after ${STOP_TIMEOUT}s: SIGKILL"
			kill -KILL "$pid" 2>/dev/null || true
			while ours "$pid"; do sleep 0.05; done
		fi
	done
	for s in "${SERVERS[@]}"; do rm -f "$RUN/$s.pid"; done
	[ ${#pids[@]} -eq 0 ] || say "stopped ${#pids[@]} processes of $DIR"
}

# ---- ports -------------------------------------------------------------------

# True when TCP ports P..P+4 can all be bound on 127.0.0.1 (SO_REUSEADDR, as
# the servers themselves bind, so our own TIME_WAIT leftovers do not count).
block_free() { # base
	"$SWIFT_PY" - "$1" <<'PY'
import socket, sys
base = int(sys.argv[1])
for p in range(base, base + 5):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p))
    except OSError:
        sys.exit(1)
    finally:
        s.close()
PY
}

choose_port() {
	local p last
	if [ -n "${KILN_S3_PORT:-}" ]; then
		[[ $KILN_S3_PORT =~ ^[0-9]+$ ]] && [ "$KILN_S3_PORT" -ge 1024 ] && [ "$KILN_S3_PORT" -le 65530 ] ||
			die "KILN_S3_PORT=$KILN_S3_PORT: not a port number in 1024..65530"
		block_free "$KILN_S3_PORT" ||
			die "KILN_S3_PORT=$KILN_S3_PORT: a port of $KILN_S3_PORT..$((KILN_S3_PORT + 4)) is in use"
		echo "$KILN_S3_PORT"
		return
	fi
	last=$(cat "$ETC/port" 2>/dev/null || true)
	if [[ $last =~ ^[0-9]+$ ]] && block_free "$last"; then
		echo "$last"
		return
	fi
	for ((p = 8780; p <= 9270; p += 10)); do
		if block_free "$p"; then
			echo "$p"
			return
		fi
	done
	die "no free block of ports in 8780..9275 (set KILN_S3_PORT)"
}

# ---- configuration -------------------------------------------------------------

write_server_conf() { # name port pipeline-app-section...
	local name=$1 port=$2 P=$3 ip=127.0.0.1
	shift 3
	[ "$name" = proxy ] && ip=$BIND
	{
		cat <<EOF
# written by scripts/s3-local.sh; rewritten on every start
[DEFAULT]
bind_ip = $ip
bind_port = $port
workers = 0
user = $(id -un)
swift_dir = $ETC
devices = $DIR/node
mount_check = false
log_name = s3-local-$name
log_udp_host = 127.0.0.1
log_udp_port = $((P + 5))

EOF
		printf '%s\n' "$@"
	} >"$ETC/$name-server.conf"
}

write_configs() { # base-port
	local P=$1
	if [ ! -f "$ETC/swift.conf" ]; then
		# The hash prefix/suffix place objects on disk: fixed for the life of DIR.
		cat >"$ETC/swift.conf" <<EOF
[swift-hash]
swift_hash_path_prefix = kiln-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')
swift_hash_path_suffix = kiln-$(od -An -N8 -tx8 /dev/urandom | tr -d ' ')

[storage-policy:0]
name = Policy-0
default = yes
EOF
	fi
	local hc='[filter:healthcheck]
use = egg:swift#healthcheck'
	write_server_conf account $((P + 3)) "$P" '[pipeline:main]' 'pipeline = healthcheck account-server' \
		'[app:account-server]' 'use = egg:swift#account' "$hc"
	write_server_conf container $((P + 2)) "$P" '[pipeline:main]' 'pipeline = healthcheck container-server' \
		'[app:container-server]' 'use = egg:swift#container' "$hc"
	write_server_conf object $((P + 1)) "$P" '[pipeline:main]' 'pipeline = healthcheck object-server' \
		'[app:object-server]' 'use = egg:swift#object' "$hc"
	write_server_conf proxy "$P" "$P" \
		'[pipeline:main]' \
		'pipeline = catch_errors gatekeeper healthcheck proxy-logging cache listing_formats s3api tempauth copy slo dlo proxy-logging proxy-server' \
		'[app:proxy-server]' 'use = egg:swift#proxy' 'account_autocreate = true' \
		'[filter:tempauth]' 'use = egg:swift#tempauth' 'user_test_tester = testing .admin' 'user_cust_alice = alicesecret .admin' \
		'[filter:s3api]' 'use = egg:swift#s3api' 'location = us-east-1' \
		'[filter:cache]' 'use = egg:swift#memcache' "memcache_servers = 127.0.0.1:$((P + 4))" \
		'[filter:catch_errors]' 'use = egg:swift#catch_errors' \
		'[filter:gatekeeper]' 'use = egg:swift#gatekeeper' \
		"$hc" \
		'[filter:proxy-logging]' 'use = egg:swift#proxy_logging' \
		'[filter:listing_formats]' 'use = egg:swift#listing_formats' \
		'[filter:copy]' 'use = egg:swift#copy' \
		'[filter:slo]' 'use = egg:swift#slo' \
		'[filter:dlo]' 'use = egg:swift#dlo'
}

# One ring per service, one device; rebuilt only when the ports changed (the
# ring names each device's port; with one device every partition stays on d1,
# so objects already stored remain reachable). Built through Swift's own
# RingBuilder in one Python process: nine swift-ring-builder runs (create,
# add, rebalance per ring) cost ~6 s here.
write_rings() { # base-port
	local P=$1 out
	[ "$(cat "$ETC/port" 2>/dev/null || true)" = "$P" ] && [ -f "$ETC/object.ring.gz" ] &&
		[ -f "$ETC/container.ring.gz" ] && [ -f "$ETC/account.ring.gz" ] && return 0
	say "building rings for ports $((P + 1))..$((P + 3))"
	rm -f "$ETC/port"
	out=$("$SWIFT_PY" - "$ETC" "$P" 2>&1 <<'PY'
import os, sys
from swift.common.ring import RingBuilder
etc, base = sys.argv[1], int(sys.argv[2])
for svc, port in (("object", base + 1), ("container", base + 2), ("account", base + 3)):
    b = RingBuilder(8, 1, 1)  # 2^8 partitions, 1 replica, min_part_hours 1
    b.add_dev({"id": 0, "region": 1, "zone": 1, "ip": "127.0.0.1", "port": port,
               "replication_ip": "127.0.0.1", "replication_port": port,
               "device": "d1", "weight": 1, "meta": ""})
    b.rebalance()
    b.get_ring().save(os.path.join(etc, svc + ".ring.gz"))
    b.save(os.path.join(etc, svc + ".builder"))
PY
) || die "building the rings failed: $out"
	echo "$P" >"$ETC/port"
}

# ---- start ---------------------------------------------------------------------

# Start one server detached (own session, stdin closed, output to its log,
# without the lock fd) and record its pid.
spawn() { # name command...
	local name=$1
	shift
	echo "---- $(date -u +%FT%TZ) start" >>"$LOG/$name.log"
	setsid "$@" </dev/null >>"$LOG/$name.log" 2>&1 9>&- &
	echo $! >"$RUN/$name.pid"
}

answers() { # server base-port
	local P=$2 port
	case $1 in
	memcached)
		# memcached speaks its text protocol: "version" -> "VERSION x.y.z".
		timeout 2 bash -c 'exec 3<>/dev/tcp/127.0.0.1/$0 && printf "version\r\n" >&3 &&
			IFS= read -r l <&3 && [[ $l == VERSION* ]]' $((P + 4)) 2>/dev/null
		return
		;;
	proxy) port=$P ;;
	object) port=$((P + 1)) ;;
	container) port=$((P + 2)) ;;
	account) port=$((P + 3)) ;;
	esac
	local ip=127.0.0.1
	[ "$1" = proxy ] && ip=$BIND
	[ "$(curl -s -m 2 "http://$ip:$port/healthcheck" 2>/dev/null)" = OK ]
}

print_env() { # base-port
	echo "S3_ENDPOINT=http://$BIND:$1"
	echo "S3_REGION=us-east-1"
	echo "S3_ACCESS_KEY=test:tester"
	echo "S3_SECRET_KEY=testing"
}

# Wait until every server answers; a server that exits meanwhile fails the
# start at once, with the end of its log.
wait_ready() { # base-port
	local P=$1 s pending deadline=$((SECONDS + START_TIMEOUT))
	while :; do
		pending=()
		for s in "${SERVERS[@]}"; do
			if ! ours "$(pid_of "$s")"; then
				say "$s exited during start-up; end of $LOG/$s.log:"
				tail -n 15 "$LOG/$s.log" >&2 || true
				return 1
			fi
			answers "$s" "$P" || pending+=("$s")
		done
		[ ${#pending[@]} -eq 0 ] && return 0
		if [ $SECONDS -ge $deadline ]; then
			say "not ready after ${START_TIMEOUT}s: ${pending[*]} (logs in $LOG)"
			return 1
		fi
		sleep 0.1
	done
}

start() {
	local n P user
	n=$(running_count)
	if [ "$n" -eq ${#SERVERS[@]} ]; then
		say "already running in $DIR"
		print_env "$(cat "$ETC/port")"
		return 0
	fi
	if [ "$n" -gt 0 ]; then
		say "only $n of ${#SERVERS[@]} servers running in $DIR: restarting all"
		stop_all
	fi
	for s in swift-proxy-server swift-object-server swift-container-server swift-account-server \
		memcached curl "$SWIFT_PY"; do
		command -v "$s" >/dev/null || die "$s not found (run scripts/deps.sh)"
	done
	mkdir -p "$ETC" "$RUN" "$LOG" "$DIR/node/d1"
	echo "$BIND" >"$RUN/bind"
	P=$(choose_port)
	write_configs "$P"
	write_rings "$P"
	say "starting Swift in $DIR on 127.0.0.1:$P..$((P + 4))"
	user=$(id -un)
	# memcached refuses to run as root unless told which user to be.
	spawn memcached memcached -l 127.0.0.1 -p $((P + 4)) -U 0 -m 64 -u "$user" -P "$RUN/memcached.pid"
	spawn account swift-account-server "$ETC/account-server.conf" --verbose
	spawn container swift-container-server "$ETC/container-server.conf" --verbose
	spawn object swift-object-server "$ETC/object-server.conf" --verbose
	spawn proxy swift-proxy-server "$ETC/proxy-server.conf" --verbose
	if ! wait_ready "$P"; then
		stop_all
		die "start failed"
	fi
	say "ready: S3 endpoint http://$BIND:$P"
	print_env "$P"
}

status() {
	local s pid n=0 bad=0 P
	P=$(cat "$ETC/port" 2>/dev/null || echo 0)
	for s in "${SERVERS[@]}"; do
		pid=$(pid_of "$s")
		if ours "$pid"; then
			n=$((n + 1))
			if answers "$s" "$P"; then
				echo "$s pid $pid running"
			else
				echo "$s pid $pid not answering"
				bad=1
			fi
		else
			echo "$s stopped"
		fi
	done
	[ "$n" -gt 0 ] || return 3
	[ "$n" -eq ${#SERVERS[@]} ] && [ $bad -eq 0 ] || return 1
	return 0
}

# ---- main ------------------------------------------------------------------------

case $cmd in
env)
	[ "$(running_count)" -eq ${#SERVERS[@]} ] || die "not running in $DIR"
	print_env "$(cat "$ETC/port")"
	;;
status)
	rc=0
	status || rc=$?
	exit $rc
	;;
stop)
	[ -d "$DIR" ] || exit 0
	exec 9>"$DIR/lock"
	flock -w 120 9 || die "$DIR/lock: another start/stop did not finish within 120 s"
	stop_all
	;;
start)
	mkdir -p "$DIR"
	# One start or stop at a time per DIR (fd 9 is closed in the servers).
	exec 9>"$DIR/lock"
	flock -w 120 9 || die "$DIR/lock: another start/stop did not finish within 120 s"
	start
	;;
esac
