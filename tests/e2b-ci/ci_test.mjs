// kiln's code interpreter through E2B's unmodified Code Interpreter SDK
// (@e2b/code-interpreter 2.8.0 with e2b 2.51.0), with nothing but what
// `kiln up`'s credentials file holds: state across cells, streamed output,
// errors, rich results (DataFrame data, matplotlib PNG + chart, display()),
// contexts, bash, env vars, timeouts, restart, reconnect, hostile cells, a
// killed sandbox. Prints PASS/FAIL/SKIP NAME lines and "ci_test: N passed,
// N failed"; exit 1 when a check failed, 2 when it could not start.
//
//   KILN_E2B_CI_SDK=$(scripts/e2b-ci-sdk.sh) node tests/e2b-ci/ci_test.mjs
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { pathToFileURL } from 'node:url';
import { inflateSync } from 'node:zlib';
import { checker } from '../e2b/sdk.mjs';

export async function loadCiSdk() {
  const dir = process.env.KILN_E2B_CI_SDK;
  if (!dir) throw new Error('KILN_E2B_CI_SDK is not set: run scripts/e2b-ci-sdk.sh and pass the directory it prints');
  return import(pathToFileURL(join(dir, '@e2b', 'code-interpreter', 'dist', 'index.mjs')).href);
}

// A PNG that decodes: signature, IHDR, CRC-free walk of its chunks, and the
// inflated IDAT exactly as long as its rows need. Returns [width, height].
export function pngSize(b64) {
  const b = Buffer.from(b64, 'base64');
  assert.equal(b.subarray(0, 8).toString('hex'), '89504e470d0a1a0a', 'a PNG signature');
  let off = 8, w = 0, h = 0, bpp = 0;
  const idat = [];
  while (off + 8 <= b.length) {
    const len = b.readUInt32BE(off), type = b.toString('latin1', off + 4, off + 8);
    const data = b.subarray(off + 8, off + 8 + len);
    if (type === 'IHDR') {
      w = data.readUInt32BE(0); h = data.readUInt32BE(4);
      bpp = { 2: 3, 6: 4, 0: 1, 4: 2 }[data[9]] * (data[8] / 8);
    } else if (type === 'IDAT') idat.push(data);
    else if (type === 'IEND') break;
    off += 12 + len;
  }
  const raw = inflateSync(Buffer.concat(idat));
  assert.ok(w > 0 && h > 0 && bpp > 0, 'IHDR');
  assert.equal(raw.length, h * (1 + w * bpp), 'inflated rows');
  return [w, h];
}

const main = import.meta.url === pathToFileURL(process.argv[1]).href;
if (main) await run();

