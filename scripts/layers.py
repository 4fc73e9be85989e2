#!/usr/bin/python3
# scripts/layers.py: checks a component's rooms against its LAYERS table,
# host/LAYERS or api/LAYERS (run by make tree-check). Fails, naming file and
# line, on an #include "..." in the component that goes up or sideways where
# the table does not allow it, that names a header of another room other
# than its door, or that names a header found neither in the file's own room
# nor in the folders the component shares (lib/ and jail/ for host/, lib/
# for api/); and on a folder of the component that the table does not list
# (or a listed one that is gone).
#
#   scripts/layers.py COMPONENT [ROOT]   (COMPONENT: host or api;
#                                         ROOT: the tree, default: this script's ..)
import os
import re
import sys

# The folders each component's files may include headers from, besides its own.
SHARED = {"host": ("lib", "jail"), "api": ("lib",)}
if len(sys.argv) < 2 or sys.argv[1] not in SHARED:
    sys.exit("usage: scripts/layers.py %s [ROOT]" % "|".join(sorted(SHARED)))
comp = sys.argv[1]
root = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
folder = os.path.join(root, comp)
table = os.path.join(folder, "LAYERS")
errors = []


def fail(where, msg):
    errors.append("%s: %s" % (where, msg))


doors, allowed, order = {}, {}, []
with open(table) as f:
    for n, line in enumerate(f, 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        where = "%s/LAYERS:%d" % (comp, n)
        if len(words) < 2 or not words[1].endswith(".h"):
            fail(where, "want 'ROOM DOOR.h [ROOM ...]'")
            continue
        room, door, may = words[0], words[1], words[2:]
        if room in doors:
            fail(where, "room %s listed twice" % room)
        for other in may:
            if other not in doors:
                fail(where, "%s may include %s, which is not listed above it (only lower rooms)" % (room, other))
        doors[room], allowed[room] = door, set(may)
        order.append(room)

for room in order:
    if not os.path.isfile(os.path.join(folder, room, doors[room])):
        fail(comp + "/LAYERS", "room %s: no door %s/%s/%s" % (room, comp, room, doors[room]))
for name in sorted(os.listdir(folder)):
    if os.path.isdir(os.path.join(folder, name)) and name not in doors:
        fail(comp + "/" + name, "a folder %s/LAYERS does not list" % comp)

shared = [os.path.join(root, d) for d in SHARED[comp]]
include = re.compile(r'^\s*#\s*include\s*"([^"]+)"')


def check(path, room):
    rel = os.path.relpath(path, root)
    here = os.path.dirname(path)
    with open(path, errors="replace") as f:
        for n, line in enumerate(f, 1):
            m = include.match(line)
            if not m:
                continue
            name, where = m.group(1), "%s:%d" % (rel, n)
            if "/" in name:
                other, header = name.split("/", 1)
                if other not in doors:
                    fail(where, '#include "%s": %s is not a room of %s/LAYERS' % (name, other, comp))
                elif header != doors[other]:
                    fail(where, '#include "%s": another room is entered by its door only, "%s/%s"'
                         % (name, other, doors[other]))
                elif other == room:
                    fail(where, '#include "%s": a room includes its own headers by bare name' % name)
                elif room is not None and other not in allowed[room]:
                    fail(where, '#include "%s": room %s may not include room %s (%s/LAYERS: %s may include %s)'
                         % (name, room, other, comp, room, " ".join(sorted(allowed[room])) or "no room"))
            elif not any(os.path.isfile(os.path.join(d, name)) for d in [here] + shared):
                fail(where, '#include "%s": not in %s/%s/ or %s (another room\'s header? include its door)'
                     % (name, comp, room or "", ", ".join(d + "/" for d in SHARED[comp])))


for name in sorted(os.listdir(folder)):
    path = os.path.join(folder, name)
    if name.endswith((".c", ".h")):
        check(path, None)  # host/main.c, api/main.c: any door
    elif name in doors:
        for dirpath, _, files in os.walk(path):
            for f in sorted(files):
                if f.endswith((".c", ".h")):
                    check(os.path.join(dirpath, f), name)

for e in errors:
    print(e, file=sys.stderr)
if errors:
    print("scripts/layers.py: %d include(s) against %s/LAYERS" % (len(errors), comp), file=sys.stderr)
    sys.exit(1)
print("layers: %d rooms, every include in %s/ follows %s/LAYERS" % (len(order), comp, comp))
