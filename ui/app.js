// kiln web console: plain JavaScript, no build step, no third-party code.
//
// Rules (docs/architecture.md, "Threat model"):
// - every piece of data from the API (task output, file names, metadata,
//   ids, error messages) reaches the DOM as text: el() below only ever makes
//   text nodes from strings, and nothing here uses innerHTML, outerHTML,
//   insertAdjacentHTML, document.write or eval;
// - links are made only from http(s) URLs (safeUrl); images only from
//   base64 data URLs of the image types imageData() allows;
// - the one piece of HTML shown as HTML is a code result's `html` (a
//   DataFrame's table, a cell's display(HTML(...))): it goes only into an
//   iframe's srcdoc with an empty sandbox attribute (sandboxedHtml), so it
//   runs no script, has an opaque origin (never the console's: no key, no
//   API) and cannot navigate the console; the console's CSP stays as it is;
// - the API key lives in sessionStorage (this tab only) and travels only in
//   the Authorization header of same-origin requests, never in a URL.
'use strict';

const KEY = 'kiln.key';
const STATES = ['queued', 'scheduled', 'starting', 'running', 'uploading', 'succeeded', 'failed', 'timed_out',
	'cancelled', 'error'];
const FINAL = new Set(['succeeded', 'failed', 'timed_out', 'cancelled', 'error']);
const $ = (id) => document.getElementById(id);

// ---- DOM helpers: text only ----

function el(tag, attrs, ...kids) {
	const e = document.createElement(tag);
	for (const [k, v] of Object.entries(attrs || {})) {
		if (v === undefined || v === null || v === false)
			continue;
		if (k === 'class')
			e.className = v;
		else if (k === 'on')
			for (const [ev, fn] of Object.entries(v))
				e.addEventListener(ev, fn);
		else if (k === 'href')
			e.href = safeUrl(v);
		else if (/^(id|type|name|value|placeholder|title|for|min|max|step|rows|download|rel|target|role|disabled|selected|required)$/.test(k) || k.startsWith('data-'))
			e.setAttribute(k, v === true ? '' : String(v));
		else
			throw new Error('el: attribute not allowed: ' + k);
	}
	append(e, ...kids);
	return e;
}

function append(e, ...kids) {
	for (const k of kids.flat()) {
		if (k === undefined || k === null || k === false)
			continue;
		e.append(k instanceof Node ? k : document.createTextNode(String(k)));
	}
	return e;
}

function clear(e) {
	while (e.firstChild)
		e.removeChild(e.firstChild);
	return e;
}

function safeUrl(u) {
	try {
		const p = new URL(String(u), location.href);
		if (p.protocol === 'http:' || p.protocol === 'https:')
			return p.href;
	} catch (e) { /* not a URL */ }
	return 'about:blank';
}

function fmtTime(ms) {
	return ms ? new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '';
}

function fmtMs(ms) {
	if (ms === null || ms === undefined)
		return '';
	return ms < 1000 ? ms + ' ms' : (ms / 1000).toFixed(2) + ' s';
}

function stateBadge(s) {
	return el('span', { class: 'state state-' + String(s).replace(/[^a-z_]/g, ''), 'data-state': s }, s);
}

function status(msg) {
	$('status').textContent = msg || '';
}

// A base64 image as an <img> (data: URL, which the CSP's img-src allows).
const IMAGE_TYPES = { png: 'image/png', jpeg: 'image/jpeg', gif: 'image/gif', svg: 'image/svg+xml' };
const IMAGE_EXT = { png: 'png', jpg: 'jpeg', jpeg: 'jpeg', gif: 'gif', svg: 'svg' };
const INLINE_MAX = 16 << 20; // kiln-api's GET /v1/tasks/{id}/outputs/{n} bound
function imageData(kind, b64, alt) {
	const mime = IMAGE_TYPES[kind];
	const s = String(b64 || '').replace(/\s+/g, '');
	if (!mime || !/^[A-Za-z0-9+/]*={0,2}$/.test(s))
		return el('p', { class: 'note' }, 'an image that is not valid base64');
	const img = document.createElement('img');
	img.alt = alt || kind;
	img.className = 'result-image';
	img.setAttribute('data-kind', kind);
	img.src = 'data:' + mime + ';base64,' + s;
	return img;
}

// HTML from a sandbox (a code result) in a frame of its own: an empty
// sandbox attribute (no allow-scripts, no allow-same-origin) gives it an
// opaque origin with no script, no forms, no popups, no top navigation.
function sandboxedHtml(html) {
	const f = document.createElement('iframe');
	f.setAttribute('sandbox', '');
	f.setAttribute('referrerpolicy', 'no-referrer');
	f.setAttribute('title', 'HTML result (sandboxed)');
	f.className = 'html-result';
	f.srcdoc = String(html);
	return f;
}

// Output n of a task, fetched with the key: its bytes in base64.
async function outputImage(taskId, n) {
	const r = await api('GET', '/v1/tasks/' + encodeURIComponent(taskId) + '/outputs/' + n, undefined, { raw: true });
	const bytes = new Uint8Array(await r.arrayBuffer());
	let bin = '';
	for (let i = 0; i < bytes.length; i += 0x8000)
		bin += String.fromCharCode.apply(null, bytes.subarray(i, i + 0x8000));
	return btoa(bin);
}

