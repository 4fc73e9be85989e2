// Loads the unmodified E2B SDK from the node_modules directory that
// scripts/e2b-sdk.sh prints (KILN_E2B_SDK), so that nothing of it lives in
// the clone. Shared by tests/e2b/sdk_test.mjs and bench/e2b.mjs.
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

export async function loadSdk() {
  const dir = process.env.KILN_E2B_SDK;
  if (!dir) throw new Error('KILN_E2B_SDK is not set: run scripts/e2b-sdk.sh and pass the directory it prints');
  const pkg = JSON.parse(readFileSync(join(dir, 'e2b', 'package.json'), 'utf8'));
  const sdk = await import(pathToFileURL(join(dir, 'e2b', 'dist', 'index.mjs')).href);
  return { sdk, version: pkg.version };
}

// The variables an E2B script needs (envd at E2B_SANDBOX_URL, or by host
// name under E2B_DOMAIN as kiln up's credentials have it); anything else is
// the test's own.
export function requireEnv() {
  const missing = ['E2B_API_URL', 'E2B_API_KEY'].filter((k) => !process.env[k]);
  if (!process.env.E2B_SANDBOX_URL && !process.env.E2B_DOMAIN) missing.push('E2B_SANDBOX_URL or E2B_DOMAIN');
  if (missing.length) throw new Error(`set ${missing.join(', ')} (kiln up writes them into DIR/credentials)`);
}

// check(name, fn, ms): one PASS/FAIL line for fn (its answer, if any, in
// parentheses; a failure's message and stack), given up after ms; counted
// in counts {pass, fail}. Shared by the tests that print those lines.
export function checker(counts, defaultMs) {
  return async function check(name, fn, ms = defaultMs) {
    const t0 = performance.now();
    let timer;
    try {
      const detail = await Promise.race([
        Promise.resolve().then(fn),
        new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`no answer after ${ms / 1000} s`)), ms); }),
      ]);
      counts.pass++;
      console.log(`PASS ${name}${detail ? ` (${detail})` : ''} [${Math.round(performance.now() - t0)} ms]`);
    } catch (e) {
      counts.fail++;
      console.log(`FAIL ${name}: ${String(e && e.message).split('\n')[0].slice(0, 300)}`);
      for (const l of String((e && e.stack) || e).split('\n').slice(1, 6)) console.log(`    ${l}`);
    } finally {
      clearTimeout(timer);
    }
  };
}
