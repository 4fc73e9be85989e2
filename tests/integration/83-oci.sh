#!/usr/bin/env bash
# OCI image imports (host/template_build/oci.c, `kiln-host template import`): an image built
# here from a local directory with umoci (no registry is reachable), as an
# OCI layout tar and as a docker-archive (skopeo), imported and booted in a
# real VM; its Env/WorkingDir/User read right. Then hostile archives written
# by Python's tarfile: escaping paths, links out, device nodes, set-uid
# bits, a whiteout of /etc: refused or neutralised, and nothing outside the
# work directory changes. Not-images are invalid_image. Resources counted.
. "$(dirname "$0")/lib.sh"
t_plan 26
require_image
for tool in umoci skopeo busybox debugfs; do
	if ! command -v "$tool" > /dev/null; then
		echo "1..0 # SKIP $tool missing (scripts/deps.sh installs umoci and skopeo)"
		exit 0
	fi
done
PY=/usr/bin/python3
IMG=$ROOT/build/image

before_qemu=$(count_qemu)
before_cg=$(count_cgroups)
before_mounts=$(count_mounts)
before_run=$(count_run_entries)
etc_sum() { find /etc -xdev -maxdepth 2 -printf '%p %s %T@\n' 2>/dev/null | sort | sha256sum; }
before_etc=$(etc_sum)

# import NAME ARCHIVE [args]: meta JSON in $T_TMP/NAME.json, log in NAME.err, status in NAME.rc
import() {
	local name=$1 archive=$2; shift 2
	"$KILN_HOST" template import "$archive" --out "$T_TMP/$name.ext4" --work-dir "$T_TMP/$name.work" "$@" \
		> "$T_TMP/$name.json" 2> "$T_TMP/$name.err"
	echo $? > "$T_TMP/$name.rc"
}

# ---- an image from a local directory ------------------------------------------
L=$T_TMP/layout
B=$T_TMP/bundle
(
	set -e
	umoci init --layout "$L"
	umoci new --image "$L:t"
	umoci unpack --image "$L:t" "$B"
	R=$B/rootfs
	mkdir -p "$R/bin" "$R/etc" "$R/home/app" "$R/data"
	cp /bin/busybox "$R/bin/busybox"
	for a in sh cat id pwd env ls stat echo; do ln -s busybox "$R/bin/$a"; done
	printf 'root:x:0:0:root:/root:/bin/sh\napp:x:1234:2345::/home/app:/bin/sh\n' > "$R/etc/passwd"
	printf 'root:x:0:\napps:x:2345:\nstaff:x:50:\n' > "$R/etc/group"
	echo hello-from-oci > "$R/hello.txt"
	echo app-data > "$R/home/app/notes"
	chown -R 1234:2345 "$R/home/app"
	umoci repack --image "$L:t" "$B"
	umoci config --image "$L:t" --config.env FOO=bar --config.env "GREETING=hi there" \
		--config.workingdir /home/app --config.user app
	tar -C "$L" -cf "$T_TMP/oci.tar" .
	skopeo --insecure-policy copy --quiet "oci:$L:t" "docker-archive:$T_TMP/docker.tar:kiln/test:1"
) > "$T_TMP/build.log" 2>&1
if [ $? -ne 0 ] || [ ! -s "$T_TMP/oci.tar" ] || [ ! -s "$T_TMP/docker.tar" ]; then
	not_ok "build the test image with umoci and skopeo" "$(tail -5 "$T_TMP/build.log")"
	t_done; exit
fi

import oci "$T_TMP/oci.tar" --max-mib 1024
if [ "$(rc oci)" = 0 ] && [ "$(r oci '.env | join(",")')" = "FOO=bar,GREETING=hi there" ] \
   && [ "$(r oci .workdir)" = /home/app ] && [ "$(r oci .uid)" = 1234 ] && [ "$(r oci .gid)" = 2345 ]; then
	ok "an OCI layout tar imports; Env, WorkingDir and User (app -> 1234:2345 from the image's passwd) read"
else not_ok "OCI layout import" "$(cat "$T_TMP/oci.json")" "$(tail -5 "$T_TMP/oci.err")"; fi
check "the image is mode 0444 and the work directory is gone" \
	test "$(stat -c %a "$T_TMP/oci.ext4" 2>/dev/null)" = 444 -a ! -e "$T_TMP/oci.work"

import docker "$T_TMP/docker.tar" --max-mib 1024
if [ "$(rc docker)" = 0 ] && [ "$(r docker .workdir)" = /home/app ] && [ "$(r docker .uid):$(r docker .gid)" = 1234:2345 ] \
   && grep -q 'docker-archive' "$T_TMP/docker.err"; then
	ok "the same image as a docker-archive imports with the same meta"
