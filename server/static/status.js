// rmserve status page: reads /v1/models, /v1/queue and /v1/status (engine, prefix cache, leases,
// the last 15 minutes' history, drawn as inline SVG charts) every few seconds.
"use strict";

const REFRESH_MS = 1000 * Number(document.body.dataset.refreshS || 3);
const TOKEN_KEY = "rmserve-token";

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: "Bearer " + token } : {};
}

async function getJson(path) {
  const reply = await fetch(path, { headers: headers(), cache: "no-store" });
  if (reply.status === 401) {
    document.getElementById("token-form").hidden = false;
    throw new Error(path + ": this server needs a token (401)");
  }
  if (!reply.ok) {
    let message = reply.status + " " + reply.statusText;
    try { message = (await reply.json()).error.message; } catch (e) { /* keep the status */ }
    throw new Error(path + ": " + message);
  }
  return reply.json();
}

function cell(row, text, className) {
  const td = document.createElement("td");
  td.textContent = text;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function fmtInt(n) { return Number(n).toLocaleString("en-US"); }

function fmtSeconds(s) {
  if (s === null || s === undefined) return "unknown";
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  return m + " min " + Math.round(s - 60 * m) + " s";
}

function fmtTime(unix) {
  if (unix === null || unix === undefined) return "never";
  return new Date(unix * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
}

function fmtRate(rate) { return rate === null || rate === undefined ? "no queries yet" : (100 * rate).toFixed(1) + " %"; }

function showModels(body) {
  const tbody = document.querySelector("#models tbody");
  tbody.replaceChildren();
  for (const m of body.models) {
    const row = document.createElement("tr");
    row.dataset.model = m.name;
    cell(row, m.name, "name");
    cell(row, m.fingerprint, "fingerprint");
    cell(row, m.kind + (m.mode ? " (" + m.mode + ")" : ""));
    cell(row, m.engine);
    cell(row, m.dtype);
    cell(row, fmtInt(m.max_model_len));
    cell(row, fmtInt(m.swap_count), "swaps");
    cell(row, fmtTime(m.last_swap_time), "last-swap");
    tbody.appendChild(row);
  }
}

function showQueue(body) {
  const summary = document.getElementById("queue-summary");
  if (!body.fair_share) {
    summary.textContent = "No fair queue: groups go to the engine in arrival order.";
  } else {
    summary.textContent = fmtInt(body.inflight_groups) + " of " + fmtInt(body.concurrency) +
      " engine slots busy, " + fmtInt(body.queued_groups) + " groups queued, " +
      fmtInt(Math.round(body.tokens_per_s)) + " tokens/s" +
      (body.admin ? " (all users)" : " (only your own entry is shown)");
  }
  const tbody = document.querySelector("#queue tbody");
  tbody.replaceChildren();
  for (const u of body.users) {
    const row = document.createElement("tr");
    row.dataset.user = u.user;
    cell(row, u.user, "user");
    cell(row, String(u.weight), "weight");
    cell(row, fmtInt(u.queued_groups), "queued-groups");
    cell(row, fmtInt(u.queued_tokens), "queued-tokens");
    cell(row, fmtInt(u.inflight_groups), "inflight-groups");
    cell(row, fmtInt(u.inflight_tokens), "inflight-tokens");
    cell(row, fmtInt(u.served_groups), "served-groups");
    cell(row, fmtInt(u.served_tokens), "served-tokens");
    cell(row, fmtInt(Math.round(u.tokens_per_s)), "tokens-per-s");
    cell(row, fmtSeconds(u.estimated_wait_s), "wait");
    tbody.appendChild(row);
  }
}

// What blocks a checkpoint load now, from /v1/status's leases (one entry per served model):
// nothing (an admin may load), a lease held (by whom, how it ends), pinned work in flight
// (whose, that a load waits for it), and what an admin's force then stops.
function leasesSummary(leases) {
  if (leases.length === 0) return "No model is served.";
  const held = leases.filter((l) => l.holder !== null);
  const pinned = leases.filter((l) => l.pinned.length > 0);
  if (held.length === 0 && pinned.length === 0) {
    return "Nobody holds a lease and no pinned work is in flight: an admin may load a checkpoint (scorers never may).";
  }
  const parts = ["Only admins load checkpoints."];
  for (const l of held) {
    parts.push(l.holder + " holds the lease on " + l.model + ": another admin's load is refused until the lease " +
      "ends (once " + l.holder + " has had no pinned work in flight for the server's --lease-idle-s) or is released.");
  }
  for (const l of pinned) {
    parts.push("Loads into " + l.model + " are blocked by the pinned work in flight on it (" + pinnedText(l.pinned) +
      "): a load by any other user is refused until it is done.");
  }
  parts.push(pinned.length > 0
    ? "An admin may force a load, which stops those pinned runs; they keep what they scored and resume once their " +
      "checkpoint is served again."
    : "An admin may force a load; runs pinned to the old checkpoint then stop, keep what they scored and resume once " +
      "it is served again.");
  return parts.join(" ");
}

function showLeases(leases) {
  document.getElementById("leases-summary").textContent = leasesSummary(leases);
  const tbody = document.querySelector("#leases tbody");
  tbody.replaceChildren();
  for (const l of leases) {
    const row = document.createElement("tr");
    row.dataset.model = l.model;
    cell(row, l.model, "model");
    cell(row, l.fingerprint, "fingerprint");
    cell(row, l.holder === null ? "nobody" : l.holder, "holder");
    cell(row, l.since === null ? "" : fmtTime(l.since), "since");
    cell(row, l.holder === null ? "" : l.expires_in_s === null ? "holder busy" : fmtSeconds(l.expires_in_s), "expires");
    cell(row, l.pinned.length === 0 ? "none" : pinnedText(l.pinned), "pinned");
    tbody.appendChild(row);
  }
}

function pinnedText(pinned) {
  return pinned.map((p) => p.user + ": " + fmtInt(p.groups) + (p.groups === 1 ? " group" : " groups")).join(", ");
}

function showSwaps(swaps) {
  document.getElementById("swaps-summary").textContent = swaps.length === 0
    ? "No checkpoint swap since the server started."
    : swaps.length + (swaps.length === 1 ? " swap" : " swaps") + ", newest first.";
  const tbody = document.querySelector("#swaps tbody");
  tbody.replaceChildren();
  for (const s of swaps) {
    const row = document.createElement("tr");
    row.dataset.user = s.user;
    cell(row, fmtTime(s.time), "time");
    cell(row, s.user, "user");
    cell(row, s.model, "model");
    cell(row, s.old_fingerprint, "old-fingerprint");
    cell(row, s.new_fingerprint, "new-fingerprint");
    cell(row, s.forced ? "yes" : "no", "forced");
    cell(row, s.overridden.length === 0 ? "none" : pinnedText(s.overridden), "overridden");
    tbody.appendChild(row);
  }
}

function showStatus(body) {
  showLeases(body.leases || []);
  showHistory(body.history, body.fair_share);
  showSwaps(body.swaps || []);
  document.getElementById("engine-status").textContent = body.status;
  document.getElementById("uptime").textContent = fmtSeconds(body.uptime_s);
  document.getElementById("replica").hidden = !body.replica;
  document.getElementById("replica-name").textContent = body.replica || "";
  const engine = body.engine_prefix_cache;
  const served = body.served_prefix_cache;
  const text = engine
    ? "hit rate " + fmtRate(engine.hit_rate) + " (" + fmtInt(engine.hit_tokens) + " of " +
      fmtInt(engine.query_tokens) + " tokens, engine's own count)"
    : "the engine reports no counters";
  document.getElementById("prefix-cache").textContent = text + "; from the replies sent: " +
    fmtRate(served.hit_rate) + " of " + fmtInt(served.query_tokens) + " tokens; " +
    fmtInt(body.groups_scored) + " groups scored";
}

// --- the last 15 minutes: inline SVG charts built with DOM calls (no library, no inline style) ---

const SVG_NS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"];
const PLOT = { width: 560, height: 230, left: 62, right: 16, top: 14, bottom: 44 };

function svg(name, attrs, text) {
  const el = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attrs || {})) el.setAttribute(key, String(value));
  if (text !== undefined) el.textContent = text;
  return el;
}

