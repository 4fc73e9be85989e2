#!/usr/bin/env bash
# Templates through the whole stack: kiln-api (SQLite) and a local S3 in the
# root network namespace, two kiln-hosts in network namespaces of their own on
# a private bridge: h1 with egress (its build VMs reach the Debian mirror
# through tests/integration/mirror_proxy.py on a second veth, so the root
# namespace's forwarding and firewall are never touched), h2 without. Built-ins (default, python-data), a
# recipe built in a build VM, an OCI image imported from a local archive,
# customer isolation, quotas, deletion while a task runs, a template that
# only S3 holds running on a host that never had it, clone safety per
# template. Traffic: loopback, the bridge and the veth, plus the proxy's
# requests for one small package (jq) to the machine's own Debian mirror.
. "$(dirname "$0")/lib.sh"
t_plan 15
require_image
t_require_tools ip nsenter swift-proxy-server umoci busybox
[ -x "$ROOT/build/kiln-api" ] || { echo "1..0 # SKIP build/kiln-api missing: run make"; exit 0; }
[ -e "$ROOT/build/image/rootfs-python-data.ext4" ] || { echo "1..0 # SKIP the python-data image is missing: run make image"; exit 0; }

UPSTREAM=$(grep -hsoE '^URIs: *http[^ ]*debian/?$' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
[ -n "$UPSTREAM" ] || UPSTREAM=http://deb.debian.org/debian
curl -sf -m 20 -o /dev/null "${UPSTREAM%/}/dists/bookworm/InRelease" || {
	echo "1..0 # SKIP the Debian mirror $UPSTREAM is not reachable from this machine"; exit 0; }

N=$((RANDOM % 200 + 20))
NET=10.232.$N
BR=ktb$N
NS=kiln-tpl-$N
# h1's second link: the proxy's side in the root namespace, h1's in its own.
PBASE=$((128 + (N % 16) * 4))
PEER=198.51.100.$((PBASE + 1))
PSELF=198.51.100.$((PBASE + 2))
MIRROR=http://$PEER:3142/debian
proxy_pid=
TOKEN=cluster-token-$RANDOM$RANDOM$RANDOM
ADMIN=admin-key-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 12000))
API=http://$NET.1:$API_PORT
BUCKET=kiln-templates-it
host_pids=()
api_pid=


t_mark
net_bridge "$BR" "$NET.1"
for n in 1 2; do net_ns "$NS-$n" "kt$N-$n" "$NET.$((10 + n))"; done
ip link add "kp$N" type veth peer name eth1 netns "$NS-1"
ip addr add "$PEER/30" dev "kp$N" && ip link set "kp$N" up
ip -n "$NS-1" addr add "$PSELF/30" dev eth1 && ip -n "$NS-1" link set eth1 up
t_bg /usr/bin/python3 "$ROOT/tests/integration/mirror_proxy.py" "$PEER" 3142 "$UPSTREAM" "$T_TMP/proxy.count" 2> "$T_TMP/proxy.err"
proxy_pid=$T_BG_PID

s3_local_start "$NET.1"

api_config "$T_TMP/api.json" "$NET.1:$API_PORT" '. + {host_lost_after_s: 3}'
api_up "$T_TMP/api.json" "$API"