else not_ok "docker-archive import" "$(cat "$T_TMP/docker.json")" "$(tail -5 "$T_TMP/docker.err")"; fi

# Owners from the image survive the rootless unpack; kiln-init's directories are there.
de() { debugfs -R "$1" "$T_TMP/oci.ext4" 2>/dev/null; }
if de "stat /home/app/notes" | grep -q 'User:  1234   Group:  2345' && de "stat /hello.txt" | grep -q 'User:     0   Group:     0' \
   && de "stat /work" | grep -q 'User:  1234   Group:  2345' && de "cat /etc/hostname" | grep -qx kiln \
   && for d in dev proc sys tmp run kiln output dev/pts dev/shm; do de "stat /$d" | grep -q 'Type: directory' || exit 1; done; then
	ok "owners kept (1234:2345 under /home/app, root elsewhere); /work owned by the task user; kiln-init's mount points and /etc/hostname added"
else not_ok "owners and directories in the image" "$(de 'stat /home/app/notes' | head -3)" "$(de 'stat /work' | head -3)"; fi

# ---- a task in a VM booted from the imported image ------------------------------
D=$T_TMP/imgdir
mkdir -p "$D"
ln -s "$(readlink -f "$IMG/vmlinux")" "$D/vmlinux"
ln -s "$(readlink -f "$IMG/initramfs.cpio")" "$D/initramfs.cpio"
ln -s "$T_TMP/oci.ext4" "$D/rootfs.ext4"
# Env and WorkingDir applied by hand here (kiln-api merges them into specs for
# templates); `kiln-host run` has no user option, so the task runs as 1000
# and the test shows the image's /work and /output are the image user's.
spec=$(jq -cn --argjson meta "$(cat "$T_TMP/oci.json")" '{
	argv: ["/bin/sh", "-c", "cat /hello.txt; echo \"$FOO|$GREETING\"; pwd; cat notes; ls /dev/null; stat -c %u:%g /work /output; id -u"],
	env: ($meta.env | map(split("=") | {key: .[0], value: (.[1:] | join("="))}) | from_entries),
	cwd: $meta.workdir, limits: {timeout_s: 60}}')
run_spec boot "$spec" --cold --image-dir "$D" --output-dir "$T_TMP/out"
if [ "$(r boot .state)" = succeeded ] \
   && [ "$(r boot .stdout)" = "$(printf 'hello-from-oci\nbar|hi there\n/home/app\napp-data\n/dev/null\n1234:2345\n1234:2345\n1000')" ]; then
	ok "a task boots from the imported image (kiln-init injected): the file is there, Env and WorkingDir apply"
else not_ok "task from the imported image" "$(show boot)"; fi

# ---- hostile archives ----------------------------------------------------------
CANARY=$T_TMP/canary.txt
echo canary > "$CANARY"
mkdir -p "$T_TMP/outside"
tmp_list() { find "$T_TMP" -maxdepth 1 -mindepth 1 -printf '%f %s %m %U\n' | grep -v -e '^evil[pch]\.' -e '^evil-hard' | sort; }
cat > "$T_TMP/evil.py" << 'EOF'
# evil.py OUT KIND [OUTSIDE CANARY]: a docker-archive whose layers try their worst.
import hashlib, io, json, os, sys, tarfile

out, kind = sys.argv[1], sys.argv[2]

def layer(entries):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, typ, extra in entries:
            ti = tarfile.TarInfo(name)
            ti.type = typ
            ti.mode = extra.get("mode", 0o644 if typ == tarfile.REGTYPE else 0o755)
            ti.linkname = extra.get("link", "")
            ti.devmajor, ti.devminor = extra.get("dev", (0, 0))
            ti.pax_headers = extra.get("pax", {})
            data = extra.get("data", b"")
            ti.size = len(data) if typ == tarfile.REGTYPE else 0
            t.addfile(ti, io.BytesIO(data) if typ == tarfile.REGTYPE else None)
    return buf.getvalue()

F, D, S, H = tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
base = [("bin", D, {}), ("etc", D, {}), ("etc/passwd", F, {"data": b"root:x:0:0::/:/bin/sh\n"}),
        ("etc/shadow", F, {"data": b"root:*:1::::::\n", "mode": 0o600})]
