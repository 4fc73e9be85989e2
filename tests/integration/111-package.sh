#!/usr/bin/env bash
# The package and the install (docs/operations.md): `make deb` and what
# dpkg-deb says is in it, `make install DESTDIR=` and the installed binaries'
# version and data paths (resolved from their prefix, not the build tree),
# the installed kiln-api's /healthz, /metrics and console, and the systemd
# units through systemd-analyze verify. No root, no VM.
. "$(dirname "$0")/lib.sh"
t_plan 24
t_require_tools make dpkg-deb dpkg-shlibdeps jq curl systemd-analyze
t_require_built kiln kiln-api kiln-host kiln-jail
[ -r "$ROOT/build/image/initramfs.cpio" ] || t_skip_all "build/image/initramfs.cpio missing: run make all"

V=$(cat "$ROOT/VERSION")
DEB=$ROOT/build/kiln_${V}_amd64.deb

# ---- make deb and dpkg-deb's view of it ----
make -s -C "$ROOT" deb > "$T_TMP/deb.out" 2>&1 || t_bail "make deb" "$(tail -5 "$T_TMP/deb.out")"
check "make deb makes build/kiln_<VERSION>_amd64.deb" [ -s "$DEB" ]
field() { dpkg-deb --field "$DEB" "$1"; }
check "Package: kiln" [ "$(field Package)" = kiln ]
check "Version: the VERSION file's ($V)" [ "$(field Version)" = "$V" ]
check "Architecture: amd64" [ "$(field Architecture)" = amd64 ]
deps=$(field Depends)
missing=
for p in libc6 libjansson4 libcurl4 libssl3 libmicrohttpd12 libsqlite3-0 libpq5 libnftables1 libseccomp2 \
	libzstd1 libarchive13 qemu-system-x86 qemu-utils nftables iproute2 e2fsprogs adduser; do
	grep -qE "(^|, )$p( |,|$)" <<< "$deps" || missing+=" $p"
done
check "Depends names the libraries the binaries link and the tools they run (missing:${missing:-none})" [ -z "$missing" ]

dpkg-deb --contents "$DEB" | awk '{print $6}' | sed 's|^\./|/|' > "$T_TMP/contents"
has() { grep -qxF "$1" "$T_TMP/contents"; }
missing=
for f in /usr/bin/kiln /usr/bin/kiln-api /usr/bin/kiln-host /usr/bin/kiln-jail \
	/lib/systemd/system/kiln-api.service /lib/systemd/system/kiln-host.service \
	/etc/kiln/api.json /etc/kiln/host.json /usr/lib/kiln/image/initramfs.cpio \
	/usr/share/kiln/ui/index.html /usr/share/kiln/ui/app.js /usr/share/kiln/s3-local.sh \
	/usr/share/kiln/monitoring/kiln-alerts.yml /usr/share/kiln/monitoring/kiln-dashboard.json \
	/usr/share/doc/kiln/operations.md; do
	has "$f" || missing+=" $f"
done
check "the package holds the binaries, units, configs, initramfs, console and docs (missing:${missing:-none})" [ -z "$missing" ]
# The kernel, when built, is in it; the root images (gigabytes) never are:
# they are kiln-images' (make deb-images).
kin=none; [ -e "$ROOT/build/image/vmlinux" ] && { has /usr/lib/kiln/image/vmlinux && kin=yes || kin=missing; }
check "the guest kernel is in the package when built ($kin), no root image is ($(grep -c 'rootfs.*\.ext4$' "$T_TMP/contents"))" \
	[ "$kin" != missing -a "$(grep -c 'rootfs.*\.ext4$' "$T_TMP/contents")" = 0 ]
check "the package recommends kiln-images" grep -q 'kiln-images' <<< "$(field Recommends)"
check "conffiles: exactly /etc/kiln/api.json and /etc/kiln/host.json" \
	[ "$(dpkg-deb --info "$DEB" conffiles | sort | tr '\n' ' ')" = "/etc/kiln/api.json /etc/kiln/host.json " ]
