"""The live fleet page (``GET /fleet``): one self-contained HTML document, no build step, nothing
loaded from elsewhere. It asks for a control-plane key when the API wants one, keeps it for the
tab only (``sessionStorage``), and reads ``/v1/rl/workers`` and the journal stream with ``fetch``
and an ``Authorization`` header (a key never goes into a URL). Read-only.

The in-flight column is the data plane's counters (``GET /workers/stats``: rollout requests in
flight per instance, summed per engine row), read once a second while the tab is visible (rollout
traffic is not journaled, so the stream cannot carry it); one request at a time."""

PAGE = r"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>smgrl fleet</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em; color: #1d2330; background: #fafbfc; }
  h1 { font-size: 1.3em; margin: 0 0 .6em; } h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
  table { border-collapse: collapse; width: 100%; background: #fff; }
  th, td { text-align: left; padding: .3em .6em; border-bottom: 1px solid #e3e6ea; font-variant-numeric: tabular-nums; }
  th { background: #f0f2f5; font-weight: 600; }
  tr.quarantined td { background: #fdecea; } tr.paused td { background: #fff7e0; }
  .pill { display: inline-block; padding: 0 .5em; border-radius: 1em; font-size: .85em; background: #e3e6ea; }
  .pill.active { background: #d9f2e3; } .pill.paused { background: #ffe8a8; } .pill.q { background: #f7c3bd; }
  #status { color: #667; font-size: .9em; } #keyform { display: none; margin: 1em 0; padding: 1em; background: #fff; border: 1px solid #e3e6ea; }
  svg text { font: 11px system-ui, sans-serif; fill: #334; } svg .axis line { stroke: #99a; }
  td.quarantine .reason { white-space: normal; overflow-wrap: anywhere; color: #8a1f11; }
  #legend { font-size: .85em; margin: .2em 0 .4em; } #legend .item { margin-right: 1em; white-space: nowrap; }
  #legend .swatch { display: inline-block; width: .9em; height: .9em; margin-right: .3em; vertical-align: -.1em; }
  #ops td.time { white-space: nowrap; } #ops tr.failed td.result, #ops tr.partial td.result { color: #b3261e; }
  .mono { font-family: ui-monospace, monospace; font-size: .9em; } #fleet td.mono { white-space: nowrap; }
</style>
</head>
<body>
<h1>smgrl fleet <span id="status">connecting...</span></h1>
<form id="keyform"><label>Control-plane key (kept for this tab only):
  <input id="key" type="password" autocomplete="off" size="40"></label> <button type="submit">Use key</button>
  <span id="keyerror"></span></form>
<table id="fleet"><thead><tr><th>engine</th><th>kind</th><th>url</th><th>version</th><th>state</th>
  <th>quarantine</th><th>health</th><th>in flight</th></tr></thead><tbody></tbody></table>
<h2>Refit timeline</h2>
<div id="legend"></div>
<svg id="timeline" width="100%" height="40" role="img" aria-label="refit timeline"></svg>
<h2>Last operations</h2>
<table id="ops"><thead><tr><th>time</th><th>operation</th><th>selector</th><th>result</th></tr></thead>
  <tbody></tbody></table>
<script>
"use strict";
const KEY = "smgrl-key";
const PHASE_COLORS = {pause: "#f2b134", load: "#4f81bd", init: "#8064a2", begin: "#8064a2", transfer: "#9bbb59",
  end: "#4f81bd", version: "#4bacc6", flush: "#c0504d", verify: "#2c7f5f", checksum: "#1f6f5f", destroy: "#8064a2", resume: "#3a9d5d",
  recheck: "#888", quarantine: "#d9534f"};
const cycles = new Map();   // refit id -> {id, version, result, steps: [{phase, start, end}], started}
const ops = new Map();      // op or refit id -> {id, ts, what, selector, result, cls}: one entry per id
const started = new Map();  // op id -> its control.started (method, path, selector), for its entry
const MAX_OPS = 20, MAX_STARTED = 2000;
let lastSeq = null, refreshTimer = null, inflight = new Map(), polling = false;

function headers() {
  const k = sessionStorage.getItem(KEY);
  return k ? {"authorization": "Bearer " + k} : {};
}
function text(s) { return document.createTextNode(s == null ? "" : String(s)); }
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  for (const c of kids) e.append(c instanceof Node ? c : text(c));
  return e;
}
function setStatus(s) { document.getElementById("status").textContent = s; }
function askKey(message) {
  document.getElementById("keyform").style.display = "block";
  document.getElementById("keyerror").textContent = message || "";
}
document.getElementById("keyform").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, document.getElementById("key").value);
  document.getElementById("key").value = "";
  document.getElementById("keyform").style.display = "none";
  start();
});

async function loadWorkers() {
  const r = await fetch("/v1/rl/workers", {headers: headers()});
  if (r.status === 401 || r.status === 403) { askKey(r.status === 403 ? "this key may not read" : ""); return false; }
  const body = await r.json();
  const tbody = document.querySelector("#fleet tbody");
  tbody.replaceChildren();
  for (const w of body.workers) {
    const state = w.control || "active";
    const q = w.quarantined ? (w.quarantine && w.quarantine.reason) || "quarantined" : "";
    const tr = el("tr", {"data-worker-id": w.id, "class": w.quarantined ? "quarantined" : state});
    tr.append(el("td", {"class": "mono", title: w.id}, w.id.slice(0, 13)), el("td", {}, w.engine),
      el("td", {"class": "mono"}, w.url), el("td", {"class": "version"}, w.weight_version || "-"),
      el("td", {"class": "state"}, el("span", {"class": "pill " + state}, state)),
      el("td", {"class": "quarantine"}, q ? el("span", {"class": "reason"}, q) : ""),
      el("td", {}, w.health), el("td", {"class": "inflight"}, inflight.has(w.id) ? String(inflight.get(w.id)) : "-"));
    tbody.append(tr);
  }
  return true;
}
// Rollout requests in flight per engine row (DP ranks summed), from the data plane's counters.
async function loadInflight() {
  let r;
  try { r = await fetch("/workers/stats", {headers: headers()}); } catch (e) { return; }
  if (!r.ok) return;
  const body = await r.json(), counts = new Map();
  for (const w of body.workers) {
    const id = w.base_worker_id || w.worker_id;
    counts.set(id, (counts.get(id) || 0) + (w.in_flight || 0));
  }
  inflight = counts;
  for (const tr of document.querySelectorAll("#fleet tbody tr")) {
    const cell = tr.querySelector(".inflight"), id = tr.getAttribute("data-worker-id");
    if (cell) cell.textContent = counts.has(id) ? String(counts.get(id)) : "-";
  }
}
async function pollInflight() {
  // One request at a time, once a second, only while the tab is shown: bounded load on the gateway.
  for (;;) {
    if (!document.hidden) await loadInflight();
    await sleep(1000);
  }
}
function scheduleRefresh() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => { refreshTimer = null; loadWorkers(); }, 150);
}

function onRecord(rec) {
  lastSeq = rec.seq;
  const p = rec.payload, t = rec.type;
  if (t.startsWith("refit.")) {
    let c = cycles.get(p.refit_id);
    if (!c) { c = {id: p.refit_id, version: p.weight_version, result: null, steps: [], started: rec.ts}; cycles.set(p.refit_id, c); }
    if (t === "refit.started") c.selector = p.selector;
    if (t === "refit.step") c.steps.push({phase: p.phase, start: rec.ts, end: null});
    if (t === "refit.step_done") {
      const s = [...c.steps].reverse().find((x) => x.phase === p.phase && x.end === null);
      if (s) s.end = rec.ts; else c.steps.push({phase: p.phase, start: rec.ts, end: rec.ts});
    }
    if (t === "refit.finished") {
      c.result = p.result; c.ended = rec.ts;
      const held = p.quarantined.length ? " (held out: " + p.quarantined.join(", ") + ")" : "";
      addOp({id: p.refit_id, ts: c.started, what: "refit to " + (c.version || "?"), selector: c.selector,
        result: p.result + held, cls: p.result === "succeeded" ? "ok" : "failed"});
    }
    drawTimeline();
  } else if (t === "control.started") {
    started.set(p.op_id, {method: p.method, path: p.path, selector: p.selector, ts: rec.ts});
    if (started.size > MAX_STARTED) started.delete(started.keys().next().value);
  } else if (t === "control.finished") {
    const s = started.get(p.op_id);
    started.delete(p.op_id);
    addOp({id: p.op_id, ts: s ? s.ts : rec.ts, what: s ? s.method + " " + s.path : "operation " + p.op_id.slice(0, 13),
      selector: s && s.selector, cls: p.result,
      result: p.result + " " + p.succeeded + "/" + p.total + " in " + p.latency_ms + " ms"});
  }
  if (/^(worker|engine|control|refit)\./.test(t)) scheduleRefresh();
}
function addOp(o) {
  // Keyed by id: a record seen twice (a reconnect, a replay) updates its entry, never adds one.
  ops.set(o.id, o);
  if (ops.size > MAX_OPS) {
    const oldest = [...ops.values()].sort((a, b) => a.ts - b.ts)[0];
    ops.delete(oldest.id);
  }
  drawOps();
}
function clock(ts) {
  const d = new Date(ts * 1000), two = (n) => String(n).padStart(2, "0");
  return two(d.getHours()) + ":" + two(d.getMinutes()) + ":" + two(d.getSeconds());
}
function drawOps() {
  const rows = [...ops.values()].sort((a, b) => b.ts - a.ts).map((o) => el("tr", {"data-id": o.id, "class": o.cls || ""},
    el("td", {"class": "time", title: new Date(o.ts * 1000).toISOString()}, clock(o.ts)),
    el("td", {"class": "what mono"}, o.what), el("td", {"class": "selector mono"}, o.selector || "-"),
    el("td", {"class": "result"}, o.result)));
  document.querySelector("#ops tbody").replaceChildren(...rows);
}
function span(s) { return s < 1 ? Math.round(s * 1000) + " ms" : (s < 10 ? s.toFixed(1) : Math.round(s)) + " s"; }
function drawTimeline() {
  // Every cycle on one time scale (seconds since its start), an axis under them, a legend above.
  const svg = document.getElementById("timeline"), ns = "http://www.w3.org/2000/svg";
  const list = [...cycles.values()].slice(-8);
  svg.replaceChildren();
  const rowsHeight = list.length * 26;
  svg.setAttribute("height", String(Math.max(40, rowsHeight + 44)));
  const width = svg.clientWidth || 900, left = 190, plot = width - left - 20;
  const endOf = (c) => c.ended || Math.max(c.started, ...c.steps.map((s) => s.end || s.start)) + 0.001;
  const longest = Math.max(0.001, ...list.map((c) => endOf(c) - c.started));
  const x = (c, ts) => left + (ts - c.started) / longest * plot;
  const seen = new Set();
  const node = (tag, attrs) => {
    const e = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    return e;
  };
  list.forEach((c, i) => {
    const g = node("g", {"class": "cycle", "data-refit-id": c.id});
    const end = endOf(c), y = 8 + i * 26;
    const label = node("text", {x: 0, y: y + 13});
    label.textContent = "v" + (c.version || "?") + " " + (c.result || "running") + " (" + span(end - c.started) + ")";
    g.append(label);
    for (const s of c.steps) {
      seen.add(s.phase);
      const x0 = x(c, s.start), x1 = x(c, s.end || end);
      const r = node("rect", {x: x0, y: y, height: 18, width: Math.max(2, x1 - x0), fill: PHASE_COLORS[s.phase] || "#999",
        "data-phase": s.phase});
      const tip = document.createElementNS(ns, "title");
      tip.textContent = s.phase + ": " + span((s.end || end) - s.start);
      r.append(tip);
      g.append(r);
    }
    svg.append(g);
  });
  if (list.length) {
    const axis = node("g", {"class": "axis"}), y = 12 + rowsHeight;
    axis.append(node("line", {x1: left, x2: left + plot, y1: y, y2: y}));
    for (let k = 0; k <= 4; k++) {
      const tx = left + plot * k / 4;
      axis.append(node("line", {x1: tx, x2: tx, y1: y, y2: y + 4}));
      const tick = node("text", {x: tx, y: y + 16, "text-anchor": k === 0 ? "start" : (k === 4 ? "end" : "middle"),
        "class": "tick"});
      tick.textContent = span(longest * k / 4);
      axis.append(tick);
    }
    const name = node("text", {x: 0, y: y + 16, "class": "axis-label"});
    name.textContent = "time since the refit began";
    axis.append(name);
    svg.append(axis);
  }
  const legend = document.getElementById("legend");
  legend.replaceChildren(...Object.keys(PHASE_COLORS).filter((p) => seen.has(p)).map((p) =>
    el("span", {"class": "item", "data-phase": p}, el("span", {"class": "swatch", style: "background:" + PHASE_COLORS[p]}), p)));
}

async function follow() {
  // fetch (not EventSource): it can send the key in a header.
  for (let attempt = 0; attempt < 1000; attempt++) {
    const url = "/v1/rl/journal/stream" + (lastSeq === null ? "?tail=5000" : "?after=" + lastSeq);
    let r;
    try { r = await fetch(url, {headers: headers()}); } catch (e) { setStatus("disconnected; retrying"); await sleep(1000); continue; }
    if (r.status === 401 || r.status === 403) { askKey(); setStatus("needs a key"); return; }
    setStatus("live");
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut); buf = buf.slice(cut + 2);
        let event = "message", data = "";
        for (const line of block.split("\n")) {
          if (line.startsWith("event: ")) event = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (event === "journal" && data) onRecord(JSON.parse(data));
      }
    }
    setStatus("reconnecting");
    await sleep(500);
  }
}
function sleep(ms) { return new Promise((res) => setTimeout(res, ms)); }
async function start() {
  if (await loadWorkers()) {
    follow();
    if (!polling) { polling = true; pollInflight(); }
  }
}
start();
</script>
</body>
</html>
"""
