#!/usr/bin/env bash
# The web console (kiln-api's /ui, ui/) in Debian's headless Chromium,
# driven by playwright-core (pinned in tests/console/package-lock.json,
# installed by scripts/console-deps.sh into a cache outside the clone),
# against the whole stack: kiln-api, a local S3 and one kiln-host on
# loopback, real VMs. First the static route with curl (CSP and nosniff on
# every answer, content types, 404 for unknown names and for every way out
# of the directory, 405, ETag revalidation); then tests/console/console_test.mjs
# (sign in, a wrong key, submit a task from the page and watch its output
# stream in, download an output, HTML-looking output and metadata shown as
# text with nothing run, a session (exec, files, pause, resume, destroy),
# an operator's hosts, cluster figures, customers and keys, a new key
# revoked from the page). Each of its checks is one result here.
. "$(dirname "$0")/lib.sh"
t_plan 55
require_image
. "$ROOT/tests/e2b/stack.sh"
e2b_require
[ -x /usr/bin/chromium ] || t_skip_all "/usr/bin/chromium missing: run scripts/deps.sh"
DEPS=$("$ROOT/scripts/console-deps.sh" 2> "$T_TMP/deps.err") || t_skip_all "playwright-core could not be installed: $(tail -n 1 "$T_TMP/deps.err")"

before_cg=$(count_cgroups)
before_mounts=$(count_mounts)
before_chrome=$(pgrep -c -x chromium || true)
# kiln-api finds the console beside its binary (build/../ui): no ui_dir.
e2b_stack_start

# ---- the static route ----
hdr() { # PATH [curl args]: status, then headers, into $T_TMP/h
	curl -s -m 10 --path-as-is -D "$T_TMP/h" -o "$T_TMP/b" -w '%{http_code}' "${@:2}" "$URL$1"
}
has() { grep -qi "^$1" "$T_TMP/h"; }
st=$(hdr /ui/)
check "GET /ui/: 200 text/html, the index (HTTP $st)" \
	eval '[ "$st" = 200 ] && has "content-type: text/html" && grep -q "<script src=\"/ui/app.js\"" "$T_TMP/b"'
check "its Content-Security-Policy: default-src 'self', no inline script, frame-ancestors 'none'" \
	has "content-security-policy: default-src 'self'; script-src 'self'; style-src 'self';.*frame-ancestors 'none'"
check "X-Content-Type-Options: nosniff, Cache-Control no-cache, an ETag" \
	eval 'has "x-content-type-options: nosniff" && has "cache-control: no-cache" && has "etag: \""'
check "the index has no inline script or style" \
	[ "$(grep -c '<script>\|<style\| style=\| on[a-z]*=' "$T_TMP/b")" = 0 ]
st=$(hdr /ui)
check "GET /ui: the index too (HTTP $st)" [ "$st" = 200 ]
st=$(hdr /ui/app.js)
check "GET /ui/app.js: 200 text/javascript (HTTP $st)" eval '[ "$st" = 200 ] && has "content-type: text/javascript"'
etag=$(sed -n 's/^[Ee][Tt][Aa][Gg]: *\(.*\)\r$/\1/p' "$T_TMP/h")
st=$(hdr /ui/app.js -H "If-None-Match: $etag")
check "revalidation with its ETag: 304 ($st)" [ "$st" = 304 ]
st=$(hdr /ui/app.css)
check "GET /ui/app.css: 200 text/css (HTTP $st)" eval '[ "$st" = 200 ] && has "content-type: text/css"'
for p in /ui/nosuch.js /ui/../api.json /ui/..%2fapi.json /ui/%2e%2e/api.json /ui/../../etc/passwd \
	/ui/..%2f..%2fetc%2fpasswd /ui/.hidden.js /ui/sub/app.js /ui//app.js /ui/app.js/ /ui/index.html.bak \
	"/ui/app.js?x=1/../../x"; do
	st=$(hdr "$p")
	case $p in *\?*) want=200 ;; *) want=404 ;; esac
	check "GET $p: $want with the CSP (HTTP $st)" \
		eval '[ "$st" = "$want" ] && has "content-security-policy:" && ! grep -q "root:\|admin_key" "$T_TMP/b"'
done
if ln -s /etc/passwd "$ROOT/ui/zz-link-test.js" 2> "$T_TMP/ln.err"; then
	st=$(hdr /ui/zz-link-test.js); rm -f "$ROOT/ui/zz-link-test.js"
	check "a symlink in the directory is not followed: 404 (HTTP $st)" [ "$st" = 404 ]
else not_ok "a symlink in the directory is not followed" "cannot make the link: $(cat "$T_TMP/ln.err")"; fi
st=$(hdr /ui/app.js -X POST --data x)
check "POST /ui/app.js: 405 with Allow (HTTP $st)" eval '[ "$st" = 405 ] && has "allow: GET, HEAD"'
st=$(hdr /ui/ -I)
check "HEAD /ui/: 200 (HTTP $st)" [ "$st" = 200 ]
st=$(hdr /v1/usage)
check "the API still wants a key: GET /v1/usage without one is 401 (HTTP $st)" [ "$st" = 401 ]

# ---- the browser ----
client_results browser "$T_TMP/console.out" \
	env -i PATH=/usr/bin:/bin HOME="$T_TMP" KILN_URL="$URL" KILN_KEY="$KA" KILN_ADMIN_KEY="$ADMIN" \
	KILN_CONSOLE_DEPS="$DEPS" timeout -k 5 600 node "$ROOT/tests/console/console_test.mjs"
summary=$(grep '^console_test: ' "$T_TMP/console.out" | tail -n 1)
# console_test.mjs prints exactly 26 checks; its exit status is 1 when one failed, else 0.
check "the browser test ran to its end: ${summary:-no summary} (exit ${C_RC:-?}, $C_N checks of 26)" \
	[ -n "$summary" -a "$C_N" = 26 -a "${C_RC:-1}" = "$(grep -q '^FAIL ' "$T_TMP/console.out" && echo 1 || echo 0)" ]
for _ in $(seq 50); do [ "$(pgrep -c -x chromium || true)" = "$before_chrome" ] && break; sleep 0.2; done
check "no chromium process is left" [ "$(pgrep -c -x chromium || true)" = "$before_chrome" ]

e2b_stack_stop
check "nothing left: no QEMU ($(count_qemu)), VM directories ($(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)), mounts ($(count_mounts) = $before_mounts), cgroups ($(count_cgroups) = $before_cg)" \
	[ "$(count_qemu)" = 0 -a "$(find "$KILN_RUN_DIR" -mindepth 2 2> /dev/null | wc -l)" = 0 \
	-a "$(count_mounts)" = "$before_mounts" -a "$(count_cgroups)" = "$before_cg" ]
t_done
