// kiln's code interpreter through E2B's unmodified Code Interpreter SDK
// (figures, not pass/fail): Sandbox.create() -> the first runCode('1+1')
// result, p50/p95 over RUNS sandboxes (each killed after its run, outside
// the timing); on one warm sandbox, runCode('x+1') round trips p50/p95; a
// matplotlib line plot cell to its PNG result p50/p95.
// Environment: what `kiln up` writes into DIR/credentials, KILN_E2B_CI_SDK
// (scripts/e2b-ci-sdk.sh).
//   usage: node bench/code_interpreter.mjs [RUNS]   bench/code_interpreter.sh starts the stack
import { performance } from 'node:perf_hooks';
import { loadCiSdk } from '../tests/e2b-ci/ci_test.mjs';

const RUNS = Number(process.argv[2] || process.env.RUNS || 20);
const { Sandbox } = await loadCiSdk();
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const pct = (a, p) => {
  const s = [...a].sort((x, y) => x - y);
  return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)];
};
const fmt = (a) => `p50 ${pct(a, 50).toFixed(0)} ms, p95 ${pct(a, 95).toFixed(0)} ms (n=${a.length})`;

// The template's snapshot is made on first use: not in the figures.
await (await Sandbox.create({ requestTimeoutMs: 600000 })).kill();
const first = [];
for (let i = 0; i < RUNS; i++) {
  const t0 = performance.now();
  const sbx = await Sandbox.create();
  const e = await sbx.runCode('1+1');
  const dt = performance.now() - t0;
  if (e.text !== '2') throw new Error(`runCode('1+1') gave ${e.text}: ${JSON.stringify(e.error)}`);
  first.push(dt);
  await sbx.kill();
  await sleep(500); // the pool refills between runs, as between users
}
console.log(`code-interpreter: Sandbox.create() -> first runCode('1+1'): ${fmt(first)}`);

const sbx = await Sandbox.create();
await sbx.runCode('x = 1');
const warm = [];
for (let i = 0; i < Math.max(RUNS, 50); i++) {
  const t0 = performance.now();
  const e = await sbx.runCode('x+1');
  warm.push(performance.now() - t0);
  if (e.text !== '2') throw new Error(`runCode('x+1') gave ${e.text}`);
}
console.log(`code-interpreter: warm runCode('x+1') round trip: ${fmt(warm)}`);

const plot = [];
const cell = 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3, 4], [1, 4, 2, 3])\nplt.title("t")\nplt.show()';
for (let i = 0; i < RUNS; i++) {
  const t0 = performance.now();
  const e = await sbx.runCode(cell);
  plot.push(performance.now() - t0);
  if (!e.results[0] || !e.results[0].png) throw new Error(`no PNG: ${JSON.stringify(e.error)}`);
}
console.log(`code-interpreter: matplotlib line plot cell -> PNG result: ${fmt(plot)}`);
await sbx.kill();
