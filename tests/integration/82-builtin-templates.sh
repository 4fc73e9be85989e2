#!/usr/bin/env bash
# The built-in templates (image/build-rootfs.sh): `default` has the everyday
# tools and no numpy; `python-data` imports numpy, pandas and matplotlib,
# draws a PNG (Agg by default), and, restored from a snapshot, has them
# preloaded by kiln-init's pre-started interpreter (/etc/kiln/preload),
# numpy still working in the forked task. A template's preload file is
# untrusted: junk lines, too many names and noisy or failing modules change
# nothing about the task. Nothing outlives the tasks.
. "$(dirname "$0")/lib.sh"
t_plan 10
require_image
PD=$ROOT/build/image/rootfs-python-data.ext4
if [ ! -r "$PD" ]; then
	echo "1..0 # SKIP python-data image missing ($PD): run make image"
	exit 0
fi

# An image dir per template; every file a link to its real path, so the
# snapshot key (resolved paths) is the same in every run.
IMG=$T_TMP/pd
mkdir -p "$IMG"
for f in vmlinux initramfs.cpio; do ln -s "$(readlink -f "$ROOT/build/image/$f")" "$IMG/$f"; done
ln -s "$(readlink -f "$PD")" "$IMG/rootfs.ext4"

before_entries=$(count_run_entries)
t_mark

# default: the everyday tools, and no numpy.
run_spec tools "$(sh_spec 'ps -e -o comm= | grep -cx init; curl --version | head -n1 | cut -d" " -f1; git --version | cut -d" " -f1,2
pip --version | cut -d" " -f1; python3 -m venv --without-pip /tmp/v && /tmp/v/bin/python -c "print(\"venv\")"
for t in mkfs.ext4 resize2fs mount; do command -v $t > /dev/null && echo $t; done')" --cold
if [ "$(r tools .state)" = succeeded ] && [ "$(r tools .stdout)" = "$(printf '1\ncurl\ngit version\npip\nvenv\nmkfs.ext4\nresize2fs\nmount')" ]; then
	ok "default: ps, curl, git, pip, venv, mkfs.ext4, resize2fs and mount work"
else not_ok "default: everyday tools" "$(show tools)"; fi

run_spec nonumpy "$(py_spec 'import numpy')" --cold
if [ "$(r nonumpy .state)" = failed ] && r nonumpy .stderr | grep -q "ModuleNotFoundError: No module named 'numpy'"; then
	ok "default: import numpy fails (ModuleNotFoundError)"
else not_ok "default: no numpy" "$(show nonumpy)"; fi

# python-data, cold: the data stack, a plot into /output, BLAS that runs under TCG.
plot='import numpy, pandas, matplotlib
import matplotlib.pyplot as plt
df = pandas.DataFrame({"x": numpy.arange(20), "y": numpy.arange(20) ** 2})
a = numpy.arange(9.0).reshape(3, 3) + numpy.eye(3)
fig, ax = plt.subplots(figsize=(4, 3), dpi=50)
ax.plot(df.x, df.y)
fig.savefig("/output/plot.png")
print(matplotlib.get_backend(), int((a @ a).sum()), round(float(numpy.linalg.det(a)), 3), int(df.y.sum()))'
mkdir -p "$T_TMP/plot-out"
run_spec plot "$(py_spec "$plot")" --cold --image-dir "$IMG" --output-dir "$T_TMP/plot-out"
png=$T_TMP/plot-out/plot.png
# PNG: the 8-byte signature, then the IHDR chunk (length 13) with width 200, height 150.
if [ "$(r plot .state)" = succeeded ] && [ "$(r plot .stdout)" = "agg 561 -5.0 2470" ] && [ -f "$png" ] \
   && [ "$(head -c 16 "$png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a0000000d49484452 ] \
   && [ "$(od -An -tu4 --endian=big -j16 -N8 "$png" | tr -s ' ' | sed 's/^ //')" = "200 150" ]; then
	ok "python-data: numpy, pandas and matplotlib (Agg) draw /output/plot.png, a valid 200x150 PNG"
else not_ok "python-data: plot" "$(show plot)" "png: $(head -c 24 "$png" 2>/dev/null | od -An -tx1 | tr -d '\n')"; fi

# python-data, restored: numpy, pandas, matplotlib were imported before the
# snapshot; the forked task uses them (OpenBLAS/threads would break here).
key=$("$KILN_HOST" snapshot create --image-dir "$IMG" 2> "$T_TMP/snap.err")
check "python-data: snapshot create ($key)" [ -n "$key" ]
pre='import sys, time
pre = [m for m in ("numpy", "pandas", "matplotlib", "matplotlib.pyplot") if m in sys.modules]
t = time.perf_counter(); import pandas; dt = time.perf_counter() - t
import numpy, os
a = numpy.arange(9.0).reshape(3, 3) + numpy.eye(3)
print(pre, int((a @ a).sum()), round(float(numpy.linalg.det(a)), 3), os.getuid())
print("%.1f" % (dt * 1000), file=sys.stderr)'
run_spec pre "$(py_spec "$pre")" --image-dir "$IMG"
if [ "$(r pre .state)" = succeeded ] && [ "$(r pre .timings.start)" = restore ] \
   && [ "$(r pre .stdout)" = "['numpy', 'pandas', 'matplotlib', 'matplotlib.pyplot'] 561 -5.0 1000" ]; then
	ok "python-data restored: numpy, pandas, matplotlib preloaded; numpy works in the task (import pandas took $(r pre .stderr) ms)"
else not_ok "python-data: preloaded" "$(show pre)"; fi

