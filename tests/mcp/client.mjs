// kiln mcp driven by the official MCP TypeScript SDK client
// (@modelcontextprotocol/sdk, pinned in package-lock.json, installed by
// scripts/mcp-sdk.sh; KILN_MCP_SDK is its node_modules). Spawns
// KILN_BIN mcp with KILN_API/KILN_KEY (a real stack: tests/integration/95-mcp.sh)
// and prints one line per check: "PASS what" or "FAIL what: why", then
// "mcp_test: N passed, M failed". Every run prints the same 55 checks
// (95-mcp.sh expects exactly that many).
import { spawn } from 'node:child_process';
import { createInterface } from 'node:readline';

const sdk = `${process.env.KILN_MCP_SDK}/@modelcontextprotocol/sdk/dist/esm`;
const { Client } = await import(`${sdk}/client/index.js`);
const { StdioClientTransport } = await import(`${sdk}/client/stdio.js`);

const BIN = process.env.KILN_BIN, API = process.env.KILN_API, KEY = process.env.KILN_KEY;
let passed = 0, failed = 0;
function check(what, cond, why) {
  if (cond) { passed++; console.log(`PASS ${what}`); }
  else { failed++; console.log(`FAIL ${what}: ${why}`); }
}
const text = (r) => (r?.content ?? []).map((c) => c.text).join('\n');
const show = (r) => JSON.stringify(r).slice(0, 400);
const LONG = { timeout: 600000 };

async function connect(key) {
  const transport = new StdioClientTransport({
    command: BIN, args: ['mcp'], stderr: 'inherit',
    env: { PATH: process.env.PATH, KILN_API: API, KILN_KEY: key, KILN_CREDENTIALS: '/nonexistent' },
  });
  const client = new Client({ name: 'kiln-mcp-test', version: '1.0.0' });
  await client.connect(transport);
  return client;
}

const client = await connect(KEY);
check('initialize: the server is kiln and offers tools',
  client.getServerVersion()?.name === 'kiln' && client.getServerCapabilities()?.tools,
  JSON.stringify(client.getServerVersion()));
// ping answers an empty result; a rejection is a failed check, not a crash.
const pinged = async (c) => { try { const p = await c.ping(); return [p && typeof p === 'object' && !Object.keys(p).some((k) => k !== '_meta'), JSON.stringify(p)]; } catch (e) { return [false, `${e.code} ${e.message}`]; } };
let [pong, pongWhy] = await pinged(client);
check('ping', pong, pongWhy);

const { tools } = await client.listTools();
const names = tools.map((t) => t.name).sort();
const want = ['create_sandbox', 'create_volume', 'delete_snapshot', 'delete_volume', 'destroy_sandbox', 'exec',
  'fork_sandbox', 'list_files', 'list_snapshots', 'list_volumes', 'pause_sandbox', 'read_file', 'resume_sandbox',
  'run_code', 'snapshot_sandbox', 'write_file'];
check(`tools/list: ${names.join(' ')}`, JSON.stringify(names) === JSON.stringify(want), names.join(' '));
check('every tool has a description and an object input schema',
  tools.every((t) => t.description?.length > 20 && t.inputSchema?.type === 'object'), show(tools));

// ---- run_code ----
let t0 = Date.now();
let r = await client.callTool({ name: 'run_code', arguments: {
  language: 'python', timeout: 60,
  code: 'import sys\nprint(open("data.txt").read().strip() * 2)\nprint("to stderr", file=sys.stderr)\n' +
        'open("/output/result.txt", "w").write("forty-two\\n")\n',
  files: [{ path: 'data.txt', content: '21\n' }] } }, undefined, LONG);
let s = r.structuredContent ?? {};
check(`run_code: python ran, stdout "2121", stderr, exit 0 (${Date.now() - t0} ms)`,
  !r.isError && s.exit_code === 0 && s.stdout === '2121\n' && s.stderr === 'to stderr\n', show(r));
const out = (s.output_files ?? []).find((f) => f.path === 'result.txt');
check('run_code: /output/result.txt comes back with a download link', out && out.url, show(s.output_files));
// Every check prints a line on every run (95-mcp.sh counts them): no link is a failure here too.
const body = out?.url ? await (await fetch(out.url)).text() : null;
check('run_code: the output file downloads through its url', body === 'forty-two\n', out?.url ? JSON.stringify(body) : 'no url');
r = await client.callTool({ name: 'run_code', arguments: { language: 'bash', code: 'echo oops >&2; exit 3' } },
  undefined, LONG);