// A DataFrame's data ({column: [values]}) as a table of text.
function dataTable(data) {
	const cols = Object.keys(data || {}).slice(0, 100);
	const all = cols.reduce((m, c) => Math.max(m, Array.isArray(data[c]) ? data[c].length : 0), 0);
	const n = Math.min(200, all);
	const cell = (v) => el('td', {}, v === null || v === undefined ? '' : typeof v === 'object' ? JSON.stringify(v) : String(v));
	const rows = [];
	for (let i = 0; i < n; i++)
		rows.push(el('tr', {}, cols.map((c) => cell(Array.isArray(data[c]) ? data[c][i] : undefined))));
	const note = all > n || Object.keys(data || {}).length > cols.length
		? el('p', { class: 'note' }, `the first ${n} of ${all} rows and ${cols.length} of ${Object.keys(data).length} columns`) : null;
	return el('div', {}, el('table', { class: 'data-table' }, el('thead', {}, el('tr', {}, cols.map((c) => el('th', {}, c)))), el('tbody', {}, rows)), note);
}

// One code execution (docs/api.md "Code") into root.
function renderExecution(root, ex) {
	clear(root);
	const logs = ex.logs || {};
	if ((logs.stdout || []).length)
		root.append(el('pre', { class: 'code-stdout' }, logs.stdout.join('')));
	if ((logs.stderr || []).length)
		root.append(el('pre', { class: 'code-stderr stderr' }, logs.stderr.join('')));
	(ex.results || []).forEach((r, i) => {
		const box = el('div', { class: 'code-result', 'data-result': String(i), 'data-main': r.is_main_result ? 'yes' : 'no' });
		let shown = false;
		for (const kind of ['png', 'jpeg'])
			if (typeof r[kind] === 'string') {
				box.append(imageData(kind, r[kind], (r.chart && r.chart.title) || 'result ' + i));
				shown = true;
			}
		if (!shown && typeof r.svg === 'string') {
			// as an image: a script inside an SVG does not run in <img>
			box.append(imageData('svg', btoa(unescape(encodeURIComponent(r.svg))), 'svg result ' + i));
			shown = true;
		}
		if (r.data && typeof r.data === 'object') {
			box.append(dataTable(r.data));
			shown = true;
		} else if (typeof r.html === 'string') {
			box.append(sandboxedHtml(r.html));
			shown = true;
		}
		if (r.chart && typeof r.chart === 'object')
			box.append(el('p', { class: 'note chart-info' }, 'chart: ' + (r.chart.type || '') + (r.chart.title ? ', ' + r.chart.title : '')));
		if (!shown || r.is_main_result)
			box.append(el('pre', { class: 'code-text' }, r.text || ''));
		root.append(box);
	});
	if (ex.error)
		root.append(el('pre', { class: 'code-error stderr' }, (ex.error.name || '') + ': ' + (ex.error.value || '') +
			(ex.error.traceback ? '\n' + ex.error.traceback : '')));
	root.append(el('p', { class: 'note', id: 'code-count' }, ex.execution_count !== null && ex.execution_count !== undefined
		? 'execution ' + ex.execution_count : ''));
}

// ---- the API ----

class ApiError extends Error {
	constructor(status, code, message) {
		super(message);
		this.status = status;
		this.code = code;
	}
}

function key() {
	return sessionStorage.getItem(KEY) || '';
}

async function api(method, path, body, opts) {
	const headers = { Authorization: 'Bearer ' + key(), ...((opts && opts.headers) || {}) };
	let payload;
	if (body !== undefined && !(body instanceof Blob) && typeof body !== 'string') {
		headers['Content-Type'] = 'application/json';
		payload = JSON.stringify(body);
	} else {
		payload = body;
	}
	const r = await fetch(path, { method, headers, body: payload, cache: 'no-store', signal: opts && opts.signal });
	if (opts && opts.raw && r.ok)
		return r;
	const text = await r.text();
	let j = null;
	try {
		j = text ? JSON.parse(text) : null;
	} catch (e) { /* not JSON */ }
	if (!r.ok) {
		const err = (j && j.error) || {};
		throw new ApiError(r.status, err.code || 'http_' + r.status, err.message || r.statusText || 'request failed');
	}
	return j;
}

// Reads a text/event-stream with fetch (EventSource cannot send the
// Authorization header). onEvent(name, data) per event; resolves at the end.
async function eventStream(path, onEvent, signal, method, body) {
	const r = await api(method || 'GET', path, body, { raw: true, signal, headers: { Accept: 'text/event-stream' } });
	const reader = r.body.getReader();
	const dec = new TextDecoder();
	let buf = '';
	for (;;) {
		const { value, done } = await reader.read();
		if (done)
			break;
		buf += dec.decode(value, { stream: true });
		let i;
		while ((i = buf.search(/\r?\n\r?\n/)) >= 0) {
			const block = buf.slice(0, i);
			buf = buf.slice(i).replace(/^\r?\n\r?\n/, '');
			let name = 'message';
			const data = [];
			for (const line of block.split(/\r?\n/)) {
				if (line.startsWith(':'))
					continue;
				const c = line.indexOf(':');
				const f = c < 0 ? line : line.slice(0, c);
				const v = c < 0 ? '' : line.slice(c + 1).replace(/^ /, '');
				if (f === 'event')
					name = v;
				else if (f === 'data')
					data.push(v);
			}
			if (!data.length)
				continue;
			let d = data.join('\n');
			try {
				d = JSON.parse(d);
			} catch (e) { /* left as text */ }
			onEvent(name, d);
		}
	}
}

// ---- views ----

const ui = { role: null, customer: null, view: null, timers: [], aborts: [] };

function stopView() {
	for (const t of ui.timers)
		clearInterval(t);
	for (const a of ui.aborts)
		a.abort();
	ui.timers = [];
	ui.aborts = [];
}

function every(ms, fn) {
	fn();
	ui.timers.push(setInterval(fn, ms));
}

function abortable() {
	const a = new AbortController();
	ui.aborts.push(a);
	return a.signal;
}

function show(name) {
	stopView();
	ui.view = name;
	for (const b of $('nav').querySelectorAll('button'))
		b.classList.toggle('active', b.dataset.view === name);
	const root = clear($('app-view'));
	status('');
	const views = ui.role === 'admin' ? adminViews : customerViews;
	views[name](root).catch(showError);
}

