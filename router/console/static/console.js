// freshroute's operator console: polls the router's cluster summary (and the selected table's replicas) twice a
// second, draws them, and lists the changes it observes between two polls. Nothing but this router is contacted.
"use strict";

const POLL_MS = 500;
const RETRY_MS = 1000;
const NODES_SHOWN = 100;
const GRID_PAGE = 256;
const EVENTS_KEPT = 300;

const state = {
  token: null,          // kept for the page's life only
  summary: null,
  grid: null,
  gridTable: null,
  gridFrom: 0,
  connected: null,
  rates: {},            // table -> {offset, at}: input records/s between two summaries
};

const $ = (id) => document.getElementById(id);

// An element with attributes and children (text is always set as text, never parsed as HTML). A boolean is a
// present-or-absent attribute (disabled), except data-* ones, which say "true" or "false".
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    const data = k.startsWith("data-");
    if (v === null || v === undefined || (v === false && !data)) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true && !data ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

async function api(path) {
  const headers = { accept: "application/json" };
  if (state.token) headers.authorization = "Bearer " + state.token;
  const response = await fetch(path, { headers, cache: "no-store" });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  return { status: response.status, body };
}

function errorText(r) {
  const err = r.body && r.body.error;
  return err ? `${r.status} ${err.code}: ${err.message}` : `HTTP ${r.status}`;
}

// ---- formatting -------------------------------------------------------------------------------------------------

function ago(ms) {
  if (ms === null || ms === undefined) return "unknown";
  if (ms < 1000) return `${ms} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms / 60000)} min`;
}

// A replica never known to be complete reports the whole epoch as its staleness: unbounded.
const NEVER_MS = Date.now() - Date.UTC(2020, 0, 1);

function lagText(offsets, ms) {
  const o = offsets === null || offsets === undefined ? "?" : offsets;
  const t = ms === null || ms === undefined ? "?" : ms >= NEVER_MS ? "never caught up" : ago(ms);
  return `${o} / ${t}`;
}

function lagClass(offsets, ms) {
  if (offsets === null || offsets === undefined || (ms || 0) >= NEVER_MS) return "lag unknown";
  if (offsets === 0) return "lag fresh";
  return (ms || 0) > 5000 ? "lag far" : "lag behind";
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString([], { hour12: false });
}

// ---- events: what changed between two polls ----------------------------------------------------------------------

function addEvent(text, kind) {
  const list = $("events");
  list.prepend(h("li", { class: kind || "", "data-kind": kind || "" }, h("time", {}, clock(Date.now())), text));
  while (list.children.length > EVENTS_KEPT) list.lastChild.remove();
}

function observeSummary(before, after) {
  if (!before) return;
  const old = new Map(before.nodes.map((n) => [n.node, n]));
  const now = new Map(after.nodes.map((n) => [n.node, n]));
  for (const [id, n] of now) {
    const was = old.get(id);
    if (!was) addEvent(`${id} joined (${n.address})`, "node-joined");
    else if (was.alive && !n.alive) addEvent(`${id} died: no heartbeat for ${ago(n.heartbeat_age_ms)}`, "node-died");
    else if (!was.alive && n.alive) addEvent(`${id} is alive again`, "node-joined");
    else if (!was.draining && n.draining) addEvent(`${id} is draining`, "node-draining");
  }
  for (const id of old.keys()) if (!now.has(id)) addEvent(`${id} left the cluster`, "node-left");
  if (before.assignor !== after.assignor) {
    addEvent(`assignor lease: ${before.assignor || "nobody"} → ${after.assignor || "nobody"}`, "assignor");
  }
  const restores = (s) => new Map(s.tables.flatMap((t) => t.restoring.map((r) => [`${t.name}/${r.partition} on ${r.node}`, r])));
  const was = restores(before);
  const is = restores(after);
  for (const [k, r] of is) if (!was.has(k)) addEvent(`restore started: ${k} (${progressText(r)})`, "restore-started");
  for (const k of was.keys()) if (!is.has(k)) addEvent(`restore finished: ${k}`, "restore-finished");
  const pipes = new Map(before.tables.map((t) => [t.name, t.pipeline && t.pipeline.alive]));
  for (const t of after.tables) {
    const alive = t.pipeline && t.pipeline.alive;
    if (pipes.has(t.name) && pipes.get(t.name) !== alive) {
      addEvent(`pipeline of ${t.name} ${alive ? "is running again" : "stopped: silent for over 3 s"}`, "pipeline");
    }
  }
}

