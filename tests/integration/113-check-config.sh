#!/usr/bin/env bash
# `kiln-api check-config FILE` and `kiln-host check-config FILE` (README
# "Checking a configuration"): a good configuration of each passes (exit 0)
# and prints what would be used (store, TLS, S3 endpoint and bucket, accel,
# directories, capacity); then one broken setting at a time is caught (exit
# 1) by an "error: SETTING: ..." line naming it: unparsable JSON, an unknown
# key, the database's directory, a bad PEM and a key that is not the
# certificate's, S3 on a closed port, with a wrong secret and with a missing
# bucket, PostgreSQL on a closed port (and a real one when PostgreSQL is
# installed), a missing kernel, QEMU, a run_dir that cannot be created,
# kiln-api's /healthz not answering. check-config starts no QEMU and creates
# none of the directories it checks. No VM is started.
. "$(dirname "$0")/lib.sh"
t_plan 32
t_require_tools swift-proxy-server memcached jq curl openssl
t_require_built kiln-api kiln-host tests/s3tool

unset KILN_CLUSTER_TOKEN
TOKEN=cc-token-$RANDOM$RANDOM
ADMIN=cc-admin-$RANDOM$RANDOM
BUCKET=kiln-check-config
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
s3_local_start
"$ROOT/build/tests/s3tool" --endpoint "$S3_ENDPOINT" --bucket "$BUCKET" --access-key "$S3_ACCESS_KEY" \
	--secret-key "$S3_SECRET_KEY" ensure-bucket > "$T_TMP/bucket.out" 2>&1 ||
	t_bail "the bucket $BUCKET is created in the local S3" "$(cat "$T_TMP/bucket.out")"

# A port nothing listens on (a connection is refused at once).
closed_port() {
	local p
	for _ in $(seq 50); do
		p=$((30000 + RANDOM % 20000))
		(echo > "/dev/tcp/127.0.0.1/$p") 2> /dev/null || { echo "$p"; return; }
	done
	t_bail "a closed port is found"
}
CLOSED=$(closed_port)

# cc NAME DAEMON FILE: DAEMON check-config FILE, both outputs in
# $T_TMP/NAME.out, the exit status in CC_RC.
cc() { "$ROOT/build/$2" check-config "$3" > "$T_TMP/$1.out" 2>&1; CC_RC=$?; }
# passes NAME DAEMON FILE PATTERN...: exit 0 and every PATTERN in the output.
passes() {
	local name=$1 d=$2 f=$3 p miss=
	shift 3
	cc "$name" "$d" "$f"
	for p; do grep -qE -- "$p" "$T_TMP/$name.out" || miss="$miss [$p]"; done
	if [ "$CC_RC" -eq 0 ] && [ -z "$miss" ]; then
		ok "$d: $name passes and prints what it would use"
	else
		not_ok "$d: $name passes and prints what it would use" "exit $CC_RC, missing:$miss" \
			"$(head -c 2000 "$T_TMP/$name.out")"
	fi
}
# caught NAME DAEMON FILE PATTERN: exit 1 and a line "error: PATTERN".
caught() {
	local name=$1 d=$2 f=$3 p=$4
	cc "$name" "$d" "$f"
	if [ "$CC_RC" -eq 1 ] && grep -qE -- "^error: $p" "$T_TMP/$name.out"; then
		ok "$d: $name is caught ($(grep -m1 -E -- "^error: $p" "$T_TMP/$name.out" | head -c 160))"
	else
		not_ok "$d: $name is caught" "exit $CC_RC, no line \"error: $p\"" "$(head -c 2000 "$T_TMP/$name.out")"
	fi
}
# variant BASE NEW JQ: NEW is BASE changed by the jq filter JQ.
variant() { jq "$3" "$1" > "$2"; }

# ---- kiln-api ----
P=$T_TMP/pem
mkdir -p "$P"
openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=check-config.test -days 2 \
	-keyout "$P/key.pem" -out "$P/cert.pem" 2> /dev/null || t_bail "openssl makes a test certificate"
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$P/other-key.pem" 2> /dev/null ||
	t_bail "openssl makes a second key"
echo "this is not a certificate" > "$P/junk.pem"
A=$T_TMP/api.json
api_config "$A" "127.0.0.1:$API_PORT" \
	". + {tls: {listen: \"127.0.0.1:$((API_PORT + 1))\", cert_file: \"$P/cert.pem\", key_file: \"$P/key.pem\"}}"
passes api-good kiln-api "$A" "^  listen +http://127.0.0.1:$API_PORT" "^  store +sqlite" \
	"^  db +$T_TMP/api.db \(will be created\)" "^  s3 +$S3_ENDPOINT bucket $BUCKET" \
	"^  tls.key_file +$P/key.pem \(matches the certificate\)" "CN=check-config.test" "configuration ok"
