#!/usr/bin/env bash
# kiln template and kiln up --egress, through the CLI over the one-command
# stack. kiln up --egress runs in a network namespace of its own ("up": its
# S3, kiln-api, kiln-host and their nftables table stay there), linked by a
# veth to a peer namespace that serves HTTP on 198.51.100.20 (TEST-NET-2,
# outside every default deny range). Checked: bad usage (exit 2, before any
# configuration is read), kiln-host's capacity and the customer's quota with
# --egress, a task with --allow reaching the peer (and only it), kiln run
# --template default and -c CODE, kiln session create --template default; the
# 404 of an unknown template, template list/get/rm, a recipe built and used,
# an OCI upload that is not an image failing with the API's error. SIGTERM:
# nothing of the stack is left.
. "$(dirname "$0")/lib.sh"
t_plan 33
require_image
t_require_tools swift-proxy-server memcached jq ip nsenter nft curl
t_require_built kiln kiln-api kiln-host

KILN=$ROOT/build/kiln
UP=$T_TMP/up
N=$((RANDOM % 200 + 20))
NS=kiln-up-$N
PEER_NS=kiln-upp-$N
NET=198.51.100
PORT=8080
export KILN_CREDENTIALS=$UP/credentials
unset KILN_API KILN_KEY KILN_ADMIN_KEY
up_pid=
peer_pid=

t_on_exit 'ip netns del "$NS" 2> /dev/null; ip netns del "$PEER_NS" 2> /dev/null'

# --- bad usage: exit 2, without any configuration ---
bad=""
while IFS= read -r args; do
	# shellcheck disable=SC2086
	KILN_CREDENTIALS=$T_TMP/none "$KILN" $args > /dev/null 2> "$T_TMP/usage.err"
	rc=$?
	[ "$rc" = 2 ] || bad="$bad [kiln $args: $rc $(head -c 200 "$T_TMP/usage.err")]"
done <<'EOF'
template
template frobnicate
template build
template build --packages jq
template build --name Bad_Name --packages jq
template build --name x --oci x.tar --packages jq
template build r.json --run true
template build --name x --file nocolon
template build --name x --file local:relative/path
template build --name x --env NOEQUALS
template build --name x --workdir relative
template build --name x --bogus
template get
template get Bad/Name
template rm
template rm a b
template list extra
run x.py --template Bad!Name
run -c print(1) x.py
run -c print(1) --lang ruby
run x.py --lang bash
EOF
check "bad usage of kiln template / --template exits 2${bad:+:$bad}" [ -z "$bad" ]
KILN_CREDENTIALS=$T_TMP/none "$KILN" template build --name x --packages 'a,b' > /dev/null 2> "$T_TMP/noconf.err"
rc=$?
check "a valid build without configuration: exit 2 with the kiln up hint ($(head -c 200 "$T_TMP/noconf.err"))" \
	eval '[ "$rc" = 2 ] && grep -q "kiln up" "$T_TMP/noconf.err"' 
"$KILN" template build --name x --file "$T_TMP/missing.txt:/etc/x" > /dev/null 2> "$T_TMP/nofile.err"
rc=$?
check "--file of a missing local file: exit 2 naming it ($(cat "$T_TMP/nofile.err"))" \
	eval '[ "$rc" = 2 ] && grep -q "missing.txt: No such file" "$T_TMP/nofile.err"' 
"$KILN" template --help > "$T_TMP/help.out" 2>&1
check "kiln template --help documents build (recipe flags, --oci), list, get, rm" \
	grep -q "template build --name N --oci IMAGE.tar" "$T_TMP/help.out"
grep -q -- "--egress" <("$KILN" up --help) && ok "kiln up --help documents --egress" || not_ok "kiln up --help" "no --egress"

# --- the namespaces: kiln up's, and a peer on a veth ---
before_ns=$(ip netns list | wc -l)
before_cg=$(count_cgroups)
if ! ip netns add "$NS" 2> "$T_TMP/ns.err"; then
	skip "kiln up --egress in a namespace" "cannot create a network namespace: $(cat "$T_TMP/ns.err")"
	t_done; exit $?