function activeOf(p) {
  const a = p.replicas.find((r) => r.role === "ACTIVE" || r.role === "active");
  return a ? a.node : null;
}

function observeGrid(before, after) {
  if (!before || before.table !== after.table) return;
  const old = new Map(before.partitions.map((p) => [p.partition, activeOf(p)]));
  for (const p of after.partitions) {
    const was = old.get(p.partition);
    const is = activeOf(p);
    if (old.has(p.partition) && was !== is) {
      addEvent(`${after.table}/${p.partition}: active moved ${was || "nowhere"} → ${is || "nowhere"}`, "active-moved");
    }
  }
}

function progressText(r) {
  if (r.end_offset === null || r.end_offset === undefined) return `at offset ${r.applied_offset}, end unknown`;
  return `${r.applied_offset} of ${r.end_offset}`;
}

// ---- drawing ----------------------------------------------------------------------------------------------------

function renderOverview(s) {
  const alive = s.nodes.filter((n) => n.alive).length;
  const md = s.metadata;
  $("overview").textContent = `${alive} of ${s.nodes.length} nodes alive · ${s.tables.length} tables · assignor ` +
    `${s.assignor || "none"} · assignment generation ${s.assignment_generation ?? "none"} · metadata ` +
    `${md.loaded ? ago(md.age_ms) + " old" : "not loaded"}${md.redis_ok ? "" : " (Redis unreachable)"}`;
}

function attention(n) {
  return (n.alive ? 0 : 4) + (n.draining ? 2 : 0) + (n.restoring ? 1 : 0);
}

function renderNodes(s) {
  let nodes = [...s.nodes];
  if ($("nodes-filter").value === "attention") {
    nodes.sort((a, b) => attention(b) - attention(a) || (b.max_lag_offsets || 0) - (a.max_lag_offsets || 0) ||
      a.node.localeCompare(b.node, undefined, { numeric: true }));
  } else {
    nodes.sort((a, b) => a.node.localeCompare(b.node, undefined, { numeric: true }));
  }
  const dead = s.nodes.length - s.nodes.filter((n) => n.alive).length;
  $("nodes-count").textContent = `${s.nodes.length} (${dead} dead)`;
  const rows = nodes.slice(0, NODES_SHOWN).map((n) => h("tr", { class: n.alive ? "alive" : "dead", "data-node": n.node,
    "data-alive": n.alive },
  h("td", {}, n.node),
  h("td", {}, h("span", { class: "dot" }), n.alive ? (n.draining ? "draining" : "alive") : "dead"),
  h("td", { class: "num" }, ago(n.heartbeat_age_ms)),
  h("td", {}, n.address),
  h("td", { class: "num" }, n.replicas), h("td", { class: "num" }, n.actives), h("td", { class: "num" }, n.restoring),
  h("td", { class: lagClass(n.max_lag_offsets, n.max_lag_ms) }, lagText(n.max_lag_offsets, n.max_lag_ms))));
  $("nodes").tBodies[0].replaceChildren(...rows);
  $("nodes-more").textContent = nodes.length > NODES_SHOWN ? `${nodes.length - NODES_SHOWN} more not shown` : "";
}

// Records the pipeline read from the table's input per second, over at least two seconds of summaries.
function recordsPerSecond(t, at) {
  if (t.input_offset === null || t.input_offset === undefined) return null;
  const r = state.rates[t.name];
  if (!r || t.input_offset < r.offset) {
    state.rates[t.name] = { offset: t.input_offset, at, rate: null };
    return null;
  }
  if (at - r.at >= 2000) {
    r.rate = ((t.input_offset - r.offset) * 1000) / (at - r.at);
    r.offset = t.input_offset;
    r.at = at;
  }
  return r.rate;
}