write_host_config() { # n listen extra-json
	host_config "$T_TMP/host$1.json" "$2" "h$1" ".api = \"$API\" | .run_dir += \"/h$1\" | .cache = \"$T_TMP/cache-$1\"
		| .heartbeat_ms = 500 | .capacity.cpu_overcommit = 4 | .pool = {size: 1, prestart: 0} | . + $3"
}
write_host_config 1 "$NET.11:7070" '{"network":{"egress":true,"dns_upstream":"'"$PEER"':53","link_range":"10.233.0.0/16"},"templates":{"mirror":"'"$MIRROR"'"}}'
write_host_config 2 "$NET.12:7070" '{}'
# Each host keeps its templates in a cache of its own: h2 must not see what h1 fetched or built.
for n in 1 2; do mkdir -p "$T_TMP/cache-$n"; ln -s "${KILN_CACHE:-/var/cache/kiln}/snapshots" "$T_TMP/cache-$n/snapshots" 2> /dev/null || true; done
start_host() { # n
	host_start "$T_TMP/host$1.json" "host$1" "$NS-$1"
	host_pids[$1]=$host_pid
}
other() { curl -s -m 70 -H "Authorization: Bearer $KEY2" -H 'Content-Type: application/json' "$@"; }
host_json() { admin "$API/v1/admin/hosts" | jq -c --arg h "$1" '(.hosts // .)[] | select(.id == $h)'; }
final() { [[ $1 =~ ^(succeeded|failed|error|cancelled|timed_out)$ ]]; }
wait_task() { # id [client] -> the task JSON in $T_TMP/ID.json
	local c=${2:-cust} i st
	for i in 1 2 3 4 5; do
		$c "$API/v1/tasks/$1?wait=60" > "$T_TMP/$1.json"
		st=$(jq -r .state "$T_TMP/$1.json" 2> /dev/null)
		final "$st" && return 0
	done
	return 1
}
submit() { cust -X POST --data-binary @- "$API/v1/tasks" | jq -r '.id // empty'; }
tpl_state() { cust "$API/v1/templates/$1" | jq -r '.state // .error.code'; }
wait_template() { # name seconds
	local i
	for i in $(seq "$2"); do
		case $(tpl_state "$1") in ready | failed) return 0 ;; esac
		sleep 1
	done
	return 1
}

start_host 1
start_host 2
check "two kiln-hosts register (h1 with egress, h2 in its own namespace)" wait_live 2

KEY=$(new_customer acme '{"name":"Acme","quotas":{"max_templates":3}}')
KEY2=$(new_customer globex '{"name":"Globex"}')

# --- built-ins ---
for _ in $(seq 100); do
	[ "$(cust "$API/v1/templates" | jq '[.templates[] | select(.public and .state == "ready")] | length')" -ge 2 ] && break
	sleep 0.2
done
cust "$API/v1/templates" > "$T_TMP/list0.json"
if jq -e '[.templates[] | select(.public and .state == "ready") | .name] | index("default") != null and index("python-data") != null' \
	"$T_TMP/list0.json" > /dev/null; then
	ok "GET /v1/templates lists the built-ins default and python-data, public and ready"
else not_ok "built-ins listed" "$(head -c 600 "$T_TMP/list0.json")"; fi

PLOT='import numpy as np, pandas as pd, matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
df = pd.DataFrame({"x": np.arange(10), "y": np.arange(10) ** 2})
ax = df.plot(x="x", y="y")
plt.savefig("/output/plot.png")
print("rows", len(df), "numpy", np.__version__)'
id=$(py_spec "$PLOT" '{"template":"python-data","limits":{"timeout_s":120}}' | submit)
wait_task "$id"
url=$(jq -r '.outputs[]? | select(.path == "plot.png") | .url' "$T_TMP/$id.json")
[ -n "$url" ] && curl -s -m 30 -o "$T_TMP/plot.png" "$url"
if [ "$(jq -r .state "$T_TMP/$id.json")" = succeeded ] && grep -q '^rows 10 numpy' <<< "$(jq -r .result.stdout "$T_TMP/$id.json")" \
   && /usr/bin/python3 -c '
import struct, sys, zlib
d = open(sys.argv[1], "rb").read()
assert d[:8] == b"\x89PNG\r\n\x1a\n", "magic"
n, t = struct.unpack(">I4s", d[8:16]); assert t == b"IHDR" and n == 13
w, h = struct.unpack(">II", d[16:24]); assert w > 100 and h > 100
assert zlib.crc32(d[12:29]) == struct.unpack(">I", d[29:33])[0], "IHDR crc"
assert d.rstrip()[-8:-4] == b"IEND"' "$T_TMP/plot.png"; then
	ok "a python-data task imports numpy, pandas and matplotlib and its plot.png reaches S3 as a valid PNG"
else not_ok "python-data plot" "$(head -c 800 "$T_TMP/$id.json")"; fi