check "kiln-api: check-config created no database" test ! -e "$T_TMP/api.db"

printf '{"listen": "127.0.0.1:1",' > "$T_TMP/api-json.json"
caught "unparsable JSON" kiln-api "$T_TMP/api-json.json" ".*api-json.json"
variant "$A" "$T_TMP/api-key.json" '. + {listne: "127.0.0.1:8080"}'
caught "an unknown key" kiln-api "$T_TMP/api-key.json" ".*listne"
variant "$A" "$T_TMP/api-db.json" ".db = \"$T_TMP/no-such-dir/api.db\""
caught "a database directory that does not exist" kiln-api "$T_TMP/api-db.json" "db: directory $T_TMP/no-such-dir of $T_TMP/no-such-dir/api.db: No such file or directory"
touch "$T_TMP/a-file"
variant "$A" "$T_TMP/api-db2.json" ".db = \"$T_TMP/a-file/api.db\""
caught "a database directory that is a file" kiln-api "$T_TMP/api-db2.json" "db: $T_TMP/a-file \\(the directory of $T_TMP/a-file/api.db\\) is not a directory"
variant "$A" "$T_TMP/api-pem.json" ".tls.cert_file = \"$P/junk.pem\""
caught "a certificate that is not PEM" kiln-api "$T_TMP/api-pem.json" "tls.cert_file: .*junk.pem is not PEM"
variant "$A" "$T_TMP/api-pair.json" ".tls.key_file = \"$P/other-key.pem\""
caught "a key that is not the certificate's" kiln-api "$T_TMP/api-pair.json" "tls.key_file: .*other-key.pem is not the key of"
variant "$A" "$T_TMP/api-nokey.json" ".tls.key_file = \"$P/missing.pem\""
caught "a missing key file" kiln-api "$T_TMP/api-nokey.json" "tls.key_file: cannot read .*missing.pem"
variant "$A" "$T_TMP/api-s3port.json" ".s3.endpoint = \"http://127.0.0.1:$CLOSED\""
caught "S3 on a closed port" kiln-api "$T_TMP/api-s3port.json" "s3: endpoint http://127.0.0.1:$CLOSED bucket $BUCKET: .*s3_unavailable"
variant "$A" "$T_TMP/api-s3auth.json" '.s3.secret_key = "wrong-secret"'
caught "a wrong S3 secret" kiln-api "$T_TMP/api-s3auth.json" "s3: endpoint .* bucket $BUCKET: .*s3_auth"
variant "$A" "$T_TMP/api-s3bucket.json" '.s3.bucket = "kiln-no-such-bucket"'
caught "a missing bucket" kiln-api "$T_TMP/api-s3bucket.json" "s3: endpoint .* bucket kiln-no-such-bucket: .*s3_not_found"
variant "$A" "$T_TMP/api-pg.json" ".store = {postgres: \"postgresql://kiln@127.0.0.1:$CLOSED/kiln\"}"
caught "PostgreSQL on a closed port" kiln-api "$T_TMP/api-pg.json" "store.postgres: cannot connect: postgresql: .*"
if grep -q "127.0.0.1:$CLOSED/kiln" "$T_TMP/PostgreSQL on a closed port.out" 2> /dev/null; then
	not_ok "kiln-api: the PostgreSQL conninfo (it may hold a password) is not printed"
else
	ok "kiln-api: the PostgreSQL conninfo (it may hold a password) is not printed"