s = r.structuredContent ?? {};
check('run_code: a failing program is an error result with its exit code 3 and stderr',
  r.isError === true && s.exit_code === 3 && s.stderr === 'oops\n', show(r));

r = await client.callTool({ name: 'run_code', arguments: { language: 'python',
  code: 'for i in range(20000): print(f"line {i:05d}")' } }, undefined, LONG);
s = r.structuredContent ?? {};
check('run_code: 220 KB of stdout shows its head and tail, says how much there was, and links the whole log',
  !r.isError && s.output_truncated === true && s.stdout.startsWith('line 00000\n') &&
  s.stdout.endsWith('line 19999\n') && /220000 bytes in all/.test(s.stdout) && s.logs?.stdout, show(r));
const log = s.logs?.stdout ? await (await fetch(s.logs.stdout)).text() : '';
check('run_code: the whole stdout log downloads through its url', log.length === 220000 && log.endsWith('line 19999\n'),
  s.logs?.stdout ? `${log.length} bytes` : 'no url');

// ---- a sandbox round trip ----
t0 = Date.now();
r = await client.callTool({ name: 'create_sandbox', arguments: { idle_timeout: 600 } }, undefined, LONG);
const id = r.structuredContent?.sandbox_id;
check(`create_sandbox: ${id} running (${Date.now() - t0} ms)`,
  !r.isError && /^s_/.test(id ?? '') && r.structuredContent.state === 'running', show(r));
console.log(`SANDBOX ${id}`);
r = await client.callTool({ name: 'write_file', arguments: { sandbox_id: id, path: 'notes/hello.txt', content: 'héllo\n' } });
check('write_file: notes/hello.txt', !r.isError && /wrote 7 bytes to \/work\/notes\/hello.txt/.test(text(r)), show(r));
r = await client.callTool({ name: 'write_file', arguments: { sandbox_id: id, path: '/work/bin.dat', content: 'AP8BAg==', encoding: 'base64' } });
check('write_file: binary content as base64', !r.isError && /wrote 4 bytes/.test(text(r)), show(r));
r = await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: '/work/notes/hello.txt' } });
check('read_file: the text as written', !r.isError && text(r) === 'héllo\n', show(r));
r = await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: 'bin.dat' } });
check('read_file: binary bytes come back base64', !r.isError && r.content?.[1]?.text === 'AP8BAg==', show(r));
r = await client.callTool({ name: 'list_files', arguments: { sandbox_id: id } });
const ents = r.structuredContent?.entries ?? [];
check('list_files: /work has the notes directory and bin.dat (4 bytes)',
  !r.isError && ents.some((e) => e.name === 'notes' && e.type === 'dir') &&
  ents.some((e) => e.name === 'bin.dat' && e.size === 4), show(r));
r = await client.callTool({ name: 'exec', arguments: { sandbox_id: id, command: 'cat notes/hello.txt; echo "$GREETING"; pwd; cat',
  env: { GREETING: 'hi there' }, stdin: 'from stdin' } }, undefined, LONG);
s = r.structuredContent ?? {};
check('exec: reads the file, env and stdin, in /work, exit 0',
  !r.isError && s.exit_code === 0 && s.stdout === 'héllo\nhi there\n/work\nfrom stdin', show(r));
r = await client.callTool({ name: 'exec', arguments: { sandbox_id: id, command: 'echo before; ls /nonexistent; exit 7' } }, undefined, LONG);
s = r.structuredContent ?? {};
check('exec: a failing command is an error result with exit code 7, stdout and stderr',
  r.isError === true && s.exit_code === 7 && s.stdout === 'before\n' && /nonexistent/.test(s.stderr), show(r));
await client.callTool({ name: 'exec', arguments: { sandbox_id: id, command: 'echo kept > /tmp/state' } }, undefined, LONG);

