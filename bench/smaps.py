#!/usr/bin/python3
"""smaps.py PID: a process's PSS by kind of mapping, largest first (what an
idle VM's memory is made of). Anonymous mappings are told apart by size."""
import collections
import sys

pid = sys.argv[1]
kinds = collections.defaultdict(lambda: [0, 0, 0, 0])  # pss, rss, private dirty, count
name = None
size = 0
with open("/proc/%s/smaps" % pid) as f:
    for line in f:
        parts = line.split()
        if "-" in parts[0] and len(parts[0]) > 8 and ":" not in parts[0]:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            size = (hi - lo) >> 10
            path = parts[5] if len(parts) > 5 else ""
            if path.startswith("/") or path.startswith("["):
                name = path
            else:
                name = "anon %s KiB" % (size if size < 65536 else "%d MiB" % (size >> 10))
                name = "anon %s" % ("%d MiB" % (size >> 10) if size >= 1024 else "%d KiB" % size)
            kinds[name][3] += 1
        elif parts[0] == "Pss:":
            kinds[name][0] += int(parts[1])
        elif parts[0] == "Rss:":
            kinds[name][1] += int(parts[1])
        elif parts[0] == "Private_Dirty:":
            kinds[name][2] += int(parts[1])
tot = sum(v[0] for v in kinds.values())
print("    PSS of pid %s: %.1f MiB" % (pid, tot / 1024))
for k, v in sorted(kinds.items(), key=lambda kv: -kv[1][0])[:14]:
    print("    %8.1f MiB PSS %8.1f MiB RSS %8.1f MiB private dirty  x%-3d %s" % (v[0] / 1024, v[1] / 1024, v[2] / 1024, v[3], k))
