#!/usr/bin/env bash
# The package installed for real (issue 42): `make deb`, then `apt-get
# install` of it into a clean Debian 12 root (debootstrap, scripts/deb-root.sh:
# cached in $KILN_CACHE/debootstrap with the package's Depends already in it,
# so the install is the package alone, offline; each run works on an overlay
# over the cached root, which stays clean). postinst's user, configuration,
# keys and directories; `systemd-analyze verify --root` of the installed
# units; then kiln-api and kiln-host started in the root as the units say
# (ExecStart, User=/Group=, UMask and LimitNOFILE read from the installed
# unit files, LimitNOFILE capped at the machine's hard limit; each in a
# cgroup of its own, as systemd would), with only the ports, S3 (a local S3
# outside the root, reached on 127.0.0.1) and the host's capacity written
# over the shipped /etc/kiln/*.json; a python task end to end through
# kiln-api (a real VM, the snapshot built first in the root's own
# /var/cache/kiln), its stdout and its output in S3; `apt-get purge kiln` removes the
# binaries, units, /etc/kiln and /var/cache/kiln and keeps /var/lib/kiln;
# and nothing is left: processes, cgroups, mounts.
#
# What is not the package's: the guest root images are kiln-images' (make
# deb-images: 860 MB, too slow to pack per run), so build/image's
# rootfs*.ext4 are bind-mounted read-only into the root's
# /usr/lib/kiln/image/ (the kernel and initramfs are the package's), and
# unmounted before the purge (kiln-images would go first). Recommends
# (kiln-images, skopeo, umoci) are not installed (--no-install-recommends).
# What systemd adds around the daemons (its sandboxing options, capability
# drops, StateDirectory=) is not applied: a mount namespace pivoted into the
# root is not systemd (the units themselves are checked by systemd-analyze).
# Needs root.
. "$(dirname "$0")/lib.sh"
t_plan 24
require_image
t_require_tools make dpkg-deb debootstrap unshare pivot_root chroot systemd-analyze swift-proxy-server memcached jq curl
t_require_built kiln kiln-api kiln-host kiln-jail tests/s3tool
[ "$(id -u)" -eq 0 ] || t_skip_all "needs root (debootstrap, mounts, namespaces)"
grep -qw overlay /proc/filesystems || t_skip_all "needs overlayfs (a per-run root over the cached one)"

V=$(cat "$ROOT/VERSION")
DEB=$ROOT/build/kiln_${V}_amd64.deb
R=$T_TMP/root
CG=
img_mounts=()

# ---- the package and the root ----
make -s -C "$ROOT" deb > "$T_TMP/deb.out" 2>&1 || t_bail "make deb" "$(tail -5 "$T_TMP/deb.out")"
cached=$("$ROOT/scripts/deb-root.sh" "$DEB" 2> "$T_TMP/deb-root.err") ||
	t_bail "a Debian 12 root with the package's Depends (scripts/deb-root.sh)" "$(tail -3 "$T_TMP/deb-root.err")"
sed 's/^/# /' "$T_TMP/deb-root.err"
mkdir -p "$R" "$T_TMP/ov/upper" "$T_TMP/ov/work"
mount -t overlay overlay -o "lowerdir=$cached,upperdir=$T_TMP/ov/upper,workdir=$T_TMP/ov/work" "$R" ||
	t_bail "an overlay over the cached root"
