// The live dashboard served at "/" by MetricsServer: one self-contained page (no external
// scripts or fonts) that polls /api/state every second and draws the job state, a table of
// ranks, the throughput chart, restarts with their causes, recent log lines, collective
// bandwidth and GPU availability. Thread-safety: a constant string.
#include "cohort/metrics/http_server.h"
#include "cohort/metrics/page_style.h"

namespace cohort::metrics {

extern const char kDashboardPage[] = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cohort dashboard</title>
<style>)html"
    COHORT_PAGE_BASE_STYLE
    R"html(.HEALTHY,.running{color:#0a7a2f}.FAILED,.failed{color:#b00020}.SUCCEEDED{color:#1a55c4}
#chart{background:#fff;border:1px solid #ddd;border-radius:6px}
pre{background:#111;color:#ddd;padding:8px;max-height:260px;overflow:auto;font-size:12px}
</style></head><body>
<h1>cohort <span id="run" class="muted"></span> <a href="/job" style="font-size:14px">the whole job</a></h1>
<div class="cards" id="cards"></div>
<h2>Ranks</h2>
<table id="ranks"><thead><tr><th>rank</th><th class="l">state</th><th>step</th><th>loss</th>
<th>samples/s</th><th>comm wait</th><th>allreduce GB/s</th><th>CPU %</th><th>RSS MiB</th></tr></thead><tbody></tbody></table>
<h2>Throughput (samples/s per rank)</h2>
<svg id="chart" width="660" height="185" viewBox="0 0 660 185"></svg>
<h2>Restarts and failures</h2><div id="restarts" class="muted">none</div>
<h2>GPUs</h2><div id="gpus" class="muted"></div>
<h2>Recent log lines</h2><pre id="logs"></pre>
<script>
let since = 0, ticks = 0, logs = [], restarts = [];
const esc = t => String(t ?? '').replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
const fmt = (v, d) => (v === undefined || v === null) ? '-' :
  (d > 2 && v !== 0 && Math.abs(v) < 0.01) ? Number(v).toExponential(2) : Number(v).toFixed(d);
function metric(m, name, labels) {
  if (!m) return undefined;
  if (labels) return m[name + '{' + labels + '}'];
  return m[name];
}
function sumPrefix(m, prefix) {
  let s = 0, seen = false;
  for (const k in m) if (k.startsWith(prefix)) { s += m[k]; seen = true; }
  return seen ? s : undefined;
}
const colors = ['#1a55c4', '#c4411a', '#1a8a3c', '#8a1ac4', '#c49a1a', '#1ab4c4', '#555', '#c41a7a'];
async function draw() {
  const svg = document.getElementById('chart');
  let h;
  try { h = await (await fetch('/api/history', {cache: 'no-store'})).json(); } catch (e) { return; }
  const series = (h.ranks || []).map(r => ({rank: r.rank, pts: r.points.filter(p => p[1] !== null)}))
    .filter(s => s.pts.length > 1);
  if (!series.length) { svg.innerHTML = '<text x="10" y="90" fill="#777">waiting for data</text>'; return; }
  const all = series.flatMap(s => s.pts);
  const t0 = Math.min(...all.map(p => p[0])), t1 = Math.max(...all.map(p => p[0]));
  const max = Math.max(...all.map(p => p[1]), 1);
  const x = t => 40 + 560 * (t - t0) / Math.max(t1 - t0, 1e-9), y = v => 165 - 150 * v / max;
  let out = '<line x1="40" y1="165" x2="600" y2="165" stroke="#999"/>' +
    '<text x="2" y="18" font-size="11" fill="#555">' + max.toFixed(0) + '</text>' +
    '<text x="2" y="168" font-size="11" fill="#555">0</text>' +
    '<text x="600" y="178" font-size="11" fill="#555" text-anchor="end">' + (t1 - t0).toFixed(0) + ' s</text>';
  series.forEach((s, i) => {
    const c = colors[i % colors.length];
    out += '<polyline fill="none" stroke="' + c + '" stroke-width="2" points="' +
      s.pts.map(p => x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1)).join(' ') + '"/>' +
      '<text x="606" y="' + (20 + 14 * i) + '" font-size="11" fill="' + c + '">rank ' + esc(s.rank) + '</text>';
  });
  svg.innerHTML = out;
}
async function tick() {
  let s;
  try { s = await (await fetch('/api/state?since=' + since, {cache: 'no-store'})).json(); }
  catch (e) { document.getElementById('run').textContent = '(agent unreachable)'; return; }
  const a = s.agent || {};
  document.getElementById('run').textContent = (a.run_id || '') + ' on ' + (a.host || '');
  const cards = [['state', a.state], ['round', a.round], ['world size', a.world_size],
    ['restarts', a.restarts ?? 0], ['re-forms', a.reforms ?? 0],
    ['restart budget', (a.budget_used ?? 0) + ' / ' + (a.max_restarts ?? 0)], ['node', (a.group_rank ?? '-') + ' of ' + (a.group_world_size ?? '-')],
    ['node CPU %', fmt(s.system && s.system.node && s.system.node.cpu_percent, 0)]];
  document.getElementById('cards').innerHTML = cards.map(c =>
    '<div class="card">' + esc(c[0]) + '<b class="' + esc(c[1]) + '">' + esc(c[1] ?? '-') + '</b></div>').join('');
  const usage = {};
  for (const w of ((s.system || {}).workers || [])) usage[w.rank] = w;
  const states = {};
  for (const r of (a.ranks || [])) states[r.rank] = r.state;
  const rows = [];
  let total = 0, any = false;
  const ranks = s.ranks || [];
  const all = new Set([...ranks.map(r => r.rank), ...Object.keys(states).map(Number)]);
  for (const rank of [...all].sort((p, q) => p - q)) {
    const m = (ranks.find(r => r.rank === rank) || {}).metrics || {};
    const u = usage[rank] || {};
    const sps = metric(m, 'cohort_train_samples_per_second');
    if (sps !== undefined) { total += sps; any = true; }
    const bytes = sumPrefix(m, 'cohort_comm_bytes_total'), secs = sumPrefix(m, 'cohort_comm_seconds_total');
    const bw = bytes && secs ? bytes / secs / 1e9 : undefined;
    const wait = metric(m, 'cohort_train_comm_wait_fraction');
    rows.push('<tr><td>' + esc(rank) + '</td><td class="l ' + esc(states[rank] || '') + '">' + esc(states[rank] || '-') +
      '</td><td>' + fmt(metric(m, 'cohort_train_step'), 0) + '</td><td>' + fmt(metric(m, 'cohort_train_loss'), 4) +
      '</td><td>' + fmt(sps, 0) + '</td><td>' + (wait === undefined ? '-' : fmt(100 * wait, 1) + '%') +
      '</td><td>' + fmt(bw, 2) + '</td><td>' + fmt(u.cpu_percent, 0) + '</td><td>' +
      fmt(u.rss_bytes === undefined ? undefined : u.rss_bytes / 1048576, 0) + '</td></tr>');
  }
  document.querySelector('#ranks tbody').innerHTML = rows.join('');
  if (any && ticks++ % 3 === 0) draw();
  for (const e of (s.events || [])) {
    since = Math.max(since, e.seq);
    if (e.type === 'log') logs.push('[rank' + e.rank + '] ' + e.line);
    else if (e.type === 'restart' || e.type === 'failure' || e.type === 'round') restarts.push(e);
  }
  logs = logs.slice(-200);
  const pre = document.getElementById('logs');
  pre.textContent = logs.join('\n');
  pre.scrollTop = pre.scrollHeight;  // newest lines in view
  if (restarts.length) document.getElementById('restarts').innerHTML = '<table><tr><th class="l">time</th><th class="l">event</th><th class="l">cause</th></tr>' +
    restarts.slice(-20).map(e => '<tr><td class="l">' + esc(new Date(e.time * 1000).toLocaleTimeString()) + '</td><td class="l">' + esc(e.type) +
      (e.round !== undefined ? ' (round ' + esc(e.round) + ')' : '') + '</td><td class="l">' + esc(e.cause || '') + '</td></tr>').join('') + '</table>';
  const g = (s.system || {}).gpus || {};
  document.getElementById('gpus').textContent = g.available ?
    (g.devices || []).map(d => 'GPU ' + d.index + ' ' + (d.name || '') + ': ' + d.utilization_percent + '% busy, ' +
      fmt(d.memory_used_bytes / 1073741824, 1) + ' GiB used').join('; ') : ('not monitored: ' + (g.reason || 'unknown'));
}
tick(); setInterval(tick, 1000);
</script></body></html>
)html";

}  // namespace cohort::metrics
