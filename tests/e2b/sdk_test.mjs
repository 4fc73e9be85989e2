// kiln's E2B compatibility test: the unmodified E2B JavaScript SDK (e2b
// 2.51.0, tests/e2b/package.json) against a kiln stack, configured by the
// three variables an E2B user sets and nothing else:
//
//   E2B_API_URL=http://HOST:PORT/e2b E2B_SANDBOX_URL=http://HOST:PORT E2B_API_KEY=kiln_...
//
// Test-only inputs: KILN_E2B_SDK (the node_modules directory printed by
// scripts/e2b-sdk.sh) and E2B_TEST_OTHER_KEY (another customer's key, for
// the isolation checks; without it they are skipped, saying so).
//
// One sandbox serves every check that does not need its own (a second one is
// never created: VMs under TCG are slow). Each check prints one line,
// PASS/FAIL/SKIP NAME, with details on indented lines below a failure; the
// last line is "sdk_test: N passed, N failed, N skipped". Exit status 1 when
// any check failed, 2 when the test could not start.
//
//   KILN_E2B_SDK=$(scripts/e2b-sdk.sh) node tests/e2b/sdk_test.mjs
import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { performance } from 'node:perf_hooks';
import { loadSdk, requireEnv } from './sdk.mjs';

let sdk, version;
try {
  requireEnv();
  ({ sdk, version } = await loadSdk());
} catch (e) {
  console.log(`sdk_test: cannot start: ${e.message}`);
  process.exit(2);
}
const {
  Sandbox, CommandExitError, TimeoutError, AuthenticationError, NotFoundError, FileNotFoundError,
  SandboxNotFoundError, SandboxError, Volume, Template, Secret,
} = sdk;

const RUN = `sdk-${process.pid}-${Date.now()}`;
const OTHER_KEY = process.env.E2B_TEST_OTHER_KEY || '';
const counts = { pass: 0, fail: 0, skip: 0 };
// What each unsupported call raised, for docs/e2b.md's table.
const raised = [];

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sha256 = (buf) => createHash('sha256').update(buf).digest('hex');
const errName = (e) => (e && e.constructor ? e.constructor.name : typeof e);
const errText = (e) => `${errName(e)}: ${String(e && e.message).split('\n')[0].slice(0, 200)}`;

function withTimeout(promise, ms, what) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`${what}: no answer after ${ms / 1000} s (a hang)`)), ms);
    }),
  ]).finally(() => clearTimeout(timer));
}

// check NAME FN [timeout ms]: FN returns nothing or a detail string.
async function check(name, fn, ms = 60000) {
  const t0 = performance.now();
  try {
    const detail = await withTimeout(Promise.resolve().then(fn), ms, name);
    const took = Math.round(performance.now() - t0);
    counts.pass++;
    console.log(`PASS ${name}${detail ? ` (${detail})` : ''} [${took} ms]`);
    return true;
  } catch (e) {
    const took = Math.round(performance.now() - t0);
    counts.fail++;
    console.log(`FAIL ${name} [${took} ms]`);
    for (const l of String((e && e.stack) || e).split('\n').slice(0, 8)) console.log(`    ${l}`);
    return false;
  }
}

function skip(name, why) {
  counts.skip++;
  console.log(`SKIP ${name}: ${why}`);
}

// rejects PROMISE-FN CLASS: the error, asserted to be an instance of CLASS.
async function rejects(fn, cls) {
  let err;
  try {
    await fn();
  } catch (e) {
    err = e;
  }
  assert.ok(err, `expected ${cls.name}, but the call succeeded`);
  assert.ok(err instanceof cls, `expected ${cls.name}, got ${errText(err)}`);
  return err;
}

// An error the SDK made (its own classes), not a raw fetch/socket failure.
function isSdkError(e) {
  return e instanceof SandboxError || e instanceof AuthenticationError || e instanceof sdk.ServiceBusyError ||
    e instanceof sdk.VolumeError || e instanceof sdk.BuildError || e instanceof sdk.SecretError;
}
async function sdkFailure(fn, name) {
  let err;
  try {
    const v = await fn();
    err = null;
    raised.push(`${name}: returned ${JSON.stringify(v)}`);
  } catch (e) {
    err = e;
    raised.push(`${name}: ${errText(e)}`);
  }
  assert.ok(err, `${name} succeeded`);
  assert.ok(isSdkError(err), `${name} raised ${errText(err)}, not one of the SDK's error classes`);
  return errText(err);
}

async function waitFor(pred, ms, what) {
  const end = Date.now() + ms;
  while (Date.now() < end) {
    if (await pred()) return;
    await sleep(100);
  }
  throw new Error(`${what}: not within ${ms} ms`);
}

async function listAll(opts) {
  const p = Sandbox.list(opts);
  const out = [];
  while (p.hasNext) out.push(...(await p.nextItems()));
  return out;
}

console.log(`# e2b SDK ${version} against ${process.env.E2B_API_URL} (envd at ${process.env.E2B_SANDBOX_URL}), run ${RUN}`);

let sbx;
const t0 = performance.now();
await check('Sandbox.create() with envs, metadata and a timeout', async () => {
  sbx = await Sandbox.create({ envs: { SBX_VAR: 'from-create' }, metadata: { kilntest: RUN }, timeoutMs: 900_000 });
  assert.match(sbx.sandboxId, /\S/);
  return `${sbx.sandboxId} in ${Math.round(performance.now() - t0)} ms`;
}, 300_000);
if (!sbx) {
  console.log(`sdk_test: ${counts.pass} passed, ${counts.fail} failed, ${counts.skip} skipped (no sandbox: the rest cannot run)`);
  process.exit(1);
}
const id = sbx.sandboxId;

