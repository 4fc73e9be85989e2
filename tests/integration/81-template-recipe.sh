#!/usr/bin/env bash
# Recipe templates built in a build VM (kiln-host template build): a real
# package from the real Debian mirror, a file, a run step; a task booted from
# the image sees all three. The run steps have no network: not the mirror's
# port the packages came from, not DNS. Failures: an unknown package (apt's message), a
# failing run step (named), a step past the timeout, a cancel, an image past
# max_bytes, packages without egress. Every build leaves nothing behind.
#
# The build's network: kiln-host runs in a namespace of its own (egress on
# there, nothing changed in the root namespace), joined to the root
# namespace by a veth pair; on the root side a small reverse proxy
# (mirror_proxy.py) passes apt's requests on to this machine's real mirror.
. "$(dirname "$0")/lib.sh"
t_plan 25
require_image
t_require_tools ip nsenter nft curl jq

# The machine's Debian mirror, as image/build-rootfs.sh finds it.
UPSTREAM=$(grep -hsoE '^URIs: *http[^ ]*debian/?$' /etc/apt/sources.list.d/*.sources | head -n1 | awk '{print $2}')
[ -n "$UPSTREAM" ] || UPSTREAM=http://deb.debian.org/debian
curl -sf -m 20 -o /dev/null "${UPSTREAM%/}/dists/bookworm/InRelease" || {
	echo "1..0 # SKIP the Debian mirror $UPSTREAM is not reachable from this machine"; exit 0; }

N=$((RANDOM % 50))
NS=kiln-t81-$N
LINK=kt81h$N
# A /30 of TEST-NET-2 high enough not to meet 65-egress.sh's addresses.
BASE=$((200 + (N % 12) * 4))
PEER=198.51.100.$((BASE + 1))   # root namespace: the proxy
SELF=198.51.100.$((BASE + 2))   # kiln-host's namespace
PORT=3142
MIRROR=http://$PEER:$PORT/debian
proxy_pid=
build_pid=

t_on_exit 'ip netns del "$NS" 2> /dev/null; ip link del "$LINK" 2> /dev/null'

ip netns add "$NS" 2> /dev/null && ip link add "$LINK" type veth peer name eth0 netns "$NS" || {
	echo "1..0 # SKIP cannot create a network namespace and a veth pair (needs root and CAP_NET_ADMIN)"; exit 0; }
ip addr add "$PEER/30" dev "$LINK" && ip link set "$LINK" up
ip -n "$NS" addr add "$SELF/30" dev eth0 && ip -n "$NS" link set eth0 up && ip -n "$NS" link set lo up
t_bg /usr/bin/python3 "$ROOT/tests/integration/mirror_proxy.py" "$PEER" "$PORT" "$UPSTREAM" "$T_TMP/proxy.count" \
	2> "$T_TMP/proxy.err"
proxy_pid=$T_BG_PID
for _ in $(seq 100); do curl -s -o /dev/null -m 2 "$MIRROR/dists/bookworm/InRelease" && break; sleep 0.1; done
jq -n --arg dns "$PEER:53" '{network: {egress: true, dns_upstream: $dns, link_range: "10.203.0.0/16"}}' > "$T_TMP/host.json"

# Resources before any build.
before_qemu=$(count_qemu) before_cg=$(count_cgroups) before_mounts=$(count_mounts)
before_links=$(ip -n "$NS" -o link | wc -l)
before_run=$(count_run_entries)

# build NAME RECIPE_JSON [args...]: kiln-host template build in the test's
# namespace; meta JSON in $T_TMP/NAME.json, log in NAME.log, status NAME.rc,
# seconds NAME.secs; the image is $T_TMP/NAME.ext4.
build() {
	local name=$1 recipe=$2 t0; shift 2
	printf '%s' "$recipe" > "$T_TMP/$name.recipe"
	t0=$(date +%s.%N)
	nsenter --net="/run/netns/$NS" "$KILN_HOST" template build "$T_TMP/$name.recipe" --out "$T_TMP/$name.ext4" \
		--mirror "$MIRROR" --vcpus 2 --memory 1024 "$@" > "$T_TMP/$name.json" 2> "$T_TMP/$name.log"
	echo $? > "$T_TMP/$name.rc"
	/usr/bin/python3 -c "import sys; print('%.1f' % ($(date +%s.%N) - float(sys.argv[1])))" "$t0" > "$T_TMP/$name.secs"
}
m() { jq -r "$2" "$T_TMP/$1.json" 2> /dev/null; }
why() { echo "rc=$(cat "$T_TMP/$1.rc") out=$(head -c 600 "$T_TMP/$1.json")"; echo "log: $(tail -c 1200 "$T_TMP/$1.log" | tr '\n' '|')"; }

# --- the good build ---
# Its last run step (net_probe.py, one of its files) tries the mirror's own
# address and port, the build VM's DNS server and a name, 3 s each, and
# leaves what happened in /opt/net-probe: the packages came from the mirror,
# the run steps after them must reach nothing (issue 37).
PROBE_B64=$(base64 -w0 "$ROOT/tests/integration/net_probe.py")
GOOD=$(jq -cn --arg probe "$PROBE_B64" --arg run_probe "python3 /usr/local/lib/kiln-net-probe.py $PEER $PORT deb.debian.org > /opt/net-probe" \
	'{name:"jqtool", packages:["jq"],
	files:[{path:"/etc/kiln-test/hello.txt", content_b64:"aGVsbG8gZnJvbSBhIHJlY2lwZQo=", mode:420},
	       {path:"/usr/local/bin/greet", content_b64:"IyEvYmluL3NoCmVjaG8gaGkK", mode:493},
	       {path:"/usr/local/lib/kiln-net-probe.py", content_b64:$probe, mode:420}],
	run:["jq --version > /opt/run-made && echo \"HOME=$HOME FOO=$FOO\" >> /opt/run-made", "test \"$(id -u)\" = 0",
	     $run_probe],
	preload:["json","csv"], env:{FOO:"bar", LANG:"C.UTF-8"}, workdir:"/srv"}')
build good "$GOOD" --timeout 900 --max-mib 2048 --config "$T_TMP/host.json"
echo "# good build: $(cat "$T_TMP/good.secs") s (boot, apt-get update + install jq from the mirror, image)"
if [ "$(cat "$T_TMP/good.rc")" = 0 ] && [ -f "$T_TMP/good.ext4" ]; then ok "a recipe with a package, files and run steps builds"
else not_ok "the good build" "$(why good)"; fi
check "the meta names the recipe's env, workdir and uid/gid 1000:1000" \
	test "$(m good '[.env, .workdir, .uid, .gid] | tostring')" = '[["FOO=bar","LANG=C.UTF-8"],"/srv",1000,1000]'
size=$(stat -c %s "$T_TMP/good.ext4" 2> /dev/null || echo 0)
check "the image is root's, mode 0444, a multiple of 4 KiB, within max_bytes" \
	test "$(stat -c %U:%a "$T_TMP/good.ext4" 2> /dev/null)" = root:444 -a $((size % 4096)) = 0 -a "$size" -gt 0 \
	-a "$size" -le $((2048 << 20)) -a "$(m good .size)" = "$size"
check "apt's own output is in the build log, with the build's progress" \
	grep -q 'Setting up jq' "$T_TMP/good.log"
check "the log names each step and the image's size" \
	sh -c "grep -q '^\[build\] apt-get update' '$T_TMP/good.log' && grep -q '^\[build\] run\[1\]' '$T_TMP/good.log' && grep -q '^\[build\] done in .*: image [0-9]* MiB' '$T_TMP/good.log'"
check "apt went through the mirror proxy (the build VM reached it)" test "$(cat "$T_TMP/proxy.count" 2> /dev/null || echo 0)" -ge 3
# What the run step could reach, read from the image (debugfs: the test's
# own look at it; kiln-host never parses a guest-made image).
debugfs -R "cat /opt/net-probe" "$T_TMP/good.ext4" > "$T_TMP/probe.out" 2> /dev/null
probe() { sed -n "s/^$1 //p" "$T_TMP/probe.out"; }
pm=$(probe mirror)
if [ -n "$pm" ] && [ "$pm" != connected ] && [ "$pm" != refused ]; then
	ok "a run step cannot reach the mirror's address and port, which the package step before it used ($pm)"
else not_ok "run step to the mirror's port" "probe: $(tr '\n' '|' < "$T_TMP/probe.out") $(why good)"; fi
pd=$(probe dns) pr=$(probe resolve)
if [ -n "$pd" ] && [ "$pd" != answered ] && [ -n "$pr" ] && [ "$pr" != resolved ]; then
	ok "a run step gets no answer from the build VM's DNS server and resolves no name (dns $pd, resolve $pr)"
else not_ok "run step DNS" "probe: $(tr '\n' '|' < "$T_TMP/probe.out")"; fi
check "the log says the network goes after the packages, before the files and run steps" \
	sh -c "grep -A1 '^\[build\] packages installed' '$T_TMP/good.log' | grep -q '^\[build\] network: none from here on' &&
	       grep -n '^\[build\] \(network: none\|files:\)' '$T_TMP/good.log' | head -1 | grep -q 'network: none'"

# --- a task booted from the image ---
mkdir -p "$T_TMP/img"
ln -s "$ROOT/build/image/vmlinux" "$T_TMP/img/vmlinux"
ln -s "$ROOT/build/image/initramfs.cpio" "$T_TMP/img/initramfs.cpio"
ln -s "$T_TMP/good.ext4" "$T_TMP/img/rootfs.ext4"
run_spec boot "$(sh_spec 'echo "{\"k\":[1,2]}" | jq -c ".k|add"
stat -c "%U:%a %s" /etc/kiln-test/hello.txt /usr/local/bin/greet; greet
cat /etc/kiln-test/hello.txt /opt/run-made /etc/kiln/preload
ls /var/lib/apt/lists | grep -vc lock; wc -c < /etc/resolv.conf; ls -A /mnt | wc -l; id -u')" \
	--image-dir "$T_TMP/img" --cold
EXPECT='3
root:644 20
root:755 18
hi
hello from a recipe
jq-1.6
HOME=/root FOO=bar
json
csv
0
0
0
1000'
if [ "$(r boot .state)" = succeeded ] && [ "$(r boot .stdout)" = "$EXPECT" ]; then
	ok "a task booted from the image has the package, the files (root's, their modes), the run step's file, the preload list, no apt lists"
else not_ok "task on the built image" "$(show boot)"; fi

# --- failures ---
build nopkg '{"name":"x","packages":["kiln-no-such-package"]}' --timeout 600 --max-mib 2048 --config "$T_TMP/host.json"
if [ "$(cat "$T_TMP/nopkg.rc")" = 1 ] && [ "$(m nopkg .error.code)" = build_failed ] &&
   m nopkg .error.message | grep -q '^apt-get install exited with status 100: E: Unable to locate package kiln-no-such-package' &&
   grep -q '^E: Unable to locate package kiln-no-such-package' "$T_TMP/nopkg.log"; then
	ok "an unknown package fails the build with apt's message (in the error and the log)"
else not_ok "unknown package" "$(why nopkg)"; fi

# The recipe's env is not the package steps' env: there it could run the
# customer's code while the mirror is reachable (APT_CONFIG names apt's
# config, hooks included; BASH_ENV, PERL5OPT). An APT_CONFIG apt cannot
# parse shows it: apt would fail at once.
build envapt '{"name":"x","packages":["jq"],"env":{"APT_CONFIG":"/etc/debian_version"},
	"run":["test \"$APT_CONFIG\" = /etc/debian_version"]}' --timeout 600 --max-mib 2048 --config "$T_TMP/host.json"
if [ "$(cat "$T_TMP/envapt.rc")" = 0 ] && grep -q '^\[build\] run\[0\] done' "$T_TMP/envapt.log"; then
	ok "the recipe's env reaches its run steps but not apt's (APT_CONFIG of the recipe ignored by apt-get)"
else not_ok "recipe env in the package steps" "$(why envapt)"; fi
rm -f "$T_TMP/envapt.ext4"

build badrun '{"name":"x","run":["true","echo about to fail; exit 3","touch /never"]}' --timeout 600 --max-mib 2048
if [ "$(cat "$T_TMP/badrun.rc")" = 1 ] && [ "$(m badrun .error.code)" = build_failed ] &&
   [ "$(m badrun .error.message)" = "run[1] exited with status 3" ] && grep -q '^about to fail$' "$T_TMP/badrun.log" &&
   ! grep -q 'run\[2\]' "$T_TMP/badrun.log"; then
	ok "a failing run step fails the build naming it (run[1] exited with status 3); later steps do not run"
else not_ok "failing run step" "$(why badrun)"; fi

build slow '{"name":"x","run":["sleep 600"]}' --timeout 30 --max-mib 2048
secs=$(cat "$T_TMP/slow.secs")
if [ "$(cat "$T_TMP/slow.rc")" = 1 ] && [ "$(m slow .error.code)" = build_timeout ] &&
   m slow .error.message | grep -q 'run\[0\]' && [ "${secs%.*}" -lt 50 ]; then
	ok "a step past the build's timeout ends it with build_timeout (${secs} s for a 30 s timeout)"
else not_ok "build timeout" "$(why slow) secs=$secs"; fi

build big '{"name":"x","run":["true"]}' --timeout 600 --max-mib 256
if [ "$(cat "$T_TMP/big.rc")" = 1 ] && [ "$(m big .error.code)" = too_large ]; then
	ok "an image past max_bytes fails with too_large ($(m big .error.message))"
else not_ok "too large" "$(why big)"; fi

build noegress '{"name":"x","packages":["jq"]}' --timeout 600 --max-mib 2048
if [ "$(cat "$T_TMP/noegress.rc")" = 3 ] && [ "$(m noegress .error.code)" = egress_disabled ] &&
   ! grep -q booting "$T_TMP/noegress.log"; then
	ok "packages without egress fail with egress_disabled before any VM starts"
else not_ok "egress disabled" "$(why noegress)"; fi

# Cancel: SIGTERM while a step runs.
printf '%s' '{"name":"x","run":["sleep 600"]}' > "$T_TMP/cancel.recipe"
t_bg nsenter --net="/run/netns/$NS" "$KILN_HOST" template build "$T_TMP/cancel.recipe" --out "$T_TMP/cancel.ext4" \
	--timeout 600 --max-mib 2048 > "$T_TMP/cancel.json" 2> "$T_TMP/cancel.log"
build_pid=$T_BG_PID
for _ in $(seq 600); do grep -q '^\[build\] run\[0\]' "$T_TMP/cancel.log" 2> /dev/null && break; sleep 0.1; done
t0=$(date +%s)
kill -TERM "$build_pid"
wait "$build_pid"
echo $? > "$T_TMP/cancel.rc"
build_pid=
if [ "$(cat "$T_TMP/cancel.rc")" = 1 ] && [ "$(m cancel .error.code)" = cancelled ] && [ $(($(date +%s) - t0)) -lt 15 ]; then
	ok "SIGTERM during a step cancels the build (cancelled)"
else not_ok "cancel" "$(why cancel)"; fi

# --- nothing left behind ---
check "no image for a failed build, no scratch directory" \
	test -z "$(ls -d "$T_TMP"/*.ext4.build "$T_TMP"/{nopkg,badrun,slow,big,noegress,cancel}.ext4 2> /dev/null)"
check "no QEMU left" test "$(count_qemu)" = "$before_qemu"
check "no cgroup left" test "$(count_cgroups)" = "$before_cg"
check "no mount left" test "$(count_mounts)" = "$before_mounts"
check "no run directory entry left" test "$(count_run_entries)" = "$before_run"
check "no sandbox link left in the build's namespace" test "$(ip -n "$NS" -o link | wc -l)" = "$before_links"
# nft must answer in the namespace (a probe that fails is not "no table").
tables=$(nsenter --net="/run/netns/$NS" nft list tables 2>&1); nft_rc=$?
check "no nftables table left in the build's namespace (nft: exit $nft_rc, '$tables')" test "$nft_rc" = 0 -a -z "$tables"
# (Slot locks die with their holder: no QEMU and no kiln-host left means none
# held; the machine-wide count would also see other worktrees' VMs.)
check "no kiln-host process left" test -z "$(pgrep -f "template build $T_TMP" || true)"
t_done