function showError(e) {
	if (e && e.name === 'AbortError')
		return;
	if (e instanceof ApiError && e.status === 401) {
		signOut('Your key was refused: ' + e.message);
		return;
	}
	status(e instanceof ApiError ? e.code + ': ' + e.message : String(e && e.message || e));
}

function errorBox() {
	return el('p', { class: 'error', role: 'alert' });
}

async function guarded(box, fn) {
	box.textContent = '';
	try {
		await fn();
	} catch (e) {
		if (e instanceof ApiError && e.status === 401)
			return showError(e);
		box.textContent = e instanceof ApiError ? e.code + ': ' + e.message : String(e.message || e);
	}
}

// ---- customer: tasks ----

const customerViews = {
	async tasks(root) {
		const filter = el('select', { id: 'task-filter' }, el('option', { value: '' }, 'all states'),
			STATES.map((s) => el('option', { value: s }, s)));
		const body = el('tbody', { id: 'task-rows' });
		append(root, el('h2', {}, 'Tasks'),
			el('form', { class: 'row' }, el('label', {}, 'State', filter)),
			el('table', {}, el('thead', {}, el('tr', {}, ['id', 'state', 'created', 'template', 'metadata'].map((h) => el('th', {}, h)))), body));
		const load = async () => {
			const q = filter.value ? '&state=' + encodeURIComponent(filter.value) : '';
			const j = await api('GET', '/v1/tasks?limit=50' + q);
			clear(body);
			for (const t of j.tasks)
				body.append(el('tr', { class: 'clickable', 'data-task': t.id, on: { click: () => openTask(t.id) } },
					el('td', {}, t.id), el('td', {}, stateBadge(t.state)), el('td', {}, fmtTime(t.created_at)),
					el('td', { 'data-template': t.template || 'default' }, t.template || 'default'), el('td', {}, t.metadata ? JSON.stringify(t.metadata) : '')));
			if (!j.tasks.length)
				body.append(el('tr', {}, el('td', {}, 'no tasks')));
		};
		filter.addEventListener('change', () => load().catch(showError));
		every(2000, () => load().catch(showError));
	},

	async task(root) {
		const id = ui.taskId;
		const head = el('div', { id: 'task-head' });
		const stdout = el('pre', { id: 'task-stdout' });
		const stderr = el('pre', { id: 'task-stderr', class: 'stderr' });
		const outs = el('div', { id: 'task-outputs' });
		const cancel = el('button', { type: 'button', id: 'task-cancel' }, 'Cancel');
		const box = errorBox();
		cancel.addEventListener('click', () => guarded(box, async () => {
			await api('POST', '/v1/tasks/' + encodeURIComponent(id) + '/cancel');
		}));
		append(root, el('h2', {}, 'Task ', el('span', { id: 'task-id' }, id)), head, cancel, box,
			el('h3', {}, 'stdout'), stdout, el('h3', {}, 'stderr'), stderr, el('h3', {}, 'Outputs'), outs);
		const render = (t) => {
			const tm = t.timings || {};
			clear(head).append(el('table', {}, el('tbody', {},
				el('tr', {}, el('th', {}, 'state'), el('td', { id: 'task-state' }, stateBadge(t.state))),
				el('tr', {}, el('th', {}, 'created'), el('td', {}, fmtTime(t.created_at))),
				el('tr', {}, el('th', {}, 'template'), el('td', { id: 'task-template' }, t.template || 'default')),
				el('tr', {}, el('th', {}, 'host'), el('td', {}, t.host || '')),
				el('tr', {}, el('th', {}, 'end reason'), el('td', {}, t.end_reason || '')),
				el('tr', {}, el('th', {}, 'exit code'), el('td', { id: 'task-exit' }, t.result && t.result.exit_code !== undefined ? String(t.result.exit_code) : '')),
				el('tr', {}, el('th', {}, 'timings'), el('td', { id: 'task-timings' },
					['queued_ms', 'start_ms', 'run_ms', 'upload_ms', 'total_ms'].map((k) => k.replace('_ms', '') + ' ' + fmtMs(tm[k]) + '  ').join(''))),
				el('tr', {}, el('th', {}, 'limits'), el('td', {}, JSON.stringify(t.limits || {}))),
				el('tr', {}, el('th', {}, 'metadata'), el('td', { id: 'task-metadata' }, t.metadata ? JSON.stringify(t.metadata) : '')))));
			cancel.hidden = FINAL.has(t.state);
			clear(outs);
			const links = [];
			for (const o of t.outputs || [])
				links.push(el('li', {}, o.url ? el('a', { href: o.url, download: o.path.split('/').pop(), rel: 'noopener noreferrer', 'data-output': o.path }, o.path) : o.path,
					' (' + o.size + ' bytes)', o.url_error ? ' ' + o.url_error : ''));
			for (const [n, a] of Object.entries(t.artifacts || {}))
				if (a && a.url)
					links.push(el('li', {}, el('a', { href: a.url, download: n, rel: 'noopener noreferrer', 'data-artifact': n }, n)));
			outs.append(links.length ? el('ul', {}, links) : el('p', { class: 'note' }, FINAL.has(t.state) ? 'no outputs' : 'outputs appear when the task ends'));
			// Image outputs inline, fetched through kiln-api (the CSP allows
			// no other origin) and shown from data: URLs.
			(t.outputs || []).forEach((o, i) => {
				const kind = IMAGE_EXT[String(o.path || '').split('.').pop().toLowerCase()];
				if (!kind || !o.url || o.size > INLINE_MAX)
					return;
				const fig = el('figure', { class: 'output-image', 'data-output-image': o.path });
				outs.append(fig);
				if (!images.has(i))
					images.set(i, outputImage(id, i));
				images.get(i).then((b64) => fig.append(imageData(kind, b64, o.path), el('figcaption', {}, o.path)),
					(e) => fig.append(el('p', { class: 'error' }, o.path + ': ' + (e.message || e))));
			});
		};
		const images = new Map();
		const t = await api('GET', '/v1/tasks/' + encodeURIComponent(id));
		render(t);
		if (FINAL.has(t.state) && t.result) {
			// the stream of a finished task may be gone: show the result's excerpt
			stdout.textContent = (t.result.stdout || '') + (t.result.stdout_tail ? '\n…\n' + t.result.stdout_tail : '');
			stderr.textContent = (t.result.stderr || '') + (t.result.stderr_tail ? '\n…\n' + t.result.stderr_tail : '');
			return;
		}
		const signal = abortable();
		let got = false;
		await eventStream('/v1/tasks/' + encodeURIComponent(id) + '/events', (name, d) => {
			if (name === 'stdout' || name === 'stderr') {
				got = true;
				(name === 'stdout' ? stdout : stderr).append(document.createTextNode(d.data || ''));
			} else if (name === 'state') {
				const s = $('task-state');
				if (s)
					clear(s).append(stateBadge(d.state));
			}
		}, signal);
		const fin = await api('GET', '/v1/tasks/' + encodeURIComponent(id), undefined, { signal });
		render(fin);
		if (!got && fin.result) {
			stdout.textContent = fin.result.stdout || '';
			stderr.textContent = fin.result.stderr || '';
		}
	},

	async submit(root) {
		const lang = el('select', { id: 'submit-language' }, ['python', 'bash', 'sh'].map((l) => el('option', { value: l }, l)));
		const code = el('textarea', { id: 'submit-code', rows: 10, placeholder: "print('hello')" });
		const timeout = el('input', { id: 'submit-timeout', type: 'number', min: 1, max: 86400, value: 30 });
		const template = el('input', { id: 'submit-template', placeholder: 'default' });
		const box = errorBox();
		const form = el('form', { id: 'submit-form' },
			el('div', { class: 'row' }, el('label', {}, 'Language', lang), el('label', {}, 'Timeout (s)', timeout),
				el('label', {}, 'Template', template)),
			el('label', {}, 'Code', code), el('p', {}, el('button', { type: 'submit', id: 'submit-go' }, 'Run')), box);
		form.addEventListener('submit', (ev) => {
			ev.preventDefault();
			guarded(box, async () => {
				const spec = { language: lang.value, code: code.value, limits: { timeout_s: Number(timeout.value) || 30 } };
				if (template.value)
					spec.template = template.value;
				const t = await api('POST', '/v1/tasks', spec);
				openTask(t.id);
			});
		});
		append(root, el('h2', {}, 'Submit a task'), form);
	},

	async sessions(root) {
		const body = el('tbody', { id: 'session-rows' });
		const box = errorBox();
		const create = el('button', { type: 'button', id: 'session-create' }, 'New session');
		create.addEventListener('click', () => guarded(box, async () => {
			const s = await api('POST', '/v1/sessions', {});
			openSession(s.id);
		}));
		append(root, el('h2', {}, 'Sessions'), create, box,
			el('table', {}, el('thead', {}, el('tr', {}, ['id', 'state', 'created', 'last active', 'end reason'].map((h) => el('th', {}, h)))), body));
		every(3000, async () => {
			try {
				const j = await api('GET', '/v1/sessions?state=all&limit=50');
				clear(body);
				for (const s of j.sessions)
					body.append(el('tr', { class: 'clickable', 'data-session': s.id, on: { click: () => openSession(s.id) } },
						el('td', {}, s.id), el('td', {}, stateBadge(s.state)), el('td', {}, fmtTime(s.created_at)),
						el('td', {}, fmtTime(s.last_active_at)), el('td', {}, s.end_reason || '')));
			} catch (e) {
				showError(e);
			}
		});
	},

	async session(root) {
		const id = ui.sessionId;
		const p = '/v1/sessions/' + encodeURIComponent(id);
		const head = el('div', {});
		const box = errorBox();
		const btn = (label, fn) => {
			const b = el('button', { type: 'button', 'data-action': label.toLowerCase() }, label);
			b.addEventListener('click', () => guarded(box, async () => { await fn(); await refresh(); }));
			return b;
		};
		const cmd = el('textarea', { id: 'exec-code', rows: 4, placeholder: "print('hi')" });
		const lang = el('select', { id: 'exec-language' }, ['python', 'bash'].map((l) => el('option', { value: l }, l)));
		const out = el('pre', { id: 'exec-out' });
		const err = el('pre', { id: 'exec-err', class: 'stderr' });
		const execForm = el('form', { class: 'row' }, el('label', {}, 'Language', lang), el('label', {}, 'Code', cmd),
			el('button', { type: 'submit', id: 'exec-go' }, 'Exec'));
		execForm.addEventListener('submit', (ev) => {
			ev.preventDefault();
			guarded(box, async () => {
				clear(out);
				clear(err);
				const r = await api('POST', p + '/exec', { language: lang.value, code: cmd.value });
				out.textContent = r.stdout || '';
				err.textContent = (r.stderr || '') + (r.exit_code ? '\nexit code ' + r.exit_code : '');
				await refresh();
			});
		});
		const code = el('textarea', { id: 'code-input', rows: 6, placeholder: 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3]); plt.show()' });
		const codeLang = el('select', { id: 'code-language' }, ['python', 'bash'].map((l) => el('option', { value: l }, l)));
		const results = el('div', { id: 'code-results' });
		const codeForm = el('form', { class: 'row', id: 'code-form' }, el('label', {}, 'Language', codeLang), el('label', {}, 'Cell', code),
			el('button', { type: 'submit', id: 'code-go' }, 'Run'));
		codeForm.addEventListener('submit', (ev) => {
			ev.preventDefault();
			guarded(box, async () => {
				clear(results).append(el('p', { class: 'note' }, 'running…'));
				// Streamed (server-sent events): output shows as the cell
				// writes it; the page is drawn at most every 100 ms.
				const ex = { results: [], logs: { stdout: [], stderr: [] }, error: null, execution_count: null };
				let ended = false, timer = null;
				const draw = () => { timer = null; renderExecution(results, ex); };
				try {
					await eventStream(p + '/code', (name, d) => {
						if ((name === 'stdout' || name === 'stderr') && d && typeof d.text === 'string')
							ex.logs[name].push(d.text);
						else if (name === 'result' && d && typeof d === 'object')
							ex.results.push(d);
						else if (name === 'error' && d && typeof d === 'object')
							ex.error = d;
						else if ((name === 'execution_count' || name === 'end') && d && d.execution_count !== undefined && d.execution_count !== null)
							ex.execution_count = d.execution_count;
						if (name === 'end')
							ended = true;
						if (!timer)
							timer = setTimeout(draw, 100);
					}, abortable(), 'POST', { code: code.value, language: codeLang.value });
				} catch (e) {
					clear(results);
					throw e;
				} finally {
					if (timer)
						clearTimeout(timer);
				}
				if (!ended && !ex.error)
					ex.error = { name: 'InterpreterError', value: 'the stream of the cell was cut', traceback: '' };
				renderExecution(results, ex);
			});
		});
		const dir = el('input', { id: 'files-dir', value: '/work' });
		const files = el('tbody', { id: 'file-rows' });
		const filesForm = el('form', { class: 'row' }, el('label', {}, 'Directory', dir), el('button', { type: 'submit', id: 'files-go' }, 'List'));
		const listFiles = async () => {
			const j = await api('GET', p + '/files?dir=' + encodeURIComponent(dir.value));
			clear(files);
			for (const f of j.entries)
				files.append(el('tr', {}, el('td', {}, f.name), el('td', {}, f.type), el('td', {}, String(f.size))));
		};
		filesForm.addEventListener('submit', (ev) => { ev.preventDefault(); guarded(box, listFiles); });
		append(root, el('h2', {}, 'Session ', el('span', { id: 'session-id' }, id)), head,
			el('p', {}, btn('Pause', () => api('POST', p + '/pause')), ' ', btn('Resume', () => api('POST', p + '/resume')), ' ',
				btn('Destroy', () => api('DELETE', p))), box,
			el('h3', {}, 'Exec'), execForm, out, err,
			el('h3', {}, 'Code'), el('p', { class: 'note' }, 'A notebook cell in the session\'s code interpreter (template code-interpreter): variables persist between cells; figures, tables and HTML show below (HTML in a sandboxed frame).'),
			codeForm, results, el('h3', {}, 'Files'), filesForm,
			el('table', {}, el('thead', {}, el('tr', {}, ['name', 'type', 'size'].map((h) => el('th', {}, h)))), files));
		const refresh = async () => {
			const s = await api('GET', p);
			clear(head).append(el('table', {}, el('tbody', {},
				el('tr', {}, el('th', {}, 'state'), el('td', { id: 'session-state' }, stateBadge(s.state))),
				el('tr', {}, el('th', {}, 'template'), el('td', { id: 'session-template' }, s.template || 'default')),
				el('tr', {}, el('th', {}, 'host'), el('td', {}, s.host || '')),
				el('tr', {}, el('th', {}, 'created'), el('td', {}, fmtTime(s.created_at))),
				el('tr', {}, el('th', {}, 'expires'), el('td', {}, fmtTime(s.expires_at))),
				el('tr', {}, el('th', {}, 'end reason'), el('td', {}, s.end_reason || '')),
				el('tr', {}, el('th', {}, 'limits'), el('td', {}, JSON.stringify(s.limits || {}))),
				el('tr', {}, el('th', {}, 'metadata'), el('td', {}, s.metadata ? JSON.stringify(s.metadata) : '')))));
		};
		every(5000, () => refresh().catch(showError));
	},

	async usage(root) {
		const cards = el('div', { class: 'grid', id: 'usage-cards' });
		const chart = el('div', { id: 'usage-chart' });
		// History from the store's metering (GET /v1/usage/history): what
		// ran before this page was opened too.
		const ranges = { '24h': [86400000, '1h'], '1h': [3600000, '1m'], '7d': [7 * 86400000, '6h'], '30d': [30 * 86400000, '1d'] };
		const pick = el('select', { id: 'usage-range' }, Object.keys(ranges).map((k) => el('option', { value: k }, 'last ' + k)));
		const csv = el('button', { id: 'usage-csv' }, 'download CSV');
		const totals = el('p', { class: 'note', id: 'usage-totals' });
		const query = () => {
			const [span, step] = ranges[pick.value] || ranges['24h'];
			const to = Date.now();
			return `/v1/usage/history?from=${to - span}&to=${to}&step=${step}`;
		};
		const history = async () => {
			const h = await api('GET', query());
			const pts = (h.buckets || []).map((b) => ({ t: b.start_ms, a: b.vcpu_seconds || 0, b: (b.mib_seconds || 0) / 1024 }));
			const t = h.totals || {};
			totals.textContent = `${(t.vcpu_seconds || 0).toFixed(1)} vCPU-seconds, ${((t.mib_seconds || 0) / 1024).toFixed(1)} GiB-seconds, ` +
				`${t.tasks_started || 0} tasks and ${t.sessions_started || 0} sessions started, ` +
				`${((t.egress_bytes || 0) / 1048576).toFixed(1)} MiB sent out by tasks, at most ` +
				`${((t.snapshot_bytes_max || 0) / 1048576).toFixed(1)} MiB of snapshots, ${t.volume_mib_max || 0} MiB of volumes, ` +
				`${((t.pause_bytes_max || 0) / 1048576).toFixed(1)} MiB of paused sessions and ` +
				`${((t.template_bytes_max || 0) / 1048576).toFixed(1)} MiB of templates ` +
				'(a running session\'s time appears once it pauses or ends)';
			clear(chart).append(lineChart(pts, ['vCPU-seconds per step', 'GiB-seconds per step']));
		};
		pick.addEventListener('change', () => history().catch(showError));
		csv.addEventListener('click', async () => {
			try {
				const r = await api('GET', query() + '&format=csv', undefined, { raw: true });
				// A blob: URL of our own bytes (el() allows only http(s) links).
				const a = document.createElement('a');
				a.href = URL.createObjectURL(await r.blob());
				a.download = 'kiln-usage.csv';
				a.click();
				setTimeout(() => URL.revokeObjectURL(a.href), 10000);
			} catch (e) {
				showError(e);
			}
		});
		append(root, el('h2', {}, 'Usage against quotas'), cards,
			el('h3', {}, 'History (metered)'), el('p', {}, pick, ' ', csv), totals, chart);
		every(60000, () => history().catch(showError));
		every(5000, async () => {
			try {
				const u = await api('GET', '/v1/usage');
				const q = u.quotas || {};
				const g = u.usage || {};
				clear(cards).append(
					card('running', g.running, q.max_running), card('vCPUs', g.vcpus, q.max_vcpus),
					card('memory MiB', g.memory_mib, q.max_memory_mib), card('queued', g.queued, q.max_queued),
					card('sessions', g.sessions), card('paused sessions', g.paused_sessions),
					card('submit tokens', u.submit ? Math.floor(u.submit.tokens) : '', u.submit ? u.submit.burst : undefined));
			} catch (e) {
				showError(e);
			}
		});
	},

	async templates(root) {
		const body = el('tbody', { id: 'template-rows' });
		append(root, el('h2', {}, 'Templates'),
			el('table', {}, el('thead', {}, el('tr', {}, ['name', 'state', 'public', 'created', 'size'].map((h) => el('th', {}, h)))), body));
		const j = await api('GET', '/v1/templates');
		for (const t of j.templates)
			body.append(el('tr', {}, el('td', {}, t.name), el('td', {}, stateBadge(t.state || '')), el('td', {}, t.public ? 'yes' : ''),
				el('td', {}, fmtTime(t.created_at)), el('td', {}, t.size_bytes !== undefined ? String(t.size_bytes) : '')));
	},
};