// ---- fork and snapshots (issue 41; requests and errors against a stand-in: 106-snapshot-clients.sh) ----
t0 = Date.now();
r = await client.callTool({ name: 'fork_sandbox', arguments: { sandbox_id: id, count: 2 } }, undefined, LONG);
const forks = r.structuredContent?.sandbox_ids ?? [];
check(`fork_sandbox: two new sandbox_ids, no errors (${Date.now() - t0} ms, the sandbox stopped ${r.structuredContent?.stop_ms} ms)`,
  !r.isError && forks.length === 2 && forks.every((f) => /^s_/.test(f) && f !== id) && forks[0] !== forks[1] &&
  (r.structuredContent?.errors ?? [1]).length === 0, show(r));
r = await client.callTool({ name: 'exec', arguments: { sandbox_id: forks[0], command: 'cat /tmp/state notes/hello.txt; echo fork0 > /tmp/state' } }, undefined, LONG);
check('a fork has the sandbox\'s files (/tmp too)', !r.isError && r.structuredContent?.stdout === 'kept\nhéllo\n', show(r));
r = await client.callTool({ name: 'exec', arguments: { sandbox_id: id, command: 'cat /tmp/state' } }, undefined, LONG);
const r2 = await client.callTool({ name: 'exec', arguments: { sandbox_id: forks[1], command: 'cat /tmp/state' } }, undefined, LONG);
check('a change in one fork is invisible to the sandbox and to the other fork',
  r.structuredContent?.stdout === 'kept\n' && r2.structuredContent?.stdout === 'kept\n', `${show(r)} ${show(r2)}`);
const snapName = `mcp-test-${process.pid}`;
r = await client.callTool({ name: 'snapshot_sandbox', arguments: { sandbox_id: id, name: snapName } }, undefined, LONG);
const snapId = r.structuredContent?.snapshot_id;
check(`snapshot_sandbox: ${snapId} of ${id}`, !r.isError && /^snap_/.test(snapId ?? '') &&
  r.structuredContent?.sandbox_id === id && r.structuredContent?.name === snapName, show(r));
r = await client.callTool({ name: 'list_snapshots', arguments: { name: snapName } });
check('list_snapshots {name}: that snapshot', !r.isError &&
  JSON.stringify((r.structuredContent?.snapshots ?? []).map((x) => x.snapshot_id)) === JSON.stringify([snapId]), show(r));
r = await client.callTool({ name: 'create_sandbox', arguments: { snapshot_id: snapId, idle_timeout: 120 } }, undefined, LONG);
const fromSnap = r.structuredContent?.sandbox_id;
const r3 = await client.callTool({ name: 'exec', arguments: { sandbox_id: fromSnap, command: 'cat /tmp/state notes/hello.txt' } }, undefined, LONG);
check('create_sandbox {snapshot_id}: a new sandbox with the snapshot\'s files',
  !r.isError && /^s_/.test(fromSnap ?? '') && fromSnap !== id && r3.structuredContent?.stdout === 'kept\nhéllo\n', `${show(r)} ${show(r3)}`);
let gone = true;
for (const f of [...forks, fromSnap]) {
  r = await client.callTool({ name: 'destroy_sandbox', arguments: { sandbox_id: f } }, undefined, LONG);
  gone = gone && !r.isError && r.structuredContent?.state === 'destroyed';
}
check('destroy_sandbox of the forks and of the sandbox from the snapshot', gone, show(r));
r = await client.callTool({ name: 'delete_snapshot', arguments: { snapshot_id: snapId } }, undefined, LONG);
const r4 = await client.callTool({ name: 'list_snapshots', arguments: { name: snapName } });
check('delete_snapshot: deleted; list_snapshots no longer has it',
  !r.isError && (r4.structuredContent?.snapshots ?? [1]).length === 0, `${show(r)} ${show(r4)}`);