fi
ip netns add "$PEER_NS"
ip -n "$NS" link set lo up
ip -n "$PEER_NS" link set lo up
ip link add "kup$N" netns "$NS" type veth peer name eth0 netns "$PEER_NS"
ip -n "$NS" addr add "$NET.1/24" dev "kup$N"
ip -n "$NS" link set "kup$N" up
ip -n "$PEER_NS" addr add "$NET.20/24" dev eth0
ip -n "$PEER_NS" link set eth0 up
t_bg nsenter --net="/run/netns/$PEER_NS" /usr/bin/python3 "$ROOT/tests/integration/egress_peer.py" http "$NET.20" 8080 \
	peer-says-hi 2> "$T_TMP/peer.err"
peer_pid=$T_BG_PID
inns() { nsenter --net="/run/netns/$NS" "$@"; }
K() { inns "$KILN" "$@"; }
has() { grep -q -- "$1" "$2"; }
host_table() { inns nft list table inet kiln_host > /dev/null 2>&1; }
# host_table_gone: nft answers in kiln up's namespace, and without that table.
host_table_gone() { inns nft list tables > "$T_TMP/nft.tables" 2>&1 && ! grep -q 'inet kiln_host' "$T_TMP/nft.tables"; }

stack_procs() { pgrep -f -- "$UP/" | grep -vx "$$" | wc -l; }
before_procs=$(stack_procs)
# nsenter execs kiln: $! is kiln up itself (SIGTERM below reaches it).
t_bg nsenter --net="/run/netns/$NS" "$KILN" up --egress --dir "$UP" --port "$PORT" > "$T_TMP/up.out" 2> "$T_TMP/up.err"
up_pid=$T_BG_PID
for _ in $(seq 2400); do
	[ -f "$UP/credentials" ] && break
	kill -0 "$up_pid" 2> /dev/null || break
	sleep 0.25
done
if [ -f "$UP/credentials" ]; then
	ok "kiln up --egress gets ready in its namespace"
else
	t_bail "kiln up --egress gets ready" "$(tail -5 "$T_TMP/up.err")" "$(tail -5 "$UP/host.log" 2> /dev/null)"
fi
running_procs=$(stack_procs)
check "its banner says egress is on" grep -q "egress *on" "$T_TMP/up.out"
check "kiln-host's config has network.egress true" [ "$(jq -r .network.egress "$UP/host.json")" = true ]
HOST_TOKEN=$(jq -r .token "$UP/host.json")
HOST_LISTEN=$(jq -r .listen "$UP/host.json")
cap=$(inns curl -s -m 10 -H "Authorization: Bearer $HOST_TOKEN" "http://$HOST_LISTEN/v1/capacity")
check "kiln-host's /v1/capacity says it offers egress" [ "$(echo "$cap" | jq -r .egress)" = true ]
check "kiln-host's nftables table is in kiln up's namespace" host_table
. "$UP/credentials"
quota=$(inns curl -s -m 10 -H "Authorization: Bearer $KILN_ADMIN_KEY" "$KILN_API/v1/admin/customers/default")
check "the customer of kiln up has allow_egress ($(echo "$quota" | jq -c .quotas.allow_egress))" \
	[ "$(echo "$quota" | jq -r .quotas.allow_egress)" = true ]
unset KILN_API KILN_KEY KILN_ADMIN_KEY S3_ENDPOINT S3_REGION S3_BUCKET S3_ACCESS_KEY S3_SECRET_KEY

cd "$T_TMP" || exit 1

# --- egress: the allowed peer, and nothing else ---
cat > "$T_TMP/fetch.py" <<PY
import socket, urllib.request
print(urllib.request.urlopen("http://$NET.20:8080/", timeout=10).read().decode())
try:
    socket.create_connection(("$NET.20", 8081), timeout=2)
    print("8081 reached")
except OSError as e:
    print("8081 blocked")
try:
    socket.create_connection(("$NET.1", 8080), timeout=2)
    print("host reached")
except OSError as e:
    print("host blocked")
