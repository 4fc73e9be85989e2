#!/usr/bin/env bash
# Sessions (figures, not pass/fail): pause and resume time against guest
# memory size (128, 256, 512 MiB), with the snapshot in a local S3 (Swift on
# loopback), next to E2B's published figures (about 4 s per GiB to pause,
# about 1 s to resume); and the round trip of `true` run in a live session.
# One kiln-host per size (its snapshot has that size); RUNS rounds of
# pause + resume each, after a command that touched 64 MiB of the session's RAM.
# Per round: pause time, the bytes the pause sent to S3 (what the host
# reports: compressed chunks and manifest for manifest v2, the whole state
# and disk files for v1), resume time and resume to the first exec answered;
# how busy the machine's CPUs were during the resume (/proc/stat) and the
# CPU time each process (QEMU, kiln-host, the S3 server) used in it. At
# 256 MiB also the same for a session that changed almost nothing (the
# floor a lazy resume could reach if its page faults cost nothing).
# The first pause of a snapshot also hashes its RAM (cached after) and, in
# a fresh bucket, finds or puts its base there: rounds after the first
# count; the first pause is printed on its own (its time, base_bytes, and
# whether kiln-host had put the base in S3 ahead of it). KILN_HOST=path
# compares another build (e.g. main's). SESSION_PREPARE_BASE=0 turns the
# base's preparation ahead off (sessions.prepare_base), 1 on; empty leaves
# the key out (on; builds from before it have none).
# SESSION_PRESTART=1 (the default) keeps a session QEMU started ahead
# (sessions.prestart); 0 turns it off; empty leaves the key out (builds
# from before it). SESSION_SAVE_PAGES=0 has a pause save through QEMU's
# walk of every page, 1 reads the changed pages itself (the default: empty
# leaves the key out). SESSION_LOG=file keeps kiln-host's log.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-3}
KILN_HOST=${KILN_HOST:-build/kiln-host}
SIZES=${SESSION_SIZES:-128 256 512}
PRESTART=${SESSION_PRESTART-1}
SAVE_PAGES=${SESSION_SAVE_PAGES-}
PREPARE_BASE=${SESSION_PREPARE_BASE-}
TMP=$(mktemp -d /tmp/kiln-bench-session.XXXXXX)
export KILN_RUN_DIR=${KILN_RUN_DIR:-$TMP/run}
PORT=$((30000 + RANDOM % 10000))
TOKEN=bench-$RANDOM$RANDOM
host_pid=
cleanup() {
	[ -z "${SESSION_LOG:-}" ] || [ -z "$host_pid" ] || cat "$TMP/host.err" >> "$SESSION_LOG"
	[ -z "$host_pid" ] || { kill "$host_pid" 2> /dev/null || true; wait "$host_pid" 2> /dev/null || true; }
	scripts/s3-local.sh stop "$TMP/s3" > /dev/null 2>&1 || true
	rm -rf "$TMP"
}
trap cleanup EXIT
scripts/s3-local.sh start "$TMP/s3" > "$TMP/s3.env" 2> /dev/null
. "$TMP/s3.env"
h() { curl -s -m 600 -H "Authorization: Bearer $TOKEN" "$@"; }
ms() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
# All CPUs' busy and total time so far (clock ticks), from /proc/stat.
cpu() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
# Every process's CPU time so far (ticks), as "pid name ticks" lines.
procs() { awk '{ i = index($0, "("); j = length($0) - index(reverse($0), ")") + 1; n = substr($0, i + 1, j - i - 1); gsub(/ /, "_", n)
	split(substr($0, j + 2), f, " "); print $1, n, f[12] + f[13] }
	function reverse(s,  r, k) { r = ""; for (k = length(s); k > 0; k--) r = r substr(s, k, 1); return r }' /proc/[0-9]*/stat 2> /dev/null || true; }
med() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "nan" }'; }