fi
if command -v pg_ctlcluster > /dev/null || ls /usr/lib/postgresql/*/bin/pg_ctl > /dev/null 2>&1; then
	pg_start 2> "$T_TMP/pg.err" || true
fi
if [ -n "$T_PG_URL" ]; then
	variant "$A" "$T_TMP/api-pgok.json" ".store = {postgres: \"$T_PG_URL\"}"
	passes "a running PostgreSQL" kiln-api "$T_TMP/api-pgok.json" "^  store +postgresql \(store.postgres\)" \
		"^  store.postgres +reachable \(server version"
else
	skip "kiln-api: a running PostgreSQL passes" "no PostgreSQL server (scripts/deps.sh: postgresql)"
fi

# ---- kiln-host ----
IMG=$T_TMP/image
mkdir -p "$IMG"
for f in vmlinux initramfs.cpio rootfs.ext4; do echo "$f" > "$IMG/$f"; done
# kiln-api serving (plain HTTP only) for the host's /healthz.
api_config "$T_TMP/api-serve.json" "127.0.0.1:$API_PORT"
api_up "$T_TMP/api-serve.json" "$URL"
HPORT=$((API_PORT + 2))
H=$T_TMP/host.json
host_config "$H" "127.0.0.1:$HPORT" hcc ".image_dir = \"$IMG\" | .cache = \"$T_TMP/cache\" | .api = \"$URL\""
cc host-good kiln-host "$H"
machine=$(grep -E '^error: ' "$T_TMP/host-good.out" | grep -vE '^error: (nftables|cgroups): ')
if [ "$CC_RC" -ne 0 ] && [ -z "$machine" ]; then
	# Only what the machine lacks (root, nftables, cgroup v1 for the jail).
	skip "kiln-host: the good configuration passes" "$(grep -m1 '^error: ' "$T_TMP/host-good.out")"
else
	passes host-good kiln-host "$H" "^  listen +127.0.0.1:$HPORT" "^  accel +(kvm|tcg) " \
		"^  image_dir \(vmlinux\) +$IMG/vmlinux" "^  spool_dir +$T_TMP/spool-hcc \(will be created, [0-9]+ MiB free\)" \
		"^  cache +$T_TMP/cache \(will be created" "^  capacity +vcpus 2 \(x2 overcommit\)" \
		"^  s3 +$S3_ENDPOINT bucket $BUCKET" "^  api +$URL \(healthz 200\)" "^(  nftables +usable|warning: nftables: )" \
		"configuration ok"
fi
check "kiln-host: check-config created none of the directories it checked" \
	test ! -e "$T_TMP/spool-hcc" -a ! -e "$T_TMP/cache"
check "kiln-host: check-config started no QEMU" test "$(count_qemu)" -eq 0

printf '{"listen": ' > "$T_TMP/host-json.json"
caught "unparsable JSON" kiln-host "$T_TMP/host-json.json" ".*host-json.json"
variant "$H" "$T_TMP/host-key.json" '. + {spool_dri: "/tmp"}'
caught "an unknown key" kiln-host "$T_TMP/host-key.json" ".*spool_dri"
rm "$IMG/vmlinux"
caught "a missing kernel" kiln-host "$H" "image_dir \(vmlinux\): cannot read $IMG/vmlinux"
echo vmlinux > "$IMG/vmlinux"
variant "$H" "$T_TMP/host-qemu.json" ".qemu = \"$T_TMP/no-such-qemu\""
caught "a missing QEMU" kiln-host "$T_TMP/host-qemu.json" "qemu: $T_TMP/no-such-qemu: No such file"
variant "$H" "$T_TMP/host-run.json" ".run_dir = \"$T_TMP/a-file/run\""
caught "a run_dir under a file" kiln-host "$T_TMP/host-run.json" "run_dir: $T_TMP/a-file is not a directory"
variant "$H" "$T_TMP/host-accel.json" '.accel = "kvmm"'
caught "an unknown accel" kiln-host "$T_TMP/host-accel.json" ".*accel"
variant "$H" "$T_TMP/host-s3port.json" ".s3.endpoint = \"http://127.0.0.1:$CLOSED\""
caught "S3 on a closed port" kiln-host "$T_TMP/host-s3port.json" "s3: endpoint http://127.0.0.1:$CLOSED bucket $BUCKET: .*s3_unavailable"
variant "$H" "$T_TMP/host-s3auth.json" '.s3.access_key = "nobody:nobody"'
caught "wrong S3 credentials" kiln-host "$T_TMP/host-s3auth.json" "s3: endpoint .* bucket $BUCKET: .*s3_auth"
variant "$H" "$T_TMP/host-s3bucket.json" '.s3.bucket = "kiln-no-such-bucket"'
caught "a missing bucket" kiln-host "$T_TMP/host-s3bucket.json" "s3: endpoint .* bucket kiln-no-such-bucket: .*s3_not_found"
variant "$H" "$T_TMP/host-api.json" ".api = \"http://127.0.0.1:$CLOSED\""
caught "kiln-api not answering" kiln-host "$T_TMP/host-api.json" "api: http://127.0.0.1:$CLOSED/healthz: "
variant "$H" "$T_TMP/host-token.json" 'del(.token)'
caught "a missing cluster token" kiln-host "$T_TMP/host-token.json" "token: not set"
variant "$H" "$T_TMP/host-listen.json" '.listen = "localhost:7070"'
caught "a listen address that is not IPv4" kiln-host "$T_TMP/host-listen.json" "listen: \"localhost\" is not an IPv4 address"

# ---- usage ----
"$ROOT/build/kiln-api" check-config > /dev/null 2>&1
check "kiln-api check-config without a file is a usage error (2)" test $? -eq 2
"$ROOT/build/kiln-host" check-config > /dev/null 2>&1
check "kiln-host check-config without a file is a usage error (2)" test $? -eq 2
t_done