PY
K run "$T_TMP/fetch.py" --allow "$NET.20:8080" > "$T_TMP/fetch.out" 2> "$T_TMP/fetch.err"
rc=$?
check "kiln run --allow $NET.20:8080 reaches the peer, not another port nor kiln up's own address (exit $rc: $(tr '\n' ' ' < "$T_TMP/fetch.out"))" \
	[ "$rc" = 0 -a "$(cat "$T_TMP/fetch.out")" = "$(printf 'peer-says-hi\n8081 blocked\nhost blocked')" ]
printf 'import socket\ntry:\n    socket.create_connection(("%s.20", 8080), timeout=2); print("reached")\nexcept OSError:\n    print("no network")\n' \
	"$NET" > "$T_TMP/nonet.py"
K run "$T_TMP/nonet.py" > "$T_TMP/nonet.out" 2> "$T_TMP/nonet.err"
check "without --allow the task has no network ($(cat "$T_TMP/nonet.out"))" [ "$(cat "$T_TMP/nonet.out")" = "no network" ]

# --- --template default ---
printf 'import sys\nprint("on", sys.version_info[0])\n' > "$T_TMP/ver.py"
K run "$T_TMP/ver.py" --template default > "$T_TMP/tdef.out" 2> "$T_TMP/tdef.err"
rc=$?
check "kiln run --template default runs (exit $rc: $(cat "$T_TMP/tdef.out"))" [ "$rc" = 0 -a "$(cat "$T_TMP/tdef.out")" = "on 3" ]
py=$(K run --template default -c 'print(6 * 7)' 2> "$T_TMP/c.err")
rc=$?
sh=$(K run -c 'echo "$((6 * 7))-$0"' --lang bash 2>> "$T_TMP/c.err")
check "kiln run -c CODE (python; bash with --lang bash): exit $rc, '$py' '$sh'" [ "$rc" = 0 -a "$py" = 42 -a "${sh%%-*}" = 42 ]
K session create --template 'Not Valid' > /dev/null 2> "$T_TMP/sessbad.err"
rc=$?
check "kiln session create --template with a bad name: exit 2 ($(cat "$T_TMP/sessbad.err"))" \
	eval '[ "$rc" = 2 ] && has "not a template name" "$T_TMP/sessbad.err"' 

# --- the templates API ---
K template list > "$T_TMP/tlist.out" 2> "$T_TMP/tlist.err"
list_rc=$?
list_err=$(head -c 150 "$T_TMP/tlist.err")
check "kiln template list shows the built-in templates (exit $list_rc${list_err:+: $list_err})" \
	grep -q "^default  *ready  *yes" "$T_TMP/tlist.out"
sid=$(K session create --template default 2> "$T_TMP/sess.err")
rc=$?
check "kiln session create --template default (exit $rc, $sid $(head -c 200 "$T_TMP/sess.err"))" \
	[ "$rc" = 0 -a -n "$sid" ]
[ -n "$sid" ] && K session rm "$sid" > /dev/null 2>&1
K run "$T_TMP/ver.py" --template nosuch > /dev/null 2> "$T_TMP/nosuch.err"
rc=$?
check "kiln run --template nosuch: exit 1 with the API's 404 ($(head -c 200 "$T_TMP/nosuch.err"))" \
	eval '[ "$rc" = 1 ] && has "HTTP 404" "$T_TMP/nosuch.err"'
K template get nosuch > /dev/null 2> "$T_TMP/getno.err"
rc1=$?
K template rm nosuch > /dev/null 2> "$T_TMP/rmno.err"
rc2=$?
check "kiln template get/rm nosuch: exit 1, HTTP 404 ($(head -c 120 "$T_TMP/getno.err"))" \
	eval '[ "$rc1" = 1 -a "$rc2" = 1 ] && has "HTTP 404" "$T_TMP/getno.err" && has "HTTP 404" "$T_TMP/rmno.err"'

echo "from-the-cli-$RANDOM" > "$T_TMP/tfile.txt"
head -c 3000000 /dev/urandom > "$T_TMP/junk.tar"
# A recipe without packages needs no mirror: a run step and a file.
K template build --name clitest --run 'echo built-by-run > /etc/kiln-built' \
	--file "$T_TMP/tfile.txt:/etc/kiln-file" > "$T_TMP/build.out" 2> "$T_TMP/build.err"
