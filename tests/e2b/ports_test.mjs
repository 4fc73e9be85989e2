// A sandbox's ports through the unmodified E2B SDK (e2b 2.51.0) on `kiln up`,
// with nothing but DIR/credentials in the environment (its E2B_* variables,
// and NODE_EXTRA_CA_CERTS for kiln up's local CA): sandbox.getHost(port) and
// https fetches of a server in the sandbox (python -m http.server and
// tests/integration/port_server.py), a 50 MiB download and upload by
// sha256, 100 connections at once, a WebSocket echoing 1,000 messages,
// E2B's header routing, a port nobody listens on (502) and a paused
// sandbox (409). Prints PASS/FAIL NAME lines and "ports_test: N passed, N
// failed"; exit 1 when a check failed, 2 when it could not start.
//
//   node --experimental-websocket tests/e2b/ports_test.mjs PORT_SERVER.py
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { checker, loadSdk, requireEnv } from './sdk.mjs';

let sdk;
try {
  requireEnv();
  ({ sdk } = await loadSdk());
} catch (e) {
  console.log(`ports_test: cannot start: ${e.message}`);
  process.exit(2);
}
const { Sandbox } = sdk;
const counts = { pass: 0, fail: 0 };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sha256 = (buf) => createHash('sha256').update(buf).digest('hex');

const check = checker(counts, 120000);

const server = readFileSync(process.argv[2]);
let sbx;
await check('Sandbox.create() returns the sandbox domain', async () => {
  sbx = await Sandbox.create({ timeoutMs: 600000 });
  assert.equal(sbx.sandboxDomain, process.env.E2B_DOMAIN);
  assert.match(sbx.sandboxId, /^[a-z0-9]+$/, 'a sandbox id is a DNS label');
  return sbx.sandboxId;
});
if (!sbx) {
  console.log(`ports_test: ${counts.pass} passed, ${counts.fail} failed`);
  process.exit(1);
}
const host = (port) => `https://${sbx.getHost(port)}`;

await check('servers start in the sandbox (http.server on 8001, port_server.py on 8000)', async () => {
  await sbx.files.write('/home/user/port_server.py', server);
  await sbx.commands.run('head -c 52428800 /dev/urandom > /tmp/big; mkdir -p /tmp/www && echo hello-https > /tmp/www/index.html');
  await sbx.commands.run('cd /tmp/www && python3 -m http.server 8001', { background: true, timeoutMs: 0 });
  await sbx.commands.run('python3 /home/user/port_server.py', { background: true, timeoutMs: 0 });
  for (let i = 0; i < 100; i++) {
    const r = await sbx.commands.run('cat /proc/net/tcp');
    if (r.stdout.includes(':1F40 ') && r.stdout.includes(':1F41 ')) return;
    await sleep(100);
  }
  throw new Error('the servers did not listen');
});

await check('fetch(https:// + getHost(8001)): python -m http.server answers over TLS', async () => {
  const r = await fetch(`${host(8001)}/index.html`);
  assert.equal(r.status, 200);
  assert.equal((await r.text()).trim(), 'hello-https');
  // kiln's own API lists the port with that URL.
  const s = await (await fetch(`${process.env.KILN_API}/v1/sessions/${sbx.sandboxId}`, {
    headers: { Authorization: `Bearer ${process.env.KILN_KEY}` },
  })).json();
  const p = (s.ports || []).find((x) => x.port === 8001);
  assert.equal(p && p.url, `${host(8001)}/`, `GET /v1/sessions/{id}: ${JSON.stringify(s.ports)}`);
  return sbx.getHost(8001);
});

await check('a 50 MiB download by sha256', async () => {
  const want = (await sbx.commands.run('sha256sum /tmp/big')).stdout.split(' ')[0];
  const t0 = performance.now();
  const r = await fetch(`${host(8000)}/big`);
  const got = Buffer.from(await r.arrayBuffer());
  const s = (performance.now() - t0) / 1000;
  assert.equal(r.status, 200);
  assert.equal(got.length, 52428800);
  assert.equal(sha256(got), want);
  return `${(50 / s).toFixed(1)} MiB/s`;
});

await check('a 50 MiB upload by sha256', async () => {
  const body = randomBytes(52428800);
  const r = await fetch(`${host(8000)}/`, { method: 'POST', body });
  assert.equal(r.status, 200);
  assert.equal((await r.text()).trim(), `${sha256(body)} 52428800`);
});

await check('100 connections at once', async () => {
  const rs = await Promise.all(Array.from({ length: 100 }, () => fetch(`${host(8000)}/`, { headers: { Connection: 'close' } })
    .then(async (r) => [r.status, await r.text()])));
  assert.equal(rs.filter(([st, t]) => st === 200 && t.trim() === 'hello from the sandbox').length, 100);
});