// ---- volumes (issue 41; requests and errors against a stand-in: 110-volume-clients.sh) ----
const volName = `mcp-vol-${process.pid}`;
r = await client.callTool({ name: 'create_volume', arguments: { name: volName, size_mib: 64 } }, undefined, LONG);
const volId = r.structuredContent?.volume_id;
check(`create_volume: ${volId}`, !r.isError && /^vol_/.test(volId ?? '') && r.structuredContent?.size_mib === 64, show(r));
r = await client.callTool({ name: 'create_sandbox', arguments: { volumes: [{ name: volName, path: '/data' }], idle_timeout: 120 } }, undefined, LONG);
const volBox = r.structuredContent?.sandbox_id;
const w = await client.callTool({ name: 'exec', arguments: { sandbox_id: volBox, command: 'echo in-volume > /data/v.txt && sync' } }, undefined, LONG);
const lv = await client.callTool({ name: 'list_volumes', arguments: { name: volName } });
check('create_sandbox {volumes}: mounted read-write at /data, a file written and synced; list_volumes names the sandbox',
  !r.isError && /^s_/.test(volBox ?? '') && r.structuredContent?.volumes?.[0]?.path === '/data' && !w.isError &&
  lv.structuredContent?.volumes?.[0]?.mounted_by?.[0]?.sandbox_id === volBox, `${show(r)} ${show(w)} ${show(lv)}`);
await client.callTool({ name: 'destroy_sandbox', arguments: { sandbox_id: volBox } }, undefined, LONG);
r = await client.callTool({ name: 'create_sandbox', arguments: { volumes: [{ name: volName, path: '/mnt/v', read_only: true }], idle_timeout: 120 } }, undefined, LONG);
const volBox2 = r.structuredContent?.sandbox_id;
const rd = await client.callTool({ name: 'exec', arguments: { sandbox_id: volBox2, command: 'cat /mnt/v/v.txt' } }, undefined, LONG);
check('the next sandbox (read-only) reads the file the last one synced',
  !r.isError && rd.structuredContent?.stdout === 'in-volume\n', `${show(r)} ${show(rd)}`);
await client.callTool({ name: 'destroy_sandbox', arguments: { sandbox_id: volBox2 } }, undefined, LONG);
r = await client.callTool({ name: 'delete_volume', arguments: { volume: volName } }, undefined, LONG);
const lv2 = await client.callTool({ name: 'list_volumes', arguments: { name: volName } });
check('delete_volume: deleted; list_volumes no longer has it',
  !r.isError && (lv2.structuredContent?.volumes ?? [1]).length === 0, `${show(r)} ${show(lv2)}`);
t0 = Date.now();
r = await client.callTool({ name: 'pause_sandbox', arguments: { sandbox_id: id } }, undefined, LONG);
check(`pause_sandbox: paused (${Date.now() - t0} ms)`, !r.isError && r.structuredContent?.state === 'paused', show(r));
r = await client.callTool({ name: 'exec', arguments: { sandbox_id: id, command: 'true' } }, undefined, LONG);
check('exec on a paused sandbox: an error result naming the state', r.isError === true && /not_running|paused|409/.test(text(r)), show(r));
t0 = Date.now();
r = await client.callTool({ name: 'resume_sandbox', arguments: { sandbox_id: id } }, undefined, LONG);
check(`resume_sandbox: running (${Date.now() - t0} ms)`, !r.isError && r.structuredContent?.state === 'running', show(r));
r = await client.callTool({ name: 'exec', arguments: { sandbox_id: id, command: 'cat /tmp/state notes/hello.txt' } }, undefined, LONG);
check('after the resume the files are there (/tmp too)', !r.isError && r.structuredContent?.stdout === 'kept\nhéllo\n', show(r));
r = await client.callTool({ name: 'destroy_sandbox', arguments: { sandbox_id: id } }, undefined, LONG);
check('destroy_sandbox: destroyed', !r.isError && r.structuredContent?.state === 'destroyed', show(r));
r = await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: 'notes/hello.txt' } });
check('read_file on a destroyed sandbox: an error result', r.isError === true && /HTTP 4\d\d/.test(text(r)), show(r));

