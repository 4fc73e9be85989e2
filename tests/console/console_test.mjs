// Drives kiln's web console (/ui) in Debian's headless Chromium with
// playwright-core (pinned in package-lock.json, installed by
// scripts/console-deps.sh; KILN_CONSOLE_DEPS is its node_modules). Run by
// tests/integration/96-console.sh against a real stack. Prints one line per
// check: "PASS what", "FAIL what: why"; the last line "console_test: N
// passed, M failed". Asserts on the DOM; takes no screenshots. Every run
// prints the same 26 checks (96-web-console.sh expects exactly that many).
//   env: KILN_URL, KILN_KEY (customer acme), KILN_ADMIN_KEY, KILN_CONSOLE_DEPS
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.KILN_CONSOLE_DEPS, 'x.js'));
const { chromium } = require('playwright-core');

const URL0 = process.env.KILN_URL;
const KEY = process.env.KILN_KEY;
const ADMIN = process.env.KILN_ADMIN_KEY;
let passed = 0, failed = 0;

function pass(what) { passed++; console.log('PASS ' + what); }
function fail(what, why) { failed++; console.log('FAIL ' + what + ': ' + String(why).replace(/\s+/g, ' ').slice(0, 400)); }
async function check(what, fn) {
	try {
		const r = await fn();
		if (r === false)
			fail(what, 'assertion false');
		else
			pass(what + (typeof r === 'string' ? ' (' + r + ')' : ''));
	} catch (e) {
		fail(what, e && e.stack ? e.message : e);
	}
}
function assert(c, msg) { if (!c) throw new Error(msg); }
// The console errors a page must not have: all but Chromium's own report of
// an HTTP error answer the page asked for and handles (a wrong key's 401).
const badConsole = (w) => w.consoleErrors.filter((m) => !/^Failed to load resource: the server responded with a status of 4\d\d/.test(m));
// Nothing went wrong on a watched page: its dialogs, page errors, CSP
// violations and console errors (but for the HTTP errors it handles) are all empty.
function assertClean(w) {
	assert(!w.dialogs.length && !w.errors.length && !w.csp.length && !badConsole(w).length,
		JSON.stringify({ ...w, consoleErrors: badConsole(w) }));
	const n = w.consoleErrors.length;
	return n ? n + ' console error(s), each an HTTP error answer it handles' : 'no console error';
}

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true,
	args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });

// One watched page: dialogs, page errors, CSP violations and console errors
// are recorded (and must stay empty: assertClean).
async function newPage() {
	const ctx = await browser.newContext({ acceptDownloads: true });
	const page = await ctx.newPage();
	const w = { dialogs: [], errors: [], csp: [], consoleErrors: [] };
	page.on('dialog', (d) => { w.dialogs.push(d.message()); d.dismiss().catch(() => {}); });
	page.on('pageerror', (e) => w.errors.push(e.message));
	page.on('console', (m) => {
		if (m.type() === 'error')
			w.consoleErrors.push(m.text());
	});
	await page.exposeFunction('__kilnCsp', (v) => w.csp.push(v));
	await page.addInitScript(() => {
		document.addEventListener('securitypolicyviolation', (e) => window.__kilnCsp(e.violatedDirective + ' ' + e.blockedURI));
	});
	return { ctx, page, w };
}

async function signIn(page, key) {
	await page.goto(URL0 + '/ui/');
	await page.fill('#key', key);
	await page.click('#signin');
}

const text = (page, sel) => page.locator(sel).textContent();