if kind == "paths":
    layers = [base + [
        ("../escape-dotdot.txt", F, {"data": b"escaped\n"}),
        ("/abs-escape.txt", F, {"data": b"absolute\n"}),
        ("./../../../../../../../../" + sys.argv[3].lstrip("/") + "/deep-escape.txt", F, {"data": b"deep\n"}),
        ("link-out", S, {"link": sys.argv[3]}),
        ("link-out/through-link.txt", F, {"data": b"through a symlink\n"}),
        ("rel-out", S, {"link": "../../../../../../../../../../" + sys.argv[3].lstrip("/")}),
        ("rel-out/through-rel.txt", F, {"data": b"through a relative symlink\n"}),
        ("hard-etc", H, {"link": "/etc/passwd"}),
    ], [("../../../../../../../../" + os.path.dirname(sys.argv[4]).lstrip("/") + "/.wh." + os.path.basename(sys.argv[4]), F, {}),
         ("/.wh.." + "/etc", F, {})]]
elif kind == "hardlink":
    layers = [base + [("hard-canary", H, {"link": sys.argv[4]})]]
else:
    layers = [base + [
        ("dev", D, {}),
        ("dev/evil-sda", tarfile.CHRTYPE, {"dev": (8, 0), "mode": 0o666}),
        ("dev/evil-mem", tarfile.BLKTYPE, {"dev": (1, 1), "mode": 0o666}),
        ("fifo", tarfile.FIFOTYPE, {}),
        ("bin/su-evil", F, {"data": b"#!/bin/sh\nid\n", "mode": 0o4755}),
        ("bin/sg-evil", F, {"data": b"#!/bin/sh\nid\n", "mode": 0o2755}),
        ("abs-link", S, {"link": "/etc/shadow"}),
        ("bin/capped", F, {"data": b"x", "mode": 0o755, "pax": {
            "SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20" + "\x00" * 14}}),
        ("bin/xattrs", F, {"data": b"x", "pax": {"SCHILY.xattr.user.evil": "1", "SCHILY.xattr.trusted.evil": "1"}}),
    ], [(".wh.etc", F, {}), ("kept.txt", F, {"data": b"kept\n"})]]

files, diff_ids, names = {}, [], []
for i, l in enumerate(layers):
    data = layer(l)
    name = "layer%d.tar" % i
    files[name] = data
    names.append(name)
    diff_ids.append("sha256:" + hashlib.sha256(data).hexdigest())
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Env": ["A=1"]},
                     "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
cname = hashlib.sha256(config).hexdigest() + ".json"
files[cname] = config
files["manifest.json"] = json.dumps([{"Config": cname, "RepoTags": ["evil:1"], "Layers": names}]).encode()
with tarfile.open(out, "w") as t:
    for n, d in files.items():
        ti = tarfile.TarInfo(n)
        ti.size = len(d)
        t.addfile(ti, io.BytesIO(d))
EOF
$PY "$T_TMP/evil.py" "$T_TMP/evil-paths.tar" paths "$T_TMP/outside" "$CANARY"
$PY "$T_TMP/evil.py" "$T_TMP/evil-content.tar" content
before_tmp=$(tmp_list)

import evilp "$T_TMP/evil-paths.tar" --max-mib 1024
outside_files=$(find "$T_TMP/outside" -mindepth 1 | wc -l)
if [ "$outside_files" = 0 ] && [ "$(cat "$CANARY")" = canary ] && [ ! -e "$T_TMP/escape-dotdot.txt" ] \
   && [ ! -e /abs-escape.txt ] && [ ! -e "$T_TMP/evilp.work" ] \
   && { [ "$(r evilp .error.code)" = invalid_image ] || [ "$(rc evilp)" = 0 ]; }; then
	ok "../, absolute, through-symlink, hard-link and whiteout escapes change nothing outside (result: $(r evilp '.error.code // "imported"'))"