function renderTables(s) {
  const rows = s.tables.map((t) => {
    const p = t.pipeline || {};
    const kinds = Object.entries(t.replica_kinds || {}).map(([k, n]) => h("span", { class: `kind ${k}` }, `${n} ${k}`));
    const rate = recordsPerSecond(t, s.at_ms);
    const restores = t.restoring.map((r) => h("div", {}, `${r.partition} on ${r.node} `,
      r.end_offset ? h("progress", { max: r.end_offset, value: r.applied_offset }) : null, ` ${progressText(r)}`));
    if (t.restoring_total > t.restoring.length) restores.push(h("div", { class: "muted" }, `${t.restoring_total - t.restoring.length} more`));
    return h("tr", { "data-table": t.name, class: t.name === state.gridTable ? "selected" : "",
      onclick: () => selectTable(t.name) },
    h("td", {}, t.name, t.window ? h("span", { class: "muted" }, " windowed") : null,
      t.table && t.table !== t.name
        ? h("span", { class: "muted", "data-table-version": t.table_version, title: "a version's own table" },
          ` v${t.table_version} of ${t.table}`)
        : h("span", { class: "muted", "data-table-version": t.version ?? 1, title: "the version served, and the others under way" },
          ` v${t.version ?? 1}${versionsUnderWay(t)}`)),
    h("td", { class: "num" }, t.partitions ?? ""),
    h("td", { class: "num" }, t.standby_replicas ?? ""),
    h("td", {}, kinds, t.unserved_partitions ? h("span", { class: "error" }, ` ${t.unserved_partitions} partitions unserved`) : null),
    h("td", { class: lagClass(t.max_lag_offsets, t.max_lag_ms) }, lagText(t.max_lag_offsets, t.max_lag_ms)),
    h("td", { class: p.alive ? "alive" : "dead", "data-pipeline-alive": Boolean(p.alive) },
      h("span", { class: "dot" }), p.alive ? "running" : "not running",
      t.pipeline_mode ? h("span", { class: "muted", "data-pipeline-mode": t.pipeline_mode }, ` ${t.pipeline_mode === "realtime" ? "real-time" : "micro-batches"}`) : null,
      t.query ? h("span", { class: "muted", "data-query": t.query, title: "the pipeline's streaming query that computes it" }, ` in ${t.query}`) : null),
    h("td", { class: "num" }, p.last_progress_ms ? `${ago(s.at_ms - p.last_progress_ms)} ago` : "never"),
    // A table no pipeline has ever written to (a topic served as it is) has no input lag to tell.
    h("td", { class: "num" }, p.last_progress_ms && t.input_lag ? `${t.input_lag.records} / ${ago(t.input_lag.ms)}` : "unknown"),
    h("td", { class: "num" }, rate === null || rate === undefined ? "" : rate.toFixed(1)),
    h("td", {}, restores.length ? restores : h("span", { class: "muted" }, "none")),
    h("td", { class: "versions" }, versionList(t)));
  });
  $("tables").tBodies[0].replaceChildren(...rows);
}

// A duration as a person reads an estimate: "45 s", "3 min", "2 h 5 min", "3 d" (as `freshroute table list` says it).
function durationText(ms) {
  const seconds = ms / 1000;
  if (seconds < 60) return `${Math.max(1, Math.ceil(seconds))} s`;
  const minutes = Math.round(seconds / 60);
  if (minutes < 60) return `${minutes} min`;
  const hours = Math.floor(minutes / 60);
  const rest = minutes % 60;
  if (hours < 48) return rest ? `${hours} h ${rest} min` : `${hours} h`;
  return `${Math.round(hours / 24)} d`;
}

// When a building version will be within switch_lag of its input; unknown (null) is said so, never 0.
function estimateText(ms) {
  if (ms === null || ms === undefined) return "catch-up time unknown";
  return ms === 0 ? "caught up" : `caught up in ~${durationText(ms)}`;
}

// Each version of a table but the retired ones: its state and input lag; a building one's progress (a bar, empty and
// moving while unknown) and when it will have caught up; a failed one's reason.
function versionList(t) {
  if (t.table && t.table !== t.name) return h("span", { class: "muted" }, `listed under ${t.table}`);
  const versions = (t.versions || []).filter((v) => v.state !== "retired");
  if (!versions.length) return h("span", { class: "muted" }, "one version");
  return versions.map((v) => {
    const known = v.progress !== null && v.progress !== undefined;
    const parts = [h("span", { class: `kind ${v.state}` }, `v${v.version} ${v.state}`)];
    if (v.state === "failed") {
      parts.push(h("span", { class: "error reason" }, ` ${v.reason || "no reason recorded"}`));
    } else {
      parts.push(h("span", { class: "input-lag" }, v.input_lag ? ` input lag ${v.input_lag.records} / ${ago(v.input_lag.ms)}`
        : " input lag unknown"));
    }
    if (v.state === "building") {
      parts.push(h("div", { class: "way" }, h("progress", { max: 1, value: known ? v.progress : null }),
        h("span", { class: "progress" }, ` ${known ? Math.floor(v.progress * 100) : "?"}%`),
        h("span", { class: "estimate" }, ` · ${estimateText(v.caught_up_in_ms)}`)));
    }
    return h("div", { class: `version ${v.state}`, "data-version": v.version, "data-state": v.state,
      "data-progress": known ? v.progress : "", "data-caught-up-in-ms": v.caught_up_in_ms ?? "" }, parts);
  });
}