// The smallest of 1, 2, 2.5, 5 × a power of ten at or above v (1 for v ≤ 0).
function niceCeiling(v) {
  if (!(v > 0)) return 1;
  const power = Math.pow(10, Math.floor(Math.log10(v)));
  for (const m of [1, 2, 2.5, 5, 10]) if (m * power >= v * (1 - 1e-12)) return m * power;
  return 10 * power;
}

function fmtTick(v) { return v >= 1000 ? fmtInt(Math.round(v)) : String(Number(v.toPrecision(3))); }

function fmtPerS(v) { return v >= 100 ? fmtInt(Math.round(v)) : String(Number(v.toPrecision(3))); }

// chart: { windowS, endS, yTitle, series: [{ name, color, points: [[unix_s, value], …], note }], empty }
// Draws axes with their units, one polyline per series (class "series", data-series = its name),
// a legend naming each series, and chart.empty (when set) across the plot.
function drawChart(figure, chart) {
  const { width, height, left, right, top, bottom } = PLOT;
  const innerW = width - left - right, innerH = height - top - bottom;
  const values = chart.series.flatMap((s) => s.points.map((p) => p[1]));
  const yMax = niceCeiling(Math.max(0, ...values));
  const x = (t) => left + innerW * (1 - (chart.endS - t) / chart.windowS);
  const y = (v) => top + innerH * (1 - v / yMax);
  const root = svg("svg", { class: "chart", viewBox: "0 0 " + width + " " + height, width: width, height: height,
    role: "img", "aria-label": figure.querySelector("figcaption").textContent });
  for (let i = 0; i <= 4; i++) {
    const v = yMax * i / 4;
    root.appendChild(svg("line", { class: "grid", x1: left, x2: left + innerW, y1: y(v), y2: y(v) }));
    root.appendChild(svg("text", { class: "y-tick", x: left - 6, y: y(v) + 4, "text-anchor": "end" }, fmtTick(v)));
  }
  const minutes = chart.windowS / 60;
  const step = niceCeiling(minutes / 4);
  for (let m = 0; m <= minutes + 1e-9; m += step) {
    const at = x(chart.endS - 60 * m);
    root.appendChild(svg("line", { class: "axis", x1: at, x2: at, y1: top + innerH, y2: top + innerH + 4 }));
    root.appendChild(svg("text", { class: "x-tick", x: at, y: top + innerH + 16, "text-anchor": "middle" },
      m === 0 ? "0" : "−" + fmtTick(m)));
  }
  root.appendChild(svg("line", { class: "axis", x1: left, x2: left + innerW, y1: top + innerH, y2: top + innerH }));
  root.appendChild(svg("line", { class: "axis", x1: left, x2: left, y1: top, y2: top + innerH }));
  root.appendChild(svg("text", { class: "x-title", x: left + innerW / 2, y: height - 6, "text-anchor": "middle" },
    "minutes before " + fmtTime(chart.endS)));
  root.appendChild(svg("text", { class: "y-title", x: -(top + innerH / 2), y: 14, "text-anchor": "middle",
    transform: "rotate(-90)" }, chart.yTitle));
  for (const s of chart.series) {
    const points = s.points.map(([t, v]) => x(t).toFixed(1) + "," + y(v).toFixed(1)).join(" ");
    const line = svg("polyline", { class: "series", points: points, stroke: s.color });
    line.dataset.series = s.name;
    root.appendChild(line);
  }
  if (chart.empty) {
    root.appendChild(svg("text", { class: "empty", x: left + innerW / 2, y: top + innerH / 2, "text-anchor": "middle" },
      chart.empty));
  }
  figure.querySelector(".plot").replaceChildren(root);
  const legend = figure.querySelector(".legend");
  legend.replaceChildren();
  for (const s of chart.series) {
    const item = document.createElement("li");
    item.dataset.series = s.name;
    const swatch = svg("svg", { class: "swatch", width: 14, height: 14, viewBox: "0 0 14 14" });
    swatch.appendChild(svg("rect", { x: 1, y: 5, width: 12, height: 4, fill: s.color }));
    item.appendChild(swatch);
    const name = document.createElement("span");
    name.className = "name";
    name.textContent = s.name;
    item.appendChild(name);
    if (s.note) {
      const note = document.createElement("span");
      note.className = "note muted";
      note.textContent = s.note;
      item.appendChild(note);
    }
    legend.appendChild(item);
  }
}

