#!/usr/bin/env bash
# The monitoring files in the tree (docs/operations.md, "Monitoring"):
# packaging/monitoring/kiln-alerts.yml parses as Prometheus rule groups
# (PyYAML, Debian's python3-yaml) and through promtool (from Debian's
# prometheus package, scripts/promtool.sh), packaging/monitoring/kiln-dashboard.json parses (jq) as a
# Grafana dashboard whose panels all have queries, and every kiln_* name
# either file mentions is a metric the daemons emit: the `.name = "kiln_..."`
# declarations under api/, host/ and lib/ (a histogram's _bucket, _sum and
# _count too). Each alert is named in docs/operations.md, whose kiln_*
# names are all emitted too; every declared metric is documented in
# docs/api.md or docs/operations.md; and the example
# api.json and host.json there load through the daemons' own loaders
# (check-config: every key exists). No root, no VM.
. "$(dirname "$0")/lib.sh"
t_plan 16
t_require_tools python3 jq

MON=$ROOT/packaging/monitoring
ALERTS=$MON/kiln-alerts.yml
DASH=$MON/kiln-dashboard.json
[ -r "$ALERTS" ] && [ -r "$DASH" ] || t_bail "packaging/monitoring has kiln-alerts.yml and kiln-dashboard.json"
/usr/bin/python3 -c 'import yaml' 2> /dev/null || t_skip_all "PyYAML missing (Debian: python3-yaml; scripts/deps.sh)"

# ---- the names the code emits ----
# One declaration a line: `.name = "kiln_x", .type = METRIC_...` (lib/metrics.h).
grep -rhoE '\.name = "kiln_[a-z0-9_]+", \.type = METRIC_[A-Z]+' "$ROOT/api" "$ROOT/host" "$ROOT/lib" \
	--include='*.c' --include='*.h' |
	sed -E 's/^\.name = "([a-z0-9_]+)", \.type = METRIC_([A-Z]+)$/\1 \2/' | sort -u > "$T_TMP/declared"
awk '{print $1} $2 == "HISTOGRAM" {print $1 "_bucket"; print $1 "_sum"; print $1 "_count"}' "$T_TMP/declared" |
	sort -u > "$T_TMP/emitted"
# A declaration written another way would be missed: every .name = "kiln_
# must have been read above (and there are dozens: kiln-api's, kiln-host's).
all_decl=$(grep -rhoE '\.name = "kiln_[a-z0-9_]+"' "$ROOT/api" "$ROOT/host" "$ROOT/lib" --include='*.c' --include='*.h' | sort -u | wc -l)
check "every \`.name = \"kiln_...\"\` declaration is read with its type ($(wc -l < "$T_TMP/declared") of $all_decl, over 40)" \
	[ "$(wc -l < "$T_TMP/declared")" -eq "$all_decl" -a "$all_decl" -gt 40 ]
has_all() { local n; for n in "$@"; do grep -qx "$n" "$T_TMP/emitted" || return 1; done; }
check "the emitted names include kiln-api's, kiln-host's, lib's and the histogram's series" \
	has_all kiln_api_hosts kiln_host_upload_failures_total kiln_build_info kiln_host_task_start_seconds_bucket \
	kiln_host_task_start_seconds_sum kiln_host_task_start_seconds_count

# unknown FILE: the kiln_* names in FILE that no daemon emits (none: empty).
unknown() { grep -oE 'kiln_[a-z0-9_]+' "$1" | sort -u | comm -23 - "$T_TMP/emitted"; }