echo "sessions: pause (VM -> S3) and resume (S3 -> running VM) by guest memory ($RUNS rounds each; local S3 on loopback; session QEMU started ahead: ${PRESTART:-not configured})"
printf '  %-8s %10s %10s %14s %12s %14s %14s\n' memory "pause ms" "resume ms" "resume+exec ms" "MB to S3" "pause s/GiB" "E2B s/GiB"
for mem in $SIZES; do
	jq -n --arg port "$PORT" --arg token "$TOKEN" --arg spool "$TMP/spool" --arg run "$KILN_RUN_DIR" --argjson mem "$mem" \
		--arg ep "$S3_ENDPOINT" --arg ak "$S3_ACCESS_KEY" --arg sk "$S3_SECRET_KEY" --arg pre "$PRESTART" --arg sp "$SAVE_PAGES" \
		--arg pb "$PREPARE_BASE" \
		'{listen: ("127.0.0.1:" + $port), host_id: "bench", token: $token, spool_dir: $spool, run_dir: $run,
		  pool: {size: 0, prestart: 0, memory_mib: $mem},
		  s3: {endpoint: $ep, region: "us-east-1", bucket: "kiln-bench", access_key: $ak, secret_key: $sk}}
		 + {sessions: ((if $pre == "" then {} else {prestart: ($pre | tonumber)} end)
			       + (if $sp == "" then {} else {save_pages: ($sp | tonumber)} end)
			       + (if $pb == "" then {} else {prepare_base: ($pb == "1")} end))}' > "$TMP/host.json"
	"$KILN_HOST" serve --config "$TMP/host.json" > /dev/null 2> "$TMP/host.err" &
	host_pid=$!
	for _ in $(seq 1800); do
		curl -s -m 1 "http://127.0.0.1:$PORT/healthz" > /dev/null && break
		kill -0 "$host_pid" 2> /dev/null || { echo "kiln-host exited: $(tail -n 3 "$TMP/host.err")" >&2; host_pid=; exit 1; }
		sleep 0.2
	done
	U=http://127.0.0.1:$PORT/v1/sessions
	h -X POST "$U" --data "{\"id\":\"b$mem\",\"customer\":\"bench\",\"spec\":{\"limits\":{\"memory_mib\":$mem}}}" > "$TMP/create"
	jq -e '.state == "running"' "$TMP/create" > /dev/null || { echo "  $mem MiB: create failed: $(cat "$TMP/create")"; kill "$host_pid"; wait "$host_pid" || true; host_pid=; continue; }
	# A process holding 64 MiB of written memory across the pauses.
	h -X POST "$U/b$mem/exec" --data '{"argv":["sh","-c","python3 -c \"import time; b = bytearray(64 << 20); b[::4096] = b\\\"x\\\" * (len(b) // 4096); time.sleep(3600)\" > /dev/null 2>&1 & sleep 2"]}' > /dev/null
	: > "$TMP/p"; : > "$TMP/r"; : > "$TMP/re"; : > "$TMP/b"; : > "$TMP/busy"; : > "$TMP/who"
	# One warm-up round (the first pause of a snapshot hashes its RAM once,
	# and finds its base in S3 or puts it there): reported on its own.
	t=$(date +%s%N); h -X POST "$U/b$mem/pause" > "$TMP/first"; fp=$(ms "$t")
	h -X POST "$U/b$mem/resume" --data '{"customer":"bench"}' > /dev/null
	for _ in $(seq "$RUNS"); do
		t=$(date +%s%N); h -X POST "$U/b$mem/pause" > "$TMP/pause"; ms "$t" >> "$TMP/p"
		jq -r '.snapshot.bytes // 0' "$TMP/pause" >> "$TMP/b"
		jq -r '"\(.snapshot.pages_changed // "-") of \(.snapshot.pages_total // "-") pages"' "$TMP/pause" > "$TMP/pages"
		procs > "$TMP/procs0"; c0=$(cpu); t=$(date +%s%N); h -X POST "$U/b$mem/resume" --data '{"customer":"bench"}' > "$TMP/resume"; ms "$t" >> "$TMP/r"
		echo "$c0 $(cpu)" | awk '{ if ($4 > $2) printf("%.0f\n", 100 * ($3 - $1) / ($4 - $2)) }' >> "$TMP/busy"
		# Who used it: CPU time by process name (QEMU, kiln-host, the S3 server, ...).
		procs | awk -v tck="$(getconf CLK_TCK)" 'NR == FNR { b[$1] = $3; next } { d = $3 - ($1 in b ? b[$1] : 0); if (d > 0) u[$2] += d }
			END { for (n in u) printf("%s=%d ", n, u[n] * 1000 / tck); print "" }' "$TMP/procs0" - >> "$TMP/who"
		h -X POST "$U/b$mem/exec" --data '{"argv":["true"]}' > /dev/null; ms "$t" >> "$TMP/re"
		jq -e '.state == "running"' "$TMP/resume" > /dev/null || { echo "  resume failed: $(cat "$TMP/resume")"; break; }
	done
	p=$(med < "$TMP/p"); r=$(med < "$TMP/r"); re=$(med < "$TMP/re")
	mb=$(med < "$TMP/b" | awk '{ printf("%.1f", $1 / 1e6) }')
	printf '  %-8s %10s %10s %14s %12s %14s %14s\n' "$mem MiB" "$p" "$r" "$re" "$mb" \
		"$(awk -v p="$p" -v m="$mem" 'BEGIN { printf("%.2f", p / 1000 * 1024 / m) }')" "~4 (resume ~1 s)"
	echo "    the machine's CPUs during a resume: $(med < "$TMP/busy")% busy (median; all of them, $(nproc) here, everything running)"
	echo "    CPU time used during a resume, by process (medians, ms; 10 ms ticks): $(/usr/bin/python3 -c '
