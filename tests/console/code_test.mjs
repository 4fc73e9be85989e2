// The web console's code results and task images (tests/integration/
// 102-console-code.sh, against `kiln up`): in Debian's headless Chromium with
// playwright-core (KILN_CONSOLE_DEPS, as console_test.mjs). A task of the
// template python-data that writes /output/plot.png shows its template in the
// list and the detail and the image inline; a session of the template
// code-interpreter runs a cell from the page: a matplotlib figure as an image
// that decoded, a DataFrame as a table, HTML only inside a frame whose sandbox
// attribute is empty, whose script did not run and whose document the console
// cannot reach (an opaque origin); the CSP header unchanged and no CSP
// violation. Prints "PASS what" / "FAIL what: why", then
// "code_test: N passed, M failed".
//   env: KILN_URL, KILN_KEY, KILN_CONSOLE_DEPS, TASK_ID, SESSION_ID
import { createRequire } from 'node:module';
import path from 'node:path';

const require = createRequire(path.join(process.env.KILN_CONSOLE_DEPS, 'x.js'));
const { chromium } = require('playwright-core');
const URL0 = process.env.KILN_URL, KEY = process.env.KILN_KEY;
const TASK = process.env.TASK_ID, SESSION = process.env.SESSION_ID;
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

const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', headless: true,
	args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'] });
try {
	const ctx = await browser.newContext();
	const page = await ctx.newPage();
	const w = { dialogs: [], errors: [], csp: [] };
	page.on('dialog', (d) => { w.dialogs.push(d.message()); d.dismiss().catch(() => {}); });
	page.on('pageerror', (e) => w.errors.push(e.message));
	await page.exposeFunction('__kilnCsp', (v) => w.csp.push(v));
	await page.addInitScript(() => {
		document.addEventListener('securitypolicyviolation', (e) => window.__kilnCsp(e.violatedDirective + ' ' + e.blockedURI));
	});
	let csp = '';
	await check('sign in; the console keeps its CSP', async () => {
		const r = await page.goto(URL0 + '/ui/');
		csp = r.headers()['content-security-policy'] || '';
		assert(csp === "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'", 'CSP: ' + csp);
		await page.fill('#key', KEY);
		await page.click('#signin');
		await page.waitForSelector('#nav button[data-view="tasks"]', { timeout: 15000 });
		return csp;
	});

	// ---- a task: its template, its PNG output inline ----
	await check('the task list shows the task\'s template', async () => {
		await page.click('#nav button[data-view="tasks"]');
		const cell = page.locator(`tr[data-task="${TASK}"] td[data-template]`);
		await cell.waitFor({ timeout: 15000 });
		const t = await cell.textContent();
		assert(t === 'python-data', 'template cell: ' + t);
		return t;
	});
	await check('the task\'s page: its template, and its PNG output shown inline, decoded', async () => {
		await page.click(`tr[data-task="${TASK}"]`);
		await page.waitForSelector('#task-template', { timeout: 15000 });
		const t = await page.locator('#task-template').textContent();
		assert(t === 'python-data', 'template: ' + t);
		const img = page.locator('figure[data-output-image="plot.png"] img.result-image');
		await img.waitFor({ timeout: 15000 });
		await page.waitForFunction((sel) => { const i = document.querySelector(sel); return i && i.complete; }, 'figure[data-output-image="plot.png"] img', { timeout: 15000 });
		const [wd, ht, src] = await img.evaluate((i) => [i.naturalWidth, i.naturalHeight, i.src.slice(0, 22)]);
		assert(wd === 7 && ht === 5 && src === 'data:image/png;base64,', `${wd}x${ht} ${src}`);
		return `${wd}x${ht} from a data: URL`;
	});

	// ---- a session: a cell with a figure, a DataFrame and hostile HTML ----
	const cell = [
		'import matplotlib.pyplot as plt, pandas as pd',
		'class Hostile:',
		'    def _repr_html_(self):',
		'        return \'<p id="hello">hello from html</p><script>parent.document.title = "pwned"</script><img src="x" onerror="parent.document.title = 1">\'',
		'print("started")',
		'plt.plot([1, 2, 3], [3, 1, 2]); plt.title("from the page"); plt.show()',
		'display(pd.DataFrame({"col_a": [1, 2], "col_b": ["x", "y"]}))',
		'display(Hostile())',
		'1 + 1',
	].join('\n');
	await check('the session\'s page shows its template and runs a cell: a figure as an image that decoded', async () => {
		await page.click('#nav button[data-view="sessions"]');
		await page.click(`tr[data-session="${SESSION}"]`, { timeout: 15000 });
		await page.waitForSelector('#session-template', { timeout: 15000 });
		const t = await page.locator('#session-template').textContent();
		assert(t === 'code-interpreter', 'template: ' + t);
		await page.fill('#code-input', cell);
		await page.click('#code-go');
		await page.waitForSelector('#code-results .code-result[data-main="yes"]', { timeout: 60000 });
		const img = page.locator('#code-results img.result-image[data-kind="png"]').first();
		await page.waitForFunction(() => { const i = document.querySelector('#code-results img.result-image'); return i && i.complete; }, null, { timeout: 15000 });
		const [wd, ht] = await img.evaluate((i) => [i.naturalWidth, i.naturalHeight]);
		assert(wd > 100 && ht > 100, `${wd}x${ht}`);
		return `${wd}x${ht}`;
	});
	await check('the DataFrame is a table of text', async () => {
		const heads = await page.locator('#code-results table.data-table th').allTextContents();
		const cells = await page.locator('#code-results table.data-table td').allTextContents();
		assert(heads.join(',') === 'col_a,col_b' && cells.join(',') === '1,x,2,y', heads + ' / ' + cells);
		return cells.join(',');
	});
	await check('the main result\'s text is 2; the cell\'s stdout is shown', async () => {
		const t = await page.locator('#code-results .code-result[data-main="yes"] pre.code-text').textContent();
		assert(t === '2', t);
		const out = await page.locator('#code-results pre.code-stdout').textContent();
		assert(out === 'started\n', JSON.stringify(out));
	});
	await check('the HTML is only in an iframe with an empty sandbox attribute (no allow-same-origin, no scripts)', async () => {
		const frames = page.locator('#code-results iframe.html-result');
		assert(await frames.count() === 1, 'frames: ' + await frames.count());
		const sb = await frames.first().getAttribute('sandbox');
		assert(sb === '', 'sandbox="' + sb + '"');
		const inPage = await page.locator('#hello').count();
		assert(inPage === 0, 'the HTML reached the console\'s document');
		const f = await (await frames.first().elementHandle()).contentFrame();
		assert(f, 'no frame');
		const p = await f.locator('#hello').textContent();
		assert(p === 'hello from html', 'frame text: ' + p);
		return 'sandbox=""';
	});
	await check('its script did not run, its onerror neither, and the console cannot reach its document (opaque origin)', async () => {
		await page.waitForTimeout(500);
		const title = await page.title();
		assert(title === 'kiln console', 'title: ' + title);
		const reach = await page.evaluate(() => {
			const f = document.querySelector('iframe.html-result');
			try { return f.contentDocument === null ? 'null' : 'reachable'; } catch (e) { return 'threw'; }
		});
		assert(reach === 'null', 'contentDocument: ' + reach);
		return 'title ' + title;
	});
	await check('no page error, dialog or CSP violation', async () => {
		assert(!w.dialogs.length && !w.errors.length && !w.csp.length, JSON.stringify(w));
	});
	await ctx.close();
} finally {
	await browser.close();
}
console.log(`code_test: ${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
