// Cumulus operator console. No build step, no dependency: it reads
// GET /admin/v1/console every second and sends the admin API's own
// calls. Every string from the cluster is put in the page as text
// (textContent, text nodes), never parsed as HTML. The admin token is
// kept in sessionStorage and sent only in the Authorization header.
'use strict';

const TOKEN_KEY = 'cumulus-admin-token';
const POLL_MS = 1000;
const MAX_ROWS = 500; // rows a long table shows (plan, audit)

const state = {
  view: 'models',
  model: '',        // the model shown in detail
  data: null,       // the last GET /admin/v1/console
  audit: [],        // the last GET /admin/v1/audit
  lastOK: 0,        // when data last came
  rendered: {},     // section → the JSON it was last drawn from
  timer: 0,
  firstRender: true,
  mapFocus: 0,      // the partition the map's keyboard cursor is on
  renders: 0,       // renders so far
};

const $ = (id) => document.getElementById(id);

// el builds an element: attrs are set as attributes (on* as listeners),
// children that are not nodes become text nodes.
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else e.setAttribute(k, v === true ? '' : String(v));
  }
  for (const k of kids.flat(Infinity)) {
    if (k === undefined || k === null || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }

// api calls the admin API; it resolves to {status, body}.
async function api(method, path, body) {
  const init = { method, headers: { Authorization: 'Bearer ' + token() }, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' };
  if (body !== undefined) {
    init.headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const resp = await fetch(path, init);
  let parsed = null;
  try { parsed = await resp.json(); } catch (e) { parsed = { error: resp.statusText }; }
  return { status: resp.status, body: parsed };
}

// ---- formatting

function bytes(n) {
  if (!n) return '0 B';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + ' ' + u[i];
}

function isTime(t) { return t && !t.startsWith('0001-'); }

function age(from, to) {
  if (!isTime(from)) return '';
  const ms = (to ? Date.parse(to) : Date.parse(state.data.time)) - Date.parse(from);
  if (!(ms >= 0)) return '';
  const s = ms / 1000;
  if (s < 1) return Math.round(ms) + ' ms';
  if (s < 120) return s.toFixed(1) + ' s';
  if (s < 7200) return Math.round(s / 60) + ' min';
  if (s < 172800) return (s / 3600).toFixed(1) + ' h';
  return Math.round(s / 86400) + ' d';
}

function clock(t) { return isTime(t) ? new Date(t).toLocaleTimeString() : ''; }
function stamp(t) { return isTime(t) ? new Date(t).toLocaleString() : ''; }
function ms(s) { return s ? (s * 1000).toFixed(s < 0.01 ? 2 : 1) + ' ms' : ''; }
function rate(x) { return x >= 100 ? Math.round(x).toString() : x >= 1 ? x.toFixed(1) : x > 0 ? x.toFixed(2) : '0'; }

function table(cols, rows, opts) {
  opts = opts || {};
  return el('table', { 'aria-label': opts.label },
    el('thead', null, el('tr', null, cols.map((c) => el('th', { scope: 'col', class: c.num ? 'num' : null }, c.title)))),
    el('tbody', null, rows.length ? rows : el('tr', null, el('td', { colspan: cols.length, class: 'muted' }, opts.empty || 'none'))));
}

function td(v, attrs) { return el('td', attrs, v); }
function num(v, attrs) { return el('td', Object.assign({ class: 'num' }, attrs || {}), v); }

// ---- drawing, one section at a time, only when its data changed

// draw replaces a section's content when key (its data) changed, and
// gives focus back to the element that had it (by data-key).
function draw(id, key, build) {
  if (state.rendered[id] === key) return;
  state.rendered[id] = key;
  const box = $(id);
  const focused = document.activeElement && box.contains(document.activeElement) ? document.activeElement.getAttribute('data-key') : null;
  box.replaceChildren(build());
  if (focused) {
    const again = box.querySelector('[data-key="' + CSS.escape(focused) + '"]');
    if (again) again.focus();
  }
}

function render() {
  const d = state.data;
  if (!d) return;
  const start = performance.now();
  const leader = $('leader');
  const leaderKey = JSON.stringify([d.manager.leading, d.manager.leader, d.manager.leader_admin]);
  if (leader.getAttribute('data-for') === leaderKey) {
    // unchanged: not redrawn (it is a live region)
  } else if (d.manager.leading) {
    leader.setAttribute('data-for', leaderKey);
    leader.hidden = true;
  } else {
    leader.setAttribute('data-for', leaderKey);
    leader.hidden = false;
    const parts = ['This manager follows: it shows what it reads, and acts on nothing. '];
    if (d.manager.leader) {
      parts.push('The leader is ' + d.manager.leader);
      const u = safeURL(d.manager.leader_admin);
      leader.replaceChildren(...parts, u ? [': ', el('a', { href: u, rel: 'noreferrer' }, u)] : [], '.');
    } else {
      leader.replaceChildren(...parts, 'No leader is known to it.');
    }
  }
  const view = state.view;
  if (view === 'models') { renderModels(d); renderModel(d); }
  if (view === 'shards') renderShards(d);
  if (view === 'routers') renderRouters(d);
  if (view === 'managers') renderManagers(d);
  if (view === 'plan') renderPlan(d);
  if (view === 'audit') renderAudit();
  // For whoever measures the console (the browser test and benchmark).
  performance.measure('cumulus-render', { start });
  if (++state.renders % 600 === 0) performance.clearMeasures('cumulus-render'); // a console open for days
  if (state.firstRender) {
    state.firstRender = false;
    performance.mark('cumulus-console-rendered');
  }
}

// safeURL is u if it is an http(s) URL, else ''.
function safeURL(u) {
  try {
    const p = new URL(u);
    return p.protocol === 'http:' || p.protocol === 'https:' ? p.href : '';
  } catch (e) { return ''; }
}

function traffic(d, model, track) {
  return (d.traffic || []).find((t) => t.model === model && t.track === track);
}

function trafficCell(t, field) {
  if (!t) return el('td', { class: 'muted', 'data-field': field }, '—');
  return el('td', { class: 'num', 'data-field': field }, rate(t.qps) + '/s · p99 ' + (ms(t.p99) || '—') + (t.errors > 0 ? ' · ' : ''),
    t.errors > 0 ? el('span', { class: 'error' }, rate(t.errors) + ' err/s') : null);
}

function renderModels(d) {
  // The ages shown are part of the key: they move with the clock.
  const key = JSON.stringify([d.models, d.traffic, state.model, d.manager.leading, d.models.map((m) => [age(m.live_created), age(m.live_at)])]);
  draw('models', key, () => table([
    { title: 'Model' }, { title: 'Type' }, { title: 'Live' }, { title: 'Canary' }, { title: 'Staged' }, { title: 'Pin' },
    { title: 'Versions', num: true }, { title: 'Rejected', num: true }, { title: 'Age (since published)' }, { title: 'Live for' }, { title: 'Published → live' },
    { title: 'Stable traffic' }, { title: 'Canary traffic' },
  ], d.models.map((m) => el('tr', { 'data-model': m.name, class: m.name === state.model ? 'selected' : null },
    el('td', null, el('button', { type: 'button', class: 'link', 'data-key': 'model:' + m.name, 'aria-label': 'Show model ' + m.name, onclick: () => selectModel(m.name) }, m.name)),
    td(m.type || ''),
    td(m.live || '—', { 'data-field': 'live' }),
    td(m.canary ? m.canary.version + ' at ' + Math.round(m.canary.fraction * 100) + '%' + (m.canary.serving ? '' : ' (staging)') : '—', { 'data-field': 'canary' }),
    td(m.staged ? m.staged + (m.rollout ? ' (' + m.rollout.holding + '/' + m.rollout.replicas + ' loaded)' : '') : '—', { 'data-field': 'staged' }),
    td(m.pin || '—'),
    num(m.versions), num(m.rejected || 0, { class: m.rejected ? 'num error' : 'num' }),
    td(age(m.live_created)), td(age(m.live_at)), td(age(m.live_created, m.live_at)),
    trafficCell(traffic(d, m.name, 'stable'), 'traffic-stable'), trafficCell(traffic(d, m.name, 'canary'), 'traffic-canary'),
  )), { label: 'Models', empty: 'No models: publish one (cumulus model gen|import) to the repository.' }));
}

function selectModel(name) {
  state.model = name;
  state.rendered = {};
  state.showDetail = true;
  refresh();
}

// actions a version row offers, given the model.
function versionActions(m, v, leading) {
  const out = [];
  const dis = !leading;
  const btn = (label, what, fn, danger) => el('button', { type: 'button', disabled: dis, class: danger ? 'danger' : null, 'data-key': what + ':' + v.version,
    'aria-label': label + ' version ' + v.version, onclick: fn }, label);
  const from = m.live;
  if (v.phase === 'standby') {
    out.push(btn('Roll back to', 'rollback', () => confirmAction('Roll back ' + m.name,
      [m.name + ': live ' + from + ' → ' + v.version, 'Routers switch at once; the model is pinned to ' + v.version + '.'],
      'POST', path(m.name, 'rollback'), { to: v.version, from }), true));
  }
  if (['standby', 'ready', 'live'].includes(v.phase) && m.pin !== v.version) {
    out.push(btn('Pin', 'pin', () => confirmAction('Pin ' + m.name + ' to ' + v.version,
      [m.name + ': pin ' + (m.pin || 'none') + ' → ' + v.version, 'live: ' + (from || 'none') + ' → ' + v.version + (from === v.version ? ' (unchanged)' : ''),
        'New versions are validated but not served until unpinned.', 'Refused if the live version is no longer ' + (from || 'none') + '.'],
      'PUT', path(m.name, 'pin'), { version: v.version, from })));
  }
  if (v.phase === 'ready' && !m.canary) {
    out.push(btn('Canary', 'canary', () => confirmAction('Start a canary of ' + m.name,
      [m.name + ': canary none → ' + v.version + ', beside live ' + (from || 'none'), 'It is staged and gated first, then served the share below; the live version is kept.'],
      'PUT', path(m.name, 'canary'), { version: v.version, from }, [{ name: 'fraction', label: 'Share of traffic, in percent (above 0, at most 50)', value: '5', type: 'number', scale: 0.01 }])));
  }
  if (v.phase === 'rejected') {
    out.push(btn('Accept', 'accept', () => confirmAction('Accept version ' + v.version + ' of ' + m.name,
      [m.name + ' ' + v.version + ': rejected → accepted: its failed gates are recorded but no longer reject it, and it is served as any valid version'],
      'POST', path(m.name, 'accept'), { version: v.version }, [{ name: 'reason', label: 'Reason (audited)', value: '', type: 'text', required: true }])));
  }
  return out;
}

function path(model, what) { return '/admin/v1/models/' + encodeURIComponent(model) + '/' + what; }

function modelActions(m, leading) {
  const dis = !leading;
  const from = m.live;
  const out = [];
  const btn = (label, key, fn) => el('button', { type: 'button', disabled: dis, 'data-key': key, onclick: fn }, label);
  if (m.live && m.rollback_to) {
    const to = m.rollback_to; // the most recently live standby version, as the manager picks it
    out.push(btn('Roll back', 'model-rollback', () => confirmAction('Roll back ' + m.name,
      [m.name + ': live ' + from + ' → ' + to, 'Routers switch at once; the model is pinned to ' + to + '.'],
      'POST', path(m.name, 'rollback'), { to, from })));
  }
  if (m.pin) {
    out.push(btn('Unpin', 'model-unpin', () => confirmAction('Unpin ' + m.name,
      [m.name + ': pin ' + m.pin + ' → none', m.canary ? 'It follows the newest valid version again once its canary ends.' : 'It then follows the newest valid version again.'],
      'DELETE', path(m.name, 'pin') + '?from=' + from)));
  }
  if (m.canary) {
    if (m.canary.serving) {
      out.push(btn('Promote canary', 'model-promote', () => confirmAction('Promote the canary of ' + m.name,
        [m.name + ': live ' + from + ' → ' + m.canary.version + ' (pinned)'],
        'POST', path(m.name, 'promote'), { from })));
    }
    out.push(btn('Canary off', 'model-canary-off', () => confirmAction('Turn the canary of ' + m.name + ' off',
      [m.name + ': canary ' + m.canary.version + ' → none; all traffic on live ' + from, 'pin: ' + (m.pin || 'none') + ' → ' + from + ' (unpin to follow new versions again)'],
      'DELETE', path(m.name, 'canary') + '?from=' + from)));
  }
  out.push(btn('Prune…', 'model-prune', () => confirmAction('Prune ' + m.name,
    [m.name + ': remove from the repository the versions nothing keeps, but the newest N'],
    'POST', path(m.name, 'prune'), {}, [{ name: 'keep', label: 'Removable versions to keep (newest)', value: '2', type: 'number' }])));
  return out;
}

function renderModel(d) {
  const m = d.model;
  if (!m) {
    draw('model', 'none', () => el('p', { class: 'muted' }, d.models.length ? 'Choose a model to see its versions, rollout and partitions.' : ''));
    return;
  }
  const key = JSON.stringify([m, d.manager.leading]);
  draw('model', key, () => {
    const leading = d.manager.leading;
    const rows = m.versions.slice().reverse().map((v) => el('tr', { 'data-version': v.version },
      num(v.version), td(v.kind || 'full'), td(v.parent || ''),
      td(el('span', { class: 'phase phase-' + v.phase, 'data-field': 'phase' }, v.phase)),
      num(v.bytes ? bytes(v.bytes) : ''),
      el('td', { class: 'wrap' }, (v.gates || []).map((g) => el('span', { class: 'gate' },
        el('span', { class: 'outcome outcome-' + g.outcome }, g.gate + ': ' + g.outcome), ' ', el('span', { class: 'muted' }, clock(g.at)),
        g.reason ? [' ', el('span', { class: 'reason', 'data-field': 'gate-reason' }, g.reason)] : null))),
      el('td', { class: 'wrap' }, v.reason ? el('span', { 'data-field': 'reason' }, v.reason) : '',
        v.accepted ? el('span', { class: 'gate' }, 'accepted: ', el('span', { class: 'reason', 'data-field': 'accept-reason' }, v.accepted.reason)) : null),
      td(stamp(v.created)),
      el('td', null, versionActions(m, v, leading))));
    const counts = {};
    for (const c of m.map) counts[c] = (counts[c] || 0) + 1;
    const canvas = el('canvas', { class: 'map', tabindex: 0, role: 'img', 'data-key': 'map',
      'aria-label': 'Partition map of ' + m.name + ': ' + mapSummary(counts, m.map.length) + '. Arrow keys move between partitions.' });
    const info = el('p', { id: 'map-info', 'aria-live': 'polite' }, 'Point at or move to a partition to see its replicas.');
    drawMap(canvas, m, info);
    const shardRows = m.shards.filter((s) => s.assigned || Object.keys(s.loaded).length || (s.errors || []).length).map((s) => el('tr', null,
      td(s.id), num(s.assigned),
      td(Object.entries(s.loaded).map(([v, n]) => 'v' + v + ': ' + n).join(', ')),
      el('td', { class: 'wrap error' }, (s.mismatched || []).length ? 'mismatched ' + s.mismatched.join(', ') : '', (s.errors || []).join('; '))));
    const audit = m.audit.slice(0, 20).map((e) => el('tr', null, td(stamp(e.time)), td(e.op), td(e.version || ''), td(e.from || ''),
      el('td', { class: 'wrap' }, e.reason ? e.reason + ' — ' : '', e.result)));
    return el('div', { 'data-detail': m.name },
      el('h2', { 'data-key': 'detail-heading', tabindex: -1 }, 'Model ', m.name),
      el('p', null, 'Live ', el('strong', { 'data-field': 'detail-live' }, m.live || 'none'),
        m.pin ? ' · pinned to ' + m.pin : '', m.staged ? ' · staged ' + m.staged : '',
        m.canary ? ' · canary ' + m.canary.version + ' at ' + Math.round(m.canary.fraction * 100) + '%' : '',
        ' · ' + m.partitions + ' partitions'),
      m.over_budget ? el('p', { class: 'banner error' }, m.over_budget) : null,
      m.held_pushes ? el('p', { class: 'banner' }, 'Pushes held in version ' + m.held_pushes.version + ': ' + m.held_pushes.why) : null,
      el('div', { class: 'actions', role: 'group', 'aria-label': 'Actions on ' + m.name }, modelActions(m, leading)),
      m.rollout ? el('p', null, 'Rollout of ', m.rollout.version, ': ',
        el('span', { class: 'bar', role: 'progressbar', 'aria-valuemin': 0, 'aria-valuemax': m.rollout.replicas, 'aria-valuenow': m.rollout.holding },
          el('span', { class: 'fill', 'data-width': pct(m.rollout.holding, m.rollout.replicas) })),
        m.rollout.holding + ' of ' + m.rollout.replicas + ' replicas loaded') : null,
      el('h3', null, 'Versions'),
      table([{ title: 'Version', num: true }, { title: 'Kind' }, { title: 'Parent' }, { title: 'Phase' }, { title: 'Size', num: true },
        { title: 'Gates' }, { title: 'Reason' }, { title: 'Published' }, { title: 'Actions' }], rows, { label: 'Versions of ' + m.name }),
      el('h3', null, 'Partitions'),
      el('p', { class: 'legend' }, [['l', 'live on every replica'], ['r', 'staged version loading'], ['d', 'a replica lacks live'], ['x', 'no replica holds live'], ['-', 'unassigned']]
        .map(([c, t]) => el('span', null, el('i', { class: 's-' + c }), t + ' (' + (counts[c] || 0) + ')'))),
      el('div', { class: 'map-wrap' }, canvas, info),
      el('h3', null, 'Shards'),
      table([{ title: 'Shard' }, { title: 'Assigned', num: true }, { title: 'Loaded (version: partitions)' }, { title: 'Problems' }], shardRows, { label: 'Shards of ' + m.name }),
      el('h3', null, 'Recent changes'),
      table([{ title: 'Time' }, { title: 'Operation' }, { title: 'Version' }, { title: 'Caller' }, { title: 'Result' }], audit, { label: 'Audit of ' + m.name, empty: 'No admin calls on this model yet.' }));
  });
  // Widths from data are set as style properties (the CSP forbids
  // inline style attributes).
  for (const f of $('model').querySelectorAll('.fill[data-width]')) f.style.width = f.getAttribute('data-width') + '%';
  if (state.showDetail) {
    // The model just chosen: bring its view to the eye and the focus.
    state.showDetail = false;
    const h = $('model').querySelector('h2');
    h.scrollIntoView({ block: 'start' });
    h.focus({ preventScroll: true });
  }
}

function pct(a, b) { return b ? Math.round((100 * a) / b) : 0; }

function mapSummary(counts, n) {
  const bad = (counts.d || 0) + (counts.x || 0);
  return n + ' partitions, ' + (counts.l || 0) + ' live everywhere' + (counts.r ? ', ' + counts.r + ' loading' : '') + (bad ? ', ' + bad + ' lacking live on a replica' : '');
}

const COLORS = { l: '#2e7d32', r: '#1565c0', d: '#e0a100', x: '#c62828', '-': '#b0b7bf' };

// drawMap draws one cell per partition, wrapped to fit the page, and
// describes the partition pointed at or moved to in info.
function drawMap(canvas, m, info) {
  const n = m.map.length;
  const cols = Math.max(1, Math.min(128, Math.ceil(Math.sqrt(n * 4))));
  const rows = Math.ceil(n / cols);
  const cell = n > 2048 ? 6 : n > 256 ? 10 : 16;
  canvas.width = cols * cell;
  canvas.height = rows * cell;
  const ctx = canvas.getContext('2d');
  for (let p = 0; p < n; p++) {
    ctx.fillStyle = COLORS[m.map[p]] || COLORS['-'];
    ctx.fillRect((p % cols) * cell, Math.floor(p / cols) * cell, cell - 1, cell - 1);
  }
  const describe = (p) => {
    if (p < 0 || p >= n) return;
    const reps = (m.placement[p] || []).map((i) => m.shards[i] ? m.shards[i].id : '?');
    const what = { l: 'live on every replica', r: 'staged version loading', d: 'a replica lacks the live version', x: 'no replica holds the live version', '-': 'unassigned' }[m.map[p]] || m.map[p];
    info.textContent = 'Partition ' + p + ': ' + what + '; replicas: ' + (reps.join(', ') || 'none');
  };
  canvas.addEventListener('mousemove', (e) => {
    const r = canvas.getBoundingClientRect();
    const x = Math.floor(((e.clientX - r.left) * canvas.width) / r.width / cell);
    const y = Math.floor(((e.clientY - r.top) * canvas.height) / r.height / cell);
    describe(y * cols + x);
  });
  canvas.addEventListener('keydown', (e) => {
    const step = { ArrowRight: 1, ArrowLeft: -1, ArrowDown: cols, ArrowUp: -cols, Home: -n, End: n }[e.key];
    if (step === undefined) return;
    e.preventDefault();
    state.mapFocus = Math.max(0, Math.min(n - 1, state.mapFocus + step));
    describe(state.mapFocus);
  });
  canvas.addEventListener('focus', () => describe(Math.min(state.mapFocus, n - 1)));
}

function renderShards(d) {
  const key = JSON.stringify([d.shards, d.manager.leading]);
  draw('shards', key, () => {
    const t = table([{ title: 'Shard' }, { title: 'Address' }, { title: 'Zone' }, { title: 'Weight', num: true }, { title: 'State' },
      { title: 'Memory (assigned / budget)' }, { title: 'Held (kept versions) / assigned', num: true }, { title: 'Problems' }, { title: 'Actions' }],
    d.shards.map((s) => {
      const over = s.budget && s.bytes > s.budget;
      const cordoned = s.state !== 'active';
      return el('tr', { 'data-shard': s.id },
        td(s.id), td(s.addr || 'not registered'), td(s.zone || ''), num(Number(s.weight.toFixed(2))),
        td(el('span', { class: 'state state-' + s.state, 'data-field': 'state' }, s.state)),
        el('td', null, s.budget ? el('span', { class: over ? 'bar over' : 'bar', role: 'img', 'aria-label': pct(s.bytes, s.budget) + '% of budget' },
          el('span', { class: 'fill', 'data-width': Math.min(100, pct(s.bytes, s.budget)) })) : null,
        bytes(s.bytes) + (s.budget ? ' / ' + bytes(s.budget) : ''), over ? el('span', { class: 'error' }, ' over budget') : null),
        num(s.held + ' / ' + s.assigned, { 'data-field': 'held' }),
        el('td', { class: 'wrap error' }, (s.mismatched || []).length ? 'mismatched ' + s.mismatched.join(', ') + '. ' : '', (s.errors || []).join('; ')),
        el('td', null, el('button', { type: 'button', disabled: !d.manager.leading, 'data-key': 'cordon:' + s.id, 'aria-label': (cordoned ? 'Uncordon ' : 'Cordon ') + s.id,
          onclick: () => confirmAction((cordoned ? 'Uncordon ' : 'Cordon ') + s.id,
            cordoned ? [s.id + ': cordoned → active', 'Placement may assign it partitions again.'] : [s.id + ': active → cordoned', 'Its ' + s.assigned + ' partition replicas move to other shards, within the move budget; it is empty once they have.'],
            cordoned ? 'DELETE' : 'POST', '/admin/v1/shards/' + encodeURIComponent(s.id) + '/cordon') }, cordoned ? 'Uncordon' : 'Cordon')));
    }), { label: 'Shards', empty: 'No shards registered.' });
    return t;
  });
  for (const f of $('shards').querySelectorAll('.fill[data-width]')) f.style.width = f.getAttribute('data-width') + '%';
}

function renderRouters(d) {
  draw('routers', JSON.stringify(d.routers), () => table([{ title: 'Router' }, { title: 'Front' }, { title: 'Build' }, { title: 'Can score' }, { title: 'Cannot score' }, { title: 'Metrics' }],
    d.routers.map((r) => el('tr', { 'data-router': r.id }, td(r.id), td(r.addr || ''), td(r.build || ''),
      el('td', { class: 'wrap' }, Object.entries(r.scores || {}).map(([m, vs]) => m + ': ' + vs.join(', ')).join('; ')),
      el('td', { class: 'wrap' }, (r.cannot || []).map((c) => c.model + ' ' + c.version + ': ' + c.reason).join('; ')),
      el('td', { class: 'wrap' }, r.metrics || 'none registered', r.metrics_error ? el('span', { class: 'error' }, ' (' + r.metrics_error + ')') : null))),
    { label: 'Routers', empty: 'No routers registered.' }));
}

function renderManagers(d) {
  draw('managers', JSON.stringify([d.members, d.manager]), () => {
    const self = el('p', null, d.manager.leading ? 'This manager leads.' : 'This manager follows.', d.manager.id ? ' Its raft ID is ' + d.manager.id + '.' : '');
    if (!d.members) return el('div', null, self, el('p', { class: 'muted' }, 'It runs without a raft group (the managers elect a leader in etcd).'));
    return el('div', null, self, table([{ title: 'ID' }, { title: 'Raft address' }, { title: 'Voter' }, { title: 'Role' }, { title: 'Term', num: true }, { title: 'Applied', num: true }, { title: 'Console' }],
      d.members.map((mb) => {
        const u = safeURL(mb.admin);
        return el('tr', { 'data-member': mb.id }, td(mb.id), td(mb.raft), td(mb.voter ? 'yes' : 'no'), td(mb.reported ? mb.role : mb.role + ' (no report)'),
          num(mb.term || ''), num(mb.applied || ''), el('td', null, u ? el('a', { href: u, rel: 'noreferrer' }, u) : ''));
      }), { label: 'Managers' }));
  });
}

function renderPlan(d) {
  draw('plan', JSON.stringify(d.plan), () => {
    const rows = d.plan.slice(0, MAX_ROWS).map((mv) => el('tr', null, td(mv.model), num(mv.partition), td(mv.from.join(', ')), td(mv.to.join(', '))));
    return el('div', null, el('p', null, d.plan.length + ' moves' + (d.plan.length > MAX_ROWS ? ' (the first ' + MAX_ROWS + ' shown)' : '')),
      table([{ title: 'Model' }, { title: 'Partition', num: true }, { title: 'From' }, { title: 'To' }], rows, { label: 'Moves', empty: 'Every partition is where placement puts it.' }));
  });
}

function renderAudit() {
  const q = $('audit-filter').value.trim().toLowerCase();
  const op = $('audit-op').value;
  const ops = [...new Set(state.audit.map((e) => e.op))].sort();
  const sel = $('audit-op');
  if (JSON.stringify(ops) !== sel.getAttribute('data-ops')) {
    sel.setAttribute('data-ops', JSON.stringify(ops));
    sel.replaceChildren(el('option', { value: '' }, 'any'), ops.map((o) => el('option', { value: o }, o)));
    sel.value = ops.includes(op) ? op : '';
  }
  const shown = state.audit.filter((e) => (!op || e.op === op) &&
    (!q || [e.op, e.model, e.shard, e.from, e.reason, e.result, String(e.version || '')].some((f) => f && f.toLowerCase().includes(q))));
  draw('audit', JSON.stringify([state.audit, q, op]), () => el('div', null,
    el('p', null, shown.length + ' of the newest ' + state.audit.length + ' entries'),
    table([{ title: 'Time' }, { title: 'Operation' }, { title: 'Model' }, { title: 'Version' }, { title: 'Shard' }, { title: 'Caller' }, { title: 'Reason' }, { title: 'Result' }],
      shown.slice(0, MAX_ROWS).map((e) => el('tr', { 'data-op': e.op }, td(stamp(e.time)), td(e.op), td(e.model || ''), td(e.version || ''), td(e.shard || ''), td(e.from || ''),
        el('td', { class: 'wrap' }, e.reason || ''), el('td', { class: 'wrap' }, e.result))), { label: 'Audit log', empty: 'No entries match.' })));
}

// ---- actions

let pending = null; // the action the dialog confirms

// confirmAction shows what will change and, once confirmed, sends the
// call; fields are inputs whose values join the body.
function confirmAction(title, lines, method, url, body, fields) {
  const dlg = $('confirm');
  $('confirm-title').textContent = title;
  $('confirm-body').replaceChildren(el('p', null, 'This will change:'), el('div', { class: 'change' }, lines.join('\n')),
    el('p', { class: 'muted' }, method + ' ' + url));
  $('confirm-fields').replaceChildren(...(fields || []).map((f) => el('label', null, f.label,
    el('input', { id: 'field-' + f.name, name: f.name, type: f.type, value: f.value, required: f.required, step: f.type === 'number' ? 'any' : null, autocomplete: 'off' }))));
  $('confirm-error').textContent = '';
  pending = { method, url, body, fields: fields || [] };
  // Focus goes back to the button that opened the dialog (found again by
  // its data-key: the table may have been redrawn meanwhile).
  state.opener = document.activeElement ? document.activeElement.getAttribute('data-key') : null;
  $('confirm-ok').disabled = false;
  dlg.showModal();
  // The first field, or Cancel: Enter twice must not change anything.
  const first = dlg.querySelector('input');
  (first || $('confirm-cancel')).focus();
}

async function confirmed() {
  if (!pending) return;
  const p = pending;
  let body = p.body ? Object.assign({}, p.body) : undefined;
  for (const f of p.fields) {
    const v = $('field-' + f.name).value;
    if (f.type === 'number') {
      const x = Number(v);
      if (v === '' || !Number.isFinite(x)) { $('confirm-error').textContent = f.label + ': a number is needed'; return; }
      body[f.name] = x * (f.scale || 1);
    } else {
      if (f.required && !v.trim()) { $('confirm-error').textContent = f.label + ' is required'; return; }
      body[f.name] = v;
    }
  }
  $('confirm-ok').disabled = true;
  let r;
  try {
    r = await api(p.method, p.url, body);
  } catch (e) {
    $('confirm-error').textContent = 'The call failed: ' + e.message;
    $('confirm-ok').disabled = false;
    return;
  }
  if (r.status === 401) { signedOut('The token was refused.'); $('confirm').close(); return; }
  if (r.status >= 300) {
    let msg = (r.body && r.body.error) || 'HTTP ' + r.status;
    if (r.status === 409 && r.body && r.body.live !== undefined) msg = 'Refused: the live version is now ' + r.body.live + ' (someone changed it). ' + msg;
    $('confirm-error').textContent = msg;
    $('confirm-ok').disabled = false;
    refresh();
    return;
  }
  pending = null;
  $('confirm').close();
  state.rendered = {};
  refresh();
}

// ---- polling

async function refresh() {
  clearTimeout(state.timer);
  if (!token()) return;
  try {
    const q = state.model ? '?model=' + encodeURIComponent(state.model) : '';
    const r = await api('GET', '/admin/v1/console' + q);
    if (r.status === 401) { signedOut('The token was refused: sign in again.'); return; }
    if (r.status === 404 && state.model) { state.model = ''; state.rendered = {}; }
    else if (r.status !== 200) throw new Error((r.body && r.body.error) || 'HTTP ' + r.status);
    else {
      state.data = r.body;
      state.lastOK = Date.now();
      if (state.view === 'audit') {
        const a = await api('GET', '/admin/v1/audit?limit=1000');
        if (a.status === 200) state.audit = (a.body.entries || []).slice().reverse(); // newest first
      }
      showApp();
      $('failure').hidden = true;
      render();
    }
  } catch (e) {
    $('failure').hidden = false;
    $('failure').textContent = 'Cannot read the cluster: ' + e.message;
  }
  const st = $('status');
  if (state.data) {
    const behind = (Date.now() - state.lastOK) / 1000;
    st.textContent = 'updated ' + clock(state.data.time) + (behind > 3 ? ' — ' + Math.round(behind) + ' s ago' : '');
    st.className = behind > 3 ? 'stale' : '';
  }
  state.timer = setTimeout(refresh, POLL_MS);
}

function showApp() {
  $('login').hidden = true;
  $('tabs').hidden = false;
  $('signout').hidden = false;
  for (const b of $('tabs').querySelectorAll('[role=tab]')) {
    $(b.getAttribute('aria-controls')).hidden = b.getAttribute('aria-selected') !== 'true';
  }
}

function signedOut(msg) {
  sessionStorage.removeItem(TOKEN_KEY);
  clearTimeout(state.timer);
  state.data = null;
  state.audit = [];
  state.rendered = {};
  // Nothing read with the token stays in the page.
  for (const id of ['models', 'model', 'shards', 'routers', 'managers', 'plan', 'audit']) $(id).replaceChildren();
  $('leader').removeAttribute('data-for');
  $('tabs').hidden = true;
  $('signout').hidden = true;
  $('leader').hidden = true;
  $('failure').hidden = true;
  for (const s of document.querySelectorAll('[role=tabpanel]')) s.hidden = true;
  $('login').hidden = false;
  $('login-error').textContent = msg || '';
  $('status').textContent = '';
  $('token').value = '';
  $('token').focus();
}

function selectTab(b) {
  for (const t of $('tabs').querySelectorAll('[role=tab]')) {
    const on = t === b;
    t.setAttribute('aria-selected', on ? 'true' : 'false');
    t.tabIndex = on ? 0 : -1;
    $(t.getAttribute('aria-controls')).hidden = !on;
  }
  state.view = b.id.replace('tab-', '');
  state.rendered = {};
  if (state.view === 'audit') refresh(); else render();
}

function init() {
  $('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    const t = $('token').value.trim();
    if (!t) return;
    sessionStorage.setItem(TOKEN_KEY, t);
    $('token').value = '';
    $('login-error').textContent = '';
    refresh();
  });
  $('signout').addEventListener('click', () => signedOut('Signed out.'));
  const tabs = [...$('tabs').querySelectorAll('[role=tab]')];
  for (const b of tabs) {
    b.addEventListener('click', () => selectTab(b));
    b.addEventListener('keydown', (e) => {
      const i = tabs.indexOf(b);
      const j = { ArrowRight: i + 1, ArrowLeft: i - 1, Home: 0, End: tabs.length - 1 }[e.key];
      if (j === undefined) return;
      e.preventDefault();
      const t = tabs[(j + tabs.length) % tabs.length];
      t.focus();
      selectTab(t);
    });
  }
  $('audit-filter').addEventListener('input', renderAudit);
  $('audit-op').addEventListener('change', renderAudit);
  $('confirm-ok').addEventListener('click', confirmed);
  $('confirm-cancel').addEventListener('click', () => { pending = null; $('confirm').close(); });
  $('confirm').addEventListener('close', () => {
    pending = null;
    const again = state.opener && document.querySelector('[data-key="' + CSS.escape(state.opener) + '"]');
    if (again) again.focus();
  });
  $('confirm').addEventListener('keydown', (e) => { if (e.key === 'Enter' && e.target.tagName === 'INPUT') { e.preventDefault(); confirmed(); } });
  if (token()) refresh(); else signedOut('');
}

document.addEventListener('DOMContentLoaded', init);