# ---- the alert rules ----
if /usr/bin/python3 - "$ALERTS" > "$T_TMP/alerts.out" 2>&1 << 'PY'; then
import sys, yaml
d = yaml.safe_load(open(sys.argv[1]))
assert isinstance(d, dict) and list(d) == ["groups"], "top level: groups only"
names = set()
for g in d["groups"]:
    assert g.get("name") and isinstance(g.get("rules"), list) and g["rules"], "group %r: name and rules" % g.get("name")
    for r in g["rules"]:
        assert set(r) <= {"alert", "expr", "for", "labels", "annotations"}, "rule %r: keys %s" % (r.get("alert"), sorted(r))
        assert r.get("alert") and r["alert"] not in names, "rule names: unique, given (%r)" % r.get("alert")
        names.add(r["alert"])
        assert isinstance(r.get("expr"), str) and r["expr"].strip(), "%s: expr" % r["alert"]
        assert r.get("labels", {}).get("severity") in ("critical", "warning", "info"), "%s: severity" % r["alert"]
        assert r.get("annotations", {}).get("summary"), "%s: summary" % r["alert"]
        if "for" in r:
            assert isinstance(r["for"], str) and r["for"][-1] in "smhd" and r["for"][:-1].isdigit(), "%s: for" % r["alert"]
        assert r["expr"].count("(") == r["expr"].count(")"), "%s: parentheses" % r["alert"]
print("\n".join(sorted(names)))
PY
	ok "kiln-alerts.yml parses (PyYAML) as rule groups: $(wc -l < "$T_TMP/alerts.out") alerts, each with expr, severity and summary"
else
	not_ok "kiln-alerts.yml parses as Prometheus rule groups" "$(tail -3 "$T_TMP/alerts.out")"
fi
# promtool parses every PromQL expression: the rules', and the dashboard's
# queries written as recording rules. PROMTOOL may name one; else
# scripts/promtool.sh finds it (PATH, or taken from Debian's prometheus
# package into the cache).
PROMTOOL=${PROMTOOL:-$("$ROOT/scripts/promtool.sh" 2> "$T_TMP/promtool.err" || true)}
if [ -n "$PROMTOOL" ] && [ -x "$PROMTOOL" ]; then
	jq '[.panels[] | select(.type != "row") | .targets[].expr] | to_entries
		| {groups: [{name: "dashboard", rules: map({record: "kiln_dashboard:q\(.key)", expr: .value})}]}' \
		"$DASH" > "$T_TMP/dash-rules.json"
	/usr/bin/python3 -c 'import json, sys, yaml; yaml.safe_dump(json.load(open(sys.argv[1])), open(sys.argv[2], "w"))' \
		"$T_TMP/dash-rules.json" "$T_TMP/dash-rules.yml"
	if "$PROMTOOL" check rules "$ALERTS" "$T_TMP/dash-rules.yml" > "$T_TMP/promtool.out" 2>&1; then
		ok "promtool check rules accepts kiln-alerts.yml and the dashboard's queries"
	else
		not_ok "promtool check rules accepts kiln-alerts.yml and the dashboard's queries" "$(tail -5 "$T_TMP/promtool.out")"
	fi
else
	not_ok "promtool check rules accepts kiln-alerts.yml and the dashboard's queries" \
		"no promtool: $(tail -n 1 "$T_TMP/promtool.err" 2> /dev/null)"
fi
bad=$(unknown "$ALERTS" | tr '\n' ' ')
check "every kiln_* name in kiln-alerts.yml is a metric the code emits (unknown: ${bad:-none})" [ -z "$bad" ]
missing=
while read -r a; do
	grep -qw -- "$a" "$ROOT/docs/operations.md" || missing+=" $a"
done < "$T_TMP/alerts.out"
check "docs/operations.md names every alert (missing:${missing:-none})" [ -z "$missing" ]

# ---- the dashboard ----
jqq() { jq -e "$@" > /dev/null; }
check "kiln-dashboard.json parses (jq)" jqq . "$DASH"
check "it is a Grafana dashboard: title, uid, panels, the datasource variable" \
	jqq '(.title | length > 0) and (.uid | length > 0) and (.panels | length > 10)
		and any(.templating.list[]; .type == "datasource" and .name == "datasource")' "$DASH"
nq=$(jq '[.panels[] | select(.type != "row")] | length' "$DASH")
check "each of its $nq panels has queries, each a non-empty expr with a unique refId, on the \${datasource}" \
	jqq '[.panels[] | select(.type != "row")] | all((.targets | length > 0)
		and all(.targets[]; (.expr | length > 0)) and ((.targets | map(.refId) | unique | length) == (.targets | length))
		and .datasource.uid == "${datasource}")' "$DASH"