try {
  // ---- commands ----
  await check("commands.run('echo hi'): stdout, exit code 0", async () => {
    const r = await sbx.commands.run('echo hi');
    assert.equal(r.stdout, 'hi\n');
    assert.equal(r.stderr, '');
    assert.equal(r.exitCode, 0);
  });

  await check('onStdout/onStderr stream output as it is written (before the command ends)', async () => {
    let tFirst = null, errSeen = '';
    const chunks = [];
    const r = await sbx.commands.run('echo first; echo err1 >&2; sleep 1.5; echo second', {
      onStdout: (d) => {
        chunks.push(d);
        if (tFirst === null && chunks.join('').includes('first')) tFirst = performance.now();
      },
      onStderr: (d) => { errSeen += d; },
    });
    const tEnd = performance.now();
    assert.equal(r.stdout, 'first\nsecond\n');
    assert.equal(chunks.join(''), 'first\nsecond\n');
    assert.equal(errSeen, 'err1\n');
    assert.ok(tFirst !== null, 'onStdout never saw "first"');
    const lead = Math.round(tEnd - tFirst);
    assert.ok(lead >= 1000, `"first" arrived only ${lead} ms before the end (the command sleeps 1.5 s after it)`);
    return `"first" ${lead} ms before the result, ${chunks.length} chunks`;
  });

  await check('a non-zero exit raises CommandExitError with exitCode and stderr', async () => {
    const e = await rejects(() => sbx.commands.run('echo out; echo oops >&2; exit 3'), CommandExitError);
    assert.equal(e.exitCode, 3);
    assert.equal(e.stderr, 'oops\n');
    assert.equal(e.stdout, 'out\n');
  });

  await check("envs and cwd per command; the sandbox's envVars from create; a command's envs win", async () => {
    const r = await sbx.commands.run('echo "$FOO:$SBX_VAR"; pwd', { envs: { FOO: 'bar baz' }, cwd: '/tmp' });
    assert.equal(r.stdout, 'bar baz:from-create\n/tmp\n');
    const o = await sbx.commands.run('echo "$SBX_VAR"', { envs: { SBX_VAR: 'override' } });
    assert.equal(o.stdout, 'override\n');
  });

  await check("default user: whoami is 'user', HOME and cwd /home/user", async () => {
    const r = await sbx.commands.run('whoami; echo "$HOME"; pwd; id -u');
    const [who, home, cwd, uid] = r.stdout.trim().split('\n');
    assert.deepEqual([who, home, cwd], ['user', '/home/user', '/home/user']);
    assert.notEqual(uid, '0');
    return `uid ${uid}`;
  });

  await check("user: 'root' when asked", async () => {
    const r = await sbx.commands.run('whoami; cd && pwd', { user: 'root' });
    assert.equal(r.stdout, 'root\n/root\n');
  });

  await check("'user' has passwordless sudo, as in E2B's base", async () => {
    const r = await sbx.commands.run('sudo -n whoami && sudo -n -u user id -un');
    assert.equal(r.stdout, 'root\nuser\n');
  });

  await check('a command outliving timeoutMs raises TimeoutError, and it is killed', async () => {
    const t = performance.now();
    await rejects(() => sbx.commands.run('sleep 37', { timeoutMs: 1500 }), TimeoutError);
    const took = Math.round(performance.now() - t);
    assert.ok(took < 15000, `TimeoutError only after ${took} ms`);
    await waitFor(async () => {
      const r = await sbx.commands.run("ps -eo args | grep -cx 'sleep 37' || true");
      return r.stdout.trim() === '0';
    }, 5000, 'the timed-out sleep 37 still runs');
    return `raised after ${took} ms`;
  });

  await check('a background command: commands.list shows it, sendStdin reaches it, kill ends it', async () => {
    let out = '';
    const h = await sbx.commands.run('while read -r l; do echo "got:$l"; done', {
      background: true, stdin: true, onStdout: (d) => { out += d; },
    });
    assert.ok(h.pid > 0);
    const list = await sbx.commands.list();
    const mine = list.find((p) => p.pid === h.pid);
    assert.ok(mine, `pid ${h.pid} not in commands.list(): ${JSON.stringify(list)}`);
    assert.ok(mine.args.join(' ').includes('while read'), `its args: ${JSON.stringify(mine)}`);
    await sbx.commands.sendStdin(h.pid, 'ping\n');
    await waitFor(() => out.includes('got:ping\n'), 10000, 'the echo of the stdin line');
    assert.equal(await sbx.commands.kill(h.pid), true);
    const e = await rejects(() => h.wait(), CommandExitError);
    assert.notEqual(e.exitCode, 0);
    const after = await sbx.commands.list();
    assert.ok(!after.some((p) => p.pid === h.pid), `pid ${h.pid} still listed after kill`);
    assert.equal(await sbx.commands.kill(h.pid), false, 'killing it again: false (not_found)');
    return `pid ${h.pid}, ended with exitCode ${e.exitCode} (${e.error || ''})`;
  });

  await check('closeStdin ends the input: cat returns what was sent', async () => {
    const h = await sbx.commands.run('cat', { background: true, stdin: true });
    await h.sendStdin('abc\x00\xff-end');
    await h.closeStdin();
    const r = await h.wait();
    assert.equal(r.stdout, 'abc\x00\xff-end');
  });

  await check('a disconnected command keeps running; commands.connect attaches to its output', async () => {
    const h = await sbx.commands.run('sleep 2; echo late', { background: true });
    await h.disconnect();
    let out = '';
    const c = await sbx.commands.connect(h.pid, { onStdout: (d) => { out += d; } });
    const r = await c.wait();
    assert.equal(r.exitCode, 0);
    assert.equal(out, 'late\n');
  });

  await check('commands.connect to an unknown pid raises NotFoundError', async () => {
    await rejects(() => sbx.commands.connect(999999), NotFoundError);
  });

  await check('pty.create, sendInput, resize, kill', async () => {
    let out = '';
    const dec = new TextDecoder();
    const t = await sbx.pty.create({ cols: 80, rows: 24, onData: (d) => { out += dec.decode(d, { stream: true }); } });
    await sbx.pty.sendInput(t.pid, new TextEncoder().encode('echo pty-$((6*7))\n'));
    await waitFor(() => out.includes('pty-42'), 10000, 'the pty echo');
    await sbx.pty.resize(t.pid, { cols: 100, rows: 30 });
    await sbx.pty.sendInput(t.pid, new TextEncoder().encode('stty size\n'));
    await waitFor(() => out.includes('30 100'), 10000, 'stty size after resize');
    assert.equal(await sbx.pty.kill(t.pid), true);
    await t.wait().catch(() => {});
  });

  // ---- files ----
  await check('files.write and files.read of text (absolute and home-relative paths)', async () => {
    const w = await sbx.files.write('/home/user/hello.txt', 'hello kiln\n');
    assert.equal(w.path, '/home/user/hello.txt');
    assert.equal(w.name, 'hello.txt');
    assert.equal(await sbx.files.read('/home/user/hello.txt'), 'hello kiln\n');
    await sbx.files.write('rel/x.txt', 'relative');
    assert.equal(await sbx.files.read('/home/user/rel/x.txt'), 'relative');
    const r = await sbx.commands.run('cat /home/user/hello.txt; stat -c %U rel/x.txt');
    assert.equal(r.stdout, 'hello kiln\nuser\n');
  });

  await check('files.write and files.read of 5 MiB of random bytes: sha256 equal, in the guest too', async () => {
    const big = randomBytes(5 << 20);
    const w = await sbx.files.write('/home/user/big.bin', new Blob([big]));
    assert.equal(w.path, '/home/user/big.bin');
    const back = await sbx.files.read('/home/user/big.bin', { format: 'bytes' });
    assert.equal(back.length, big.length);
    assert.equal(sha256(back), sha256(big));
    const r = await sbx.commands.run('sha256sum /home/user/big.bin');
    assert.equal(r.stdout.split(' ')[0], sha256(big));
    const s = await sbx.files.read('/home/user/big.bin', { format: 'stream' });
    const h = createHash('sha256');
    for await (const c of s) h.update(c);
    assert.equal(h.digest('hex'), sha256(big), 'read as a stream');
  }, 180_000);

  await check('files.write with useOctetStream (raw body), binary with CRLF and boundary-like bytes', async () => {
    const data = Buffer.concat([randomBytes(300_000), Buffer.from('\r\n--boundary\r\n\r\n--\r\n'), randomBytes(300_000)]);
    await sbx.files.write('/home/user/oct.bin', new Blob([data]), { useOctetStream: true });
    const back = await sbx.files.read('/home/user/oct.bin', { format: 'bytes' });
    assert.equal(sha256(back), sha256(data));
  }, 120_000);

  await check('files.write and files.read with gzip: true (text, binary, a stream): the bytes themselves, sha256 equal', async () => {
    const text = 'gzip me '.repeat(1000);
    const w = await sbx.files.write('/home/user/gz.txt', text, { gzip: true });
    assert.equal(w.path, '/home/user/gz.txt');
    assert.equal(await sbx.files.read('/home/user/gz.txt'), text);
    assert.equal(await sbx.files.read('/home/user/gz.txt', { gzip: true }), text, 'read with gzip: true');
    const bin = Buffer.concat([randomBytes(400_000), Buffer.alloc(400_000, 7)]);
    await sbx.files.write('/home/user/gz.bin', new Blob([bin]), { gzip: true });
    const back = await sbx.files.read('/home/user/gz.bin', { format: 'bytes', gzip: true });
    assert.equal(sha256(back), sha256(bin), 'binary, gzip both ways');
    const r = await sbx.commands.run('sha256sum /home/user/gz.bin');
    assert.equal(r.stdout.split(' ')[0], sha256(bin), 'in the guest');
    const s = await sbx.files.read('/home/user/gz.bin', { format: 'stream', gzip: true });
    const h = createHash('sha256');
    for await (const c of s) h.update(c);
    assert.equal(h.digest('hex'), sha256(bin), 'read as a stream with gzip: true');
  }, 120_000);

  await check('files.write([{path, data}, ...]) with gzip: true and home-relative paths: each at its path', async () => {
    const res = await sbx.files.write([
      { path: 'gzmulti/a.txt', data: 'A-gz' },
      { path: '/home/user/gzmulti/deeper/b.txt', data: 'B-gz' },
    ], { gzip: true });
    assert.deepEqual(res.map((r) => r.path).sort(), ['/home/user/gzmulti/a.txt', '/home/user/gzmulti/deeper/b.txt']);
    assert.equal(await sbx.files.read('/home/user/gzmulti/a.txt'), 'A-gz');
    assert.equal(await sbx.files.read('/home/user/gzmulti/deeper/b.txt'), 'B-gz');
  });

  await check('files.write with metadata: in the answer, getInfo, list and rename; an overwrite clears it', async () => {
    const md = { author: 'kiln', purpose: 'sdk test' };
    const w = await sbx.files.write('/home/user/meta/m.txt', 'with metadata', { metadata: md });
    assert.deepEqual(w.metadata, md, 'the write answer');
    assert.deepEqual((await sbx.files.getInfo('/home/user/meta/m.txt')).metadata, md, 'getInfo');
    const l = await sbx.files.list('/home/user/meta');
    assert.deepEqual(l.find((e) => e.name === 'm.txt').metadata, md, 'list');
    const mv = await sbx.files.rename('/home/user/meta/m.txt', '/home/user/meta/n.txt');
    assert.deepEqual(mv.metadata, md, 'rename');
    const many = await sbx.files.write([{ path: '/home/user/meta/x.txt', data: 'x' }, { path: '/home/user/meta/y.txt', data: 'y' }],
      { metadata: { batch: '1' } });
    assert.deepEqual(many.map((e) => e.metadata), [{ batch: '1' }, { batch: '1' }], 'every file of a multipart write');
    await sbx.files.write('/home/user/meta/n.txt', 'overwritten');
    assert.equal((await sbx.files.getInfo('/home/user/meta/n.txt')).metadata, undefined, 'cleared on overwrite');
    const big = await sdkFailure(() => sbx.files.write('/home/user/meta/big.txt', 'x', { metadata: { v: 'x'.repeat(5000) } }),
      'files.write(metadata over 4 KiB)');
    return big;
  });

  await check('files.write of two files in one request (two multipart parts); parents made for the user, also under /', async () => {
    const res = await sbx.files.write([
      { path: '/home/user/multi/a.txt', data: 'A-content' },
      { path: '/home/user/multi/deeper/b.txt', data: 'B-content' },
    ]);
    assert.equal(res.length, 2);
    assert.deepEqual(res.map((r) => r.path).sort(), ['/home/user/multi/a.txt', '/home/user/multi/deeper/b.txt']);
    assert.equal(await sbx.files.read('/home/user/multi/a.txt'), 'A-content');
    assert.equal(await sbx.files.read('/home/user/multi/deeper/b.txt'), 'B-content');
    const rel = await sbx.files.writeFiles([{ path: 'relmulti/c.txt', data: 'C' }, { path: 'relmulti/d.txt', data: 'D' }]);
    assert.deepEqual(rel.map((r) => r.path).sort(), ['/home/user/relmulti/c.txt', '/home/user/relmulti/d.txt'], 'home-relative');
    assert.equal(await sbx.files.read('/home/user/relmulti/d.txt'), 'D');
    // A new directory under / (E2B's write test writes /0/...): made as
    // E2B's envd makes it, then the user's.
    const top = await sbx.files.write([{ path: '/0/multi_test_file0.txt', data: 'zero' }, { path: '/home/user/m1.txt', data: 'one' }]);
    assert.equal(top.length, 2);
    assert.equal(await sbx.files.read('/0/multi_test_file0.txt'), 'zero');
    assert.equal((await sbx.commands.run('stat -c %U:%G /0 /0/multi_test_file0.txt')).stdout, 'user:user\nuser:user\n');
    assert.equal(await sbx.files.makeDir('/kiln-top/inner'), true);
    assert.equal((await sbx.commands.run('stat -c %U /kiln-top /kiln-top/inner')).stdout, 'user\nuser\n');
  });

  await check('files.makeDir (true, then false when it exists) and files.list (depth 1 and 2)', async () => {
    assert.equal(await sbx.files.makeDir('/home/user/d/sub'), true);
    assert.equal(await sbx.files.makeDir('/home/user/d/sub'), false);
    const l = await sbx.files.list('/home/user/d');
    assert.deepEqual(l.map((e) => `${e.name}:${e.type}:${e.path}`), ['sub:dir:/home/user/d/sub']);
    const m = await sbx.files.list('/home/user/multi', { depth: 2 });
    assert.deepEqual(m.map((e) => e.path).sort(),
      ['/home/user/multi/a.txt', '/home/user/multi/deeper', '/home/user/multi/deeper/b.txt']);
    const one = await sbx.files.list('/home/user/multi');
    assert.deepEqual(one.map((e) => e.name).sort(), ['a.txt', 'deeper']);
  });

  await check('files.rename, files.exists, files.getInfo', async () => {
    const e = await sbx.files.rename('/home/user/hello.txt', '/home/user/d/renamed.txt');
    assert.equal(e.path, '/home/user/d/renamed.txt');
    assert.equal(e.name, 'renamed.txt');
    assert.equal(await sbx.files.exists('/home/user/hello.txt'), false);
    assert.equal(await sbx.files.exists('/home/user/d/renamed.txt'), true);
    const i = await sbx.files.getInfo('/home/user/d/renamed.txt');
    assert.equal(i.type, 'file');
    assert.equal(i.size, 11);
    assert.equal(i.owner, 'user');
    assert.match(i.permissions, /^-rw/);
    assert.ok(i.modifiedTime instanceof Date && Math.abs(Date.now() - i.modifiedTime.getTime()) < 3600_000,
      `modifiedTime ${i.modifiedTime}`);
    const d = await sbx.files.getInfo('/home/user/d');
    assert.equal(d.type, 'dir');
    assert.match(d.permissions, /^d/);
    return `${i.permissions} ${i.owner}:${i.group} mode ${i.mode.toString(8)}`;
  });

  await check('files.watchDir: create, write, rename, remove in order, names relative to the directory; stop() ends it', async () => {
    await sbx.files.makeDir('/home/user/watched');
    const seen = [];
    const h = await sbx.files.watchDir('/home/user/watched', (ev) => { seen.push(`${ev.type} ${ev.name}`); });
    await sbx.commands.run('cd /home/user/watched && echo a > f1 && mv f1 f2 && rm f2');
    await waitFor(() => seen.includes('remove f2'), 20000, `the remove event (seen: ${seen})`);
    assert.deepEqual(seen, ['create f1', 'write f1', 'rename f1', 'create f2', 'remove f2']);
    await h.stop();
    const n = seen.length;
    await sbx.commands.run('touch /home/user/watched/after-stop');
    await sleep(1000);
    assert.deepEqual(seen.slice(n), [], 'events after stop()');
    return seen.join(', ');
  }, 60000);
  await check('files.watchDir recursive: a directory made later is watched; a missing path raises FileNotFoundError', async () => {
    const seen = [];
    const h = await sbx.files.watchDir('/home/user/watched', (ev) => { seen.push(`${ev.type} ${ev.name}`); },
      { recursive: true });
    await sbx.commands.run('mkdir /home/user/watched/sub && sleep 0.5 && echo x > /home/user/watched/sub/inner');
    await waitFor(() => seen.includes('write sub/inner'), 20000, `sub/inner written (seen: ${seen})`);
    await h.stop();
    assert.deepEqual(seen, ['create sub', 'create sub/inner', 'write sub/inner']);
    await rejects(() => sbx.files.watchDir('/home/user/no-such-dir', () => {}), FileNotFoundError);
    // files.write writes in place, as E2B's envd: a new file is CREATE +
    // WRITE of its own name, an overwrite WRITE (E2B's watch test waits
    // for that WRITE), never a temporary name.
    const seen2 = [];
    const h2 = await sbx.files.watchDir('/home/user/watched', (ev) => { seen2.push(`${ev.type} ${ev.name}`); });
    await sbx.files.write('/home/user/watched/w.txt', 'one');
    await sbx.files.write('/home/user/watched/w.txt', 'two');
    await sbx.files.write('/home/user/watched/end', '');
    await waitFor(() => seen2.includes('create end'), 20000, `the last file (seen: ${seen2})`);
    await h2.stop();
    const ws = seen2.filter((x) => !x.startsWith('chmod'));
    assert.ok(ws.every((x) => / (w\.txt|end)$/.test(x)), `only the files' own names: ${seen2}`);
    assert.equal(ws[0], 'create w.txt');
    assert.ok(ws.filter((x) => x === 'write w.txt').length >= 2, `a write event per write: ${seen2}`);
    assert.equal(await sbx.files.read('/home/user/watched/w.txt'), 'two');
    return `${seen.join(', ')}; ${seen2.join(', ')}`;
  }, 60000);
  await check('files.remove of a file and of a directory tree', async () => {
    await sbx.files.remove('/home/user/d/renamed.txt');
    assert.equal(await sbx.files.exists('/home/user/d/renamed.txt'), false);
    await sbx.files.remove('/home/user/d');
    assert.equal(await sbx.files.exists('/home/user/d'), false);
  });

  await check('a missing file: read and getInfo raise FileNotFoundError', async () => {
    await rejects(() => sbx.files.read('/home/user/no-such-file'), FileNotFoundError);
    await rejects(() => sbx.files.getInfo('/home/user/no-such-file'), FileNotFoundError);
  });

  await check("files as root: written with user 'root', unreadable for 'user'", async () => {
    await sbx.files.write('/root/secret.txt', 'root only', { user: 'root' });
    const i = await sbx.files.getInfo('/root/secret.txt', { user: 'root' });
    assert.equal(i.owner, 'root');
    assert.equal(await sbx.files.read('/root/secret.txt', { user: 'root' }), 'root only');
    const e = await rejects(() => sbx.files.read('/root/secret.txt'), SandboxError);
    return `as user: ${errText(e)}`;
  });

  await check('git (through commands.run): init, status', async () => {
    await sbx.git.init('/home/user/repo', { initialBranch: 'main' });
    await sbx.files.write('/home/user/repo/a.txt', 'a');
    const st = JSON.stringify(await sbx.git.status('/home/user/repo'));
    assert.ok(st.includes('a.txt') && st.includes('main'), st);
    return st.slice(0, 120);
  });

  // ---- the sandbox ----
  await check('getInfo: running, its metadata; isRunning', async () => {
    const i = await sbx.getInfo();
    assert.equal(i.sandboxId, id);
    assert.equal(i.state, 'running');
    assert.equal(i.metadata.kilntest, RUN);
    assert.ok(i.startedAt <= new Date() && i.endAt > new Date(), `startedAt ${i.startedAt} endAt ${i.endAt}`);
    assert.equal(await sbx.isRunning(), true);
    return `template ${i.templateId}, envd ${i.envdVersion}, ${i.cpuCount} vCPU ${i.memoryMB} MiB`;
  });

  await check('setTimeout moves endAt', async () => {
    await sbx.setTimeout(1_200_000);
    const i = await sbx.getInfo();
    const left = (i.endAt.getTime() - Date.now()) / 1000;
    assert.ok(left > 1100 && left <= 1260, `endAt is ${Math.round(left)} s away, want ~1200`);
    return `${Math.round(left)} s left`;
  });

  await check("E2B's timeout tests: shortened, it is not running after its end (isRunning false); shortened then lengthened, it runs", async () => {
    const [a, b] = await Promise.all([Sandbox.create({ timeoutMs: 120_000 }), Sandbox.create({ timeoutMs: 120_000 })]);
    try {
      await Promise.all([a.setTimeout(5000), b.setTimeout(5000)]);
      await new Promise((r) => setTimeout(r, 1000));
      await b.setTimeout(10_000);
      await new Promise((r) => setTimeout(r, 5500));
      assert.equal(await a.isRunning({ requestTimeoutMs: 1000 }), false, 'shortened: still running after its end');
      assert.equal(await b.isRunning(), true, 'lengthened: not running');
      const e = await a.commands.run('true').then(() => null, (x) => x);
      assert.ok(e instanceof sdk.TimeoutError || e instanceof SandboxNotFoundError, `a command after the end: ${e}`);
      assert.ok((await b.getInfo()).endAt instanceof Date);
    } finally {
      await Promise.all([a.kill().catch(() => {}), b.kill().catch(() => {})]);
    }
  }, 60_000);

  await check('getMetrics: CPU and memory measured by the host', async () => {
    const m = await sbx.getMetrics();
    assert.ok(Array.isArray(m) && m.length >= 1, `metrics: ${JSON.stringify(m)}`);
    const x = m[m.length - 1];
    assert.ok(x.cpuCount >= 1 && x.memTotal > 0 && x.memUsed > 0 && x.memUsed <= x.memTotal, JSON.stringify(x));
    return `cpu ${x.cpuUsedPct}% of ${x.cpuCount}, mem ${x.memUsed}/${x.memTotal}, disk ${x.diskUsed}/${x.diskTotal}`;
  });

  await check('Sandbox.list sees it (also filtered by its metadata)', async () => {
    const all = await listAll();
    const mine = all.find((s) => s.sandboxId === id);
    assert.ok(mine, `${id} not in ${JSON.stringify(all.map((s) => s.sandboxId))}`);
    assert.equal(mine.state, 'running');
    const f = await listAll({ query: { metadata: { kilntest: RUN } } });
    assert.deepEqual(f.map((s) => s.sandboxId), [id]);
    const none = await listAll({ query: { metadata: { kilntest: `${RUN}-other` } } });
    assert.equal(none.length, 0);
    return `${all.length} listed`;
  });

  await check('Sandbox.connect to the running sandbox; its commands.connect attaches to a command the first client started', async () => {
    const h = await sbx.commands.run('for i in 1 2 3; do sleep 0.7; echo tick$i; done; exit 3', { background: true, timeoutMs: 0 });
    const again = await Sandbox.connect(id);
    assert.equal((await again.commands.run('echo via-connect')).stdout, 'via-connect\n');
    assert.ok((await again.commands.list()).some((p) => p.pid === h.pid), 'the command is listed for the new client');
    let out = '';
    const c = await again.commands.connect(h.pid, { onStdout: (d) => { out += d; } });
    const r = await c.wait().then(() => null, (e) => e);
    assert.equal(r && r.exitCode, 3, `wait(): ${r}`);
    assert.match(out, /tick3\n$/);
    await h.disconnect();
  });

  // ---- another customer, wrong keys and tokens ----
  if (OTHER_KEY) {
    await check("another customer's key can neither list, get, connect to nor kill it", async () => {
      const theirs = await listAll({ apiKey: OTHER_KEY });
      assert.ok(!theirs.some((s) => s.sandboxId === id), 'listed for the other customer');
      await rejects(() => Sandbox.getInfo(id, { apiKey: OTHER_KEY }), SandboxNotFoundError);
      await rejects(() => Sandbox.connect(id, { apiKey: OTHER_KEY }), SandboxNotFoundError);
      assert.equal(await Sandbox.kill(id, { apiKey: OTHER_KEY }), false);
      await rejects(() => Sandbox.setTimeout(id, 1000, { apiKey: OTHER_KEY }), SandboxNotFoundError);
      assert.equal(await Sandbox.pause(id, { apiKey: OTHER_KEY }).catch((e) => errName(e)), 'SandboxNotFoundError');
      assert.equal((await sbx.getInfo()).state, 'running', 'the sandbox is untouched');
    });
  } else {
    skip("another customer's key can neither list, get, connect to nor kill it", 'E2B_TEST_OTHER_KEY is not set');
  }

  await check('envd with a wrong access token: AuthenticationError (commands, files)', async () => {
    const info = await sbx.getInfo();
    const forged = new Sandbox({ sandboxId: id, envdVersion: info.envdVersion, envdAccessToken: 'f'.repeat(64) });
    await rejects(() => forged.commands.run('echo no'), AuthenticationError);
    await rejects(() => forged.files.read('/home/user/big.bin'), AuthenticationError);
    await rejects(() => forged.files.write('/home/user/forged.txt', 'x'), AuthenticationError);
    const tokenless = new Sandbox({ sandboxId: id, envdVersion: info.envdVersion });
    await rejects(() => tokenless.commands.list(), AuthenticationError);
    assert.equal(await sbx.files.exists('/home/user/forged.txt'), false);
  });

  await check('a wrong API key: AuthenticationError (create, list, connect)', async () => {
    const bad = { apiKey: `kiln_${'0'.repeat(8)}_${'0'.repeat(40)}` };
    await rejects(() => Sandbox.create(bad), AuthenticationError);
    await rejects(() => Sandbox.list(bad).nextItems(), AuthenticationError);
    await rejects(() => Sandbox.connect(id, bad), AuthenticationError);
  });

  await check('an unknown template: create fails with an SDK error', async () =>
    sdkFailure(() => Sandbox.create('no-such-template-kiln-test'), 'Sandbox.create(unknown template)'));

  // ---- what kiln does not support: a clean SDK error, never a hang ----
  // ---- named snapshots and fork (docs/e2b.md "Fork and snapshots") ----
  await check('createSnapshot, listSnapshots, Sandbox.create(snapshotId) with its file, deleteSnapshot', async () => {
    await sbx.files.write('/home/user/snap.txt', `snap-${RUN}`);
    const name = `kiln-${RUN}`;
    const snap = await sbx.createSnapshot({ name });
    assert.match(snap.snapshotId, /^snap_[0-9a-f]{24}$/);
    assert.deepEqual(snap.names, [name]);
    const listed = await Sandbox.listSnapshots({ sandboxId: id }).nextItems();
    assert.ok(listed.some((s) => s.snapshotId === snap.snapshotId), `listSnapshots: ${JSON.stringify(listed)}`);
    const child = await Sandbox.create(snap.snapshotId, { timeoutMs: 120_000 });
    try {
      assert.equal(await child.files.read('/home/user/snap.txt'), `snap-${RUN}`);
      await child.files.write('/home/user/snap.txt', 'child');
      assert.equal(await sbx.files.read('/home/user/snap.txt'), `snap-${RUN}`, "the parent does not see the child's change");
    } finally {
      await child.kill().catch(() => {});
    }
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true, 'deleteSnapshot');
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'deleteSnapshot again');
    assert.equal(await Sandbox.deleteSnapshot('no-such-snapshot'), false, 'deleteSnapshot of nothing');
    return `${snap.snapshotId}, ${child.sandboxId}`;
  }, 300_000);
  await check('fork: a Sandbox with the parent\'s files; updateNetwork on a sandbox without internet access is a 409', async () => {
    const [kid] = await sbx.fork({ count: 1, timeoutMs: 120_000 });
    assert.ok(kid instanceof Sandbox, `fork gave ${errText(kid)}`);
    try {
      assert.equal(await kid.files.read('/home/user/snap.txt'), `snap-${RUN}`);
      assert.equal((await kid.commands.run('echo forked')).stdout, 'forked\n');
    } finally {
      await kid.kill().catch(() => {});
    }
    assert.equal((await sbx.commands.run('echo parent')).stdout, 'parent\n', 'the parent goes on');
    // This stack's host offers no egress, so sbx has no network device to
    // change (64-egress-update.sh updates one through /e2b with curl).
    const b = await sdkFailure(() => sbx.updateNetwork({ allowOut: ['0.0.0.0/0'] }), 'sandbox.updateNetwork');
    assert.ok(/409/.test(b) && /no network device/.test(b), `updateNetwork raised ${b}`);
    return `${kid.sandboxId}; ${b}`;
  }, 300_000);
  await check("unsupported: an MCP gateway cannot start: the SDK's own 'Failed to start MCP gateway' and the sandbox is killed", async () => {
    const before = new Set((await listAll()).map((s) => s.sandboxId));
    const e = await Sandbox.create({ mcp: { exa: {} } }).then((s) => { s.kill(); return null; }, (x) => x);
    assert.ok(e instanceof SandboxError, `create with mcp: ${e}`);
    assert.match(e.message, /^Failed to start MCP gateway: kiln: MCP gateways are not supported/);
    raised.push(`Sandbox.create({mcp}): ${errName(e)} ${e.message.split('\n')[0]}`);
    const left = (await listAll()).filter((s) => !before.has(s.sandboxId));
    assert.deepEqual(left.map((s) => s.sandboxId), [], 'the SDK killed the sandbox it made');
  }, 60000);
  // ---- volumes (docs/e2b.md "Volumes"): one writer at a time ----
  await check('Volume.create, list, getInfo; Sandbox.create({volumeMounts}) keeps a synced file for the next sandbox; a second writer and Volume.destroy while mounted raise; Volume.destroy', async () => {
    const vol = await Volume.create(`kiln-${RUN}`);
    assert.match(vol.volumeId, /^vol_[0-9a-f]{24}$/);
    const listed = await Volume.list();
    assert.ok(listed.some((v) => v.volumeId === vol.volumeId && v.name === vol.name), `Volume.list: ${JSON.stringify(listed)}`);
    assert.equal((await Volume.getInfo(vol.volumeId)).name, vol.name);
    const a = await Sandbox.create({ volumeMounts: { '/home/user/vol': vol }, timeoutMs: 120_000 });
    try {
      assert.deepEqual((await a.getInfo()).volumeMounts, [{ name: vol.name, path: '/home/user/vol' }]);
      await a.commands.run(`echo vol-${RUN} > /home/user/vol/f && sync`);
      const w = await sdkFailure(() => Sandbox.create({ volumeMounts: { '/v': vol.name }, timeoutMs: 60_000 }), 'a second writer');
      assert.ok(/409/.test(w), `a second writer raised ${w}`);
      const d = await sdkFailure(() => Volume.destroy(vol.volumeId), 'Volume.destroy while mounted');
      assert.ok(/409/.test(d), `Volume.destroy while mounted raised ${d}`);
    } finally {
      await a.kill().catch(() => {});
    }
    const b = await Sandbox.create({ volumeMounts: { '/data': vol.name }, timeoutMs: 120_000 });
    try {
      assert.equal((await b.commands.run('cat /data/f')).stdout, `vol-${RUN}\n`, 'the next sandbox reads the file');
    } finally {
      await b.kill().catch(() => {});
    }
    assert.equal(await Volume.destroy(vol.volumeId), true, 'Volume.destroy');
    assert.equal(await Volume.destroy(vol.volumeId), false, 'Volume.destroy again');
    return `${vol.volumeId}, ${a.sandboxId}, ${b.sandboxId}`;
  }, 300_000);
  await check('with E2B_SANDBOX_URL, downloadUrl gives a URL on it that names no sandbox: refused (signed URLs need E2B_DOMAIN)', async () => {
    const url = await sbx.downloadUrl('/home/user/big.bin');
    const res = await fetch(url);
    await res.arrayBuffer();
    assert.ok(!res.ok, `GET ${url}: ${res.status}`);
    raised.push(`downloadUrl: fetching it gives HTTP ${res.status}`);
    return `HTTP ${res.status}`;
  }, 30000);
  await check('unsupported: Template.build / Secret.create fail cleanly', async () => {
    const a = await sdkFailure(() => Template.build(Template().fromImage('debian:bookworm'), `kiln-${process.pid}`),
      'Template.build');
    const b = await sdkFailure(() => Secret.create(`kiln-${process.pid}`, 'value'), 'Secret.create');
    return `${a}; ${b}`;
  }, 60000);
  await check('Template.exists answers false (kiln templates are not in E2B\'s template API)', async () => {
    const v = await Template.exists('default').catch((e) => errText(e));
    raised.push(`Template.exists('default'): ${JSON.stringify(v)}`);
    assert.notEqual(v, true);
    return JSON.stringify(v);
  }, 30000);

  // ---- pause and resume ----
  let bg;
  await check('pause: a running background process and a file, then paused (state, isRunning false, calls fail)', async () => {
    bg = await sbx.commands.run('while read -r l; do echo "echo:$l"; done', { background: true, stdin: true });
    bg.wait().catch(() => {}); // its stream ends with the pause
    await sbx.files.write('/home/user/persist.txt', `kept-${RUN}`);
    assert.equal(await sbx.pause(), true);
    const i = await sbx.getInfo();
    assert.equal(i.state, 'paused');
    const listed = (await listAll()).find((s) => s.sandboxId === id);
    assert.equal(listed && listed.state, 'paused', 'Sandbox.list shows it paused');
    assert.equal(await sbx.isRunning(), false);
    const e1 = await sdkFailure(() => sbx.commands.run('echo no'), 'commands.run on a paused sandbox');
    const e2 = await sdkFailure(() => sbx.files.read('/home/user/persist.txt'), 'files.read on a paused sandbox');
    assert.equal(await sbx.pause(), false, 'pausing it again: false (409)');
    return `${e1}; ${e2}`;
  }, 300_000);

  await check('Sandbox.connect resumes it: the file and the background process are there', async () => {
    const t = performance.now();
    const again = await Sandbox.connect(id, { timeoutMs: 900_000 });
    const took = Math.round(performance.now() - t);
    assert.equal((await again.getInfo()).state, 'running');
    assert.equal(await again.files.read('/home/user/persist.txt'), `kept-${RUN}`);
    const list = await again.commands.list();
    assert.ok(list.some((p) => p.pid === bg.pid), `pid ${bg.pid} not listed after resume: ${JSON.stringify(list)}`);
    let out = '';
    const c = await again.commands.connect(bg.pid, { onStdout: (d) => { out += d; } });
    await again.commands.sendStdin(bg.pid, 'after-resume\n');
    await waitFor(() => out.includes('echo:after-resume\n'), 10000, 'the resumed process answering');
    await again.commands.kill(bg.pid);
    await c.wait().catch(() => {});
    assert.equal((await sbx.commands.run('echo old-object-works')).stdout, 'old-object-works\n');
    return `resumed in ${took} ms`;
  }, 300_000);

  // ---- kill ----
  await check('kill, then every call fails cleanly with an SDK error (no hang); a running command ends as E2B says', async () => {
    const running = await sbx.commands.run('sleep 60', { background: true, timeoutMs: 0 });
    assert.equal(await sbx.kill(), true);
    const errs = [];
    const waited = await running.wait().then(() => null, (e) => e);
    assert.ok(waited instanceof SandboxError, `wait() after kill: ${waited}`);
    assert.match(waited.message, /sandbox was killed or reached its end of life/);
    errs.push(await sdkFailure(() => sbx.commands.run('echo hi'), 'commands.run after kill'));
    errs.push(await sdkFailure(() => sbx.files.read('/home/user/persist.txt'), 'files.read after kill'));
    errs.push(await sdkFailure(() => sbx.files.write('/home/user/x', 'x'), 'files.write after kill'));
    errs.push(await sdkFailure(() => sbx.commands.list(), 'commands.list after kill'));
    await rejects(() => Sandbox.getInfo(id), SandboxNotFoundError);
    await rejects(() => Sandbox.connect(id), SandboxNotFoundError);
    assert.equal(await Sandbox.kill(id), false, 'killing it again: false');
    assert.ok(!(await listAll()).some((s) => s.sandboxId === id), 'still listed');
    return errs.join('; ');
  }, 120_000);
  sbx = null;
} finally {
  if (sbx) await sbx.kill().catch(() => {});
}

for (const r of raised) console.log(`# raised: ${r}`);
console.log(`sdk_test: ${counts.pass} passed, ${counts.fail} failed, ${counts.skip} skipped`);
process.exit(counts.fail ? 1 : 0);
