// The web page of `weir run` (served at `/` by the control API, compiled into the binary).
//
// Plain JavaScript, no framework and no build step. Once a second it reads GET /v1/status and,
// per pipeline, GET /v1/pipelines/{id}/checkpoints, then draws: each pipeline's operator graph
// (SVG, one node per source, operator and sink, edges from its inputs), per-operator rates and
// backpressure (differences of the cumulative counters between two readings), the checkpoint
// history and the reload history. It only reads: it has no button that changes anything.
//
// The bearer token, when the API has one, comes from the URL fragment (`/#token=...`): a
// fragment is never sent to the server, so it appears in no request line and no log. It is sent
// as `Authorization: Bearer ...` on every fetch and kept nowhere else (no storage, no cookie).
//
// Every value from the API is inserted as text (textContent, SVG attributes), never as markup.
'use strict';

(function () {
  const POLL_MS = 1000;
  const CHECKPOINT_ROWS = 20;
  const SVG = 'http://www.w3.org/2000/svg';
  const NODE_W = 200;
  const NODE_H = 70;
  const GAP_X = 70;
  const GAP_Y = 22;
  const PAD = 12;

  let token = tokenFromFragment();
  window.addEventListener('hashchange', () => {
    token = tokenFromFragment();
  });

  // Per pipeline: its DOM and the previous reading of its counters.
  const views = new Map();

  function tokenFromFragment() {
    const params = new URLSearchParams(window.location.hash.replace(/^#/, ''));
    const given = params.get('token');
    return given ? given : null;
  }

  async function getJson(path) {
    const headers = { Accept: 'application/json' };
    if (token) {
      headers.Authorization = 'Bearer ' + token;
    }
    const response = await fetch(path, { headers, cache: 'no-store', credentials: 'omit' });
    if (!response.ok) {
      let message = response.status + ' ' + response.statusText;
      try {
        const body = await response.json();
        if (body && body.error && body.error.message) {
          message = body.error.message;
        }
      } catch (_) {
        // Not a JSON error body: keep the status line.
      }
      const error = new Error(message);
      error.status = response.status;
      throw error;
    }
    return response.json();
  }

  // --- formatting -------------------------------------------------------------------------

  function count(n) {
    return n === null || n === undefined ? '–' : Number(n).toLocaleString('en-US');
  }

  function rate(perSecond) {
    if (perSecond === null || perSecond === undefined) {
      return '–';
    }
    const abs = Math.abs(perSecond);
    if (abs >= 1e6) {
      return (perSecond / 1e6).toFixed(1) + 'M/s';
    }
    if (abs >= 1e4) {
      return (perSecond / 1e3).toFixed(1) + 'k/s';
    }
    if (abs >= 10) {
      return perSecond.toFixed(0) + '/s';
    }
    return perSecond.toFixed(1) + '/s';
  }

  function bytes(n) {
    if (n === null || n === undefined) {
      return '–';
    }
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let value = n;
    let unit = 0;
    while (value >= 1024 && unit < units.length - 1) {
      value /= 1024;
      unit += 1;
    }
    return (unit === 0 ? value.toFixed(0) : value.toFixed(1)) + ' ' + units[unit];
  }

  function millis(ms) {
    if (ms === null || ms === undefined) {
      return '–';
    }
    if (ms < 1000) {
      return ms.toFixed(0) + ' ms';
    }
    if (ms < 60000) {
      return (ms / 1000).toFixed(1) + ' s';
    }
    return (ms / 60000).toFixed(1) + ' min';
  }

  function percent(fraction) {
    return fraction === null || fraction === undefined ? '–' : (fraction * 100).toFixed(0) + ' %';
  }

  function clock(unixMs) {
    if (!unixMs) {
      return '–';
    }
    const d = new Date(unixMs);
    const pad = (v) => String(v).padStart(2, '0');
    return d.getFullYear() + '-' + pad(d.getMonth() + 1) + '-' + pad(d.getDate()) + ' ' +
      pad(d.getHours()) + ':' + pad(d.getMinutes()) + ':' + pad(d.getSeconds());
  }

  // --- DOM helpers ------------------------------------------------------------------------

  function el(tag, attrs, children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      node.setAttribute(name, value);
    }
    for (const child of children || []) {
      node.append(child);
    }
    return node;
  }

  function svg(tag, attrs) {
    const node = document.createElementNS(SVG, tag);
    for (const [name, value] of Object.entries(attrs || {})) {
      node.setAttribute(name, String(value));
    }
    return node;
  }

  function setText(node, text) {
    if (node && node.textContent !== text) {
      node.textContent = text;
    }
  }

  function row(cells) {
    return el('tr', {}, cells.map((c) => el('td', {}, [c])));
  }

  function fillTable(table, rows) {
    const body = table.tBodies[0];
    body.replaceChildren(...rows);
    table.hidden = rows.length === 0;
  }

  // --- figures ----------------------------------------------------------------------------

  // The sums over an operator's subtasks.
  function totals(op) {
    const t = {
      records_in: 0, records_out: 0, errors: 0, skipped: 0, dead_lettered: 0, bytes_read: 0,
      busy_ms: 0, backpressured_ms: 0, queue_fill: 0, lag: null, subtasks: 0,
    };
    for (const s of op.subtasks || []) {
      t.records_in += s.records_in || 0;
      t.records_out += s.records_out || 0;
      t.errors += s.errors || 0;
      t.skipped += s.skipped || 0;
      t.dead_lettered += s.dead_lettered || 0;
      t.bytes_read += s.bytes_read || 0;
      t.busy_ms += s.busy_ms || 0;
      t.backpressured_ms += s.backpressured_ms || 0;
      t.queue_fill = Math.max(t.queue_fill, s.queue_fill || 0);
      if (s.lag !== null && s.lag !== undefined) {
        t.lag = (t.lag || 0) + s.lag;
      }
      t.subtasks += 1;
    }
    return t;
  }

  // Per second between two readings; null without a previous one or when a counter went back
  // (a new run of the pipeline that does not carry the counts over).
  function perSecond(now, before, seconds) {
    if (before === undefined || seconds <= 0 || now < before) {
      return null;
    }
    return (now - before) / seconds;
  }

  // The share of wall time the subtasks spent in `field` (busy or backpressured) between two
  // readings, 0..1.
  function share(now, before, field, seconds) {
    if (!before || seconds <= 0 || now.subtasks === 0 || now[field] < before[field]) {
      return null;
    }
    const fraction = (now[field] - before[field]) / (seconds * 1000 * now.subtasks);
    return Math.max(0, Math.min(1, fraction));
  }

  // --- the graph --------------------------------------------------------------------------

  // Columns by longest path from a source, rows in plan order.
  function layout(operators) {
    const known = new Map(operators.map((op) => [op.id, op]));
    const depth = new Map();
    const depthOf = (id, visiting) => {
      if (depth.has(id)) {
        return depth.get(id);
      }
      if (visiting.has(id)) {
        return 0;
      }
      visiting.add(id);
      let d = 0;
      for (const input of known.get(id).inputs || []) {
        if (known.has(input)) {
          d = Math.max(d, depthOf(input, visiting) + 1);
        }
      }
      visiting.delete(id);
      depth.set(id, d);
      return d;
    };
    const columns = [];
    for (const op of operators) {
      const d = depthOf(op.id, new Set());
      (columns[d] = columns[d] || []).push(op.id);
    }
    const at = new Map();
    let rows = 0;
    columns.forEach((ids, column) => {
      (ids || []).forEach((id, r) => {
        at.set(id, { x: PAD + column * (NODE_W + GAP_X), y: PAD + r * (NODE_H + GAP_Y) });
      });
      rows = Math.max(rows, (ids || []).length);
    });
    return {
      at,
      width: PAD * 2 + Math.max(1, columns.length) * (NODE_W + GAP_X) - GAP_X,
      height: PAD * 2 + Math.max(1, rows) * (NODE_H + GAP_Y) - GAP_Y,
    };
  }

  function drawGraph(view, operators) {
    const { at, width, height } = layout(operators);
    const root = svg('svg', {
      class: 'graph', width, height, viewBox: '0 0 ' + width + ' ' + height, role: 'img',
      'aria-label': 'operator graph',
    });
    const defs = svg('defs');
    const marker = svg('marker', {
      id: 'arrow-' + view.index, viewBox: '0 0 10 10', refX: 10, refY: 5,
      markerWidth: 8, markerHeight: 8, orient: 'auto-start-reverse',
    });
    marker.append(svg('path', { d: 'M 0 0 L 10 5 L 0 10 z', class: 'arrow' }));
    defs.append(marker);
    root.append(defs);
    for (const op of operators) {
      const to = at.get(op.id);
      for (const input of op.inputs || []) {
        const from = at.get(input);
        if (!from) {
          continue;
        }
        const x1 = from.x + NODE_W;
        const y1 = from.y + NODE_H / 2;
        const x2 = to.x;
        const y2 = to.y + NODE_H / 2;
        const bend = Math.max(20, (x2 - x1) / 2);
        const edge = svg('path', {
          class: 'edge', d: `M ${x1} ${y1} C ${x1 + bend} ${y1}, ${x2 - bend} ${y2}, ${x2} ${y2}`,
          'marker-end': `url(#arrow-${view.index})`, 'data-edge': input + '->' + op.id,
        });
        root.append(edge);
      }
    }
    view.nodes = new Map();
    for (const op of operators) {
      const { x, y } = at.get(op.id);
      const g = svg('g', {
        class: 'node role-' + op.role, 'data-operator': op.id, transform: `translate(${x} ${y})`,
      });
      const title = svg('title');
      title.textContent = op.id + ' (' + op.role + ', ' + op.type_name + ')';
      g.append(title);
      const box = svg('rect', { class: 'box', width: NODE_W, height: NODE_H, rx: 6 });
      g.append(box);
      const name = svg('text', { class: 'name', x: 10, y: 19 });
      name.textContent = op.id;
      g.append(name);
      const kind = svg('text', { class: 'kind', x: 10, y: 36 });
      kind.textContent = op.type_name + ' · ' + op.role + ' · ×' + op.parallelism;
      g.append(kind);
      const figures = svg('text', { class: 'figures', x: 10, y: 53, 'data-figure': 'rate' });
      g.append(figures);
      // Backpressure as a bar along the bottom edge: its width is the share of time blocked.
      g.append(svg('rect', { class: 'bar-track', x: 0, y: NODE_H - 5, width: NODE_W, height: 5 }));
      const bar = svg('rect', { class: 'bar', x: 0, y: NODE_H - 5, width: 0, height: 5 });
      g.append(bar);
      root.append(g);
      view.nodes.set(op.id, { g, box, figures, bar });
    }
    view.graph.replaceChildren(root);
  }

  // --- one pipeline -----------------------------------------------------------------------

  function pipelineView(id, index) {
    const figure = (name) => el('span', { class: 'figure', 'data-figure': name });
    const labelled = (label, name) => el('span', { class: 'labelled' }, [label + ' ', figure(name)]);
    const state = el('span', { class: 'state', 'data-figure': 'state' });
    const section = el('section', { class: 'pipeline', 'data-pipeline': id }, [
      el('h2', {}, [id + ' ', state]),
      el('p', { class: 'figures' }, [
        labelled('source records', 'source_records'),
        labelled('in', 'source_rate'),
        labelled('· sink records', 'sink_records'),
        labelled('out', 'sink_rate'),
        labelled('· checkpoints', 'checkpoints'),
        labelled('latest', 'latest_checkpoint'),
        labelled('· restarts', 'restarts'),
      ]),
      el('p', { class: 'error', 'data-figure': 'error', hidden: '' }),
      el('div', { class: 'graph-box' }),
      el('table', { class: 'operators' }, [
        el('thead', {}, [el('tr', {}, [
          'operator', 'type', '×', 'in/s', 'out/s', 'records in', 'records out', 'errors',
          'busy', 'backpressure', 'queue', 'lag',
        ].map((h) => el('th', {}, [h])))]),
        el('tbody'),
      ]),
      el('h3', {}, ['Checkpoints']),
      el('p', { class: 'muted', 'data-figure': 'checkpoint_summary' }, ['No checkpoint yet.']),
      el('table', { class: 'checkpoints', hidden: '' }, [
        el('thead', {}, [el('tr', {}, [
          'id', 'kind', 'status', 'triggered', 'duration', 'size', 'new bytes', 'alignment',
          'slowest subtask',
        ].map((h) => el('th', {}, [h])))]),
        el('tbody'),
      ]),
    ]);
    return {
      id, index, section, state,
      graph: section.querySelector('.graph-box'),
      operatorTable: section.querySelector('table.operators'),
      checkpointTable: section.querySelector('table.checkpoints'),
      graphKey: null, nodes: new Map(), before: null, beforeOps: new Map(), beforeAt: 0,
    };
  }

  function figureOf(view, name) {
    return view.section.querySelector(`[data-figure="${name}"]`);
  }

  function updatePipeline(view, p, at) {
    const seconds = view.before ? (at - view.beforeAt) / 1000 : 0;
    setText(view.state, p.state);
    view.state.className = 'state state-' + p.state;
    setText(figureOf(view, 'source_records'), count(p.source_records));
    setText(figureOf(view, 'sink_records'), count(p.sink_records));
    setText(figureOf(view, 'source_rate'),
      rate(view.before ? perSecond(p.source_records, view.before.source_records, seconds) : null));
    setText(figureOf(view, 'sink_rate'),
      rate(view.before ? perSecond(p.sink_records, view.before.sink_records, seconds) : null));
    setText(figureOf(view, 'checkpoints'), count(p.checkpoints));
    setText(figureOf(view, 'latest_checkpoint'),
      p.latest_checkpoint === null || p.latest_checkpoint === undefined ? '–' : '#' + p.latest_checkpoint);
    setText(figureOf(view, 'restarts'), count(p.restarts));
    const error = figureOf(view, 'error');
    const problem = p.error || p.last_error;
    error.hidden = !problem;
    setText(error, problem ? (p.error ? 'failed: ' : 'last failure: ') + problem : '');

    const operators = p.operators || [];
    const key = JSON.stringify(operators.map((o) => [o.id, o.role, o.type_name, o.parallelism, o.inputs]));
    if (key !== view.graphKey) {
      view.graphKey = key;
      if (operators.length > 0) {
        drawGraph(view, operators);
      } else {
        view.graph.replaceChildren(el('p', { class: 'muted' }, ['No operator figures from this weir run.']));
        view.nodes = new Map();
      }
    }

    const rows = [];
    const nowOps = new Map();
    for (const op of operators) {
      const t = totals(op);
      nowOps.set(op.id, t);
      const b = view.beforeOps.get(op.id);
      const inRate = b ? perSecond(t.records_in, b.records_in, seconds) : null;
      const outRate = b ? perSecond(t.records_out, b.records_out, seconds) : null;
      const busy = share(t, b, 'busy_ms', seconds);
      const pressure = share(t, b, 'backpressured_ms', seconds);
      const node = view.nodes.get(op.id);
      if (node) {
        let text;
        if (op.role === 'source') {
          text = rate(inRate) + ' produced';
        } else if (op.role === 'sink') {
          text = rate(inRate) + ' written';
        } else {
          text = rate(inRate) + ' in · ' + rate(outRate) + ' out';
        }
        if (t.errors > 0) {
          text += ' · ' + count(t.errors) + ' errors';
        }
        setText(node.figures, text);
        node.bar.setAttribute('width', String(Math.round((pressure || 0) * NODE_W)));
        const level = pressure === null ? 'none' : pressure >= 0.5 ? 'high' : pressure >= 0.1 ? 'some' : 'none';
        node.g.setAttribute('data-backpressure', level);
      }
      const cells = [
        op.id, op.type_name, String(op.parallelism), rate(inRate),
        op.role === 'sink' ? '–' : rate(outRate), count(t.records_in),
        op.role === 'sink' ? '–' : count(t.records_out), count(t.errors), percent(busy),
        percent(pressure), percent(t.queue_fill), t.lag === null ? '–' : count(t.lag),
      ];
      const tr = row(cells);
      tr.setAttribute('data-operator-row', op.id);
      rows.push(tr);
    }
    fillTable(view.operatorTable, rows);

    view.before = { source_records: p.source_records, sink_records: p.sink_records };
    view.beforeOps = nowOps;
    view.beforeAt = at;
  }

  // `task[subtask]`, unless the task's name already carries its index.
  function subtaskName(s) {
    return /\[\d+\]$/.test(s.task) ? s.task : s.task + '[' + s.subtask + ']';
  }

  function updateCheckpoints(view, history) {
    const newest = history.slice(-CHECKPOINT_ROWS).reverse();
    const rows = newest.map((c) => {
      let slowest = '–';
      for (const s of c.subtasks || []) {
        if (slowest === '–' || s.ack_ms > slowest.ack_ms) {
          slowest = s;
        }
      }
      const slow = slowest === '–' ? '–' :
        subtaskName(slowest) + ' (' + millis(slowest.ack_ms) + ', aligned ' +
        millis(slowest.alignment_ms) + ')';
      // Answers of an older `weir run` carry no status: those are completed ones.
      const status = c.status || 'completed';
      const tr = row([
        '#' + c.id, c.kind, c.failure ? status + ': ' + c.failure : status,
        clock(c.trigger_time_ms), millis(c.duration_ms), bytes(c.size), bytes(c.new_bytes),
        millis(c.alignment_ms), slow,
      ]);
      tr.className = 'checkpoint-' + status;
      return tr;
    });
    fillTable(view.checkpointTable, rows);
    const failed = history.filter((c) => c.status && c.status !== 'completed').length;
    const summary = history.length === 0 ? 'No checkpoint yet.' :
      history.length + ' kept in memory (' + failed + ' failed or aborted)' +
      (history.length > CHECKPOINT_ROWS ? ', the latest ' + CHECKPOINT_ROWS + ' shown' : '') + '.';
    setText(figureOf(view, 'checkpoint_summary'), summary);
  }

  // --- reloads ----------------------------------------------------------------------------

  function updateReloads(status) {
    const history = status.reload_history && status.reload_history.length > 0
      ? status.reload_history
      : status.last_reload ? [status.last_reload] : [];
    const rows = history.slice().reverse().map((r) => {
      const changed = (r.pipelines || []).filter((p) => p.change !== 'unchanged')
        .map((p) => p.pipeline + ': ' + p.change);
      const message = (r.messages || []).length > 0 ? r.messages[0].split('\n')[0] : '';
      const tr = row([
        clock(r.at_ms), r.result, changed.length > 0 ? changed.join(', ') : 'nothing',
        r.pause_ms === null || r.pause_ms === undefined ? '–' : millis(r.pause_ms), message,
      ]);
      tr.className = 'reload-' + r.result;
      return tr;
    });
    fillTable(document.getElementById('reloads'), rows);
    setText(document.getElementById('reload-summary'),
      history.length === 0 ? 'No reload yet.' :
        count(status.reloads) + ' applied since start; the latest attempts, newest first:');
  }

  // --- the loop ---------------------------------------------------------------------------

  function connection(state, text) {
    const node = document.getElementById('connection');
    node.setAttribute('data-state', state);
    setText(node, text);
  }

  function notice(text) {
    const node = document.getElementById('notice');
    node.hidden = !text;
    setText(node, text || '');
  }

  async function poll() {
    let status;
    try {
      status = await getJson('/v1/status');
    } catch (error) {
      if (error.status === 401) {
        connection('error', 'token needed');
        notice('This weir run wants a bearer token. Open the page as ' +
          window.location.origin + '/#token=YOUR_TOKEN (the token of --api-token or ' +
          'WEIR_API_TOKEN; a URL fragment never reaches the server or its log).');
      } else {
        connection('error', 'cannot reach weir run: ' + error.message);
      }
      return;
    }
    const at = Date.now();
    notice(null);
    setText(document.getElementById('file'), status.file || '');
    const container = document.getElementById('pipelines');
    const seen = new Set();
    for (const p of status.pipelines || []) {
      seen.add(p.id);
      let view = views.get(p.id);
      if (!view) {
        view = pipelineView(p.id, views.size);
        views.set(p.id, view);
      }
      // Keep file order (a reload may add pipelines anywhere).
      container.append(view.section);
      updatePipeline(view, p, at);
    }
    for (const [id, view] of views) {
      if (!seen.has(id)) {
        view.section.remove();
        views.delete(id);
      }
    }
    await Promise.all((status.pipelines || []).map(async (p) => {
      try {
        const history = await getJson('/v1/pipelines/' + encodeURIComponent(p.id) + '/checkpoints');
        const view = views.get(p.id);
        if (view) {
          updateCheckpoints(view, history);
        }
      } catch (_) {
        // A pipeline removed between the two readings: the next poll drops it.
      }
    }));
    updateReloads(status);
    connection('live', 'live · ' + clock(at).slice(11));
  }

  async function loop() {
    try {
      await poll();
    } finally {
      window.setTimeout(loop, POLL_MS);
    }
  }

  loop();
})();