// history: /v1/status's StatusHistory (times in Unix seconds; rate i over time_s[i] → time_s[i + 1]).
function showHistory(history, fairShare) {
  const summary = document.getElementById("history-summary");
  const throughput = document.getElementById("throughput-chart");
  const queue = document.getElementById("queue-chart");
  if (!history) {
    summary.textContent = "This server keeps no history.";
    return;
  }
  const times = history.time_s;
  const windowS = history.capacity * history.interval_s;
  const endS = times.length ? times[times.length - 1] : Date.now() / 1000;
  const windowText = fmtSeconds(windowS).replace(" 0 s", "");
  summary.textContent = "One sample every " + history.interval_s + " s, the last " + fmtInt(history.capacity) +
    " kept (" + windowText + "); " + fmtInt(times.length) + (times.length === 1 ? " sample" : " samples") +
    " so far. Rates are over each interval between two samples.";
  const users = history.users.map((u, i) => ({
    name: u.user,
    color: COLORS[i % COLORS.length],
    points: u.tokens_per_s.map((v, j) => [times[j + 1], v]),
    note: "last " + fmtSeconds(times[times.length - 1] - times[times.length - 2]) + ": " +
      fmtPerS(u.tokens_per_s[u.tokens_per_s.length - 1]) + " tokens/s, " +
      fmtPerS(u.groups_per_s[u.groups_per_s.length - 1]) + " groups/s",
  }));
  const noTraffic = !fairShare ? "no fair queue: no per-user throughput"
    : times.length < 2 ? "no samples yet (one every " + history.interval_s + " s)"
      : users.length === 0 ? "no traffic in the last " + windowText : null;
  drawChart(throughput, { windowS: windowS, endS: endS, yTitle: "prompt tokens/s", series: users, empty: noTraffic });
  const depth = times.length === 0 ? [] : [
    { name: "queued", color: "#ff7f0e", points: history.queued_groups.map((v, j) => [times[j], v]),
      note: "now " + fmtInt(history.queued_groups[times.length - 1]) },
    { name: "in flight", color: "#1f77b4", points: history.inflight_groups.map((v, j) => [times[j], v]),
      note: "now " + fmtInt(history.inflight_groups[times.length - 1]) },
  ];
  const noQueue = !fairShare ? "no fair queue" : times.length === 0 ? "no samples yet" : null;
  drawChart(queue, { windowS: windowS, endS: endS, yTitle: "groups", series: depth, empty: noQueue });
}

async function refresh() {
  const errors = [];
  const jobs = [["/v1/status", showStatus], ["/v1/models", showModels], ["/v1/queue", showQueue]];
  await Promise.all(jobs.map(async ([path, show]) => {
    try { show(await getJson(path)); } catch (e) { errors.push(e.message); }
  }));
  const error = document.getElementById("error");
  error.hidden = errors.length === 0;
  error.textContent = errors.join("; ");
  document.getElementById("updated").textContent = new Date().toLocaleTimeString();
  document.body.dataset.refreshes = String(Number(document.body.dataset.refreshes || 0) + 1);
}

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, document.getElementById("token").value);
  document.getElementById("token").value = "";
  document.getElementById("token-form").hidden = true;
  refresh();
});

refresh();
setInterval(refresh, REFRESH_MS);