# The pre-started interpreter ran as root: it left nothing in /work, and the
# task's plot works as in a cold VM.
run_spec pplot "$(py_spec "$plot"'
import os; print(sorted(os.path.join(d, f) for d, ds, fs in os.walk("/work") for f in ds + fs if os.stat(os.path.join(d, f)).st_uid != 1000))')" \
	--image-dir "$IMG" --output-dir "$T_TMP/pplot-out"
if [ "$(r pplot .state)" = succeeded ] && [ "$(r pplot .timings.start)" = restore ] \
   && [ "$(r pplot .stdout)" = "$(printf 'agg 561 -5.0 2470\n[]')" ] && cmp -s "$png" "$T_TMP/pplot-out/plot.png"; then
	ok "python-data restored: the same plot as cold, nothing in /work owned by anyone but the task user"
else not_ok "python-data: restored plot" "$(show pplot)"; fi

# An untrusted /etc/kiln/preload (a copy of default with one planted):
# junk, 40 names of which only the first 32 are imported, a module that
# prints and raises. The task's output is its own; nothing else changes.
HI=$T_TMP/hostile
mkdir -p "$HI" "$T_TMP/plant"
for f in vmlinux initramfs.cpio; do ln -s "$(readlink -f "$ROOT/build/image/$f")" "$HI/$f"; done
cp --sparse=always "$(readlink -f "$ROOT/build/image/rootfs.ext4")" "$HI/rootfs.ext4"
chmod 0644 "$HI/rootfs.ext4"
{
	printf 'kiln_loud\n  \n../../etc/passwd\nos; import sys\n%s\n\xff\xfe\n' "$(head -c 300 /dev/zero | tr '\0' a)"
	for i in $(seq -w 1 40); do echo "kiln_m$i"; done
} > "$T_TMP/plant/preload"
printf 'import os, sys\nprint("LOUD")\nos.write(1, b"LOUD\\n"); os.write(2, b"LOUD\\n")\nraise RuntimeError("x")\n' > "$T_TMP/plant/kiln_loud.py"
cmds="mkdir /etc/kiln
write $T_TMP/plant/preload /etc/kiln/preload
cd /usr/lib/python3/dist-packages
write $T_TMP/plant/kiln_loud.py kiln_loud.py"
for i in $(seq -w 1 40); do
	echo 'X = 1' > "$T_TMP/plant/kiln_m$i.py"
	cmds+=$'\n'"write $T_TMP/plant/kiln_m$i.py kiln_m$i.py"
done
echo "$cmds" > "$T_TMP/plant/cmds"
debugfs -w -f "$T_TMP/plant/cmds" "$HI/rootfs.ext4" > "$T_TMP/plant/debugfs.out" 2>&1
hkey=$(KILN_CACHE=$T_TMP/cache "$KILN_HOST" snapshot create --image-dir "$HI" 2> "$T_TMP/hsnap.err")
check "hostile preload: snapshot create ($hkey)" [ -n "$hkey" ]
code='import sys
m = sorted(n for n in sys.modules if n.startswith("kiln_"))
print(len(m), m[0], m[-1], "kiln_loud" in m)'
KILN_CACHE=$T_TMP/cache run_spec hostile "$(py_spec "$code")" --image-dir "$HI"
if [ "$(r hostile .state)" = succeeded ] && [ "$(r hostile .timings.start)" = restore ] \
   && [ "$(r hostile .stdout)" = "31 kiln_m01 kiln_m31 False" ] && [ "$(r hostile .stderr)" = "" ]; then
	ok "hostile preload: junk lines skipped, 32 names at most, a noisy failing module neither prints nor stays"
else not_ok "hostile preload" "$(show hostile)" "$(tail -n 3 "$T_TMP/plant/debugfs.out")"; fi

# A preloaded module that kills the interpreter: it is started again without
# the preload, and the snapshot still has a pre-started interpreter.
printf 'kiln_m01\nkiln_die\n' > "$T_TMP/plant/preload2"
printf 'import os\nos._exit(3)\n' > "$T_TMP/plant/kiln_die.py"
printf 'rm /etc/kiln/preload\nwrite %s /etc/kiln/preload\ncd /usr/lib/python3/dist-packages\nwrite %s kiln_die.py\n' \
	"$T_TMP/plant/preload2" "$T_TMP/plant/kiln_die.py" > "$T_TMP/plant/cmds2"
debugfs -w -f "$T_TMP/plant/cmds2" "$HI/rootfs.ext4" > "$T_TMP/plant/debugfs2.out" 2>&1
touch "$HI/rootfs.ext4"   # another snapshot key (size and mtime)
hkey2=$(KILN_CACHE=$T_TMP/cache "$KILN_HOST" snapshot create --image-dir "$HI" 2> "$T_TMP/hsnap2.err")
code='import sys
print(sorted(n for n in sys.modules if n.startswith("kiln_")), "json" in sys.modules)'
KILN_CACHE=$T_TMP/cache run_spec die "$(py_spec "$code")" --image-dir "$HI"
if [ -n "$hkey2" ] && [ "$hkey2" != "$hkey" ] && [ "$(r die .state)" = succeeded ] && [ "$(r die .timings.start)" = restore ] \
   && [ "$(r die .stdout)" = "[] True" ]; then
	ok "a preloaded module that kills the interpreter: started again without the preload, restore still works"
else not_ok "preload that kills the interpreter" "key=$hkey2 $(tail -n 2 "$T_TMP/hsnap2.err")" "$(show die)"; fi

# nothing left behind by any of the runs above
entries_back() { [ "$(count_run_entries)" = "$before_entries" ]; }
t_nothing_left "no QEMU process, run-directory entry, cgroup, mount or slot lock outlives its task" entries_back

t_done
