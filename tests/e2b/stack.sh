# tests/e2b/stack.sh (sourced after tests/integration/lib.sh): the stack the
# E2B tests run against: a local S3 (pause and resume), kiln-api and one
# kiln-host on loopback ports of their own, and two customers, acme ($KA)
# and beta ($KB). Sets URL (kiln-api), HOST_URL, TOKEN, ADMIN, BUCKET, S3_*.
#   e2b_stack_start [API_CONFIG_JQ]   e.g. '. + {max_body_mib: 2}'
#   e2b_stack_stop                    stops the host and kiln-api (t_cleanup stops S3)
# e2b_require skips the whole script (1..0 # SKIP why) when a tool or a
# build output is missing; kiln-api or kiln-host not starting is a failure
# that ends the script (t_bail).

e2b_require() {
	t_require_tools swift-proxy-server memcached jq curl node
	t_require_built kiln-api kiln-host tests/s3tool
}

TOKEN=e2b-token-$RANDOM$RANDOM$RANDOM
ADMIN=e2b-admin-$RANDOM$RANDOM$RANDOM
API_PORT=$((20000 + RANDOM % 10000))
URL=http://127.0.0.1:$API_PORT
HOST_URL=http://127.0.0.1:$((API_PORT + 1))
BUCKET=kiln-e2b
api_pid=
h_pid=

e2b_stack_stop() { t_stop "$h_pid"; h_pid=; t_stop "$api_pid"; api_pid=; }

live_hosts() { admin "$URL/v1/admin/hosts" | jq '[.hosts[] | select(.state == "live")] | length' 2> /dev/null; }
vcpus_used() { curl -s -m 5 -H "Authorization: Bearer $TOKEN" "$HOST_URL/v1/capacity" | jq -r '.vcpus.used + .vcpus.idle'; }

e2b_stack_start() {
	local extra=${1:-.}
	s3_local_start
	api_config "$T_TMP/api.json" "127.0.0.1:$API_PORT" ". + {host_lost_after_s: 5} | $extra"
	api_up "$T_TMP/api.json" "$URL"

	jq -n --arg listen "${HOST_URL#http://}" --arg token "$TOKEN" --arg api "$URL" --arg spool "$T_TMP/spool" \
		--arg run "$KILN_RUN_DIR/h1" --arg ep "$S3_ENDPOINT" --arg ak "$S3_ACCESS_KEY" --arg sk "$S3_SECRET_KEY" \
		--arg b "$BUCKET" \
		'{listen: $listen, host_id: "h1", token: $token, api: $api, heartbeat_ms: 500,
		  spool_dir: $spool, run_dir: $run, capacity: {vcpus: 2, cpu_overcommit: 4}, pool: {size: 0, prestart: 0},
		  s3: {endpoint: $ep, region: "us-east-1", bucket: $b, access_key: $ak, secret_key: $sk}}' > "$T_TMP/h1.json"
	host_start "$T_TMP/h1.json" h1
	h_pid=$host_pid
	# A first start creates the VM snapshot: minutes.
	for _ in $(seq 3000); do [ "$(live_hosts)" = 1 ] && break; sleep 0.2; done
	if [ "$(live_hosts)" = 1 ]; then ok "kiln-api and a kiln-host with a local S3 are up"
	else t_bail "the stack starts" "$(tail -3 "$T_TMP/api.err")" "$(tail -3 "$T_TMP/h1.err")"; fi

	admin -X POST --data '{"id":"acme"}' "$URL/v1/admin/customers" > /dev/null
	admin -X POST --data '{"id":"beta"}' "$URL/v1/admin/customers" > /dev/null
	KA=$(admin -X POST "$URL/v1/admin/customers/acme/keys" | jq -r .key)
	KB=$(admin -X POST "$URL/v1/admin/customers/beta/keys" | jq -r .key)
	check "two customers with a key each" [ -n "$KA" -a "$KA" != null -a -n "$KB" -a "$KB" != null ]
}

# s3_head KEY: s3tool's status for the object (0 there, 3 absent, else an error)
s3_head() {
	S3_BUCKET=$BUCKET S3_REGION=us-east-1 S3_ENDPOINT=$S3_ENDPOINT S3_ACCESS_KEY=$S3_ACCESS_KEY \
		S3_SECRET_KEY=$S3_SECRET_KEY "$ROOT/build/tests/s3tool" head "$1" > /dev/null 2>&1
	echo $?
}
