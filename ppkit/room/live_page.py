"""The live page of ``ppkit room --serve``: one HTML document, no external resource (no CDN, no font).

It fetches ``api/rows`` every ``REFRESH_MS`` while its tab is visible, and redraws the table in place (no reload);
a click on a learner's row opens the details (each exercise's attempts and last failure, the last error's text,
the cluster, what could not be read), and stays open across refreshes. Every text from a record goes in with
textContent, so a learner's error message cannot inject markup.
"""

REFRESH_MS = 4000

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>ppkit room</title>
<style>
body { font: 14px system-ui, sans-serif; margin: 1.2em; color: #222; }
h1 { font-size: 1.3em; margin: 0 0 .3em; }
#status { color: #555; margin-bottom: .8em; } #status.error { color: #a00; font-weight: bold; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .35em .6em; border-bottom: 1px solid #ddd; vertical-align: top; }
tr.learner { cursor: pointer; } tr.learner:hover { background: #f4f4f8; }
td.state { font-weight: bold; } .stuck td.state { color: #b00; } .ok td.state { color: #070; }
.unreachable td.state, .bad-record td.state, .no-server td.state { color: #a60; }
tr.details td { background: #fafafa; font-size: 13px; } tr.details ul { margin: .2em 0 .6em 1.2em; padding: 0; }
code { background: #eee; padding: 0 .2em; }
</style></head>
<body>
<h1>The room</h1>
<div id="status">collecting...</div>
<table><thead><tr><th>learner</th><th>state</th><th>passed</th><th>failing</th><th>not tried</th>
<th>open notebooks (kernel)</th><th>last error</th><th>cluster</th><th>preflight</th><th>why</th></tr></thead>
<tbody id="rows"></tbody></table>
<script>
"use strict";
const REFRESH_MS = __REFRESH_MS__;
const XSRF = __XSRF__;
const opened = new Set();
let last = null;
function el(tag, text, cls) { const e = document.createElement(tag); if (text !== undefined && text !== null)
  e.textContent = String(text); if (cls) e.className = cls; return e; }
function ago(s) { return s === null || s === undefined ? "" : (s >= 90 ? Math.round(s / 60) + " min ago"
  : Math.round(s) + " s ago"); }
function stem(p) { return String(p).split("/").pop().replace(/\\.ipynb$/, ""); }
function count(r, k) { return Object.values(r.exercises || {}).reduce((n, e) => n + e[k].length, 0); }
function notebooks(r) { return (r.notebooks || []).map(n => stem(n.path) + " (" + (n.busy_s !== null
  ? "busy " + Math.round(n.busy_s) + " s" : n.kernel) + ")").join(", ") || "-"; }
function item(list, text) { list.appendChild(el("li", text)); }
function details(r) {
  const td = el("td"); td.colSpan = 10;
  const ex = el("ul");
  for (const a of r.attempts || []) {
    item(ex, a.exercise + " (" + stem(a.notebook || "?") + "): " + a.status + ", " + a.attempts + " attempt(s), "
      + a.failures + " failed" + (a.last_failure ? "; last failure: " + a.last_failure : ""));
  }
  for (const [nb, e] of Object.entries(r.exercises || {}))
    if (e.not_tried.length) item(ex, stem(nb) + ": not tried: " + e.not_tried.join(", "));
  if (ex.children.length) { td.appendChild(el("div", "Exercises")); td.appendChild(ex); }
  const more = el("ul");
  if (r.last_error) item(more, "last error " + ago(r.last_error.ago_s) + " in " + stem(r.last_error.notebook
    || "?") + ": " + r.last_error.error + ": " + r.last_error.message);
  if (r.cluster) item(more, "cluster " + r.cluster.state + " " + ago(r.cluster.ago_s) + ": " + r.cluster.detail);
  if (r.preflight) item(more, "preflight: " + r.preflight.verdict + " (" + r.preflight.summary + ")");
  for (const s of r.stuck || []) item(more, "stuck: " + s);
  for (const p of r.problems || []) item(more, "could not read: " + p);
  if (more.children.length) td.appendChild(more);
  if (!td.children.length) td.appendChild(el("div", r.why));
  const tr = el("tr", null, "details"); tr.dataset.user = r.user; tr.appendChild(td); return tr;
}
function draw(data) {
  const body = document.getElementById("rows");
  const rows = [];
  for (const r of data.learners) {
    const tr = el("tr", null, "learner " + r.state.replace(/ /g, "-"));
    tr.dataset.user = r.user;
    const err = r.last_error ? r.last_error.error + " " + ago(r.last_error.ago_s) : "-";
    for (const v of [r.user, r.state, count(r, "passed"), count(r, "failed"), count(r, "not_tried"), notebooks(r),
                     err, r.cluster ? r.cluster.state : "-", r.preflight ? r.preflight.verdict : "-", r.why])
      tr.appendChild(el("td", v));
    tr.children[1].className = "state";
    tr.addEventListener("click", () => { opened.has(r.user) ? opened.delete(r.user) : opened.add(r.user);
                                         draw(last); });
    rows.push(tr);
    if (opened.has(r.user)) rows.push(details(r));
  }
  body.replaceChildren(...rows);
  const status = document.getElementById("status");
  const when = data.collected ? new Date(data.collected * 1000).toLocaleTimeString() : "not yet";
  status.textContent = data.learners.length + " learner(s); collected " + when + "; stuck means a failed check "
    + "or a busy kernel for " + data.stuck_after_min + " min, or a hung cluster; click a row for details"
    + (data.error ? ". Last collection failed: " + data.error : "");
  status.className = data.error ? "error" : "";
}
async function refresh() {
  if (document.hidden) return;  // a tab in the background asks nothing: the service then stops collecting
  try {
    const resp = await fetch("api/rows", {cache: "no-store", credentials: "same-origin",
                                          headers: {"X-XSRFToken": XSRF}});
    if (!resp.ok) throw new Error("api/rows answered " + resp.status + (resp.status === 403
                                  ? ": reload the page to log in again" : ""));
    last = await resp.json(); draw(last);
  } catch (e) {
    const status = document.getElementById("status");
    status.textContent = "cannot refresh: " + e.message + " (the page tries again)"; status.className = "error";
  }
}
refresh(); setInterval(refresh, REFRESH_MS);
document.addEventListener("visibilitychange", () => { if (!document.hidden) refresh(); });
</script></body></html>
""".replace("__REFRESH_MS__", str(REFRESH_MS))