# Unmounted on every path, before t_cleanup removes $T_TMP (the daemons,
# whose namespaces hold copies of these mounts, are ended before this).
root_umount() {
	local m
	for m in "${img_mounts[@]}"; do umount "$m" 2> /dev/null; done
	img_mounts=()
	! mountpoint -q "$R" || umount "$R" || umount -l "$R"
}
t_on_exit root_umount
# cg_remove: the daemons' cgroups (made below: $CG/UNIT/CONTROLLER links
# to them), once their processes are gone.
cg_remove() {
	local l
	[ -n "$CG" ] || return 0
	for l in "$CG"/*/*; do [ -L "$l" ] && find "$(readlink "$l")" -depth -type d -exec rmdir {} + 2> /dev/null; done
	return 0
}
t_on_exit cg_remove

# in_root CMD...: CMD in the root, in a mount namespace of its own whose
# root it is (pivot_root, as a container's: in a mere chroot, where the
# process's root is not its namespace's, the kernel refuses the user
# namespaces the jail makes), with /proc, /sys (with its cgroups) and /dev
# (/dev/kvm when there is one, /dev/net/tun, /dev/vhost-*) and the
# machine's /run/kiln/slots (slot uids are one range per machine:
# kiln-hosts outside the root take them too); all of it vanishes with the
# namespace. The sh execs down to CMD: the pid t_bg
# records is CMD's. IN_ROOT_AS (uid:gid), IN_ROOT_NOFILE,
# IN_ROOT_UMASK and IN_ROOT_CG (a directory of links to cgroups) apply
# before the exec.
# (IN_ROOT: the command line before CMD, for t_bg, which must exec it, not
# a function around it.)
in_root_args() {
	IN_ROOT=(unshare -m --propagation private sh -c "$IN_ROOT_SH" _ "$R" "${IN_ROOT_AS:-}" "${IN_ROOT_NOFILE:-}"
		"${IN_ROOT_UMASK:-}" "${IN_ROOT_CG:-}")
}
in_root() { local IN_ROOT; in_root_args; "${IN_ROOT[@]}" "$@"; }
IN_ROOT_SH='
		r=$1 user=$2 nofile=$3 um=$4 cg=$5; shift 5
		mount -t proc proc "$r/proc" && mount --rbind /sys "$r/sys" && mount --rbind /dev "$r/dev" || exit 125
		mkdir -p /run/kiln/slots "$r/run/kiln/slots" && mount --bind /run/kiln/slots "$r/run/kiln/slots" || exit 125
		[ -z "$nofile" ] || ulimit -n "$nofile" || exit 125
		[ -z "$um" ] || umask "$um" || exit 125
		if [ -n "$cg" ]; then for d in "$cg"/*; do echo $$ > "$d/cgroup.procs" || exit 125; done; fi
		cd "$r" && mkdir -p .old-root && pivot_root . .old-root && cd / && umount -l /.old-root || exit 125
		if [ -n "$user" ]; then
			exec chroot --userspec="$user" / /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
		fi
		exec /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin "$@"
'
pkgs() { in_root dpkg-query -W -f '${binary:Package} ${db:Status-Abbrev}\n' | awk '$2 ~ /^ii/ {print $1}' | sort; }

check "a Debian 12 root ($(cat "$R/etc/debian_version")) without kiln" \
	bash -c '[[ $(cat "$1/etc/debian_version") == 12.* ]] && ! grep -qx kiln <<< "$2"' _ "$R" "$(pkgs)"
pkgs > "$T_TMP/pkgs.before"

# ---- apt-get install of the package alone ----
cp "$DEB" "$R/tmp/"
in_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "/tmp/${DEB##*/}" \
	> "$T_TMP/install.out" 2>&1
irc=$?
[ "$irc" -eq 0 ] || sed 's/^/# install: /' "$T_TMP/install.out" | tail -20
pkgs > "$T_TMP/pkgs.after"
check "apt-get install /tmp/${DEB##*/} succeeds (status $irc), and installs kiln alone" \
	[ "$irc:$(comm -13 "$T_TMP/pkgs.before" "$T_TMP/pkgs.after" | tr '\n' ' ')" = "0:kiln " ]
check "dpkg says kiln $V is installed" \
	[ "$(in_root dpkg-query -W -f '${Status} ${Version}' kiln 2> /dev/null)" = "install ok installed $V" ]
check "postinst made the kiln system user (no home, no login)" \
	[ "$(in_root getent passwd kiln | cut -d: -f6,7)" = /nonexistent:/usr/sbin/nologin ]
