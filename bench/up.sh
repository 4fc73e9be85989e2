# bench/up.sh, sourced by the benchmarks that measure through one `kiln up`
# stack (local S3, kiln-api on SQLite, one kiln-host): `bench_up NAME`
# starts it in a temporary directory ($TMP, credentials in $TMP/up), stops
# it and removes $TMP on exit, and returns 1 (having said why, as
# "NAME: not measured: ...") when it does not get ready in 10 minutes (the
# first run builds the VM snapshot).
bench_up() {
	local name=$1
	TMP=$(mktemp -d "/tmp/kiln-bench-$name.XXXXXX")
	PORT=$((30000 + RANDOM % 10000))
	up_pid=
	trap 'bench_up_stop' EXIT
	build/kiln up --dir "$TMP/up" --port "$PORT" > "$TMP/up.out" 2> "$TMP/up.err" &
	up_pid=$!
	for _ in $(seq 2400); do
		grep -q '^kiln up: ready' "$TMP/up.out" 2> /dev/null && [ -f "$TMP/up/credentials" ] && return 0
		kill -0 "$up_pid" 2> /dev/null || break
		sleep 0.25
	done
	echo "$name: not measured: kiln up did not get ready: $(tail -n 3 "$TMP/up.err")"
	return 1
}
bench_up_stop() {
	[ -z "$up_pid" ] || { kill -TERM "$up_pid" 2> /dev/null || true; wait "$up_pid" 2> /dev/null || true; }
	up_pid=
	rm -rf "$TMP"
}