# --- a recipe: a package, a file and a run step, built in a build VM on h1 ---
# numpy over OpenBLAS: its CPU detection must find kernels TCG can run (vm_cpu_model).
RECIPE=$(jq -cn --arg f "$(printf 'hello-from-file' | base64)" '{name: "tools", from: "debian",
	packages: ["jq", "python3-numpy", "libopenblas0-pthread"],
	files: [{path: "/etc/kiln-test", content_b64: $f, mode: 420}],
	run: ["echo built-by-run > /opt/marker && chmod 644 /opt/marker"], env: {TEMPLATE_VAR: "x1"}}')
t0=$(date +%s)
code=$(cust -o "$T_TMP/tools.json" -w '%{http_code}' -X POST --data "$RECIPE" "$API/v1/templates")
t_bg curl -s -N -m 900 -H "Authorization: Bearer $KEY" "$API/v1/templates/tools/events" > "$T_TMP/tools.ev"
ev_pid=$T_BG_PID
wait_template tools 900
build_s=$(( $(date +%s) - t0 ))
wait "$ev_pid" 2> /dev/null
cust "$API/v1/templates/tools" > "$T_TMP/tools-get.json"
if [[ $code =~ ^20[12]$ ]] && [ "$(jq -r .state "$T_TMP/tools-get.json")" = ready ] \
   && [ "$(jq -r '.sha256 | length' "$T_TMP/tools-get.json")" = 64 ] && grep -q 'Setting up jq' "$T_TMP/tools.ev" \
   && [ "$(cat "$T_TMP/proxy.count" 2> /dev/null || echo 0)" -ge 3 ]; then
	ok "a recipe (packages jq, numpy, OpenBLAS; a file; a run step) builds in a build VM in ${build_s}s; its events stream the log"
else not_ok "recipe build" "code=$code $(head -c 800 "$T_TMP/tools-get.json")" "events: $(tail -c 600 "$T_TMP/tools.ev")"; fi
echo "# recipe build (jq, numpy, OpenBLAS + file + run step): ${build_s}s"

id=$(sh_spec 'jq --version; cat /etc/kiln-test; echo; cat /opt/marker; echo "var=$TEMPLATE_VAR"' '{"template":"tools"}' | submit)
wait_task "$id"
out=$(jq -r .result.stdout "$T_TMP/$id.json")
idb=$(py_spec 'import numpy; a = numpy.ones((64, 64)); print((a @ a).sum(), numpy.linalg.inv(numpy.eye(3) * 2).sum())' '{"template":"tools"}' | submit)
wait_task "$idb"
id0=$(sh_spec 'command -v jq || echo no-jq; cat /opt/marker 2>&1 || true; test -e /etc/kiln-test || echo no-file' | submit)
wait_task "$id0"
out0=$(jq -r .result.stdout "$T_TMP/$id0.json")
if grep -q '^jq-' <<< "$out" && grep -q hello-from-file <<< "$out" && grep -q built-by-run <<< "$out" && grep -q 'var=x1' <<< "$out" \
   && grep -q no-jq <<< "$out0" && grep -q no-file <<< "$out0"; then
	ok "tasks of the recipe's template have its package, file, run step's output and env; default has none of them"
else not_ok "recipe template contents" "tools: $out" "default: $out0"; fi
if [ "$(jq -r .result.stdout "$T_TMP/$idb.json")" = "262144.0 1.5" ]; then
	ok "numpy over OpenBLAS from a recipe does matrix products and inverses in the VM (no SIGILL under TCG)"
else not_ok "OpenBLAS" "$(jq -c '{state, stdout: .result.stdout, stderr: .result.stderr, end_reason}' "$T_TMP/$idb.json")"; fi