// A table's versions building beside the served one, or kept for a rollback: " (v3 building)".
function versionsUnderWay(t) {
  const others = (t.versions || []).filter((v) => v.version !== t.version && (v.state === "building" || v.state === "previous"));
  return others.length ? ` (${others.map((v) => `v${v.version} ${v.state}`).join(", ")})` : "";
}

// A select's (or a datalist's) options made the table names, keeping what was chosen.
function syncSelect(select, names) {
  const have = [...select.querySelectorAll("option")].map((o) => o.value);
  if (have.join("\n") === names.join("\n")) return;
  const chosen = select.value;
  select.replaceChildren(...names.map((n) => h("option", { value: n }, n)));
  if (chosen !== undefined && names.includes(chosen)) select.value = chosen;
}

function renderGrid(g) {
  const body = $("grid").tBodies[0];
  $("grid").dataset.table = g ? g.table : "";
  if (!g) { body.replaceChildren(); return; }
  const width = Math.max(1, ...g.partitions.map((p) => p.replicas.length));
  body.replaceChildren(...g.partitions.map((p) => h("tr", { "data-partition": p.partition },
    h("th", {}, `partition ${p.partition}`),
    [...Array(width).keys()].map((i) => {
      const r = p.replicas[i];
      if (!r) return h("td", {});
      return h("td", { class: "replica", "data-node": r.node, "data-kind": r.kind, "data-alive": r.alive,
        "data-role": r.role, title: `${r.node} ${r.kind}${r.alive ? "" : " (node dead)"}: applied ${r.applied_offset}` +
          ` of ${r.end_offset ?? "unknown end"}` },
      h("div", {}, r.node, " ", h("span", { class: `kind ${r.alive ? r.kind : "dead"}` }, r.alive ? r.kind : `${r.kind}, dead`)),
      r.failure ? h("div", { class: "failure error" }, r.failure)
        : h("div", { class: lagClass(r.lag.offsets, r.lag.ms) }, lagText(r.lag.offsets, r.lag.ms)));
    }))));
  const pager = $("grid-pager");
  if (g.partitions_total > GRID_PAGE) {
    const first = g.partitions.length ? g.partitions[0].partition : 0;
    pager.replaceChildren(h("button", { onclick: () => pageGrid(-1), disabled: first === 0 }, "‹"),
      ` partitions ${first}–${first + g.partitions.length - 1} of ${g.partitions_total} `,
      h("button", { onclick: () => pageGrid(1), disabled: g.next_from === null }, "›"));
  } else pager.replaceChildren();
}

function pageGrid(step) {
  state.gridFrom = Math.max(0, state.gridFrom + step * GRID_PAGE);
  state.grid = null;
  refreshGrid();
}

function selectTable(name) {
  if (name === state.gridTable) return;
  state.gridTable = name;
  state.gridFrom = 0;
  state.grid = null;
  $("grid-table").value = name;
  $("lookup-table").value = name;
  onLookupTable();
  if (state.summary) renderTables(state.summary);
  refreshGrid();
}

// ---- polling ----------------------------------------------------------------------------------------------------

function setConnection(kind, text) {
  const el = $("connection");
  el.dataset.state = kind;
  el.textContent = text;
}

function showLogin(reason) {
  $("main").hidden = true;
  $("login").hidden = false;
  $("login-reason").textContent = reason;
  setConnection("unauthenticated", "token required");
}

async function refreshGrid() {
  if (!state.gridTable) return;
  const table = state.gridTable;
  const r = await api(`/v1/cluster/tables/${encodeURIComponent(table)}?from=${state.gridFrom}&limit=${GRID_PAGE}`);
  if (table !== state.gridTable) return;
  if (r.status !== 200) { $("grid-pager").replaceChildren(h("span", { class: "error" }, errorText(r))); return; }
  observeGrid(state.grid, r.body);
  state.grid = r.body;
  renderGrid(r.body);
}