import collections, statistics, sys
rows = [dict(kv.split("=") for kv in l.split()) for l in sys.stdin if l.strip()]
names = collections.Counter(n for r in rows for n in r)
print(", ".join("%s %d" % (n, statistics.median(int(r.get(n, 0)) for r in rows))
      for n in sorted(names, key=lambda n: -statistics.mean(int(r.get(n, 0)) for r in rows))[:6]))' < "$TMP/who")"
	echo "    last pause: $(cat "$TMP/pages") sent (a diff against the base snapshot; '- of -': the whole RAM)"
	echo "    first pause of this snapshot (a fresh bucket): $fp ms (kiln-host's $(jq -r '.snapshot.pause_ms // "?"' "$TMP/first") ms), base_bytes $(jq -r '.snapshot.base_bytes // "?"' "$TMP/first"); base ahead: $(grep -o 'base [0-9a-f]* \(already \)\?in S3 (.*ahead of any pause)' "$TMP/host.err" | tail -n 1 | sed 's/base \([0-9a-f]\{12\}\)[0-9a-f]*/\1/' || true)"
	# Where a resume's time goes (kiln-host logs each; "QEMU load" includes
	# the state streaming in, which an older build fetched whole first).
	grep -o 'resumed in .*' "$TMP/host.err" | tail -n "$RUNS" | /usr/bin/python3 -c '
import re, statistics, sys
lines = sys.stdin.readlines()
rows = [dict((k.strip(), int(v)) for v, k in [(m.group(2), m.group(1))
        for m in re.finditer(r"([a-zA-Z ]+?) (\d+)(?: ms|\b)", l)]) for l in lines]
if rows:
    keys = ["resumed in", "manifest", "base", "disk layer", "disk rebase", "QEMU load", "QEMU", "load", "setup", "state chunks all in at"]
    print("    resume split (medians, ms): " + ", ".join("%s %d" % (k.replace("resumed in", "total"),
          statistics.median(r.get(k, 0) for r in rows)) for k in keys))
    print("    QEMU started ahead for %d of %d resumes" % (sum("started ahead" in l for l in lines), len(lines)))' || true
	grep -o 'paused in .*' "$TMP/host.err" | tail -n "$RUNS" | /usr/bin/python3 -c '
import re, statistics, sys
rows = [dict((m.group(1).strip(), int(m.group(2))) for m in re.finditer(r"([a-zA-Z ]+?) (\d+)(?: ms|\b)", l))
        for l in sys.stdin]