else not_ok "escaping entries" "outside: $outside_files" "$(cat "$T_TMP/evilp.json")" "$(tail -5 "$T_TMP/evilp.err")"; fi
if [ "$(rc evilp)" = 0 ]; then
	de() { debugfs -R "$1" "$T_TMP/evilp.ext4" 2>/dev/null; }
	inside=${T_TMP#/}/outside
	if de "stat /link-out" | grep -q 'Type: symlink' && de "stat /rel-out" | grep -q 'Type: symlink' \
	   && de "cat /$inside/through-link.txt" | grep -q 'through a symlink' && de "cat /$inside/through-rel.txt" | grep -q relative \
	   && de "cat /$inside/deep-escape.txt" | grep -q deep && de "cat /abs-escape.txt" | grep -q absolute \
	   && de "cat /escape-dotdot.txt" | grep -q escaped && de "cat /hard-etc" | grep -q root:x; then
		ok "each escaping entry landed inside the image instead (symlinks kept as symlinks, never followed out)"
	else not_ok "escaping entries inside" "$(de 'ls -l /')"; fi
fi
$PY "$T_TMP/evil.py" "$T_TMP/evil-hard.tar" hardlink "$T_TMP/outside" "$CANARY"
import evilh "$T_TMP/evil-hard.tar"
check "a hard link to a host file (outside the layers): invalid_image, canary intact" \
	test "$(r evilh .error.code)" = invalid_image -a "$(cat "$CANARY")" = canary -a "$(stat -c %h "$CANARY")" = 1

import evilc "$T_TMP/evil-content.tar" --max-mib 1024
de() { debugfs -R "$1" "$T_TMP/evilc.ext4" 2>/dev/null; }
if [ "$(rc evilc)" = 0 ]; then
	root_ls=$(de "ls /")
	# umoci --rootless cannot mknod: it writes a device node as an empty
	# regular file; a FIFO it does make, and the walk removes it.
	if ! de "stat /dev/evil-sda" | grep -q -e 'Type: character' -e 'Type: block' \
	   && ! de "stat /dev/evil-mem" | grep -q -e 'Type: character' -e 'Type: block' && ! echo "$root_ls" | grep -qw fifo \
	   && de "stat /bin/su-evil" | grep -q 'Mode:  0755' && de "stat /bin/sg-evil" | grep -q 'Mode:  0755' \
	   && de "stat /abs-link" | grep -q 'Fast link dest: "/etc/shadow"' \
	   && [ -z "$(de "ea_list /bin/capped")$(de "ea_list /bin/xattrs")" ] && de "cat /bin/xattrs" | grep -qx x \
	   && ! de "ls /etc" | grep -q passwd && de "cat /etc/hostname" | grep -qx kiln && de "cat /kept.txt" | grep -qx kept; then
		ok "no device node or FIFO in the image, set-uid/set-gid cleared, no xattr (file capabilities, user.*, trusted.*), absolute symlink kept as a link, whiteout of /etc honoured (/etc remade)"
	else not_ok "neutralised content" "$root_ls" "$(de 'stat /bin/su-evil' | head -2)" "$(tail -5 "$T_TMP/evilc.err")"; fi
else not_ok "hostile content imports neutralised" "$(cat "$T_TMP/evilc.json")" "$(tail -5 "$T_TMP/evilc.err")"; fi
check "nothing next to the work directories changed (canary, outside/, the test's directory)" \
	test "$(tmp_list)" = "$before_tmp" -a "$(cat "$CANARY")" = canary -a -z "$(ls -A "$T_TMP/outside")"
check "the host's /etc did not change" test "$(etc_sum)" = "$before_etc"

# ---- not images ------------------------------------------------------------------
head -c 100000 /dev/urandom > "$T_TMP/random.bin"
import random "$T_TMP/random.bin"
check "random bytes: invalid_image, not a tar archive" \
	test "$(r random .error.code)" = invalid_image -a "$(r random .error.message | grep -c 'not a tar')" = 1
$PY -c 'import tarfile,sys; tarfile.open(sys.argv[1], "w").close()' "$T_TMP/empty.tar"
import empty "$T_TMP/empty.tar"
check "an empty tar: invalid_image, empty" \
	test "$(r empty .error.code)" = invalid_image -a "$(r empty .error.message | grep -c 'empty')" = 1
tar -C "$T_TMP" -cf "$T_TMP/files.tar" canary.txt
import files "$T_TMP/files.tar"
check "a tar of plain files: invalid_image naming what is missing" \
	test "$(r files .error.code)" = invalid_image -a "$(r files .error.message | grep -c manifest.json)" = 1
gzip -c "$T_TMP/docker.tar" > "$T_TMP/docker.tar.gz"
import gz "$T_TMP/docker.tar.gz"
check "a compressed archive: invalid_image saying so" test "$(r gz .error.message | grep -c compressed)" = 1

# An unknown user, and the size cap.
(
	set -e
	umoci config --image "$L:t" --config.user nosuchuser
	tar -C "$L" -cf "$T_TMP/nouser.tar" .
) > /dev/null 2>&1
import nouser "$T_TMP/nouser.tar"
check "User naming no entry of the image's /etc/passwd: invalid_image" \
	test "$(r nouser .error.code)" = invalid_image -a "$(r nouser .error.message | grep -c nosuchuser)" = 1
import small "$T_TMP/oci.tar" --max-mib 8
check "an image past --max-mib: too_large, no file left" \
	test "$(r small .error.code)" = too_large -a ! -e "$T_TMP/small.ext4" -a ! -e "$T_TMP/small.work"

# ---- bombs, time, cancellation, a crash ---------------------------------------------
cat > "$T_TMP/big.py" << 'EOF'
# big.py OUT FILES MIB: a docker-archive, one uncompressed layer of FILES files of MIB MiB of zeros each.
import hashlib, io, json, os, sys, tarfile
out, nfiles, mib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
layer = out + ".layer"
with open("/dev/zero", "rb") as zero, tarfile.open(layer, "w") as t:
    for i in range(nfiles):
        ti = tarfile.TarInfo("big/f%d" % i)
        ti.size = mib << 20
        t.addfile(ti, zero)
h = hashlib.sha256()
with open(layer, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {},
                     "rootfs": {"type": "layers", "diff_ids": ["sha256:" + h.hexdigest()]}}).encode()