function card(label, value, limit) {
	return el('div', { class: 'card', 'data-card': label }, el('div', { class: 'note' }, label),
		el('div', { class: 'big' }, String(value === undefined ? '' : value), limit !== undefined ? ' / ' + limit : ''));
}

// A small line chart in SVG: samples [{t, a, b}], two series.
function lineChart(samples, names, limit) {
	const NS = 'http://www.w3.org/2000/svg';
	const W = 600, H = 160, P = 28;
	const svg = document.createElementNS(NS, 'svg');
	svg.setAttribute('class', 'chart');
	svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
	svg.setAttribute('width', W);
	svg.setAttribute('height', H);
	const max = Math.max(1, limit || 0, ...samples.map((s) => Math.max(s.a, s.b)));
	const t0 = samples.length ? samples[0].t : 0;
	const t1 = samples.length ? samples[samples.length - 1].t : 1;
	const x = (t) => P + (t1 > t0 ? (t - t0) / (t1 - t0) : 1) * (W - 2 * P);
	const y = (v) => H - P - (v / max) * (H - 2 * P);
	const line = (x1, y1, x2, y2) => {
		const l = document.createElementNS(NS, 'line');
		for (const [k, v] of Object.entries({ x1, y1, x2, y2 }))
			l.setAttribute(k, v);
		l.setAttribute('class', 'axis');
		return l;
	};
	const text = (tx, ty, s) => {
		const e = document.createElementNS(NS, 'text');
		e.setAttribute('x', tx);
		e.setAttribute('y', ty);
		e.textContent = s;
		return e;
	};
	svg.append(line(P, H - P, W - P, H - P), line(P, P, P, H - P), text(2, y(max) + 4, String(max)), text(2, H - P, '0'));
	['a', 'b'].forEach((k, i) => {
		const pl = document.createElementNS(NS, 'polyline');
		pl.setAttribute('class', 'series' + i);
		pl.setAttribute('points', samples.map((s) => x(s.t).toFixed(1) + ',' + y(s[k]).toFixed(1)).join(' '));
		svg.append(pl);
	});
	return el('div', {}, svg, el('p', {}, el('span', { class: 'legend0' }, '— ' + names[0]), '  ', el('span', { class: 'legend1' }, '— ' + names[1])));
}

