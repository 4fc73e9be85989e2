#!/usr/bin/python3
# scripts/map.py: docs/architecture.md's "Where things live" names every
# product source file (run by make check). Fails, listing them, when a .c or
# .h under host/, api/, lib/, guest/, cli/ or jail/ is not named there as
# `path/to/file.c`, or when the map names such a file that is gone.
#
#   scripts/map.py [ROOT]     (ROOT: the tree, default: this script's ..)
import os
import re
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
folders = ("host", "api", "lib", "guest", "cli", "jail")
doc_path = os.path.join(root, "docs", "architecture.md")
doc = open(doc_path).read()
named = set(re.findall(r"`((?:%s)/[\w./-]+\.[ch])`" % "|".join(folders), doc))

files = set()
for top in folders:
    for dirpath, _, names in os.walk(os.path.join(root, top)):
        for n in names:
            if n.endswith((".c", ".h")):
                files.add(os.path.relpath(os.path.join(dirpath, n), root))

missing = sorted(files - named)
gone = sorted(named - files)
for f in missing:
    print("docs/architecture.md: %s is not in the map (\"Where things live\": one line a module)" % f, file=sys.stderr)
for f in gone:
    print("docs/architecture.md: names %s, which does not exist" % f, file=sys.stderr)
if missing or gone:
    sys.exit(1)
print("map: docs/architecture.md names all %d product source files" % len(files))