// ---- bad arguments ----
r = await client.callTool({ name: 'exec', arguments: { sandbox_id: id } });
check('exec without command: an error result saying so', r.isError === true && /"command" is required/.test(text(r)), show(r));
r = await client.callTool({ name: 'run_code', arguments: { language: 'cobol', code: 'x' } });
check('run_code in cobol: an error result naming the languages', r.isError === true && /python, bash or sh/.test(text(r)), show(r));
r = await client.callTool({ name: 'read_file', arguments: { sandbox_id: '../../v1/usage', path: 'x' } });
check('a sandbox_id that is not one: an error result', r.isError === true && /not a sandbox id/.test(text(r)), show(r));
r = await client.callTool({ name: 'run_code', arguments: { language: 'python', code: 'pass', timeout: 'soon' } });
check('a timeout that is not a number: an error result', r.isError === true && /"timeout" must be an integer/.test(text(r)), show(r));
r = await client.callTool({ name: 'exec', arguments: { sandbox_id: 's_doesnotexist', command: 'true' } });
check('exec in a sandbox that does not exist: an error result with the API\'s 404', r.isError === true && /HTTP 404/.test(text(r)), show(r));
try {
  r = await client.callTool({ name: 'no_such_tool', arguments: {} });
  check('an unknown tool is a JSON-RPC error -32602', false, show(r));
} catch (e) {
  check('an unknown tool is a JSON-RPC error -32602', e.code === -32602, `${e.code} ${e.message}`);
}
[pong, pongWhy] = await pinged(client);
check('the server still answers after all that', pong, pongWhy);
await client.close();

// ---- a wrong key ----
const bad = await connect('wrong-key-' + Date.now());
r = await bad.callTool({ name: 'run_code', arguments: { language: 'python', code: 'print(1)' } });
check('a wrong key: run_code is an error result with HTTP 401 and a hint', r.isError === true && /HTTP 401/.test(text(r)) && /KILN_KEY/.test(text(r)), show(r));
r = await bad.callTool({ name: 'create_sandbox', arguments: {} });
check('a wrong key: create_sandbox is an error result with HTTP 401', r.isError === true && /HTTP 401/.test(text(r)), show(r));
await bad.close();

// ---- the raw protocol: malformed lines ----
const proc = spawn(BIN, ['mcp'], { env: { PATH: process.env.PATH, KILN_API: API, KILN_KEY: KEY }, stdio: ['pipe', 'pipe', 'inherit'] });
const lines = createInterface({ input: proc.stdout });
const answers = [];
let wake = null;
lines.on('line', (l) => { answers.push(l); if (wake) wake(); });
async function send(l) {
  const n = answers.length;
  proc.stdin.write(l + '\n');
  const deadline = Date.now() + 10000;
  while (answers.length === n && Date.now() < deadline) await new Promise((res) => { wake = res; setTimeout(res, 200); });
  return answers.length > n ? JSON.parse(answers[answers.length - 1]) : null;
}
let a = await send('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999-01-01","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}');
check('initialize with an unknown version: answered with the latest, 2025-06-18', a?.result?.protocolVersion === '2025-06-18', JSON.stringify(a));
a = await send('{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26"}}');
check('initialize with 2025-03-26: answered with 2025-03-26', a?.result?.protocolVersion === '2025-03-26', JSON.stringify(a));
a = await send('{"jsonrpc": "2.0", "id": 2, "method": "tools/li');
check('a cut-off line: parse error -32700 with id null', a?.error?.code === -32700 && a.id === null, JSON.stringify(a));
a = await send('{"jsonrpc":"2.0","id":"x","method":"resources/list"}');
check('an unknown method: -32601 with the request\'s id', a?.error?.code === -32601 && a.id === 'x', JSON.stringify(a));
a = await send('{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"arguments":{}}}');
check('tools/call without a name: -32602', a?.error?.code === -32602 && a.id === 3, JSON.stringify(a));
a = await send('{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"exec","arguments":[1]}}');
check('tools/call with arguments that are no object: -32602', a?.error?.code === -32602, JSON.stringify(a));
a = await send('{"jsonrpc":"2.0","id":5,"method":"initialize","params":{}}');
check('initialize without protocolVersion: -32602', a?.error?.code === -32602, JSON.stringify(a));
proc.stdin.write('{"jsonrpc":"2.0","method":"notifications/whatever"}\n\n   \n');
a = await send('{"jsonrpc":"2.0","id":6,"method":"ping"}');
check('notifications and blank lines get no answer; ping answers {} next', a?.id === 6 && JSON.stringify(a.result) === '{}', JSON.stringify(a));
a = await send('\u0000\u00ff{]');
check('binary junk: a parse error, and the server lives on', a?.error?.code === -32700 && proc.exitCode === null, JSON.stringify(a));
proc.stdin.end();
const code = await new Promise((res) => (proc.exitCode !== null ? res(proc.exitCode) : proc.on('exit', res)));
check('at the end of stdin the server exits 0', code === 0, `exit ${code}`);

console.log(`mcp_test: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
