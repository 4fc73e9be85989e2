#!/usr/bin/env bash
# Snapshots: restore gives the same results as a cold boot, clones are
# independent (randomness, memory, disk), the clock is current, a changed
# input selects another snapshot, a damaged snapshot is detected and rebuilt.
. "$(dirname "$0")/lib.sh"
t_plan 13
require_image

export KILN_CACHE=$T_TMP/cache   # a private snapshot cache: these tests damage it
IMG=$T_TMP/img
mkdir -p "$IMG"
for f in vmlinux rootfs.ext4; do ln -s "$(readlink -f "$ROOT/build/image/$f")" "$IMG/$f"; done
cp "$ROOT/build/image/initramfs.cpio" "$IMG/initramfs.cpio"
H() { "$KILN_HOST" "$@" --image-dir "$IMG"; }
run_img() { local name=$1 json=$2; shift 2; run_spec "$name" "$json" --image-dir "$IMG" "$@"; }

key=$(H snapshot create 2> "$T_TMP/create.err")
if [ -n "$key" ] && [ -f "$KILN_CACHE/snapshots/$key/manifest.json" ] && H snapshot list | grep -q "^$key .* ok$"; then
	ok "snapshot create makes snapshot $key, listed as ok"
else not_ok "snapshot create" "$(cat "$T_TMP/create.err")"; fi
mem_sha=$(sha256sum "$KILN_CACHE/snapshots/$key/mem" | cut -d' ' -f1)

# Restore correctness: the same programs, cold and restored, give the same results.
progs=(
	'print("hello")'
	'import sys; print("out"); print("err", file=sys.stderr); sys.exit(3)'
	'raise ValueError("boom")'
	'import os; os.makedirs("/output/d", exist_ok=True); open("/output/d/x.txt", "w").write("x" * 1000); print(sorted(os.listdir("/output")))'
	'import sys, os; print(sys.argv, os.getcwd(), os.getuid(), os.environ.get("K"), __name__)'
	'import json, collections; print(json.dumps(collections.Counter("abracadabra").most_common(2)))'
	'import os; os.kill(os.getpid(), 9)'
	'import atexit, sys, threading, time; atexit.register(lambda: print("bye")); threading.Thread(target=lambda: (time.sleep(0.2), print("thread"))).start(); sys.exit("fatal")'
	'import sys; sys.stdout.write("no newline"); sys.exit(300)'
	'def f(:'
)
same=0; starts=""
for i in "${!progs[@]}"; do
	spec=$(py_spec "${progs[$i]}" '{"env":{"K":"v"}}')
	run_img "cold$i" "$spec" --cold
	run_img "rest$i" "$spec"
	f='{state, exit_code, signal, end_reason, stdout, stderr, outputs}'
	if [ "$(jq -cS "$f" "$T_TMP/cold$i.json")" = "$(jq -cS "$f" "$T_TMP/rest$i.json")" ] \
	   && [ "$(r "cold$i" .timings.start)" = cold ] && [ "$(r "rest$i" .timings.start)" = restore ]; then
		same=$((same + 1))
	else
		echo "# program $i differs: cold=$(jq -cS "$f + {start: .timings.start}" "$T_TMP/cold$i.json") restore=$(jq -cS "$f + {start: .timings.start}" "$T_TMP/rest$i.json")"
	fi
done
check "restored runs give the same result as cold runs ($same/${#progs[@]} programs)" [ "$same" = "${#progs[@]}" ]

# Clone independence: randomness.
code='import os, random, uuid
print(os.urandom(16).hex(), random.random(), uuid.uuid4(), open("/dev/urandom", "rb").read(16).hex())'
run_img rnd1 "$(py_spec "$code")"; run_img rnd2 "$(py_spec "$code")"
a=$(r rnd1 .stdout); b=$(r rnd2 .stdout)
set -- $a; a1=$1 a2=$2 a3=$3 a4=$4
set -- $b
if [ "$(r rnd1 .timings.start)" = restore ] && [ -n "$a1" ] && [ "$a1" != "$1" ] && [ "$a2" != "$2" ] && [ "$a3" != "$3" ] && [ "$a4" != "$4" ]; then
	ok "two clones produce different os.urandom, random, uuid4 and /dev/urandom values"
else not_ok "clone randomness" "1: $a" "2: $b"; fi

# Clone independence: memory and disk writes of one clone are not seen by the next.
code='import os, json
seen = [os.path.exists(p) for p in ("/tmp/kiln-mark", "/work/kiln-mark", "/etc/kiln-mark")] + [hasattr(json, "kiln_mark")]
json.kiln_mark = 1
for p in ("/tmp/kiln-mark", "/work/kiln-mark"): open(p, "w").write("x")
print(seen)'
run_img w1 "$(py_spec "$code")"; run_img w2 "$(py_spec "$code")"
if [ "$(r w1 .stdout)" = "[False, False, False, False]" ] && [ "$(r w2 .stdout)" = "[False, False, False, False]" ] \
   && [ "$(sha256sum "$KILN_CACHE/snapshots/$key/mem" | cut -d' ' -f1)" = "$mem_sha" ]; then
	ok "memory and disk writes stay private to each clone; the snapshot's RAM file is unchanged"
