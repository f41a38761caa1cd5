// Refreshes the status page from /v1/status every 2 s. Data goes into the
// page as text only (textContent), never as HTML.
'use strict';
(function () {
  const $ = (id) => document.getElementById(id);
  const or = (s) => (s ? String(s) : '—');
  const dash = (n) => (n ? String(n) : '—');
  const num = (v) => String(Math.round(v * 100) / 100);
  const pad = (n) => String(Math.floor(n)).padStart(2, '0');
  function dur(s) {
    if (s < 60) return s.toFixed(1) + 's';
    if (s < 3600) return Math.floor(s / 60) + 'm' + pad(s % 60) + 's';
    if (s < 86400) return Math.floor(s / 3600) + 'h' + pad((s % 3600) / 60) + 'm';
    return Math.floor(s / 86400) + 'd' + pad((s % 86400) / 3600) + 'h';
  }
  function bytes(n) {
    if (n < 1024) return n + ' B';
    let v = n / 1024, u = 'KiB';
    for (const next of ['MiB', 'GiB', 'TiB']) { if (v < 1024) break; v /= 1024; u = next; }
    return v.toFixed(1) + ' ' + u;
  }
  function stamp(t) {
    if (!t || t.startsWith('0001-')) return '—';
    return new Date(t).toISOString().slice(0, 19).replace('T', ' ') + 'Z';
  }
  const late = (st) => st.heartbeat_timeout_seconds > 0 && (st.heartbeat_age_seconds || 0) >= 0.75 * st.heartbeat_timeout_seconds;
  const top = (vs) => vs.reduce((m, v) => Math.max(m, v), 0);

  // The same texts as page.go's fields().
  function fields(st) {
    const f = {
      state: st.state, pid: dash(st.agent_pid), uptime: '—', heartbeat: '—', restarts: String(st.restarts),
      last_restart: or(st.last_restart_reason), version: or(st.version), generated: stamp(st.generated_at),
      supervisor: st.supervisor_pid ? 'pid ' + st.supervisor_pid : undefined,
    };
    if (st.agent_pid) f.uptime = dur(st.agent_uptime_seconds || 0);
    if (st.heartbeat_age_seconds > 0 || (st.agent_pid && st.last_heartbeat && !st.last_heartbeat.startsWith('0001-'))) {
      f.heartbeat = dur(st.heartbeat_age_seconds || 0) + ' ago';
      if (late(st)) f.heartbeat += ' — late: the agent is restarted at ' + dur(st.heartbeat_timeout_seconds);
    }
    const w = st.wal;
    if (w) Object.assign(f, { wal_last: String(w.last_sequence), wal_durable: String(w.durable_sequence), wal_size: bytes(w.size_bytes), wal_segments: String(w.segments) });
    const c = st.checkpoints;
    if (c) {
      Object.assign(f, { ckpt_newest: or(c.newest), ckpt_watermark: '—', ckpt_age: '—', ckpt_size: '—', ckpt_retained: String(c.retained) });
      if (c.newest) Object.assign(f, { ckpt_watermark: String(c.watermark), ckpt_age: dur(c.age_seconds || 0), ckpt_size: bytes(c.size_bytes) + ' (' + bytes(c.stored_size_bytes) + ' stored)' });
      if (c.marked_bad > 0) f.ckpt_retained += ' (' + c.marked_bad + ' marked bad)';
    }
    const r = st.replica;
    if (r) Object.assign(f, { rep_state: r.state + ' — ' + r.url, rep_lag: r.lag_entries + ' entries, ' + num(r.lag_seconds) + ' s', rep_last: stamp(r.last_success), rep_error: or(r.last_error) });
    const q = st.requests;
    if (q) Object.assign(f, { req_window: dur(q.window_seconds), req_inflight: String(q.in_flight), req_answered: String(q.answered + q.dropped), req_failed: String(q.failed), req_expired: String(q.expired) });
    Object.assign(f, { evo_current: 'none', evo_decision: '—', evo_reason: '—', evo_target: '—', evo_time: '—' });
    const e = st.evolution;
    if (e && e.current) f.evo_current = 'testing ' + e.current.target + ' (trial ' + e.current.trial + ', since ' + stamp(e.current.started) + ')';
    if (e && e.last) Object.assign(f, { evo_decision: e.last.decision, evo_reason: e.last.reason, evo_target: e.last.target, evo_time: stamp(e.last.time) });
    const h = st.history;
    if (h && h.entries_per_second.length > 0) {
      const n = h.entries_per_second.length;
      f.spark_entries = 'now ' + num(h.entries_per_second[n - 1]) + '/s, peak ' + num(top(h.entries_per_second)) + '/s';
      f.spark_heart = 'now ' + num(h.heartbeat_age_seconds[n - 1]) + ' s, peak ' + num(top(h.heartbeat_age_seconds)) + ' s';
    } else {
      f.spark_entries = f.spark_heart = 'no samples yet';
    }
    return f;
  }

  function spark(vs) {
    const m = Math.max(top(vs), 1e-9);
    return vs.map((v, i) => (240 - (vs.length - 1 - i) * 2).toFixed(1) + ',' + (38 - (v / m) * 36).toFixed(1)).join(' ');
  }

  // rows replaces a table body's rows with cells of text.
  function rows(id, data, cols, empty) {
    const body = $(id);
    const out = data.map((d) => {
      const tr = document.createElement('tr');
      d.forEach((text, i) => {
        const td = document.createElement('td');
        td.textContent = text;
        if (cols[i]) td.className = cols[i];
        tr.appendChild(td);
      });
      return tr;
    });
    if (out.length === 0) {
      const tr = document.createElement('tr'), td = document.createElement('td');
      td.colSpan = cols.length;
      td.textContent = empty;
      tr.appendChild(td);
      out.push(tr);
    }
    body.replaceChildren(...out);
  }

  function fieldsText(f) {
    if (!f || Object.keys(f).length === 0) return '';
    const s = JSON.stringify(f);
    return s.length > 300 ? s.slice(0, 300) + '…' : s;
  }

  function render(st) {
    const f = fields(st);
    document.querySelectorAll('[data-f]').forEach((el) => { if (f[el.dataset.f] !== undefined) el.textContent = f[el.dataset.f]; });
    document.title = 'supervisor: ' + st.state;
    $('heartbeat').classList.toggle('bad', late(st));
    $('replica').hidden = !st.replica;
    const rs = (st.recent_restarts || []).slice().reverse();
    rows('restart-rows', rs.map((r) => [stamp(r.time), r.reason, dash(r.agent_pid), String(r.restarts)]), ['', '', '', ''], 'none');
    const m = (st.evolution && st.evolution.last && st.evolution.last.metrics) || {};
    rows('evidence-rows', Object.keys(m).sort().map((k) => [k, num(m[k])]), ['', ''], 'none');
    rows('audit-rows', (st.audit || []).map((a) => [stamp(a.time), a.kind, fieldsText(a.fields)]), ['', '', 'fields'], 'none');
    const h = st.history;
    if (h) {
      $('spark-entries').setAttribute('points', spark(h.entries_per_second));
      $('spark-heart').setAttribute('points', spark(h.heartbeat_age_seconds));
    }
  }

  async function refresh() {
    try {
      const resp = await fetch('/v1/status', { credentials: 'same-origin', cache: 'no-store' });
      if (!resp.ok) throw new Error('HTTP ' + resp.status);
      render(await resp.json());
      $('live').textContent = '(live, every 2 s)';
    } catch (err) {
      $('live').textContent = '(not updating: ' + err.message + '; retrying)';
    }
  }
  $('live').textContent = '(live, every 2 s)';
  setInterval(refresh, 2000);
})();