function openTask(id) {
	ui.taskId = id;
	show('task');
}

function openSession(id) {
	ui.sessionId = id;
	show('session');
}

// ---- operators ----

const adminViews = {
	async hosts(root) {
		const body = el('tbody', { id: 'host-rows' });
		const box = errorBox();
		append(root, el('h2', {}, 'Hosts'),
			el('p', { class: 'note' }, 'Drain: the host takes no new work, its sessions are paused (they resume on another host), its tasks finish; it says "drained" once empty. Undrain reverses it.'),
			box,
			el('table', {}, el('thead', {}, el('tr', {}, ['id', 'state', 'url', 'vCPUs used/total', 'memory MiB used/total', 'pool ready/target', 'running tasks', 'last heartbeat', 'drain'].map((h) => el('th', {}, h)))), body));
		const load = async () => {
			const j = await api('GET', '/v1/admin/hosts');
			clear(body);
			for (const h of j.hosts) {
				const c = h.capacity || {};
				const v = c.vcpus || {}, m = c.memory_mib || {}, p = c.pool || {};
				const action = h.draining ? 'undrain' : 'drain';
				const b = el('button', { type: 'button', 'data-action': action }, action === 'drain' ? 'Drain' : 'Undrain');
				b.addEventListener('click', () => guarded(box, async () => {
					await api('POST', '/v1/admin/hosts/' + encodeURIComponent(h.id) + '/' + action);
					await load();
				}));
				const left = !h.draining ? '' : h.drained ? 'drained ' :
					`${h.tasks_left ?? '?'} task(s), ${h.sessions_left ?? '?'} session(s) left `;
				body.append(el('tr', { 'data-host': h.id }, el('td', {}, h.id), el('td', {}, stateBadge(h.state)), el('td', {}, h.url),
					el('td', {}, `${v.used ?? ''}/${v.total ?? ''}`), el('td', {}, `${m.used ?? ''}/${m.total ?? ''}`),
					el('td', {}, `${p.ready ?? ''}/${p.target ?? ''}`), el('td', {}, String(c.running_tasks ?? '')),
					el('td', {}, fmtTime(h.last_heartbeat_ms)), el('td', { class: 'drain' }, left, b)));
			}
		};
		every(3000, async () => {
			try {
				await load();
			} catch (e) {
				showError(e);
			}
		});
	},

	async cluster(root) {
		const cards = el('div', { class: 'grid', id: 'cluster-cards' });
		const chart = el('div', { id: 'cluster-chart' });
		append(root, el('h2', {}, 'Cluster'),
			el('p', { class: 'note' }, 'Summed over live hosts from their heartbeats: the figures each kiln-host exports at /metrics (kiln_host_vcpus_used, kiln_host_memory_used_mib, kiln_host_pool_ready, kiln_host_tasks).'),
			cards, el('h3', {}, 'vCPUs used and running tasks (sampled every 5 s while this page is open)'), chart);
		const samples = ui.clusterSamples || (ui.clusterSamples = []);
		every(5000, async () => {
			try {
				const j = await api('GET', '/v1/admin/hosts');
				const sum = { live: 0, lost: 0, draining: 0, vt: 0, vu: 0, mt: 0, mu: 0, pr: 0, rt: 0, up: 0 };
				for (const h of j.hosts) {
					if (h.state === 'draining')
						sum.draining++;
					else if (h.state !== 'live') {
						sum.lost++;
						continue;
					}
					const c = h.capacity || {};
					sum.live++;
					sum.vt += (c.vcpus || {}).total || 0;
					sum.vu += (c.vcpus || {}).used || 0;
					sum.mt += (c.memory_mib || {}).total || 0;
					sum.mu += (c.memory_mib || {}).used || 0;
					sum.pr += (c.pool || {}).ready || 0;
					sum.rt += c.running_tasks || 0;
					sum.up += c.uploading_tasks || 0;
				}
				samples.push({ t: Date.now(), a: sum.vu, b: sum.rt });
				if (samples.length > 360)
					samples.shift();
				clear(cards).append(card('live hosts', sum.live), card('draining hosts', sum.draining), card('lost hosts', sum.lost), card('vCPUs used', sum.vu, sum.vt),
					card('memory MiB used', sum.mu, sum.mt), card('warm VMs ready', sum.pr), card('running tasks', sum.rt),
					card('uploading tasks', sum.up));
				clear(chart).append(lineChart(samples, ['vCPUs used', 'running tasks'], sum.vt));
			} catch (e) {
				showError(e);
			}
		});
	},

	async customers(root) {
		const id = el('input', { id: 'cust-id', placeholder: 'customer id', required: true });
		const box = errorBox();
		const info = el('div', { id: 'cust-info' });
		const keyOut = el('div', { id: 'cust-key' });
		const revokeId = el('input', { id: 'revoke-id', placeholder: 'key id' });
		const revokeOut = el('p', { id: 'revoke-result' });
		const list = el('tbody', { id: 'cust-rows' });
		const keys = el('tbody', { id: 'key-rows' });
		const loadList = async () => {
			const j = await api('GET', '/v1/admin/customers?limit=1000');
			clear(list);
			for (const c of j.customers) {
				const q = c.quotas || {};
				list.append(el('tr', { class: 'clickable', 'data-customer': c.id, on: { click: () => { id.value = c.id; guarded(box, show1); } } },
					el('td', {}, c.id), el('td', {}, c.name || ''), el('td', {}, fmtTime(c.created_at)),
					el('td', {}, `running ${q.max_running ?? ''}, vCPUs ${q.max_vcpus ?? ''}, memory ${q.max_memory_mib ?? ''} MiB, queued ${q.max_queued ?? ''}, rate ${q.submit_rate ?? ''}/s`)));
			}
		};
		const loadKeys = async (cid) => {
			const j = await api('GET', '/v1/admin/customers/' + encodeURIComponent(cid) + '/keys');
			clear(keys);
			for (const k of j.keys) {
				const b = el('button', { type: 'button', 'data-revoke': k.key_id }, 'Revoke');
				b.disabled = !!k.revoked_at;
				b.addEventListener('click', () => guarded(box, async () => {
					const r = await api('DELETE', '/v1/admin/keys/' + encodeURIComponent(k.key_id));
					revokeOut.textContent = 'key ' + r.key_id + (r.revoked ? ' revoked' : ' not revoked');
					await loadKeys(cid);
				}));
				keys.append(el('tr', { 'data-key': k.key_id }, el('td', {}, k.key_id), el('td', {}, fmtTime(k.created_at)),
					el('td', { 'data-revoked': k.revoked_at ? 'yes' : 'no' }, k.revoked_at ? 'revoked ' + fmtTime(k.revoked_at) : 'active'), el('td', {}, b)));
			}
		};
		const show1 = async () => {
			const c = await api('GET', '/v1/admin/customers/' + encodeURIComponent(id.value));
			await loadKeys(c.id);
			const rows = (o) => Object.entries(o || {}).map(([k, v]) => el('tr', {}, el('th', {}, k), el('td', {}, typeof v === 'object' ? JSON.stringify(v) : String(v))));
			clear(info).append(el('h3', {}, 'Customer ', c.id), el('p', {}, c.name || ''),
				el('table', {}, el('tbody', {}, el('tr', {}, el('th', {}, 'created'), el('td', {}, fmtTime(c.created_at))))),
				el('h3', {}, 'Usage'), el('table', { id: 'cust-usage' }, el('tbody', {}, rows(c.usage && c.usage.usage ? c.usage.usage : c.usage))),
				el('h3', {}, 'Quotas'), el('table', { id: 'cust-quotas' }, el('tbody', {}, rows(c.quotas))));
		};
		const lookup = el('form', { class: 'row', id: 'cust-form' }, el('label', {}, 'Customer', id),
			el('button', { type: 'submit', id: 'cust-show' }, 'Show'),
			el('button', { type: 'button', id: 'cust-create' }, 'Create'),
			el('button', { type: 'button', id: 'key-create' }, 'New key'));
		lookup.addEventListener('submit', (ev) => { ev.preventDefault(); guarded(box, show1); });
		lookup.querySelector('#cust-create').addEventListener('click', () => guarded(box, async () => {
			await api('POST', '/v1/admin/customers', { id: id.value });
			await show1();
			await loadList();
		}));
		lookup.querySelector('#key-create').addEventListener('click', () => guarded(box, async () => {
			const k = await api('POST', '/v1/admin/customers/' + encodeURIComponent(id.value) + '/keys');
			clear(keyOut).append(el('p', {}, 'New key for ', k.customer, ' (id ', el('span', { id: 'new-key-id' }, k.key_id),
				'), shown this once: ', el('span', { class: 'secret', id: 'new-key' }, k.key)));
			await loadKeys(k.customer);
		}));
		const revoke = el('form', { class: 'row', id: 'revoke-form' }, el('label', {}, 'Revoke key', revokeId),
			el('button', { type: 'submit', id: 'revoke' }, 'Revoke'));
		revoke.addEventListener('submit', (ev) => {
			ev.preventDefault();
			guarded(box, async () => {
				const r = await api('DELETE', '/v1/admin/keys/' + encodeURIComponent(revokeId.value));
				revokeOut.textContent = 'key ' + r.key_id + (r.revoked ? ' revoked' : ' not revoked');
				if (info.firstChild)
					await show1();
			});
		});
		append(root, el('h2', {}, 'Customers'),
			el('table', {}, el('thead', {}, el('tr', {}, ['id', 'name', 'created', 'quotas'].map((h) => el('th', {}, h)))), list),
			lookup, box, keyOut, info,
			el('h3', {}, 'Keys'), el('table', {}, el('thead', {}, el('tr', {}, ['key id', 'created', 'state', ''].map((h) => el('th', {}, h)))), keys),
			revoke, revokeOut);
		await loadList();
	},

	async tasks(root) {
		return customerViews.tasks(root);
	},

	async task(root) {
		return customerViews.task(root);
	},
};

