// Loads the unmodified E2B SDK from the node_modules directory that
// scripts/e2b-sdk.sh prints (KILN_E2B_SDK), so that nothing of it lives in
// the clone. Shared by tests/e2b/sdk_test.mjs and bench/e2b.mjs.
import { readFileSync } from 'node:fs';
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