stat_of() { in_root stat -c '%U:%G %a' "$@" 2> /dev/null | tr '\n' '|'; }
check "/etc/kiln/api.json, host.json (root 644); cluster-token, admin-key (root:kiln 640)" \
	[ "$(stat_of /etc/kiln/api.json /etc/kiln/host.json /etc/kiln/cluster-token /etc/kiln/admin-key)" = \
	  "root:root 644|root:root 644|root:kiln 640|root:kiln 640|" ]
check "/var/lib/kiln (root), api/ (kiln 750), spool/ (root 700), /var/cache/kiln (root 700)" \
	[ "$(stat_of /var/lib/kiln /var/lib/kiln/api /var/lib/kiln/spool /var/cache/kiln)" = \
	  "root:root 755|kiln:kiln 750|root:root 700|root:root 700|" ]
U=$R/lib/systemd/system
systemd-analyze verify --root="$R" kiln-api.service kiln-host.service > "$T_TMP/verify.out" 2>&1
vrc=$?
sed 's/^/# verify: /' "$T_TMP/verify.out"
check "systemd-analyze verify --root: both installed units, without a warning" [ "$vrc:$(wc -c < "$T_TMP/verify.out")" = 0:0 ]
check "installed kiln-host resolves its image dir to /usr/lib/kiln/image" \
	[ "$(in_root /usr/bin/kiln-host paths | jq -r .image_dir)" = /usr/lib/kiln/image ]