rc=$?
check "kiln template build (a run step and a file) follows the build to ready, exit $rc ($(tail -1 "$T_TMP/build.err"))" \
	eval '[ "$rc" = 0 ] && has "template clitest ready: .*sha256 [0-9a-f]\{64\}" "$T_TMP/build.err"'
printf 'cat /etc/kiln-built /etc/kiln-file\n' > "$T_TMP/cat.sh"
K run "$T_TMP/cat.sh" --template clitest > "$T_TMP/tuse.out" 2> "$T_TMP/tuse.err"
check "kiln run --template clitest sees what the build made" \
	[ "$(cat "$T_TMP/tuse.out")" = "$(printf 'built-by-run\n%s' "$(cat "$T_TMP/tfile.txt")")" ]
K template get clitest > "$T_TMP/tget.out" 2>&1
check "kiln template get clitest: a summary, state ready" grep -q "^state  *ready" "$T_TMP/tget.out"
check "kiln template get clitest --json: JSON with the sha256" \
	[ "$(K template get clitest --json | jq -r .sha256 | wc -c)" = 65 ]
K template rm clitest > "$T_TMP/trm.out" 2>&1
rc=$?
# Gone means the API's 404, not any failure of the get.
K template get clitest > /dev/null 2> "$T_TMP/tgone.err"
rc2=$?
check "kiln template rm clitest (exit $rc), then get: exit 1, HTTP 404 ($rc2 $(head -c 120 "$T_TMP/tgone.err"))" \
	eval '[ "$rc" = 0 ] && [ "$rc2" = 1 ] && has "HTTP 404" "$T_TMP/tgone.err"'
# Not an image: streamed up, then refused by the build with the API's error.
K template build --name junk --oci "$T_TMP/junk.tar" > "$T_TMP/junk.out" 2> "$T_TMP/junk.err"
rc=$?
check "kiln template build --oci of 3 MB that is no image: exit 1, invalid_image ($(tail -1 "$T_TMP/junk.err"))" \
	eval '[ "$rc" = 1 ] && has invalid_image "$T_TMP/junk.err"'
K template rm junk > /dev/null 2>&1
K template build --name nw --run true --no-wait > "$T_TMP/nw.out" 2> "$T_TMP/nw.err"
rc=$?
check "--no-wait returns at once with the queued state (exit $rc: $(cat "$T_TMP/nw.out"))" \
	eval '[ "$rc" = 0 ] && grep -Eq "^nw (queued|building)$" "$T_TMP/nw.out"'
K template rm nw > /dev/null 2>&1

# --- SIGTERM: everything stops ---
kill -TERM "$up_pid"
wait "$up_pid"
rc=$?
up_pid=
check "kiln up --egress exits 0 on SIGTERM" [ "$rc" = 0 ]
check "its nftables table is gone with kiln-host (nft lists the namespace's tables: $(inns nft list tables 2>&1 | tr '\n' ' '))" host_table_gone
after_procs=$(stack_procs)
if [ "$running_procs" -gt 5 ] && [ "$after_procs" = "$before_procs" ]; then
	ok "no process of the stack is left ($running_procs while up, $after_procs after)"
else not_ok "processes left" "before=$before_procs up=$running_procs after=$after_procs" "$(pgrep -af -- "$UP/")"; fi
check "no cgroup left ($(count_cgroups) = $before_cg)" [ "$(count_cgroups)" = "$before_cg" ]
check "no sandbox link left in kiln up's namespace" [ "$(ip -n "$NS" -o link show | grep -c ': kv')" = 0 ]
kill "$peer_pid" 2> /dev/null
wait "$peer_pid" 2> /dev/null
peer_pid=
ip netns del "$NS"
ip netns del "$PEER_NS"
check "the test's namespaces are gone ($(ip netns list | wc -l) = $before_ns)" [ "$(ip netns list | wc -l)" = "$before_ns" ]
t_done