with tarfile.open(out, "w") as t:
    t.add(layer, "layer.tar")
    for name, d in [("config.json", config),
                    ("manifest.json", json.dumps([{"Config": "config.json", "RepoTags": ["big:1"], "Layers": ["layer.tar"]}]).encode())]:
        ti = tarfile.TarInfo(name); ti.size = len(d); t.addfile(ti, io.BytesIO(d))
os.unlink(layer)
EOF
$PY "$T_TMP/big.py" "$T_TMP/big.tar" 100 4
import bigcap "$T_TMP/big.tar" --max-mib 300
check "100 files of 4 MiB (400 MiB, each under the per-file limit) past --max-mib 300: too_large" \
	test "$(r bigcap .error.code)" = too_large -a ! -e "$T_TMP/bigcap.ext4" -a ! -e "$T_TMP/bigcap.work"
import bigtime "$T_TMP/big.tar" --timeout 1
check "an import past --timeout: build_timeout, nothing left" \
	test "$(r bigtime .error.code)" = build_timeout -a ! -e "$T_TMP/bigtime.ext4" -a ! -e "$T_TMP/bigtime.work"
# SIGTERM is kiln-host template import's cancel_fd.
t_bg "$KILN_HOST" template import "$T_TMP/big.tar" --out "$T_TMP/bigcan.ext4" > "$T_TMP/bigcan.json" 2> "$T_TMP/bigcan.err"
pid=$T_BG_PID
t_until 5 grep -q 'skopeo copy' "$T_TMP/bigcan.err"
t_stop "$pid"
check "SIGTERM during skopeo: cancelled, nothing left" \
	test "$(r bigcan .error.code)" = cancelled -a ! -e "$T_TMP/bigcan.ext4" -a ! -e "$T_TMP/bigcan.ext4.work"
# A crash (SIGKILL) mid-import: the jail dies with its parent; `kiln-host reap`
# removes its cgroups through the record in the run directory.
t_bg "$KILN_HOST" template import "$T_TMP/big.tar" --out "$T_TMP/bigkill.ext4" > /dev/null 2> "$T_TMP/bigkill.err"
pid=$T_BG_PID
t_until 5 grep -q 'skopeo copy' "$T_TMP/bigkill.err"
sleep 0.3
t_stop "$pid" KILL
left=$(ls -d "$KILN_RUN_DIR"/vm-oci-* 2> /dev/null | wc -l)
"$KILN_HOST" reap --run-dir "$KILN_RUN_DIR" > /dev/null 2>&1
if [ "$left" = 1 ] && [ "$(count_cgroups)" = "$before_cg" ] && [ -z "$(ls -d "$KILN_RUN_DIR"/vm-oci-* 2> /dev/null)" ] \
   && ! pgrep -f "skopeo.*$T_TMP/bigkill" > /dev/null; then
	ok "kiln-host killed mid-import: no tool left running; reap removes the jail's cgroups and run entry"
else not_ok "crash mid-import" "run entries left: $left" "cgroups: $(count_cgroups) (before $before_cg)"; fi
rm -rf "$T_TMP/bigkill.ext4.work" "$T_TMP/bigkill.ext4"

# ---- resources ------------------------------------------------------------------
check "no QEMU left" test "$(count_qemu)" = "$before_qemu"
check "no jail cgroups left" test "$(count_cgroups)" = "$before_cg"
check "no mounts left" test "$(count_mounts)" = "$before_mounts"
check "run directory as before" test "$(count_run_entries)" = "$before_run"
check "no work directory left" test -z "$(find "$T_TMP" -maxdepth 1 -name '*.work')"
t_done