mkdir -p "$T_TMP/ctrl"
dpkg-deb --control "$DEB" "$T_TMP/ctrl"
check "postinst, prerm and postrm are executable and parse (sh -n)" \
	bash -c 'for s in postinst prerm postrm; do [ -x "$1/$s" ] && sh -n "$1/$s" || exit 1; done' _ "$T_TMP/ctrl"

# The maintainer scripts for real, over throwaway overlays of /etc and /var
# in a mount namespace of their own: what they write lands in $T_TMP, the
# machine's users and directories stay as they are.
maint() {
	local o=$T_TMP/overlay
	mkdir -p "$o/eu" "$o/ew" "$o/vu" "$o/vw"
	unshare -m --propagation private bash -c '
		c=$1 o=$2 r=$3
		mount -t overlay overlay -o "lowerdir=/etc,upperdir=$o/eu,workdir=$o/ew" /etc &&
			mount -t overlay overlay -o "lowerdir=/var,upperdir=$o/vu,workdir=$o/vw" /var || exit 90
		export DPKG_MAINTSCRIPT_PACKAGE=kiln
		rm -rf /etc/kiln /var/lib/kiln /var/cache/kiln
		# A first install: a kiln user this machine has goes (from the overlay only).
		! getent passwd kiln > /dev/null || deluser --system kiln > /dev/null 2>&1 || exit 91
		DPKG_MAINTSCRIPT_NAME=postinst sh "$c/postinst" configure || exit 92
		{ getent passwd kiln | cut -d: -f1,6,7
		  stat -c "%U:%G %a %n" /etc/kiln/cluster-token /etc/kiln/admin-key /var/lib/kiln/api /var/lib/kiln/spool
		  grep -cxE "[0-9a-f]{64}" /etc/kiln/cluster-token; } > "$r/first"
		echo "operator-key-0123456789" > /etc/kiln/admin-key
		DPKG_MAINTSCRIPT_NAME=postinst sh "$c/postinst" configure 0.41.0 || exit 93
		cat /etc/kiln/admin-key > "$r/upgrade"
		touch /var/lib/kiln/spool/result /var/cache/kiln/snapshot
		DPKG_MAINTSCRIPT_NAME=postrm sh "$c/postrm" purge || exit 94
		for d in /etc/kiln /var/cache/kiln /var/lib/kiln/spool/result; do [ -e "$d" ] && echo "$d"; done > "$r/purged"
	' _ "$T_TMP/ctrl" "$o" "$T_TMP" > "$T_TMP/maint.out" 2>&1
}
if [ "$(id -u)" -ne 0 ] || ! command -v unshare > /dev/null || ! grep -qw overlay /proc/filesystems; then
	why="needs root, unshare and overlayfs (to run them over throwaway copies of /etc and /var)"
	skip "postinst makes the kiln user, its directories and keys" "$why"
	skip "postinst on upgrade keeps an edited key" "$why"
	skip "postrm purge removes /etc/kiln and /var/cache/kiln, keeps /var/lib/kiln" "$why"
else
	maint
	mrc=$?
	[ "$mrc" -eq 0 ] || sed 's/^/# maint: /' "$T_TMP/maint.out"
	check "postinst makes the kiln user (no home, no login), api/ and spool/ dirs, keys root:kiln 0640 (status $mrc)" \
		[ "$(tr '\n' '|' < "$T_TMP/first" 2> /dev/null)" = "kiln:/nonexistent:/usr/sbin/nologin|root:kiln 640 /etc/kiln/cluster-token|root:kiln 640 /etc/kiln/admin-key|kiln:kiln 750 /var/lib/kiln/api|root:root 700 /var/lib/kiln/spool|1|" ]
	check "postinst on upgrade keeps an edited key" [ "$(cat "$T_TMP/upgrade" 2> /dev/null)" = operator-key-0123456789 ]
	check "postrm purge removes /etc/kiln and /var/cache/kiln, keeps /var/lib/kiln" \
		[ "$(cat "$T_TMP/purged" 2> /dev/null || echo none)" = /var/lib/kiln/spool/result ]
fi

# ---- make install DESTDIR=: the binaries find their files under their prefix ----
D=$T_TMP/destdir
make -s -C "$ROOT" install DESTDIR="$D" PREFIX=/usr > "$T_TMP/install.out" 2>&1 ||
	t_bail "make install DESTDIR" "$(tail -5 "$T_TMP/install.out")"