else not_ok "clone writes" "w1=$(r w1 .stdout) w2=$(r w2 .stdout)"; fi

# The guest clock is the host's after restore (the snapshot's own clock is stale).
before=$(date +%s.%N)
run_img clock "$(py_spec 'import time; print(repr(time.time()))')"
after=$(date +%s.%N)
g=$(r clock .stdout)
if [ "$(r clock .timings.start)" = restore ] && python3 -c "import sys; b,g,a=map(float,sys.argv[1:]); sys.exit(0 if b-1 <= g <= a+1 else 1)" "$before" "$g" "$after"; then
	ok "guest time after restore is within a second of host time"
else not_ok "clock after restore" "host $before..$after guest $g"; fi

# Invalidation: a changed input (the initramfs) selects another snapshot.
mkdir -p "$T_TMP/initrd" && (cd "$T_TMP/initrd" && cpio -id --quiet < "$IMG/initramfs.cpio" && echo changed > extra \
	&& find . | cpio --quiet -o -H newc -R 0:0 > "$IMG/initramfs.cpio")
run_img inval "$(py_spec 'print(1)')"
key2=$(H snapshot create 2>/dev/null)
if [ "$(r inval .timings.start)" = cold ] && [ -n "$key2" ] && [ "$key2" != "$key" ]; then
	ok "changing the initramfs invalidates the snapshot (cold boot, then a new key)"
else not_ok "invalidation" "start=$(r inval .timings.start) key=$key key2=$key2"; fi
# prune: the snapshot of the old initramfs goes, the current one stays.
H snapshot prune > "$T_TMP/prune.out"
if [ ! -e "$KILN_CACHE/snapshots/$key" ] && [ -e "$KILN_CACHE/snapshots/$key2" ] && grep -q "removed $key" "$T_TMP/prune.out"; then
	ok "snapshot prune removes the snapshot of the old inputs and keeps the current one"
else not_ok "snapshot prune" "$(cat "$T_TMP/prune.out")"; fi
key=$key2

# Damage: a truncated RAM file, a modified RAM file, a corrupted state file.
damage() {
	case $1 in
	truncate) truncate -s 1M "$KILN_CACHE/snapshots/$key/mem" ;;
	modify) printf 'garbage' | dd of="$KILN_CACHE/snapshots/$key/mem" bs=1 seek=4096 conv=notrunc status=none ;;
	state) printf '\xff\xff\xff\xff' | dd of="$KILN_CACHE/snapshots/$key/state" bs=1 seek=100 conv=notrunc status=none ;;
	esac
}
for how in truncate modify state; do
	damage $how
	listed=$(H snapshot list | grep "^$key ")
	run_img "dmg-$how" "$(py_spec 'print("fine")')"
	if echo "$listed" | grep -qv ' ok$' && [ "$(r "dmg-$how" .state)" = succeeded ] && [ "$(r "dmg-$how" .stdout)" = fine ] \
	   && grep -q 'rebuilding' "$T_TMP/dmg-$how.err" && [ "$(r "dmg-$how" .timings.start)" = restore ] \
	   && H snapshot list | grep -q "^$key .* ok$"; then
		ok "a damaged snapshot ($how) is detected, reported and rebuilt"
	else not_ok "damaged snapshot ($how)" "listed: $listed" "$(show "dmg-$how")"; fi
done

# create is idempotent: an intact snapshot is reused, --force rebuilds it.
ino=$(stat -c %i "$KILN_CACHE/snapshots/$key/state")
again=$(H snapshot create 2>/dev/null)
ino_again=$(stat -c %i "$KILN_CACHE/snapshots/$key/state")
forced=$(H snapshot create --force 2>/dev/null)
ino_forced=$(stat -c %i "$KILN_CACHE/snapshots/$key/state")
if [ "$again" = "$key" ] && [ "$ino_again" = "$ino" ] && [ "$forced" = "$key" ] && [ "$ino_forced" != "$ino" ] \
   && H snapshot list | grep -q "^$key .* ok$"; then
	ok "snapshot create reuses an intact snapshot; --force rebuilds it"
else not_ok "snapshot create idempotence" "again=$again forced=$forced state inode $ino/$ino_again/$ino_forced"; fi

# snapshot rm
H snapshot rm "$key"
check "snapshot rm removes it" [ ! -e "$KILN_CACHE/snapshots/$key" ]

check "no QEMU process or run-directory entry is left" [ "$(count_qemu)" = 0 -a "$(count_run_entries)" = 0 ]
t_done
