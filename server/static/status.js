// rmserve status page: reads /v1/models, /v1/queue and /v1/status (engine, prefix cache, leases) every few seconds.
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

function showLeases(leases) {
  const held = leases.filter((l) => l.holder !== null).length;
  document.getElementById("leases-summary").textContent = leases.length === 0
    ? "No model is served."
    : held === 0 ? "Nobody holds a lease: any user may load a checkpoint."
      : "A checkpoint load by another user is refused while a lease is held or others' pinned work is in flight (an admin may force it).";
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
  showSwaps(body.swaps || []);
  document.getElementById("engine-status").textContent = body.status;
  document.getElementById("uptime").textContent = fmtSeconds(body.uptime_s);
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