# --- an OCI image, made here from a local directory (no registry) ---
mkdir -p "$T_TMP/oci-src/bin" "$T_TMP/oci-src/app"
cp "$(command -v busybox)" "$T_TMP/oci-src/bin/busybox"
for a in sh cat echo pwd id env sleep ls; do ln -sf busybox "$T_TMP/oci-src/bin/$a"; done
echo oci-hello > "$T_TMP/oci-src/app/hello.txt"
(
	set -e
	cd "$T_TMP"
	umoci init --layout img > /dev/null
	umoci new --image img:latest > /dev/null
	umoci unpack --rootless --image img:latest bundle > /dev/null
	cp -a oci-src/. bundle/rootfs/
	umoci repack --image img:latest bundle > /dev/null
	umoci config --image img:latest --config.env OCI_VAR=from-image --config.workingdir /app --config.user 0:0 > /dev/null
	tar -C img -cf oci.tar .
) > "$T_TMP/umoci.log" 2>&1
code=$(curl -s -m 120 -o "$T_TMP/busy.json" -w '%{http_code}' -H "Authorization: Bearer $KEY" -H 'Content-Type: application/x-tar' \
	--data-binary @"$T_TMP/oci.tar" "$API/v1/templates?name=busy")
wait_template busy 300
id=$(jq -cn '{argv: ["/bin/sh", "-c", "pwd; echo $OCI_VAR; cat hello.txt; id -u"], template: "busy"}' | submit)
wait_task "$id"
out=$(jq -r .result.stdout "$T_TMP/$id.json")
if [[ $code =~ ^20[12]$ ]] && [ "$(tpl_state busy)" = ready ] && [ "$out" = "$(printf '/app\nfrom-image\noci-hello\n0')" ]; then
	ok "an OCI image made from a local directory imports; its tasks get its Env, WorkingDir and User"
else not_ok "OCI import" "code=$code state=$(tpl_state busy) out=$out" "$(head -c 600 "$T_TMP/$id.json")" "$(tail -3 "$T_TMP/umoci.log")"; fi

head -c 4096 /dev/urandom > "$T_TMP/junk.tar"
curl -s -m 60 -o /dev/null -H "Authorization: Bearer $KEY" -H 'Content-Type: application/x-tar' --data-binary @"$T_TMP/junk.tar" \
	"$API/v1/templates?name=junk"
wait_template junk 120
cust "$API/v1/templates/junk" > "$T_TMP/junk.json"
if [ "$(jq -r .state "$T_TMP/junk.json")" = failed ] && [ "$(jq -r '.error.code' "$T_TMP/junk.json")" = invalid_image ]; then
	ok "an archive that is not an image fails its build with invalid_image: $(jq -r .error.message "$T_TMP/junk.json" | head -c 120)"
else not_ok "junk archive" "$(head -c 600 "$T_TMP/junk.json")"; fi

# --- isolation and quotas ---
g=$(other -w '\n%{http_code}' "$API/v1/templates/tools")
gt=$(sh_spec 'echo hi' '{"template":"tools"}' | other -w '\n%{http_code}' -X POST --data-binary @- "$API/v1/tasks")
gm=$(sh_spec 'echo hi' '{"template":"no-such-template"}' | other -w '\n%{http_code}' -X POST --data-binary @- "$API/v1/tasks")
gl=$(other "$API/v1/templates" | jq -r '[.templates[].name] | join(",")')
if [ "$(tail -1 <<< "$g")" = 404 ] && [ "$(tail -1 <<< "$gt")" = 404 ] && [ "$(head -1 <<< "$gt" | jq -r .error.message)" = "$(head -1 <<< "$gm" | jq -r .error.message | sed 's/no-such-template/tools/')" ] \
   && ! grep -q tools <<< "$gl"; then
	ok "another customer cannot see, list or use acme's template: 404, worded as for a name that does not exist"
else not_ok "isolation" "get: $g" "task: $gt" "missing: $gm" "list: $gl"; fi
q=$(cust -w '\n%{http_code}' -X POST --data '{"name":"fourth"}' "$API/v1/templates")
if [ "$(tail -1 <<< "$q")" = 429 ] && [ "$(head -1 <<< "$q" | jq -r .error.code)" = quota_exceeded ]; then
	ok "max_templates 3: a fourth template is refused (429 quota_exceeded)"
else not_ok "template quota" "$q"; fi
d=$(other -w '\n%{http_code}' -X POST --data '{"name":"python-data"}' "$API/v1/templates")
check "a public template's name cannot be taken by a customer (409 duplicate)" [ "$(tail -1 <<< "$d")" = 409 -a "$(head -1 <<< "$d" | jq -r .error.code)" = duplicate ]