async function poll() {
  let wait = POLL_MS;
  try {
    const r = await api("/v1/cluster/summary");
    if (r.status === 401 || r.status === 403) {
      showLogin(!state.token ? "This router asks for a token." : r.status === 401 ? `The token was refused: ${errorText(r)}`
        : `This token may not see the cluster: ${errorText(r)}`);
      return; // polling starts again when a token is given
    }
    if (r.status !== 200) throw new Error(errorText(r));
    if (state.connected === false) addEvent("reconnected to the router", "connection");
    state.connected = true;
    $("login").hidden = true;
    $("main").hidden = false;
    const s = r.body;
    observeSummary(state.summary, s);
    state.summary = s;
    setConnection("live", `live · ${clock(s.at_ms)}`);
    renderOverview(s);
    renderNodes(s);
    const names = s.tables.map((t) => t.name);
    syncSelect($("grid-table"), names);
    syncSelect($("lookup-tables"), names);
    if (!names.includes(state.gridTable) && names.length) selectTable(names[0]);
    renderTables(s);
    await refreshGrid();
  } catch (e) {
    if (state.connected !== false) addEvent(`lost the router: ${e.message || e}`, "connection");
    state.connected = false;
    setConnection("disconnected", "disconnected from the router · retrying");
    wait = RETRY_MS;
  }
  setTimeout(poll, wait);
}

// ---- lookups ----------------------------------------------------------------------------------------------------

function tableDoc(name) {
  return state.summary ? state.summary.tables.find((t) => t.name === name) : null;
}

function onLookupTable() {
  const t = tableDoc($("lookup-table").value);
  const windowed = Boolean(t && t.window);
  $("lookup-range").hidden = !windowed;
  $("lookup-history").hidden = !(t && t.history_retention_ms > 0);
  if (windowed && !$("lookup-from").value) {
    const local = (ms) => new Date(ms - new Date().getTimezoneOffset() * 60000).toISOString().slice(0, 19);
    $("lookup-from").value = local(Date.now() - 3600000);
    $("lookup-to").value = local(Date.now() + 60000);
  }
}

async function lookup(event) {
  event.preventDefault();
  const table = $("lookup-table").value;
  const key = $("lookup-key").value;
  const params = new URLSearchParams();
  for (const input of $("lookup-bound").querySelectorAll("input")) {
    if (input.value.trim() !== "") params.set(input.name, input.value.trim());
  }
  const t = tableDoc(table);
  let path = `/v1/tables/${encodeURIComponent(table)}/keys/${encodeURIComponent(key)}`;
  if (t && t.window) {
    params.set("from", String(new Date($("lookup-from").value).getTime()));
    params.set("to", String(new Date($("lookup-to").value).getTime()));
    path += "/windows";
  } else if (t && t.history_retention_ms > 0 && $("lookup-versions").checked) {
    path += "/versions";
  } else if (t && t.history_retention_ms > 0 && $("lookup-as-of").value) {
    params.set("as_of", String(new Date($("lookup-as-of").value).getTime()));
  }
  const out = $("lookup-result");
  out.replaceChildren(h("span", { class: "muted" }, "asking…"));
  let r;
  try {
    r = await api(`${path}?${params}`);
  } catch (e) {
    out.replaceChildren(h("p", { class: "error", "data-status": "network" }, `the router did not answer: ${e.message || e}`));
    return;
  }
  const b = r.body || {};
  const parts = [];
  if (r.status === 200) {
    const served = b.served_by || {};
    parts.push(h("p", { "data-status": r.status, "data-partition": b.partition, "data-node": served.node,
      "data-role": served.role },
    `partition ${b.partition} · served by ${served.node} (${served.role}) · lag ${lagText(b.lag && b.lag.offsets, b.lag && b.lag.ms)}` +
      ` · input lag ${b.input_lag ? `${b.input_lag.records} / ${ago(b.input_lag.ms)}` : "?"} · position ${b.position || "none"}`));
    if (b.as_of !== undefined) {
      parts.push(h("p", { id: "lookup-as-of-answer", "data-valid-from": b.valid_from, "data-final": String(b.final) },
        `as of ${clock(b.as_of)}: the value since ${clock(b.valid_from)}` +
        `${b.valid_to === null ? ", still the key's" : `, until ${clock(b.valid_to)}`}` +
        ` · ${b.final ? "final: nothing can change it any more" : "open: a change may still reach it"}`));
    }
    if (b.windows) parts.push(timeline(b));
    if (b.versions) parts.push(versionLine(b));
  } else {
    parts.push(h("p", { class: "error", "data-status": r.status, "data-code": b.error ? b.error.code : "" }, errorText(r)));
  }
  parts.push(h("pre", { id: "lookup-json" }, JSON.stringify(b, null, 2)));
  out.replaceChildren(...parts);
}

