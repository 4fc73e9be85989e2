// envd_connect.cjs BASE_URL TOKEN: drives kiln-host's envd endpoints
// (BASE_URL = http://HOST:PORT/v1/sessions/ID/envd) with the real Connect
// client the E2B SDK uses (@connectrpc/connect-web, JSON codec) and the
// SDK's own service descriptors (taken from e2b/dist/index.js), so that the
// wire format is checked by the parser that matters. Prints one line per
// check, "ok ..." or "not ok ...", for 86-envd-host.sh. NODE_PATH: the
// SDK's node_modules.
const fs = require('fs');
const path = require('path');
const NM = process.env.E2B_SDK_NODE_MODULES;
const src = fs.readFileSync(path.join(NM, 'e2b/dist/index.js'), 'utf8');
const cg = require(path.join(NM, '@bufbuild/protobuf/dist/cjs/codegenv2/index.js'));
const wkt = require(path.join(NM, '@bufbuild/protobuf/dist/cjs/wkt/index.js'));
const { createClient, ConnectError, Code } = require(path.join(NM, '@connectrpc/connect'));
const { createConnectTransport } = require(path.join(NM, '@connectrpc/connect-web'));

const files = [...src.matchAll(/fileDesc\)\("([^"]+)"/g)].map((m) => cg.fileDesc(m[1], [wkt.file_google_protobuf_timestamp]));
const svc = (name) => files.flatMap((f) => f.services).find((s) => s.typeName === name);
const transport = createConnectTransport({
	baseUrl: process.argv[2],
	useBinaryFormat: false,
	interceptors: [(next) => async (req) => { req.header.set('Authorization', 'Bearer ' + process.argv[3]); return next(req); }],
});
const proc = createClient(svc('process.Process'), transport);
const fsc = createClient(svc('filesystem.Filesystem'), transport);
let failed = 0;
const check = (name, cond, detail) => {
	console.log((cond ? 'ok ' : 'not ok ') + name + (cond || detail === undefined ? '' : ' # ' + JSON.stringify(detail)));
	if (!cond) failed++;
};
const code = async (p) => { try { await p; return 'none'; } catch (e) { return e instanceof ConnectError ? Code[e.code] : String(e); } };

(async () => {
	const st = await fsc.stat({ path: '/etc/passwd' });
	check('connect client: Stat parses (size int64, Timestamp, enum)', st.entry.name === 'passwd' && st.entry.type === 1 &&
		st.entry.size > 0n && st.entry.modifiedTime.seconds > 0n, st.entry);
	check('connect client: Stat of a missing path is NotFound', (await code(fsc.stat({ path: '/nope' }))) === 'NotFound');
	check('connect client: MakeDir of an existing directory is AlreadyExists', (await code(fsc.makeDir({ path: '/tmp' }))) === 'AlreadyExists');
	let out = '', end = null, start = null;
	for await (const ev of proc.start({ process: { cmd: '/bin/bash', args: ['-l', '-c', 'echo hello; exit 7'] } },
		{ timeoutMs: 60000, headers: { 'Keepalive-Ping-Interval': '50' } })) {
		const e = ev.event.event;
		if (e.case === 'start') start = e.value.pid;
		if (e.case === 'data') out += new TextDecoder().decode(e.value.output.value);
		if (e.case === 'end') end = e.value;
	}
	check('connect client: Start streams start, data and end', start > 0 && out === 'hello\n' && end && end.exitCode === 7 &&
		end.status === 'exit status 7', { start, out, end });
	const t0 = Date.now();
	const dl = await code((async () => { for await (const ev of proc.start({ process: { cmd: 'sleep', args: ['30'] } }, { timeoutMs: 1500 })) void ev; })());
	check('connect client: a Start past its timeoutMs is DeadlineExceeded', dl === 'DeadlineExceeded' && Date.now() - t0 < 10000, dl);
	const l = await proc.list({});
	check('connect client: List parses', Array.isArray(l.processes), l);
	check('connect client: SendSignal to an unknown pid is NotFound',
		(await code(proc.sendSignal({ process: { selector: { case: 'pid', value: 999999 } }, signal: 9 }))) === 'NotFound');
	process.exit(failed ? 1 : 0);
})().catch((e) => { console.log('not ok connect client: ' + e); process.exit(1); });