await check('a WebSocket echoes 1,000 messages in order', async () => {
  assert.ok(typeof WebSocket === 'function', 'run node with --experimental-websocket');
  const ws = new WebSocket(`wss://${sbx.getHost(8000)}/ws`);
  ws.binaryType = 'arraybuffer';
  await new Promise((res, rej) => { ws.onopen = res; ws.onerror = () => rej(new Error('the WebSocket did not open')); });
  const rtts = [];
  for (let i = 0; i < 1000; i++) {
    const data = randomBytes(1 + (i % 300));
    const t0 = performance.now();
    const got = await new Promise((res, rej) => {
      ws.onmessage = (m) => res(Buffer.from(m.data));
      ws.onerror = () => rej(new Error(`the WebSocket failed at message ${i}`));
      ws.send(data);
    });
    rtts.push(performance.now() - t0);
    assert.ok(got.equals(data), `message ${i} came back different`);
  }
  ws.close();
  rtts.sort((a, b) => a - b);
  return `round trip p50 ${rtts[500].toFixed(1)} ms`;
});

await check("E2B's header routing: kiln-api's URL with E2b-Sandbox-Id and E2b-Sandbox-Port", async () => {
  const r = await fetch(`${process.env.E2B_SANDBOX_URL || process.env.KILN_API}/index.html`, {
    headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '8001' },
  });
  assert.equal(r.status, 200, await r.clone().text());
  assert.equal((await r.text()).trim(), 'hello-https');
});

// Signed file URLs: envd by its host name (49983-<id>.<domain>, no
// E2B_SANDBOX_URL in the credentials), the signature in the query.
await check('uploadUrl(): a multipart POST to the signed URL writes the file', async () => {
  const url = await sbx.uploadUrl('/home/user/signed.txt');
  assert.match(url, /^https:\/\/49983-/);
  assert.match(url, /[?&]signature=v1_/);
  const form = new FormData();
  form.append('file', new Blob(['signed-upload\n']), 'signed.txt');
  const r = await fetch(url, { method: 'POST', body: form });
  assert.equal(r.status, 200, await r.clone().text());
  assert.equal(await sbx.files.read('/home/user/signed.txt'), 'signed-upload\n');
});

await check('downloadUrl(): a GET of the signed URL reads it, also with an expiry', async () => {
  const r = await fetch(await sbx.downloadUrl('/home/user/signed.txt'));
  assert.equal(r.status, 200);
  assert.equal(await r.text(), 'signed-upload\n');
  const r2 = await fetch(await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: 60 }));
  assert.equal(r2.status, 200);
  assert.equal(await r2.text(), 'signed-upload\n');
});

await check('signed URLs refused: expired, another path, the other operation, another sandbox (401)', async () => {
  const expired = await sbx.downloadUrl('/home/user/signed.txt', { useSignatureExpiration: -5 });
  assert.equal((await fetch(expired)).status, 401);
  const good = new URL(await sbx.downloadUrl('/home/user/signed.txt'));
  const other = new URL(good);
  other.searchParams.set('path', '/etc/shadow');
  assert.equal((await fetch(other)).status, 401, 'another path');
  assert.equal((await fetch(good, { method: 'POST', body: new FormData() })).status, 401, 'a read signature used to write');
  const sbx2 = await Sandbox.create({ timeoutMs: 120000 });
  try {
    const moved = new URL(good);
    moved.host = moved.host.replace(sbx.sandboxId, sbx2.sandboxId);
    assert.notEqual(moved.host, good.host);
    assert.equal((await fetch(moved)).status, 401, 'another sandbox');
  } finally {
    await sbx2.kill();
  }
  assert.equal((await fetch(good)).status, 200, 'the good URL still works');
});

await check('a port nobody listens on: 502', async () => {
  const r = await fetch(`${host(8999)}/`);
  assert.equal(r.status, 502);
  assert.equal((await r.json()).error.code, 'port_closed');
});

await check('a paused sandbox: 409 not_running', async () => {
  await sbx.pause();
  const r = await fetch(`${host(8001)}/`);
  assert.equal(r.status, 409);
  assert.equal((await r.json()).error.code, 'not_running');
}, 300000);

await check('connect resumes it and the port answers again', async () => {
  await sbx.connect();
  const r = await fetch(`${host(8001)}/index.html`);
  assert.equal(r.status, 200, await r.clone().text());
  assert.equal((await r.text()).trim(), 'hello-https');
}, 300000);

await check('Sandbox.kill()', async () => {
  await sbx.kill();
  assert.equal(await sbx.isRunning().catch(() => false), false);
});
console.log(`ports_test: ${counts.pass} passed, ${counts.fail} failed`);
process.exit(counts.fail ? 1 : 0);