// A key's windows on a time line: final ones filled, open ones (a late record may still change them) dashed.
function timeline(b) {
  return timeBars("timeline", "no windows in this range", b.windows.map((w) => ({
    from: w.start, to: w.end, cls: w.final ? "final" : "open", data: { "data-start": w.start },
    tip: `${clock(w.start)}–${clock(w.end)}${w.final ? " final" : " open"}: ${JSON.stringify(w.value)}`,
  })));
}

// Bars {from, to, cls, data, tip} on a time line from the earliest to the latest, its ends labelled.
function timeBars(cls, empty, bars) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("class", cls);
  svg.setAttribute("viewBox", "0 0 1000 90");
  svg.setAttribute("preserveAspectRatio", "none");
  const text = (x, y, content, anchor) => {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", String(x)); t.setAttribute("y", String(y));
    if (anchor) t.setAttribute("text-anchor", anchor);
    t.textContent = content;
    svg.append(t);
  };
  if (!bars.length) {
    text(10, 45, empty);
    return svg;
  }
  const lo = Math.min(...bars.map((v) => v.from));
  const hi = Math.max(...bars.map((v) => v.to));
  const x = (ms) => 10 + ((ms - lo) * 980) / Math.max(1, hi - lo);
  for (const bar of bars) {
    const r = document.createElementNS(ns, "rect");
    r.setAttribute("x", String(x(bar.from)));
    r.setAttribute("y", "15");
    r.setAttribute("width", String(Math.max(1, x(bar.to) - x(bar.from) - 1)));
    r.setAttribute("height", "45");
    r.setAttribute("class", bar.cls);
    for (const [name, value] of Object.entries(bar.data)) r.setAttribute(name, String(value));
    const tip = document.createElementNS(ns, "title");
    tip.textContent = bar.tip;
    r.append(tip);
    svg.append(r);
  }
  text(x(lo), 80, clock(lo), "start");
  text(x(hi), 80, clock(hi), "end");
  return svg;
}

// A key's versions on a time line, oldest left: each from when it became the key's to when the next did (the latest
// to now), a delete drawn as a gap.
function versionLine(b) {
  const now = Date.now();
  return timeBars("timeline versions", "no versions kept", b.versions.map((v) => ({
    from: v.valid_from, to: v.valid_to === null ? Math.max(now, v.valid_from) : v.valid_to,
    cls: v.deleted ? "deleted" : v.valid_to === null ? "latest" : "final", data: { "data-valid-from": v.valid_from },
    tip: `${clock(v.valid_from)}–${v.valid_to === null ? "now" : clock(v.valid_to)}: ` +
      (v.deleted ? "deleted" : JSON.stringify(v.value)),
  })));
}

// ---- start ------------------------------------------------------------------------------------------------------

// The bound's fields of the lookup form, one per parameter the router's bound defines (bound.json, beside this file).
async function boundFields() {
  const resp = await fetch("/console/bound.json");
  if (!resp.ok) return;
  $("lookup-bound").replaceChildren(...(await resp.json()).map((p) => h("label", { title: p.doc }, p.name + " ",
    h("input", { id: "lookup-" + p.name.replaceAll("_", "-"), name: p.name, size: p.numeric ? 6 : 14,
      inputmode: p.numeric ? "numeric" : null }))));
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.token = $("token").value.trim();
    $("token").value = "";
    setConnection("connecting", "connecting…");
    poll();
  });
  $("lookup-form").addEventListener("submit", lookup);
  $("lookup-table").addEventListener("input", onLookupTable);
  $("grid-table").addEventListener("change", (e) => selectTable(e.target.value));
  $("nodes-filter").addEventListener("change", () => state.summary && renderNodes(state.summary));
  boundFields();
  poll();
});