// ---- sign in ----

function setNav(names) {
	const nav = clear($('nav'));
	for (const n of names)
		nav.append(el('button', { type: 'button', 'data-view': n, on: { click: () => show(n) } }, n[0].toUpperCase() + n.slice(1)));
	nav.hidden = false;
}

async function enter() {
	// A customer key reads /v1/usage; an admin key is refused there (403)
	// and reads /v1/admin/hosts instead.
	try {
		const u = await api('GET', '/v1/usage');
		ui.role = 'customer';
		ui.customer = u.customer;
	} catch (e) {
		if (!(e instanceof ApiError) || e.status !== 403)
			throw e;
		await api('GET', '/v1/admin/hosts');
		ui.role = 'admin';
	}
	$('signin-view').hidden = true;
	$('app-view').hidden = false;
	$('signout').hidden = false;
	$('who').textContent = ui.role === 'admin' ? 'operator (admin key)' : 'customer ' + ui.customer;
	setNav(ui.role === 'admin' ? ['hosts', 'cluster', 'customers', 'tasks'] : ['tasks', 'submit', 'sessions', 'usage', 'templates']);
	show(ui.role === 'admin' ? 'hosts' : 'tasks');
}

function signOut(msg) {
	stopView();
	sessionStorage.removeItem(KEY);
	ui.role = null;
	ui.clusterSamples = null;
	$('signin-view').hidden = false;
	$('app-view').hidden = true;
	clear($('app-view'));
	$('nav').hidden = true;
	$('signout').hidden = true;
	$('who').textContent = '';
	$('signin-error').textContent = msg || '';
	status('');
}

async function signIn(k) {
	sessionStorage.setItem(KEY, k);
	try {
		await enter();
	} catch (e) {
		const why = e instanceof ApiError && e.status === 401 ? 'Sign-in failed: unknown or revoked API key.'
			: 'Sign-in failed: ' + (e instanceof ApiError ? e.code + ': ' + e.message : String(e.message || e));
		signOut(why);
	}
}

document.addEventListener('DOMContentLoaded', () => {
	$('signin-form').addEventListener('submit', (ev) => {
		ev.preventDefault();
		const k = $('key').value.trim();
		$('key').value = '';
		signIn(k);
	});
	$('signout').addEventListener('click', () => signOut(''));
	if (key())
		signIn(key());
});