async function run() {
  let sdk;
  try {
    for (const k of ['E2B_API_URL', 'E2B_API_KEY'])
      if (!process.env[k]) throw new Error(`set ${k} (kiln up writes it into DIR/credentials)`);
    // kiln up names the sandboxes by E2B_DOMAIN (https://49999-<id>.<domain>); E2B_SANDBOX_URL routes by headers.
    if (!process.env.E2B_SANDBOX_URL && !process.env.E2B_DOMAIN) throw new Error('set E2B_SANDBOX_URL or E2B_DOMAIN');
    sdk = await loadCiSdk();
  } catch (e) {
    console.log(`ci_test: cannot start: ${e.message}`);
    process.exit(2);
  }
  const { Sandbox } = sdk;
  const counts = { pass: 0, fail: 0 };

  const check = checker(counts, 180000);

  const finish = () => {
    console.log(`ci_test: ${counts.pass} passed, ${counts.fail} failed`);
    process.exit(counts.fail ? 1 : 0);
  };

  let sbx;
  await check('Sandbox.create() on the SDK\'s default template (code-interpreter-v1)', async () => {
    // The first sandbox of the template on a fresh host waits for its snapshot (the warm-up under TCG).
    sbx = await Sandbox.create({ timeoutMs: 900000, requestTimeoutMs: 600000, envs: { KILN_SBX_ENV: 'from-create' } });
    return sbx.sandboxId;
  });
  if (!sbx) finish();

  await check('x = 1, then x += 1; x gives 2 (state kept between cells)', async () => {
    const a = await sbx.runCode('x = 1');
    assert.equal(a.error, undefined);
    const b = await sbx.runCode('x += 1; x');
    assert.equal(b.text, '2');
    assert.equal(b.results.length, 1);
    assert.equal(b.results[0].isMainResult, true);
    assert.ok(b.executionCount >= 2, `executionCount ${b.executionCount}`);
  });

  await check('clones of the snapshot do not share random state (random, numpy.random)', async () => {
    const cell = 'import random, numpy\n(random.random(), float(numpy.random.rand()))';
    const other = await Sandbox.create({ requestTimeoutMs: 600000 });
    try {
      const [a, b] = [(await sbx.runCode(cell)).text, (await other.runCode(cell)).text];
      assert.match(a, /^\(0\.\d+, 0\.\d+\)$/);
      assert.notEqual(a, b);
      return `${a} vs ${b}`;
    } finally {
      await other.kill();
    }
  });

  await check('stdout and stderr reach onStdout/onStderr in order, and the logs', async () => {
    const seen = [];
    const e = await sbx.runCode(
      'import sys, time\nfor i in range(3):\n    print("out", i)\n    print("err", i, file=sys.stderr)\n    time.sleep(0.05)\n',
      { onStdout: (m) => seen.push(`o:${m.line}`), onStderr: (m) => seen.push(`e:${m.line}`) });
    assert.deepEqual(seen, ['o:out 0\n', 'e:err 0\n', 'o:out 1\n', 'e:err 1\n', 'o:out 2\n', 'e:err 2\n']);
    assert.deepEqual(e.logs.stdout, ['out 0\n', 'out 1\n', 'out 2\n']);
    assert.equal(e.error, undefined);
  });

  await check('an exception: error with name, value and traceback; the context survives', async () => {
    let cb;
    const e = await sbx.runCode('def f():\n    return 1 / 0\nf()', { onError: (er) => { cb = er; } });
    assert.equal(e.error.name, 'ZeroDivisionError');
    assert.equal(e.error.value, 'division by zero');
    assert.match(e.error.traceback, /return 1 \/ 0/);
    assert.match(e.error.traceback, /in f/);
    assert.equal(cb.name, 'ZeroDivisionError');
    assert.equal((await sbx.runCode('x')).text, '2');
  });

  await check('a DataFrame: text, html and data', async () => {
    const e = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", "z"]})');
    const r = e.results[0];
    assert.match(r.text, /a\s+b/);
    assert.match(r.html, /<table/);
    assert.deepEqual(r.data, { a: [1, 2, 3], b: ['x', 'y', 'z'] });
    assert.ok(r.formats().includes('data'));
  });

  await check('a matplotlib line plot: a PNG that decodes and a line chart with its elements', async () => {
    const e = await sbx.runCode(
      'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9], label="squares")\nplt.title("Growth")\n' +
      'plt.xlabel("n"); plt.ylabel("n^2")\nplt.show()');
    assert.equal(e.error, undefined, e.error && e.error.traceback);
    assert.equal(e.results.length, 1);
    const r = e.results[0];
    const [w, h] = pngSize(r.png);
    assert.equal(r.chart.type, 'line');
    assert.equal(r.chart.title, 'Growth');
    assert.equal(r.chart.x_label, 'n');
    assert.equal(r.chart.elements.length, 1);
    assert.equal(r.chart.elements[0].label, 'squares');
    assert.deepEqual(r.chart.elements[0].points, [[1, 1], [2, 4], [3, 9]]);
    return `${w}x${h} PNG`;
  });

  await check('bar, scatter, pie and box-and-whisker charts', async () => {
    const e = await sbx.runCode(
      'import matplotlib.pyplot as plt\n' +
      'plt.figure(); plt.bar(["a", "b", "c"], [3, 5, 7]); plt.title("bars")\n' +
      'plt.figure(); plt.scatter([1, 2], [3, 4], label="pts")\n' +
      'plt.figure(); plt.pie([1, 3], labels=["one", "three"])\n' +
      'plt.figure(); plt.boxplot([[1, 2, 3, 4, 5, 100]]);\n');
    assert.equal(e.error, undefined, e.error && e.error.traceback);
    const types = e.results.map((r) => r.chart && r.chart.type);
    assert.deepEqual(types, ['bar', 'scatter', 'pie', 'box_and_whisker']);
    const [bar, sc, pie, box] = e.results.map((r) => r.chart);
    assert.deepEqual(bar.elements.map((x) => [x.label, x.value]), [['a', 3], ['b', 5], ['c', 7]]);
    assert.deepEqual(sc.elements[0].points, [[1, 3], [2, 4]]);
    assert.deepEqual(pie.elements.map((x) => x.label), ['one', 'three']);
    assert.ok(Math.abs(pie.elements[1].angle - 270) < 1e-6, `angle ${pie.elements[1].angle}`);
    assert.equal(box.elements[0].median, 3.5);
    assert.deepEqual(box.elements[0].outliers, [100]);
    for (const r of e.results) pngSize(r.png);
  });

  await check('display() of several objects, in order, before the main result', async () => {
    const e = await sbx.runCode(
      'from IPython.display import display, HTML, Markdown\ndisplay(1, "two")\ndisplay(HTML("<b>3</b>"), Markdown("**4**"))\n5');
    assert.equal(e.error, undefined, e.error && e.error.traceback);
    assert.deepEqual(e.results.map((r) => r.isMainResult), [false, false, false, false, true]);
    assert.equal(e.results[0].text, '1');
    assert.equal(e.results[1].text, "'two'");
    assert.equal(e.results[2].html, '<b>3</b>');
    assert.equal(e.results[3].markdown, '**4**');
    assert.equal(e.text, '5');
  });

  let ctx;
  await check('contexts: each its own state and cwd; listed', async () => {
    ctx = await sbx.createCodeContext({ cwd: '/tmp' });
    assert.equal(ctx.cwd, '/tmp');
    assert.equal(ctx.language, 'python');
    const a = await sbx.runCode('import os; x = 100; os.getcwd()', { context: ctx });
    assert.equal(a.text, "'/tmp'");
    assert.equal((await sbx.runCode('x', { context: ctx })).text, '100');
    assert.equal((await sbx.runCode('x')).text, '2');
    assert.equal((await sbx.runCode('import os; os.getcwd()')).text, "'/home/user'");
    const list = await sbx.listCodeContexts();
    assert.ok(list.some((c) => c.id === ctx.id), 'the new context is listed');
  });

  await check('bash cells: output, state and cwd kept in the context', async () => {
    const a = await sbx.runCode('cd /tmp && V=41; echo "v=$((V + 1))"; echo oops >&2', { language: 'bash' });
    assert.deepEqual(a.logs.stdout, ['v=42\n']);
    assert.deepEqual(a.logs.stderr, ['oops\n']);
    const b = await sbx.runCode('pwd; echo $V', { language: 'bash' });
    assert.equal(b.logs.stdout.join(''), '/tmp\n41\n');
    const bc = await sbx.createCodeContext({ language: 'bash' });
    const c = await sbx.runCode('pwd; whoami', { context: bc });
    assert.equal(c.logs.stdout.join(''), '/home/user\nuser\n');
  });

  await check('env vars per call apply to that cell only (Python and bash)', async () => {
    const a = await sbx.runCode('import os; os.environ.get("KILN_CALL")', { envs: { KILN_CALL: 'yes' } });
    assert.equal(a.text, "'yes'");
    assert.equal((await sbx.runCode('import os; str(os.environ.get("KILN_CALL"))')).text, "'None'");
    const b = await sbx.runCode('echo "[$KILN_CALL]"', { language: 'bash', envs: { KILN_CALL: 'b' } });
    assert.equal(b.logs.stdout.join(''), '[b]\n');
    const c = await sbx.runCode('echo "[$KILN_CALL]"', { language: 'bash' });
    assert.equal(c.logs.stdout.join(''), '[]\n');
  });

  await check('a cell past its timeoutMs is interrupted; the next cell runs with the state kept', async () => {
    await assert.rejects(sbx.runCode('while True:\n    pass', { timeoutMs: 2000 }), /timed out/i);
    const t0 = performance.now();
    const e = await sbx.runCode('x * 10');
    assert.equal(e.text, '20');
    return `next cell in ${Math.round(performance.now() - t0)} ms`;
  });

  await check('restartCodeContext clears the context\'s state', async () => {
    await sbx.restartCodeContext(ctx);
    const e = await sbx.runCode('x', { context: ctx });
    assert.equal(e.error.name, 'NameError');
    assert.equal((await sbx.runCode('1 + 1', { context: ctx })).text, '2');
  });

  await check('removeCodeContext: gone from the list, a cell in it is refused', async () => {
    await sbx.removeCodeContext(ctx);
    const list = await sbx.listCodeContexts();
    assert.ok(!list.some((c) => c.id === ctx.id));
    await assert.rejects(sbx.runCode('1', { context: ctx }), /not found/);
  });

  await check('a second SDK instance (Sandbox.connect) sees the same state', async () => {
    const other = await Sandbox.connect(sbx.sandboxId);
    assert.equal((await other.runCode('x')).text, '2');
  });

  await check('hostile: a 100 MiB print is bounded, the context lives on', async () => {
    let bytes = 0;
    const e = await sbx.runCode('for i in range(100):\n    print("a" * (1 << 20))', { onStdout: (m) => { bytes += m.line.length; }, timeoutMs: 120000 });
    assert.ok(bytes <= 9 << 20, `${bytes} bytes of stdout`);
    assert.match(e.logs.stderr.join(''), /output dropped/);
    assert.equal((await sbx.runCode('x')).text, '2');
    return `${bytes} bytes streamed`;
  });

  await check('hostile: a cell that kills its interpreter: an error, the context restarts, the sandbox survives', async () => {
    const e = await sbx.runCode('import os; os.kill(os.getpid(), 9)');
    assert.equal(e.error.name, 'KernelRestarted');
    assert.equal((await sbx.runCode('1 + 2')).text, '3');
    assert.equal((await sbx.runCode('x')).error.name, 'NameError');
    const r = await sbx.commands.run('echo alive');
    assert.equal(r.stdout, 'alive\n');
  });

  await check('hostile: a cell that eats the guest\'s memory: the OOM killer takes its context, the sandbox survives', async () => {
    const e = await sbx.runCode('a = []\nwhile True:\n    a.append(b"m" * (4 << 20))', { timeoutMs: 120000 });
    assert.equal(e.error?.name, 'KernelRestarted', JSON.stringify(e.error));
    assert.equal((await sbx.runCode('1 + 2')).text, '3');
    const r = await sbx.commands.run('echo alive');
    assert.equal(r.stdout, 'alive\n');
  }, 180000);

  await check('hostile: a fork bomb past its timeoutMs: the context is killed whole, the sandbox survives', async () => {
    const t0 = performance.now();
    await assert.rejects(sbx.runCode('import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass',
      { timeoutMs: 5000 }), /timed out/i);
    assert.equal((await sbx.runCode('2 + 2', { timeoutMs: 60000 })).text, '4');
    const r = await sbx.commands.run('ps -e --no-headers | wc -l');
    assert.ok(Number(r.stdout) < 100, `${r.stdout.trim()} processes left in the guest`);
    return `next cell after ${Math.round(performance.now() - t0)} ms, ${r.stdout.trim()} processes`;
  }, 180000);

  await check('hostile: a huge display() is bounded', async () => {
    const e = await sbx.runCode('class Big:\n    def _repr_html_(self):\n        return "x" * (40 << 20)\ndisplay(Big())\n7',
      { timeoutMs: 120000 });
    assert.equal(e.text, '7');
    assert.equal(e.results[0].html, undefined);
  });

  await check('env vars given to Sandbox.create apply to cells (Python and bash); a call\'s own win', async () => {
    assert.equal((await sbx.runCode('import os; os.environ.get("KILN_SBX_ENV")')).text, "'from-create'");
    const b = await sbx.runCode('echo "[$KILN_SBX_ENV]"', { language: 'bash' });
    assert.equal(b.logs.stdout.join(''), '[from-create]\n');
    const c = await sbx.runCode('import os; os.environ["KILN_SBX_ENV"]', { envs: { KILN_SBX_ENV: 'call' } });
    assert.equal(c.text, "'call'");
  });

  await check('a killed sandbox: runCode fails cleanly', async () => {
    const id = sbx.sandboxId;
    await sbx.kill();
    await assert.rejects(sbx.runCode('1'), (e) => {
      assert.ok(e instanceof sdk.NotFoundError || e instanceof sdk.TimeoutError, `${e.name}: ${e.message}`);
      return true;
    });
    assert.equal(await Sandbox.connect(id).then(() => 'connected', () => 'refused'), 'refused');
  });
  finish();
}
