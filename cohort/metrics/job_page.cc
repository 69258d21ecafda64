// The job-wide page served at "/job" by MetricsServer: one self-contained page (no external
// scripts or fonts) that polls /api/job (JobView, job_view.h) and draws every node of the
// job (state, round, restarts, CPU, GPUs, and for a node that left, why), one row per rank
// (state, step, loss, samples/s, communication wait and volume, CPU, RSS), the restarts
// with their causes, and the recent log lines of any rank (filterable). Rows carry
// data-* attributes (node, addr, state, rank) for scripts and tests. Every value from an
// agent's answer reaches the DOM escaped (esc) or as text, and a link only when it is
// http(s): another node's answer is not trusted to be well-formed.
// Thread-safety: a constant string.
#include "cohort/metrics/http_server.h"
#include "cohort/metrics/page_style.h"

namespace cohort::metrics {

extern const char kJobPage[] = R"html(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>cohort job</title>
<style>)html"
    COHORT_PAGE_BASE_STYLE
    R"html(.HEALTHY{color:#0a7a2f}.LOST,.FAILED{color:#b00020;font-weight:bold}.SUCCEEDED{color:#1a55c4}
tr.LOST td{background:#fdecee}
pre{background:#111;color:#ddd;padding:8px;max-height:300px;overflow:auto;font-size:12px}
</style></head><body>
<h1>cohort job <span id="run" class="muted"></span></h1>
<div class="cards" id="cards"></div>
<h2>Nodes</h2>
<table id="nodes"><thead><tr><th>#</th><th class="l">host</th><th class="l">address</th>
<th class="l">state</th><th>round</th><th>node rank</th><th>restarts</th><th>re-forms</th><th>CPU %</th><th class="l">GPUs</th>
<th class="l">cause</th></tr></thead><tbody></tbody></table>
<h2>Ranks</h2>
<table id="ranks"><thead><tr><th class="l">node</th><th>rank</th><th class="l">state</th><th>step</th>
<th>loss</th><th>samples/s</th><th>comm wait</th><th>comm MB</th><th>comm ops</th><th>CPU %</th>
<th>RSS MiB</th></tr></thead><tbody></tbody></table>
<h2>Restarts and failures</h2><div id="restarts" class="muted">none</div>
<h2>Recent log lines <input id="filter" placeholder="rank or text" size="14"></h2><pre id="logs"></pre>
<p class="muted">One node's own dashboard: <a href="/">/</a>. Data: <a href="/api/job">/api/job</a>.</p>
<script>
const esc = t => String(t ?? '').replace(/[&<>"']/g, c => ({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;',"'":'&#39;'}[c]));
// A link target only when it is http(s)://, else none (no javascript: or data: URLs).
const href = u => /^https?:\/\//i.test(String(u ?? '')) ? esc(u) : '#';
const fmt = (v, d) => (v === undefined || v === null) ? '-' :
  (d > 2 && v !== 0 && Math.abs(v) < 0.01) ? Number(v).toExponential(2) : Number(v).toFixed(d);
let last = null;
// A number in the filter asks the agent for that rank's own last lines (/api/job?rank=R);
// other text filters the lines shown.
const rankFilter = () => { const f = document.getElementById('filter').value.trim(); return /^\d+$/.test(f) ? f : null; };
function logs() {
  if (!last) return;
  const f = document.getElementById('filter').value.trim();
  const lines = (last.logs || []).filter(l => !f || rankFilter() !== null || l.line.includes(f))
    .map(l => '[' + (l.addr || l.host) + ' rank' + l.rank + '] ' + l.line);
  const pre = document.getElementById('logs');
  pre.textContent = lines.join('\n');
  pre.scrollTop = pre.scrollHeight;
}
async function tick() {
  let j;
  const r = rankFilter();
  try { j = await (await fetch('/api/job' + (r !== null ? '?rank=' + r : ''), {cache: 'no-store'})).json(); }
  catch (e) { document.getElementById('run').textContent = '(agent unreachable)'; return; }
  last = j;
  const s = j.summary || {};
  document.getElementById('run').textContent = j.run_id || '';
  const cards = [['nodes', s.nodes], ['running', s.running], ['lost', s.lost], ['unreachable', s.unreachable], ['finished', s.finished],
    ['failed', s.failed], ['ranks', s.ranks], ['world size', s.world_size], ['samples/s', fmt(s.samples_per_s, 0)]];
  document.getElementById('cards').innerHTML = cards.map(c =>
    '<div class="card">' + esc(c[0]) + '<b>' + esc(c[1] ?? '-') + '</b></div>').join('');
  const nodes = j.nodes || [];
  document.querySelector('#nodes tbody').innerHTML = nodes.map(n =>
    '<tr class="node ' + esc(n.state) + '" data-node="' + esc(n.index) + '" data-addr="' + esc(n.addr) + '" data-state="' + esc(n.state) + '">' +
    '<td>' + esc(n.index) + '</td><td class="l">' + esc(n.host) + '</td><td class="l"><a href="' + href(n.url) + '">' + esc(n.addr) + '</a></td>' +
    '<td class="l ' + esc(n.state) + '">' + esc(n.state) + '</td><td>' + fmt(n.round, 0) + '</td><td>' + fmt(n.group_rank, 0) +
    '</td><td>' + fmt(n.restarts, 0) + '</td><td>' + fmt(n.reforms, 0) + '</td><td>' + fmt(n.cpu_percent, 0) + '</td><td class="l" title="' + esc(n.gpus) + '">' +
    esc(String(n.gpus ?? '').split(' (')[0]) +
    '</td><td class="l cause">' + esc(n.cause) + '</td></tr>').join('');
  const rows = [];
  for (const n of nodes) for (const r of (n.ranks || [])) rows.push(
    '<tr class="rank ' + esc(r.state) + '" data-node="' + esc(n.index) + '" data-rank="' + esc(r.rank) + '" data-state="' + esc(r.state) + '">' +
    '<td class="l">' + esc(n.addr || n.host) + '</td><td>' + esc(r.rank) + '</td><td class="l ' + esc(r.state) + '">' + esc(r.state) + '</td><td>' +
    fmt(r.step, 0) + '</td><td>' + fmt(r.loss, 4) + '</td><td>' + fmt(r.samples_per_s, 0) + '</td><td>' +
    (r.comm_wait === null ? '-' : fmt(100 * r.comm_wait, 1) + '%') + '</td><td>' +
    fmt(r.comm_bytes === null ? null : r.comm_bytes / 1e6, 1) + '</td><td>' + fmt(r.comm_operations, 0) + '</td><td>' +
    fmt(r.cpu_percent, 0) + '</td><td>' + fmt(r.rss_bytes === null ? null : r.rss_bytes / 1048576, 0) + '</td></tr>');
  document.querySelector('#ranks tbody').innerHTML = rows.join('');
  const events = [];
  for (const n of nodes) for (const e of (n.events || [])) if (e.cause !== 'start') events.push([n, e]);
  events.sort((a, b) => a[1].time - b[1].time);
  if (events.length) document.getElementById('restarts').innerHTML =
    '<table><tr><th class="l">time</th><th class="l">node</th><th class="l">event</th><th class="l">cause</th></tr>' +
    events.slice(-30).map(([n, e]) => '<tr><td class="l">' + esc(new Date(e.time * 1000).toLocaleTimeString()) +
      '</td><td class="l">' + esc(n.addr || n.host) + '</td><td class="l">' + esc(e.type) +
      (e.round !== undefined ? ' (round ' + esc(e.round) + ')' : '') + '</td><td class="l">' + esc(e.cause) + '</td></tr>').join('') + '</table>';
  logs();
}
document.getElementById('filter').addEventListener('input', () => rankFilter() !== null ? tick() : logs());
tick(); setInterval(tick, 1500);
</script></body></html>
)html";

}  // namespace cohort::metrics