check "panel ids are unique and panels do not overlap in the grid" \
	/usr/bin/python3 -c '
import json, sys
p = json.load(open(sys.argv[1]))["panels"]
ids = [x["id"] for x in p]
assert len(ids) == len(set(ids)), "duplicate ids"
cells = set()
for x in p:
    g = x["gridPos"]
    assert g["x"] + g["w"] <= 24, x["title"]
    for i in range(g["x"], g["x"] + g["w"]):
        for j in range(g["y"], g["y"] + g["h"]):
            assert (i, j) not in cells, "overlap at %s" % x["title"]
            cells.add((i, j))
' "$DASH"
bad=$(unknown "$DASH" | tr '\n' ' ')
check "every kiln_* name in kiln-dashboard.json is a metric the code emits (unknown: ${bad:-none})" [ -z "$bad" ]

# ---- the documentation ----
bad=$(unknown "$ROOT/docs/operations.md" | tr '\n' ' ')
check "every kiln_* name in docs/operations.md is a metric the code emits (unknown: ${bad:-none})" [ -z "$bad" ]
undoc=$(awk '{print $1}' "$T_TMP/declared" | sort -u |
	comm -23 - <(cat "$ROOT/docs/api.md" "$ROOT/docs/operations.md" | grep -oE 'kiln_[a-z0-9_]+' | sort -u) | tr '\n' ' ')
check "every metric the code declares is documented in docs/api.md or docs/operations.md (missing: ${undoc:-none})" [ -z "$undoc" ]

# ---- docs/operations.md's example configurations ----
# sample HEADING: the first indented JSON block after that heading.
sample() {
	awk -v h="$1" '$0 == h {p = 1} p && /^    \{/ {q = 1} q {print} q && /^    \}/ {exit}' "$ROOT/docs/operations.md" |
		sed -e 's/^    //' -e "s|/etc/kiln/|$T_TMP/etc-|g" -e 's|https\?://[a-z0-9.-]*amazonaws.com|http://127.0.0.1:1|' \
			-e 's|http://10\.0\.1\.[0-9]*:8080|http://127.0.0.1:1|g'
}
for f in admin-key cluster-token s3-secret; do echo "example-$f-0123456789abcdef" > "$T_TMP/etc-$f"; done
echo 'postgresql://kiln@127.0.0.1:1/kiln?connect_timeout=2' > "$T_TMP/etc-pg.conninfo"
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$T_TMP/etc-destinations.key"
chmod 600 "$T_TMP/etc-destinations.key"
# loads DAEMON FILE: check-config got past the loader (it prints what it would
# use only then; S3, PostgreSQL and kiln-api are unreachable here, as meant).
loads() {
	timeout 60 "$ROOT/build/$1" check-config "$2" > "$T_TMP/$1.cc.out" 2> "$T_TMP/$1.cc.err"
	grep -q 'would use:' "$T_TMP/$1.cc.out" && ! grep -q 'unknown setting\|cannot parse\|invalid JSON' "$T_TMP/$1.cc.err"
}
if [ -x "$ROOT/build/kiln-api" ] && [ -x "$ROOT/build/kiln-host" ]; then
	sample '### kiln-api configuration' > "$T_TMP/api.json"
	sample '### kiln-host configuration' > "$T_TMP/host.json"
	for d in api host; do
		name="docs/operations.md's $d.json loads (kiln-$d check-config: every key exists)"
		if loads "kiln-$d" "$T_TMP/$d.json"; then ok "$name"; else not_ok "$name" "$(head -3 "$T_TMP/kiln-$d.cc.err")"; fi
	done
else
	skip "docs/operations.md's api.json loads" "build/kiln-api missing (make all)"
	skip "docs/operations.md's host.json loads" "build/kiln-host missing (make all)"
fi

# ---- the check itself catches a name nobody emits ----
sed 's/kiln_host_upload_failures_total/kiln_host_upload_failure_total/' "$ALERTS" > "$T_TMP/bad.yml"
check "a misspelt metric in a copy of the rules is caught (kiln_host_upload_failure_total)" \
	[ "$(unknown "$T_TMP/bad.yml")" = kiln_host_upload_failure_total ]
t_done