if rows:
    keys = ["paused in", "prepare", "save", "then", "uploads and VM teardown finish", "manifest"]
    print("    pause split (medians, ms): " + ", ".join("%s %d" % (k.replace("paused in", "total"),
          statistics.median(r.get(k, 0) for r in rows)) for k in keys))' || true
	if [ "$mem" = 256 ]; then
		: > "$TMP/x"
		for _ in $(seq 20); do
			t=$(date +%s%N); h -X POST "$U/b$mem/exec" --data '{"argv":["true"]}' > /dev/null; ms "$t" >> "$TMP/x"
		done
		xt=$(med < "$TMP/x")
		# A lazy resume would serve each page the guest touches on first
		# touch (QEMU 7.2: as a postcopy destination, its RAM anonymous, so
		# every page touched faults, the base's too): how many pages does
		# the VM touch from a resume's answer to its first exec answered,
		# and during a later exec? The RAM mapping's Referenced after
		# clear_refs (root only).
		if [ "$(id -u)" = 0 ]; then
			ref() { awk -v want="$((mem * 1024))" '/^[0-9a-f]+-[0-9a-f]+ / { m = 0 } /^Size:/ { m = ($2 == want) } m && /^Referenced:/ { print $2 / 4; exit }' "/proc/$1/smaps"; }
			# The session's QEMU: this run's with the most resident memory (a
			# QEMU waiting ahead has none of the session's pages).
			qp() { for p in $(pgrep -f "qemu-system-x86_64.*$TMP" || true); do echo "$(awk '/^Rss:/ { print $2 }' "/proc/$p/smaps_rollup" 2> /dev/null || echo 0) $p"; done | sort -n | tail -n 1 | cut -d' ' -f2; }
			h -X POST "$U/b$mem/pause" > /dev/null; h -X POST "$U/b$mem/resume" --data '{"customer":"bench"}' > /dev/null
			q=$(qp)
			if [ -n "$q" ]; then
				echo 1 > "/proc/$q/clear_refs"; h -X POST "$U/b$mem/exec" --data '{"argv":["true"]}' > /dev/null
				touched1=$(ref "$q")
				echo 1 > "/proc/$q/clear_refs"; h -X POST "$U/b$mem/exec" --data '{"argv":["true"]}' > /dev/null
				touched2=$(ref "$q")
			fi
		fi
		# Typing into a terminal: an input request to the echo on the stream (kiln shell's keystroke latency).
		kt=$(PORT=$PORT TOKEN=$TOKEN SID=b$mem python3 - <<'PY' 2> "$TMP/keys.err" || echo "nan"
import http.client, json, os, statistics, time
port, tok, sid = int(os.environ["PORT"]), os.environ["TOKEN"], os.environ["SID"]
hdr = {"Authorization": "Bearer " + tok, "Content-Type": "application/json"}
st = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
st.request("POST", "/v1/sessions/%s/exec?stream=1" % sid, json.dumps({"argv": ["cat"], "tty": {"rows": 24, "cols": 80}, "timeout_s": 120}), hdr)
r = st.getresponse()
def event():
    name = None
    while True:
        line = r.fp.readline().decode().rstrip("\n")
        if line.startswith("event: "): name = line[7:]
        elif line.startswith("data: "): return name, json.loads(line[6:])
exec_id = None
while exec_id is None:
    n, d = event()
    if n == "started": exec_id = d["exec_id"]
inp = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
lat = []
for i in range(30):
    ch = "abcdefghijklmnopqrstuvwxyzABCD"[i]
    t = time.perf_counter()
    inp.request("POST", "/v1/sessions/%s/input" % sid, json.dumps({"exec_id": exec_id, "data_b64": __import__("base64").b64encode(ch.encode()).decode()}), hdr)
    inp.getresponse().read()
    while True:
        n, d = event()
        if n == "stdout" and ch in d.get("data", ""): break
    lat.append((time.perf_counter() - t) * 1000)
inp.request("POST", "/v1/sessions/%s/input" % sid, json.dumps({"exec_id": exec_id, "data_b64": "", "eof": True}), hdr)
inp.getresponse().read()
print("%.1f" % statistics.median(lat[5:]))
PY
)
	fi
	h -X DELETE "$U/b$mem?customer=bench" > /dev/null
	if [ "$mem" = 256 ]; then
		# The floor of any lazy resume: a session that changed almost
		# nothing since its snapshot (no 64 MiB process), paused and resumed
		# as above. Its resume has ~700 pages to load, so resume to first
		# exec is the manifest, QEMU's device load, SETUP and the first exec
		# with no page feed in the way: what a lazy resume could reach if its
		# faults (one per page the VM touches first, bench/uffd) cost nothing.
		h -X POST "$U" --data "{\"id\":\"f$mem\",\"customer\":\"bench\",\"spec\":{\"limits\":{\"memory_mib\":$mem}}}" > /dev/null
		h -X POST "$U/f$mem/pause" > /dev/null; h -X POST "$U/f$mem/resume" --data '{"customer":"bench"}' > /dev/null
		: > "$TMP/fr"; : > "$TMP/fre"
		for _ in $(seq "$RUNS"); do
			h -X POST "$U/f$mem/pause" > "$TMP/pause"
			t=$(date +%s%N); h -X POST "$U/f$mem/resume" --data '{"customer":"bench"}' > "$TMP/resume"; ms "$t" >> "$TMP/fr"
			h -X POST "$U/f$mem/exec" --data '{"argv":["true"]}' > /dev/null; ms "$t" >> "$TMP/fre"
			jq -e '.state == "running"' "$TMP/resume" > /dev/null || { echo "  resume failed: $(cat "$TMP/resume")"; break; }
		done
		floor="resume $(med < "$TMP/fr") ms, resume to first exec answered $(med < "$TMP/fre") ms ($(jq -r '.snapshot.pages_changed // "?"' "$TMP/pause") pages changed; medians over $RUNS)"
		h -X DELETE "$U/f$mem?customer=bench" > /dev/null
	fi
	# Creating a session (a second apart: a QEMU started ahead has time to
	# be ready), and what a QEMU waiting ahead holds (PSS).
	: > "$TMP/c"
	for i in $(seq "$RUNS"); do
		sleep 1
		t=$(date +%s%N); h -X POST "$U" --data "{\"id\":\"c$mem-$i\",\"customer\":\"bench\",\"spec\":{\"limits\":{\"memory_mib\":$mem}}}" > /dev/null; ms "$t" >> "$TMP/c"
		h -X DELETE "$U/c$mem-$i?customer=bench" > /dev/null
	done
	sleep 1
	pss=nan
	for p in $(pgrep -f "qemu-system-x86_64.*/.prestart-" || true); do
		grep -q "$TMP" "/proc/$p/cmdline" 2> /dev/null && pss=$(awk '/^Pss:/ { printf("%.1f", $2 / 1024) }' "/proc/$p/smaps_rollup")
	done
	echo "    create: median $(med < "$TMP/c") ms over $RUNS, 1 s apart; a QEMU waiting ahead: PSS $pss MiB"
	kill "$host_pid"; wait "$host_pid" 2> /dev/null || true; host_pid=
	[ -z "${SESSION_LOG:-}" ] || cat "$TMP/host.err" >> "$SESSION_LOG"
done
echo "  (medians over $RUNS rounds after a warm-up; MB to S3: bytes one pause sent; pause s/GiB is per GiB of guest memory)"
[ -z "${xt:-}" ] || echo "sessions: exec round trip of true in a running 256 MiB session (HTTP to kiln-host, EXEC, exit): median $xt ms over 20"
[ -z "${touched1:-}" ] || echo "sessions: guest pages touched (a lazy resume would fault each in): from a resume's answer to its first exec of true answered $touched1, during a later exec $touched2 (bench/uffd prints what one costs)"
[ -z "${floor:-}" ] || echo "sessions: a 256 MiB session with almost nothing to load (the floor a lazy resume could reach with free faults): $floor"
[ -z "${kt:-}" ] || echo "sessions: a key typed into a terminal (tty exec of cat) to its echo on the event stream, through kiln-host: median $kt ms over 25"