try {
	// ---- a wrong key ----
	{
		const { ctx, page, w } = await newPage();
		await check('the page loads from kiln-api with its CSP', async () => {
			const r = await page.goto(URL0 + '/ui/');
			const csp = r.headers()['content-security-policy'] || '';
			assert(r.status() === 200, 'status ' + r.status());
			assert(csp.includes("default-src 'self'") && csp.includes("frame-ancestors 'none'"), 'CSP: ' + csp);
			assert(await page.locator('#signin-form').isVisible(), 'no sign-in form');
			return csp;
		});
		await check('a wrong key: a clear error, no key kept, still signed out', async () => {
			await signIn(page, 'kiln_nosuchkey_' + 'x'.repeat(40));
			await page.waitForFunction(() => document.getElementById('signin-error').textContent.length > 0, null, { timeout: 15000 });
			const msg = await text(page, '#signin-error');
			assert(/unknown or revoked API key/.test(msg), 'message: ' + msg);
			assert(await page.evaluate(() => sessionStorage.getItem('kiln.key')) === null, 'key kept in sessionStorage');
			assert(await page.locator('#app-view').isHidden(), 'app view shown');
			return msg;
		});
		await check('the wrong-key page: no page error, dialog, console error or CSP violation', async () => {
			return assertClean(w);
		});
		await ctx.close();
	}

	// ---- a customer: sign in, submit, stream, download, XSS ----
	{
		const { ctx, page, w } = await newPage();
		await check('sign in with a customer key: the key is in sessionStorage, not in the URL', async () => {
			await signIn(page, KEY);
			await page.waitForSelector('#nav button[data-view="tasks"]', { timeout: 15000 });
			const who = await text(page, '#who');
			assert(who.includes('customer acme'), 'who: ' + who);
			assert(await page.evaluate(() => sessionStorage.getItem('kiln.key')) === KEY, 'key not in sessionStorage');
			assert(!page.url().includes(KEY) && !page.url().includes('kiln_'), 'url: ' + page.url());
			assert(await page.evaluate(() => localStorage.length) === 0, 'something in localStorage');
			return who;
		});

		let taskId;
		await check('submit a task from the page: its detail opens', async () => {
			await page.click('#nav button[data-view="submit"]');
			await page.selectOption('#submit-language', 'python');
			await page.fill('#submit-code', [
				'import time',
				'for i in range(6):',
				'    print("console line", i, flush=True)',
				'    time.sleep(1)',
				'open("/output/result.txt", "w").write("console-output-42\\n")',
			].join('\n'));
			await page.click('#submit-go');
			await page.waitForSelector('#task-id', { timeout: 15000 });
			taskId = await text(page, '#task-id');
			assert(/^t_/.test(taskId), 'task id ' + taskId);
			return taskId;
		});
		await check('its stdout streams in while it runs', async () => {
			await page.waitForFunction(() => document.getElementById('task-stdout').textContent.includes('console line 0'), null, { timeout: 180000 });
			const st = await page.locator('#task-state [data-state]').getAttribute('data-state');
			const out = await text(page, '#task-stdout');
			assert(!out.includes('console line 5'), 'the whole output came at once: ' + out);
			assert(st === 'running' || st === 'starting', 'state when the first line showed: ' + st);
			return 'first line shown in state ' + st;
		});
		await check('the task ends succeeded with all its lines, timings and exit code', async () => {
			await page.waitForFunction(() => {
				const s = document.querySelector('#task-state [data-state]');
				return s && s.dataset.state === 'succeeded' && document.querySelector('#task-outputs a');
			}, null, { timeout: 120000 });
			const out = await text(page, '#task-stdout');
			for (let i = 0; i < 6; i++)
				assert(out.includes('console line ' + i), 'line ' + i + ' missing: ' + out);
			const tm = await text(page, '#task-timings');
			assert(/total \d/.test(tm), 'timings: ' + tm);
			assert((await text(page, '#task-exit')) === '0', 'exit code');
			return tm.trim();
		});
		await check('download an output through its link', async () => {
			const a = page.locator('#task-outputs a[data-output="result.txt"]');
			const href = await a.getAttribute('href');
			assert(/^https?:\/\//.test(href), 'href ' + href);
			const r = await ctx.request.get(href);
			const body = await r.text();
			assert(r.status() === 200 && body === 'console-output-42\n', 'status ' + r.status() + ' body ' + JSON.stringify(body));
			return 'HTTP 200, ' + body.length + ' bytes';
		});
		await check('the task list shows it', async () => {
			await page.click('#nav button[data-view="tasks"]');
			await page.waitForSelector(`#task-rows tr[data-task="${taskId}"]`, { timeout: 10000 });
			const st = await page.locator(`#task-rows tr[data-task="${taskId}"] [data-state]`).getAttribute('data-state');
			assert(st === 'succeeded', 'state ' + st);
		});

		// XSS: output, stderr and metadata that look like HTML
		const evil = ['<script>window.__xss = 1</script>', '<img src=x onerror="window.__xss = 2">',
			'<svg onload="window.__xss = 3"></svg>', '"><iframe src="javascript:window.__xss=4"></iframe>'];
		let xssId;
		await check('an XSS task: submitted through the API with HTML in its metadata', async () => {
			const code = evil.map((e) => `print(${JSON.stringify(e)})`).join('\n') + `\nimport sys\nprint(${JSON.stringify(evil[1])}, file=sys.stderr)`;
			const r = await fetch(URL0 + '/v1/tasks', { method: 'POST', headers: { Authorization: 'Bearer ' + KEY, 'Content-Type': 'application/json' },
				body: JSON.stringify({ language: 'python', code, metadata: { note: evil[1], name: evil[0] } }) });
			const j = await r.json();
			assert(r.status === 202, 'status ' + r.status + ' ' + JSON.stringify(j));
			xssId = j.id;
			return xssId;
		});
		await check('the XSS task\'s output and metadata show as characters, and nothing ran', async () => {
			await page.click('#nav button[data-view="tasks"]');
			await page.waitForSelector(`#task-rows tr[data-task="${xssId}"]`, { timeout: 10000 });
			const row = await page.locator(`#task-rows tr[data-task="${xssId}"]`).textContent();
			assert(row.includes('<img src=x onerror=') && row.includes('<script>'), 'list row: ' + row);
			await page.click(`#task-rows tr[data-task="${xssId}"]`);
			await page.waitForFunction(() => {
				const s = document.querySelector('#task-state [data-state]');
				return s && s.dataset.state === 'succeeded';
			}, null, { timeout: 180000 });
			await page.waitForFunction((e) => document.getElementById('task-stdout').textContent.includes(e), evil[3], { timeout: 10000 });
			const out = await text(page, '#task-stdout');
			for (const e of evil)
				assert(out.includes(e), 'stdout lacks ' + e + ': ' + out);
			assert((await text(page, '#task-stderr')).includes(evil[1]), 'stderr');
			const md = await text(page, '#task-metadata');
			assert(md.includes(evil[0]) && md.includes('<img src=x onerror='), 'metadata: ' + md);
			const n = await page.evaluate(() => document.querySelectorAll('main img, main script, main iframe, main svg:not(.chart)').length);
			assert(n === 0, n + ' elements made from the output');
			assert(await page.evaluate(() => window.__xss) === undefined, 'window.__xss is set');
			return 'stdout shows ' + evil.length + ' HTML-looking lines as text';
		});
		await check('the customer\'s page: no dialog, page error, console error or CSP violation', async () => {
			await page.waitForTimeout(500);
			return assertClean(w);
		});
		await check('usage against quotas shows with a chart', async () => {
			await page.click('#nav button[data-view="usage"]');
			await page.waitForSelector('#usage-cards [data-card="running"]', { timeout: 10000 });
			await page.waitForSelector('#usage-chart svg polyline', { state: 'attached', timeout: 10000 });
			return (await text(page, '#usage-cards [data-card="running"]')).trim();
		});
		await check('templates list', async () => {
			await page.click('#nav button[data-view="templates"]');
			await page.waitForSelector('#template-rows', { timeout: 10000 });
			await page.waitForTimeout(500);
			return (await page.locator('#template-rows tr').count()) + ' templates';
		});
		// a session: create, exec, files, pause, resume, destroy
		const sessState = async (want, ms) => {
			await page.waitForFunction((w) => {
				const s = document.querySelector('#session-state [data-state]');
				return s && s.dataset.state === w;
			}, want, { timeout: ms });
		};
		await check('a session from the page: created and running', async () => {
			await page.click('#nav button[data-view="sessions"]');
			await page.click('#session-create');
			await page.waitForSelector('#session-id', { timeout: 120000 });
			await sessState('running', 30000);
			return await text(page, '#session-id');
		});
		await check('exec in it: HTML-looking output shows as text', async () => {
			await page.fill('#exec-code', 'open("/work/a <b>.txt", "w").write("x")\nprint("<b>bold</b><img src=x onerror=window.__xss=5>")');
			await page.click('#exec-go');
			await page.waitForFunction(() => document.getElementById('exec-out').textContent.includes('<b>bold</b>'), null, { timeout: 60000 })
				.catch(async (e) => { throw new Error(e.message + ' stderr: ' + await text(page, '#exec-err') + ' status: ' + await text(page, '#app-view [role=alert]')); });
			assert(await page.evaluate(() => document.querySelectorAll('main b, main img').length) === 0, 'elements made');
			assert(await page.evaluate(() => window.__xss) === undefined, 'window.__xss set');
		});
		await check('its files: a name with markup listed as text', async () => {
			await page.fill('#files-dir', '/work');
			await page.click('#files-go');
			await page.waitForFunction(() => document.getElementById('file-rows').textContent.includes('a <b>.txt'), null, { timeout: 30000 });
		});
		await check('pause, resume and destroy from the page', async () => {
			await page.click('button[data-action="pause"]');
			await sessState('paused', 120000);
			await page.click('button[data-action="resume"]');
			await sessState('running', 120000);
			await page.click('button[data-action="destroy"]');
			await sessState('destroyed', 60000);
		});
		await check('the session pages: no dialog, page error, console error or CSP violation', async () => {
			return assertClean(w);
		});
		await ctx.close();
	}

	// ---- an operator ----
	{
		const { ctx, page, w } = await newPage();
		await check('sign in with the admin key: hosts with capacity and pool', async () => {
			await signIn(page, ADMIN);
			await page.waitForSelector('#host-rows tr[data-host="h1"]', { timeout: 15000 });
			assert((await text(page, '#who')).includes('operator'), 'who');
			const row = await page.locator('#host-rows tr[data-host="h1"]').textContent();
			assert(row.includes('live'), 'row ' + row);
			return row.replace(/\s+/g, ' ');
		});
		await check('cluster figures', async () => {
			await page.click('#nav button[data-view="cluster"]');
			await page.waitForSelector('#cluster-cards [data-card="live hosts"]', { timeout: 10000 });
			const c = await text(page, '#cluster-cards [data-card="live hosts"]');
			assert(/1/.test(c), c);
			await page.waitForSelector('#cluster-chart svg polyline', { state: 'attached', timeout: 10000 });
		});
		let newKey, newKeyId;
		await check('a customer with its quotas; a new key for it works', async () => {
			await page.click('#nav button[data-view="customers"]');
			await page.fill('#cust-id', 'acme');
			await page.click('#cust-show');
			await page.waitForSelector('#cust-quotas tr', { timeout: 10000 });
			await page.click('#key-create');
			await page.waitForSelector('#new-key', { timeout: 10000 });
			newKey = await text(page, '#new-key');
			newKeyId = await text(page, '#new-key-id');
			const r = await fetch(URL0 + '/v1/usage', { headers: { Authorization: 'Bearer ' + newKey } });
			assert(r.status === 200, 'new key: HTTP ' + r.status);
			return 'key id ' + newKeyId;
		});
		await check('the customer list and its keys, the new one active', async () => {
			await page.waitForSelector('#cust-rows tr[data-customer="acme"]', { state: 'attached', timeout: 10000 });
			await page.waitForSelector(`#key-rows tr[data-key="${newKeyId}"] [data-revoked="no"]`, { state: 'attached', timeout: 10000 });
			return (await page.locator('#key-rows tr').count()) + ' keys of acme';
		});
		await check('revoke that key from the page: it fails at once', async () => {
			await page.click(`#key-rows button[data-revoke="${newKeyId}"]`);
			await page.waitForFunction(() => document.getElementById('revoke-result').textContent.includes('revoked'), null, { timeout: 10000 });
			await page.waitForSelector(`#key-rows tr[data-key="${newKeyId}"] [data-revoked="yes"]`, { state: 'attached', timeout: 10000 });
			const r = await fetch(URL0 + '/v1/usage', { headers: { Authorization: 'Bearer ' + newKey } });
			assert(r.status === 401, 'revoked key: HTTP ' + r.status);
			return 'HTTP 401';
		});
		await check('the admin page: no dialog, page error, console error or CSP violation', async () => {
			return assertClean(w);
		});
		await ctx.close();
		// the revoked key on the sign-in page
		const p2 = await newPage();
		await check('the revoked key on the sign-in page: a clear error', async () => {
			await signIn(p2.page, newKey);
			await p2.page.waitForFunction(() => document.getElementById('signin-error').textContent.length > 0, null, { timeout: 15000 });
			const msg = await text(p2.page, '#signin-error');
			assert(/unknown or revoked/.test(msg), msg);
		});
		await p2.ctx.close();
	}
} catch (e) {
	fail('the console test ran to its end', e && e.stack || e);
} finally {
	await browser.close();
}
console.log(`console_test: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
