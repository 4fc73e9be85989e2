// E2B SDK vs kiln's own session API (figures, not pass/fail): the time from
// asking for a sandbox to the first command's result, p50/p95 over RUNS runs
// of each, interleaved (SDK, native, SDK, ...) in the same process against
// the same stack, so that both see the same machine and pool.
//
//   SDK:    Sandbox.create() -> sandbox.commands.run('echo hi')
//   native: POST /v1/sessions -> POST /v1/sessions/{id}/exec, with the
//           command the SDK sends (/bin/bash -l -c 'echo hi'), through
//           node's fetch
//
// Each sandbox is killed (DELETE) after its run, outside the timing.
// Environment: E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY, KILN_API, KILN_KEY
// (`set -a; . DIR/credentials` of kiln up), KILN_E2B_SDK (scripts/e2b-sdk.sh).
//   usage: node bench/e2b.mjs [RUNS]            bench/e2b.sh starts the stack
import { performance } from 'node:perf_hooks';
import { loadSdk, requireEnv } from '../tests/e2b/sdk.mjs';

const RUNS = Number(process.argv[2] || process.env.RUNS || 20);
const SETTLE_MS = Number(process.env.E2B_BENCH_SETTLE_MS || 1000);
requireEnv();
const { sdk, version } = await loadSdk();
const { Sandbox } = sdk;
const API = process.env.KILN_API;
const KEY = process.env.KILN_KEY;
if (!API || !KEY) throw new Error('set KILN_API and KILN_KEY (kiln up writes them into DIR/credentials)');

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function native() {
  const h = { Authorization: `Bearer ${KEY}`, 'Content-Type': 'application/json' };
  const t0 = performance.now();
  let res = await fetch(`${API}/v1/sessions`, { method: 'POST', headers: h, body: '{}' });
  const s = await res.json();
  if (res.status !== 201) throw new Error(`POST /v1/sessions: ${res.status} ${JSON.stringify(s)}`);
  try {
    const t1 = performance.now();
    res = await fetch(`${API}/v1/sessions/${s.id}/exec`, {
      method: 'POST', headers: h, body: JSON.stringify({ argv: ['/bin/bash', '-l', '-c', 'echo hi'] }),
    });
    const r = await res.json();
    const t2 = performance.now();
    if (res.status !== 200 || r.stdout !== 'hi\n') throw new Error(`exec: ${res.status} ${JSON.stringify(r)}`);
    return [t1 - t0, t2 - t1, t2 - t0];
  } finally {
    await fetch(`${API}/v1/sessions/${s.id}`, { method: 'DELETE', headers: h }).then((x) => x.arrayBuffer()).catch(() => {});
  }
}

async function viaSdk() {
  const t0 = performance.now();
  const sbx = await Sandbox.create();
  try {
    const t1 = performance.now();
    const r = await sbx.commands.run('echo hi');
    const t2 = performance.now();
    if (r.stdout !== 'hi\n') throw new Error(`commands.run: ${JSON.stringify(r)}`);
    return [t1 - t0, t2 - t1, t2 - t0];
  } finally {
    await sbx.kill().catch(() => {});
  }
}

function pct(xs, p) {
  const v = [...xs].sort((a, b) => a - b);
  return v[Math.max(0, Math.ceil((p / 100) * v.length) - 1)];
}

const runs = { sdk: [], native: [] };
const failed = { sdk: 0, native: 0 };
// One warm-up of each, not counted: the first of anything pays for caches.
await viaSdk().catch(() => {});
await native().catch(() => {});
for (let i = 0; i < RUNS; i++) {
  for (const [name, fn] of [['sdk', viaSdk], ['native', native]]) {
    await sleep(SETTLE_MS);
    try {
      runs[name].push(await fn());
    } catch (e) {
      failed[name]++;
      console.error(`  ${name} run ${i + 1}: ${e.message}`);
    }
  }
}

const f = (x) => (x === undefined ? '   nan' : x.toFixed(0).padStart(6));
console.log(`E2B SDK ${version} vs kiln's session API: create -> first \`echo hi\` result (${RUNS} runs each, interleaved)`);
console.log(`  ${'path'.padEnd(44)} ${'create p50'.padStart(10)} ${'first cmd p50'.padStart(13)} ${'total p50'.padStart(9)} ${'total p95'.padStart(9)}`);
const row = (label, xs) => console.log(`  ${label.padEnd(44)} ${f(pct(xs.map((x) => x[0]), 50)).padStart(7)} ms ${f(pct(xs.map((x) => x[1]), 50)).padStart(10)} ms ${f(pct(xs.map((x) => x[2]), 50))} ms ${f(pct(xs.map((x) => x[2]), 95))} ms`);
row('E2B SDK: Sandbox.create + commands.run', runs.sdk);
row('native: POST /v1/sessions + POST .../exec', runs.native);
const ratio = (p) => {
  const r = pct(runs.sdk.map((x) => x[2]), p) / pct(runs.native.map((x) => x[2]), p);
  return Number.isFinite(r) ? `${r.toFixed(2)}x` : 'n/a';
};
console.log(`  ratio SDK/native: p50 ${ratio(50)}, p95 ${ratio(95)} (target <= 1.2x; E2B publishes a 0.44 s median with KVM, this machine runs TCG)`);
if (failed.sdk || failed.native) console.log(`  failed runs: SDK ${failed.sdk}, native ${failed.native}`);