# --- a template only S3 holds runs on a host that did not build it ---
# h2 has a template cache of its own and never built 'tools': whenever it
# first ran a task of it (now, or earlier when h1 was busy), it fetched the
# image from S3 and verified it (its fetch counter says so).
tools_sha=$(jq -r .sha256 "$T_TMP/tools-get.json")
t_stop "${host_pids[1]}"; unset "host_pids[1]"
wait_live 1 20
id=$(sh_spec 'cat /opt/marker; jq -n 1+1' '{"template":"tools"}' | submit)
wait_task "$id"
h2_has=$(host_json h2 | jq --arg s "$tools_sha" '[.capacity.templates[]? | select(.sha256 == $s)] | length')
fetches=$(nsenter --net="/run/netns/$NS-2" curl -s -m 5 -H "Authorization: Bearer $TOKEN" "http://$NET.12:7070/metrics" \
	| awk '$1 == "kiln_host_template_fetches_total" { print $2 }')
if [ "$(jq -r .state "$T_TMP/$id.json")" = succeeded ] && [ "$(jq -r .host "$T_TMP/$id.json")" = h2 ] \
   && [ "$(jq -r .result.stdout "$T_TMP/$id.json")" = "$(printf 'built-by-run\n2')" ] && [ "$h2_has" = 1 ] \
   && [ "${fetches:-0}" -ge 1 ] && [ -f "$T_TMP/cache-2/templates/$tools_sha/rootfs.ext4" ]; then
	ok "with h1 stopped, a task on 'tools' runs on h2, which fetched it from S3 ($fetches fetch(es)), verified it and reports it"
else not_ok "fetch on another host" "has=$h2_has fetches=$fetches $(head -c 600 "$T_TMP/$id.json")" "$(tail -5 "$T_TMP/host2.err")"; fi

# --- clone safety per template: distinct randomness, the right clock ---
CLONE='import os, time, uuid; print(os.urandom(16).hex(), uuid.uuid4(), int(time.time()))'
a=$(py_spec "$CLONE" '{"template":"tools"}' | submit); b=$(py_spec "$CLONE" '{"template":"tools"}' | submit)
wait_task "$a"; wait_task "$b"
ra=$(jq -r .result.stdout "$T_TMP/$a.json"); rb=$(jq -r .result.stdout "$T_TMP/$b.json"); now=$(date +%s)
if [ -n "$ra" ] && [ -n "$rb" ] && [ "$(cut -d' ' -f1,2 <<< "$ra")" != "$(cut -d' ' -f1,2 <<< "$rb")" ] \
   && [ $((now - $(cut -d' ' -f3 <<< "$ra"))) -lt 120 ] && [ $((now - $(cut -d' ' -f3 <<< "$ra"))) -ge 0 ]; then
	ok "two clones of the tools snapshot have distinct randomness and the host's clock"
else not_ok "clone safety" "a=$ra b=$rb now=$now"; fi

# --- deleting a template while a task of it runs ---
id=$(jq -cn '{argv: ["/bin/sh", "-c", "sleep 4; cat hello.txt"], template: "busy"}' | submit)
for _ in $(seq 300); do [ "$(cust "$API/v1/tasks/$id" | jq -r .state)" = running ] && break; sleep 0.2; done
del=$(cust -o /dev/null -w '%{http_code}' -X DELETE "$API/v1/templates/busy")
wait_task "$id"
after=$(cust -o /dev/null -w '%{http_code}' "$API/v1/templates/busy")
if [[ $del =~ ^20[04]$ ]] && [ "$(jq -r .state "$T_TMP/$id.json")" = succeeded ] && [ "$(jq -r .result.stdout "$T_TMP/$id.json")" = oci-hello ] \
   && [ "$after" = 404 ]; then
	ok "a template deleted while its task runs: the task still succeeds, the name is gone (404)"
else not_ok "delete while running" "del=$del after=$after $(head -c 500 "$T_TMP/$id.json")"; fi

# --- shutdown leaves nothing ---
t_nothing_left "afterwards: no QEMU, VM directory, namespace or cgroup left"
t_done