vh=$("$D/usr/bin/kiln-host" --version)
va=$("$D/usr/bin/kiln-api" --version)
vc=$("$D/usr/bin/kiln" --version)
check "installed kiln-host --version is VERSION, perhaps with +g<commit> ($vh)" \
	grep -qxE "kiln-host ${V//./\\.}(\+g[0-9a-f]+)?" <<< "$vh"
check "kiln-api and kiln print the same version ($va, $vc)" \
	[ "${va#kiln-api }|${vc#kiln }" = "${vh#kiln-host }|${vh#kiln-host }" ]
"$D/usr/bin/kiln-host" paths > "$T_TMP/paths.json"
check "installed kiln-host resolves its image dir under its prefix ($(jq -r .image_dir "$T_TMP/paths.json"))" \
	[ "$(jq -r .image_dir "$T_TMP/paths.json")" = "$(realpath "$D/usr/lib/kiln/image")" ]
check "the build tree's kiln-host still uses build/image" \
	[ "$("$ROOT/build/kiln-host" paths | jq -r .image_dir)" = "$ROOT/build/image" ]
echo '{"listen": "127.0.0.1:9"}' > "$D/etc/kiln/api.json"
make -s -C "$ROOT" install DESTDIR="$D" PREFIX=/usr > "$T_TMP/install2.out" 2>&1
check "make install again keeps an edited /etc/kiln/api.json" [ "$(jq -r .listen "$D/etc/kiln/api.json")" = 127.0.0.1:9 ]

# ---- the installed kiln-api: version in /healthz and /metrics, console from share/kiln/ui ----
PORT=$((20000 + RANDOM % 12000))
API=http://127.0.0.1:$PORT
t_bg "$D/usr/bin/kiln-api" --listen "127.0.0.1:$PORT" --db "$T_TMP/api.db" > "$T_TMP/api.out" 2> "$T_TMP/api.err"
t_serving "$API/healthz" "$T_BG_PID" 10 || t_bail "installed kiln-api starts" "$(tail -3 "$T_TMP/api.err")"
check "/healthz carries the version" [ "$(curl -s "$API/healthz" | jq -r .version)" = "${va#kiln-api }" ]
check "/metrics has kiln_build_info{version=...} 1" \
	grep -qxF "kiln_build_info{version=\"${va#kiln-api }\"} 1" <(curl -s "$API/metrics")
check "the installed kiln-api serves the console from PREFIX/share/kiln/ui" \
	[ "$(curl -s -o /dev/null -w '%{http_code}' "$API/ui/")" = 200 ]

# ---- the units, as installed with a real PREFIX (systemd-analyze checks ExecStart exists) ----
P=$T_TMP/prefix
make -s -C "$ROOT" install PREFIX="$P/usr" SYSCONFDIR="$P/etc" > "$T_TMP/install3.out" 2>&1 ||
	t_bail "make install PREFIX" "$(tail -5 "$T_TMP/install3.out")"
U=$P/usr/lib/systemd/system
systemd-analyze verify "$U/kiln-api.service" "$U/kiln-host.service" > "$T_TMP/verify.out" 2>&1
vrc=$?
sed 's/^/# verify: /' "$T_TMP/verify.out"
check "systemd-analyze verify passes both units, without a warning" [ "$vrc:$(wc -c < "$T_TMP/verify.out")" = 0:0 ]
sed "s|^ExecStart=.*|ExecStart=$P/no-such-binary|" "$U/kiln-api.service" > "$T_TMP/broken.service"
check "and it would fail a unit whose ExecStart is missing" bash -c '! systemd-analyze verify "$1" > /dev/null 2>&1' _ "$T_TMP/broken.service"
check "kiln-api's unit runs it as kiln, ProtectSystem=strict, from PREFIX/bin with /etc/kiln/api.json" \
	bash -c 'grep -qx "User=kiln" "$1" && grep -qx "ProtectSystem=strict" "$1" &&
		grep -qx "ExecStart=$2/usr/bin/kiln-api --config /etc/kiln/api.json" "$1"' _ "$U/kiln-api.service" "$P"
t_done