# ---- the guest root images (kiln-images'), bind-mounted read-only ----
for f in "$ROOT"/build/image/rootfs*.ext4; do
	t=$R/usr/lib/kiln/image/${f##*/}
	: > "$t" && mount --bind "$(realpath "$f")" "$t" && img_mounts+=("$t") && mount -o remount,bind,ro "$t" ||
		t_bail "bind-mount ${f##*/} into the root"
done

# ---- the daemons as the units start them ----
ADMIN=$(cat "$R/etc/kiln/admin-key")
API_PORT=$((20000 + RANDOM % 10000))
HOST_PORT=$((API_PORT + 1))
API=http://127.0.0.1:$API_PORT
BUCKET=kiln-deb
s3_local_start
t_mark
jq --arg l "127.0.0.1:$API_PORT" --arg ep "$S3_ENDPOINT" --arg ak "$S3_ACCESS_KEY" --arg sk "$S3_SECRET_KEY" --arg b "$BUCKET" \
	'.listen = $l | .s3 = {endpoint: $ep, region: "us-east-1", bucket: $b, access_key: $ak, secret_key: $sk}' \
	"$R/usr/share/kiln/examples/api.json" > "$R/etc/kiln/api.json"
jq --arg l "127.0.0.1:$HOST_PORT" --arg api "$API" --arg ep "$S3_ENDPOINT" --arg ak "$S3_ACCESS_KEY" \
	--arg sk "$S3_SECRET_KEY" --arg b "$BUCKET" \
	'.listen = $l | .api = $api | .capacity = {vcpus: 2, cpu_overcommit: 2} | .pool = {size: 0, prestart: 0}
	 | .s3 = {endpoint: $ep, region: "us-east-1", bucket: $b, access_key: $ak, secret_key: $sk}' \
	"$R/usr/share/kiln/examples/host.json" > "$R/etc/kiln/host.json"

# A cgroup per unit (systemd gives each service one; kiln-host nests its
# VMs' under its own, Delegate=yes) in the memory, cpu and pids hierarchies,
# below this shell's own: what is left in them at the end is what the
# daemons left.
CG=$T_TMP/cg
mkdir -p "$CG"
for c in memory cpu pids; do
	own=$(awk -F: -v c="$c" '{ n = split($2, a, ","); for (i = 1; i <= n; i++) if (a[i] == c) print $3 }' /proc/self/cgroup)
	[ "$own" = / ] && own=
	for u in api host; do
		d=/sys/fs/cgroup/$c$own/kiln-it-117-$$-$u
		mkdir -p "$d" "$CG/$u" && ln -s "$d" "$CG/$u/$c" || t_bail "a cgroup for kiln-$u ($d)"
	done
done
cg_procs() { local l n=0; for l in "$CG"/*/*; do n=$((n + $(find "$(readlink "$l")" -name cgroup.procs -exec cat {} + 2> /dev/null | wc -l))); done; echo "$n"; }
cg_empty() { [ "$(cg_procs)" = 0 ]; }
# cg_vms: the VMs' cgroups kiln-host made (under its own cgroup's kiln/).
cg_vms() { local l; for l in "$CG"/host/*; do find "$(readlink "$l")" -mindepth 2 -type d; done | wc -l; }

# unit_start NAME: ExecStart of kiln-NAME.service (its words, as systemd
# splits them: these have no quotes), as its User=/Group= (when it names
# them), with its LimitNOFILE and UMask, in its cgroup; t_bg, output in $T_TMP/NAME.out and .err.
unit_start() {
	local unit=$U/kiln-$1.service user exec nofile IN_ROOT
	exec=$(sed -n 's/^ExecStart=//p' "$unit")
	user=$(sed -n 's/^User=//p' "$unit")
	[ -z "$user" ] || user=$(in_root id -u "$user"):$(in_root getent group "$(sed -n 's/^Group=//p' "$unit")" | cut -d: -f3)
	# shellcheck disable=SC2086
	nofile=$(sed -n 's/^LimitNOFILE=//p' "$unit")
	# Capped at this shell's hard limit: raising it needs CAP_SYS_RESOURCE,
	# which a test machine's container may not grant (systemd would have it).
	[ -z "$nofile" ] || [ "$(ulimit -Hn)" = unlimited ] || [ "$nofile" -le "$(ulimit -Hn)" ] || {
		echo "# kiln-$1: LimitNOFILE=$nofile capped at the hard limit here, $(ulimit -Hn)"; nofile=$(ulimit -Hn); }
	IN_ROOT_AS=$user IN_ROOT_NOFILE=$nofile IN_ROOT_UMASK=$(sed -n 's/^UMask=//p' "$unit") \
		IN_ROOT_CG=$CG/$1 in_root_args
	t_bg "${IN_ROOT[@]}" $exec > "$T_TMP/$1.out" 2> "$T_TMP/$1.err"
}
unit_start api
api_pid=$T_BG_PID
t_serving "$API/healthz" "$api_pid" 20 || t_bail "the installed kiln-api starts" "$(tail -3 "$T_TMP/api.err")"
kiln_uid=$(in_root id -u kiln)
api_uid=$(awk '/^Uid:/ {print $2}' "/proc/$api_pid/status")
api_v=$(curl -s "$API/healthz" | jq -r .version)
check "kiln-api runs as kiln (uid $api_uid) from the root's /usr/bin, its /healthz version $V ($api_v)" \
	bash -c '[ "$1" = "$2" ] && [ "/proc/$3/exe" -ef "$4" ] && grep -qxE "$5(\+g[0-9a-f]+)?" <<< "$6"' _ \
	"$api_uid" "$kiln_uid" "$api_pid" "$R/usr/bin/kiln-api" "${V//./\\.}" "$api_v"
check "its store is /var/lib/kiln/api/api.db, the kiln user's" [ "$(stat_of /var/lib/kiln/api/api.db)" = "kiln:kiln 640|" ]
unit_start host
host_pid=$T_BG_PID
# The first start builds the VM snapshot in the root's /var/cache/kiln (TCG without /dev/kvm: minutes).
host_alive() { kill -0 "$host_pid" 2> /dev/null; }
live_or_gone() { [ "$(live_hosts)" = 1 ] || ! host_alive; }
if t_until 600 live_or_gone && host_alive; then ok "the installed kiln-host (as root, its image dir /usr/lib/kiln/image) registers live"
else t_bail "the installed kiln-host registers live" "$(tail -5 "$T_TMP/host.err")"; fi

# ---- a task end to end ----
KEY=$(new_customer acme)
T=$(api_task 'open("/output/deb.txt", "w").write("from the package\n")
print(6 * 7)')
api_final "$T" 300
jq -e '.state == "succeeded"' "$T_TMP/$T.json" > /dev/null 2>&1 || {
	echo "# task: $(head -c 1500 "$T_TMP/$T.json")"
	tail -n 15 "$T_TMP/host.err" | sed 's/^/# kiln-host: /'
}
check "a python task through kiln-api succeeds, its stdout 42 ($(jq -r .state "$T_TMP/$T.json" 2> /dev/null))" \
	[ "$(jq -r '.state + " " + (.result.stdout // .stdout // "" | rtrimstr("\n"))' "$T_TMP/$T.json")" = "succeeded 42" ]
key=$(jq -r '.outputs[] | select(.path == "deb.txt") | .s3_key' "$T_TMP/$T.json" 2> /dev/null)
S3_BUCKET=$BUCKET S3_REGION=us-east-1 S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY \
	S3_SECRET_KEY=$S3_SECRET_KEY "$ROOT/build/tests/s3tool" head "$key" > /dev/null 2>&1
hrc=$?
check "its output is in S3 as acme/$T/outputs/deb.txt (s3tool head: $hrc)" [ "$key:$hrc" = "acme/$T/outputs/deb.txt:0" ]
check "and its URL serves it" \
	[ "$(curl -s -m 10 "$(jq -r '.outputs[] | select(.path == "deb.txt") | .url' "$T_TMP/$T.json")")" = "from the package" ]

# ---- stop: SIGTERM, as systemctl stop does (kiln-host's KillMode=mixed: to it alone first) ----
t_stop "$host_pid"
t_stop "$api_pid"
check "both daemons stopped, no process left in their cgroups (QEMU, jails)" t_until 30 cg_empty
check "kiln-host removed its VMs' cgroups ($(cg_vms) left)" [ "$(cg_vms)" = 0 ]

# ---- purge ----
for m in "${img_mounts[@]}"; do umount "$m" && rm -f "$m"; done
img_mounts=()
in_root env DEBIAN_FRONTEND=noninteractive apt-get purge -y -q kiln > "$T_TMP/purge.out" 2>&1
prc=$?
[ "$prc" -eq 0 ] || sed 's/^/# purge: /' "$T_TMP/purge.out" | tail -20
check "apt-get purge kiln succeeds (status $prc); dpkg no longer knows it" \
	[ "$prc:$(in_root dpkg-query -W -f '${db:Status-Abbrev}' kiln 2> /dev/null)" = 0: ]
left=
for f in /usr/bin/kiln /usr/bin/kiln-api /usr/bin/kiln-host /usr/bin/kiln-jail /usr/lib/kiln /usr/share/kiln \
	/usr/share/doc/kiln /lib/systemd/system/kiln-api.service /lib/systemd/system/kiln-host.service /etc/kiln /var/cache/kiln; do
	[ ! -e "$R$f" ] || left+=" $f"
done
check "the binaries, images dir, units, /etc/kiln and /var/cache/kiln are gone (left:${left:-none})" [ -z "$left" ]
check "/var/lib/kiln is kept, kiln-api's database in it" [ -s "$R/var/lib/kiln/api/api.db" ]
check "the kiln user is kept (it owns /var/lib/kiln/api)" [ "$(in_root id -u kiln)" = "$kiln_uid" ]

# ---- nothing left ----
cg_remove
cgl=0
for l in "$CG"/*/*; do [ ! -d "$(readlink "$l")" ] || cgl=$((cgl + 1)); done
check "the daemons' cgroups removed ($cgl left)" [ "$cgl" = 0 ]
root_umount
check "no mount left under $T_TMP" [ "$(grep -c -- "$T_TMP" /proc/self/mountinfo)" = 0 ]
check "the cached root is as it was (no kiln in it)" bash -c '[ ! -e "$1/usr/bin/kiln" ] && [ ! -e "$1/etc/kiln" ]' _ "$cached"
t_nothing_left "no VM, run-directory entry, cgroup or slot lock of this test is left"
t_done
