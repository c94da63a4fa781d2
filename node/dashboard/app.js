"use strict";
// The cancel-bus ops dashboard. One server-sent event feed (/v1/dashboard/feed) brings, once a
// second, the page of runs the filters ask for, the tombstones this token may see and (for an
// ops token) the nodes. Rows are updated in place and never reordered: a new row is put where
// the server lists it, next to the rows already shown, and a row that no longer matches is
// removed. The filters are also the selector of "Cancel all matching…" (POST /v1/cancel-where),
// when they are ones it takes.

const $ = (selector, root = document) => root.querySelector(selector);
const PAGE_SIZE = 50;
const SHOWN_IDS = 10; // of the runs a bulk cancel's preview matched
const SLOWEST_SHOWN = 5; // checkpoint sites of a run's profile
const TOKEN_KEY = "cancel-bus-token";
const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  offset: 0,
  feed: null, // the AbortController of the open feed
  retry: null,
  at: 0, // the server clock of the last snapshot
  viewer: null,
  runRows: new Map(), // run_id -> <tr>
  runs: new Map(), // run_id -> the run as last seen
  nodeRows: new Map(), // node_id -> <tr>
  tombstoneRows: new Map(), // tombstone_id -> <tr>
  detail: null, // {runId, opener, timer}
  confirm: null, // {opener, run} (one run) or {opener, selector, matched} (every matching run)
};

// -- formatting -----------------------------------------------------------------------------

function span(seconds) {
  if (seconds < 1) return (seconds * 1000).toFixed(seconds < 0.01 ? 2 : 0) + " ms";
  if (seconds < 120) return seconds.toFixed(seconds < 10 ? 1 : 0) + " s";
  if (seconds < 7200) return Math.round(seconds / 60) + " min";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h";
  return Math.round(seconds / 86400) + " d";
}

function ago(at) {
  return span(Math.max(0, state.at - at)) + " ago";
}

function clock(at) {
  const d = new Date(at * 1000);
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

function sessionOf(run) {
  return [run.app_name, run.user_id, run.session_id].filter(Boolean).join(" / ") || "—";
}

function isActive(run) {
  return ["queued", "running", "waiting"].includes(run.status);
}

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

function counts(outcomes) {
  // "3 cancelled, 1 stopping"
  const by = new Map();
  for (const {outcome} of outcomes) by.set(outcome, (by.get(outcome) || 0) + 1);
  return [...by].map(([outcome, n]) => `${n} ${outcome}`).join(", ");
}

function describe(selector) {
  // "app=shop user=alice started 1 min ago or earlier"
  const names = {app_name: "app", user_id: "user", session_id: "session", node_id: "node"};
  return Object.entries(selector).map(([key, value]) => {
    if (key === "min_age") return `started ${span(value)} ago or earlier`;
    if (key === "started_before") return `started before ${clock(value).slice(11, 19)}`;
    if (key === "metadata") return Object.entries(value).map(([k, v]) => `${k}=${v}`).join(" ");
    return `${names[key] || key}=${value}`;
  }).join(" ");
}

function pill(node, key, text) {
  let badge = node.firstElementChild;
  if (!badge) node.append(badge = element("span"));
  badge.className = "pill " + key;
  setText(badge, text);
}

// -- the API --------------------------------------------------------------------------------

function headers(extra = {}) {
  return state.token ? {...extra, Authorization: "Bearer " + state.token} : extra;
}

async function api(method, path, body) {
  const options = {method, headers: headers(body ? {"Content-Type": "application/json"} : {})};
  if (body) options.body = JSON.stringify(body);
  const response = await fetch(path, options);
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401) showAuth();
  return {status: response.status, answer};
}

async function request(method, path, body) {
  // as api(), with a network failure answered as status 0
  try {
    return await api(method, path, body);
  } catch (error) {
    return {status: 0, answer: {detail: error.message}};
  }
}

function failure(response) {
  return `HTTP ${response.status}: ${response.answer.detail || "no detail"}`;
}

// -- the filters (also the selector of a cancel of every matching run) ---------------------------

function filterParams() {
  const params = new URLSearchParams();
  for (const field of $("#filters").elements) {
    const value = field.name ? field.value.trim() : "";
    if (!value) continue;
    if (field.name === "age") params.set(...value.split("="));
    else params.set(field.name, value);
  }
  return params;
}

function loadFilters() {
  const params = new URLSearchParams(location.hash.slice(1));
  for (const field of $("#filters").elements) {
    if (field.name && field.name !== "age") field.value = params.get(field.name) || field.defaultValue;
  }
  const age = ["min_age", "max_age"].find((name) => params.has(name));
  $("#f-age").value = age ? `${age}=${params.get(age)}` : "";
  if (!$("#f-status").value) $("#f-status").value = "active";
  state.offset = Number(params.get("offset")) || 0;
}

function applyFilters() {
  const params = filterParams();
  if (state.offset) params.set("offset", state.offset);
  history.replaceState(null, "", "#" + params);
  clearRuns();
  updateBulk();
  follow();
}

const SELECTOR_FILTERS = ["app_name", "user_id", "session_id", "node_id"];
const NOT_SELECTORS = {id_prefix: "run id prefix", phase: "phase", max_age: "“started in the last…”"};

function bulkSelector() {
  // The filters as the selector of POST /v1/cancel-where: {selector}, or {why} they are not one
  // (it takes active runs by app, user, session, node and age; not by status, phase or id).
  const params = filterParams();
  const status = params.get("status") || "active";
  if (status !== "active") {
    return {why: `Cancelling every matching run takes the active runs: set Status to active ` +
      `(it is ${status}).`};
  }
  for (const [name, label] of Object.entries(NOT_SELECTORS)) {
    if (params.has(name)) {
      return {why: `The ${label} filter cannot select runs to cancel (a cancel takes app, ` +
        `user, session, node and “older than”): clear it.`};
    }
  }
  const selector = {};
  for (const name of SELECTOR_FILTERS) if (params.has(name)) selector[name] = params.get(name);
  if (params.has("min_age")) selector.min_age = Number(params.get("min_age"));
  if (!Object.keys(selector).length) {
    if (!state.viewer) return {why: "Waiting for the node…"};
    if (state.viewer.role !== "ops") selector.user_id = state.viewer.user_id; // all of its own
    else return {why: "Choose an app, user, session, node or age to cancel the runs it selects."};
  }
  return {selector};
}

function updateBulk() {
  const {why} = bulkSelector();
  $("#bulk-cancel").disabled = Boolean(why);
  setText($("#bulk-why"), why || "");
}

let typing = null;
function onFilterInput(event) {
  clearTimeout(typing);
  state.offset = 0;
  typing = setTimeout(applyFilters, event.target.tagName === "SELECT" ? 0 : 300);
}

// -- the feed -------------------------------------------------------------------------------

function setStatus(text, tone) {
  setText($("#status"), text);
  $("#status").className = tone || "";
}

function showAuth() {
  $("#auth").hidden = false;
  $("#forget-token").hidden = true;
  setStatus(state.token ? "this token is not accepted" : "a token is needed", "down");
}

async function follow() {
  clearTimeout(state.retry);
  if (state.feed) state.feed.abort();
  const controller = new AbortController();
  state.feed = controller;
  const params = filterParams();
  params.set("limit", PAGE_SIZE);
  params.set("offset", state.offset);
  try {
    const response = await fetch("/v1/dashboard/feed?" + params, {headers: headers(), signal: controller.signal});
    if (response.status === 401) return showAuth();
    if (response.status === 422) {
      const answer = await response.json();
      return setStatus("check the filters: " + answer.detail, "down");
    }
    if (!response.ok) throw new Error("HTTP " + response.status);
    await readEvents(response.body.getReader());
    setStatus("reconnecting…", "down");
  } catch (error) {
    if (controller.signal.aborted) return;
    setStatus("reconnecting… (" + error.message + ")", "down");
  }
  if (state.feed === controller) state.retry = setTimeout(follow, 1000);
}

async function readEvents(reader) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const name = /^event: (.*)$/m.exec(block);
      const data = /^data: (.*)$/m.exec(block);
      if (!name || !data) continue;
      if (name[1] === "snapshot") onSnapshot(JSON.parse(data[1]));
      else if (name[1] === "unavailable") setStatus("Redis unavailable", "down");
    }
  }
}

function onSnapshot(snapshot) {
  state.at = snapshot.at;
  state.viewer = snapshot.viewer;
  const who = snapshot.viewer.role === "ops" ? "ops" : "user " + snapshot.viewer.user_id;
  setText($("#me"), `via ${snapshot.node_id} · ${who}`);
  $("#forget-token").hidden = !state.token;
  renderRuns(snapshot.runs, snapshot.more);
  renderTombstones(snapshot.tombstones);
  renderNodes(snapshot.nodes, snapshot.node_id);
  updateBulk();
  setStatus("live", "live");
}

// -- rows kept in place -----------------------------------------------------------------------

function place(body, rows, items, keyOf, make, update) {
  const seen = new Set();
  let previous = null;
  for (const item of items) {
    const key = keyOf(item);
    seen.add(key);
    let row = rows.get(key);
    if (!row) {
      row = make(item);
      rows.set(key, row);
      body.insertBefore(row, previous ? previous.nextSibling : body.firstChild);
    }
    update(row, item);
    previous = row;
  }
  for (const [key, row] of rows) {
    if (seen.has(key)) continue;
    const hadFocus = row.contains(document.activeElement);
    row.remove();
    rows.delete(key);
    if (hadFocus) $("#runs-section").focus();
  }
}

function clearRuns() {
  $("#runs tbody").replaceChildren();
  state.runRows.clear();
  state.runs.clear();
}

// -- runs -----------------------------------------------------------------------------------

function makeRunRow(run) {
  const open = element("button", {type: "button", class: "link id", title: run.run_id,
    "aria-label": "Details of run " + run.run_id}, run.run_id);
  open.addEventListener("click", () => openDetail(run.run_id, open));
  const cancel = element("button", {type: "button", class: "danger cancel",
    "aria-label": "Cancel run " + run.run_id}, "Cancel…");
  cancel.addEventListener("click", () => askCancel(state.runs.get(run.run_id), cancel));
  const row = element("tr", {"data-run-id": run.run_id},
    element("td", {class: "run"}, open), element("td", {class: "status"}),
    element("td", {class: "owner id wide"}), element("td", {class: "phase wide"}),
    element("td", {class: "session wide"}), element("td", {class: "age"}),
    element("td", {class: "actions"}, cancel));
  return row;
}

function updateRunRow(row, run) {
  state.runs.set(run.run_id, run);
  const key = run.stopping ? "stopping" : run.status;
  const ended = run.end_reason && run.end_reason !== "completed" && run.end_reason !== run.status;
  pill($(".status", row), key, ended ? `${key} · ${run.end_reason}` : key);
  row.dataset.status = key;
  setText($(".owner", row), run.owner || "—");
  setText($(".phase", row), run.phase || "—");
  setText($(".session", row), sessionOf(run));
  const age = $(".age", row);
  setText(age, run.finished_at ? "ended " + ago(run.finished_at) : span(Math.max(0, state.at - run.created_at)));
  age.title = "created " + ago(run.created_at);
  const cancel = $(".cancel", row);
  cancel.hidden = !isActive(run);
  cancel.disabled = run.stopping;
  setText(cancel, run.stopping ? "stopping…" : "Cancel…");
}

function renderRuns(runs, more) {
  place($("#runs tbody"), state.runRows, runs, (run) => run.run_id, makeRunRow, updateRunRow);
  $("#no-runs").hidden = runs.length > 0;
  setText($("#run-count"), `${runs.length}${more ? "+" : ""} shown`);
  setText($("#page-label"), runs.length ? `${state.offset + 1}–${state.offset + runs.length}` : "");
  $("#newer").disabled = state.offset === 0;
  $("#older").disabled = !more;
}

function turnPage(delta) {
  state.offset = Math.max(0, state.offset + delta);
  applyFilters();
}

// -- nodes ----------------------------------------------------------------------------------

const NODE_STATES = {alive: "alive", late: "late · lease expiring", expired: "expired"};

function makeNodeRow(node) {
  const show = element("button", {type: "button", class: "link id",
    "aria-label": `Show the runs of node ${node.node_id}`}, node.node_id);
  show.addEventListener("click", () => {
    $("#f-node").value = node.node_id;
    state.offset = 0;
    applyFilters();
    $("#runs-section").focus();
  });
  return element("tr", {"data-node-id": node.node_id},
    element("td", {class: "node"}, show), element("td", {class: "state"}),
    element("td", {class: "heartbeat"}), element("td", {class: "lease"}),
    element("td", {class: "probe wide"}), element("td", {class: "runs"}),
    element("td", {class: "up wide"}),
    element("td", {class: "version wide"}));
}

function updateNodeRow(row, node) {
  row.dataset.state = node.state;
  row.className = "node-" + node.state;
  pill($(".state", row), node.state, NODE_STATES[node.state]);
  setText($(".heartbeat", row), span(node.heartbeat_age) + " ago");
  setText($(".lease", row), node.state === "expired" ? "—" : span(node.lease_left));
  const probed = node.probe_at !== null && node.probe_latency_ms !== null;
  setText($(".probe", row), probed ? `${span(node.probe_latency_ms / 1000)} · ${ago(node.probe_at)}` : "—");
  $(".probe", row).title = "the last probe of its own channel through Redis: latency, when";
  setText($(".runs", row), String(node.active_runs));
  setText($(".up", row), span(Math.max(0, state.at - node.started_at)));
  setText($(".version", row), node.version);
}

function renderNodes(nodes, here) {
  const ops = nodes !== null;
  $("#nodes-wrap").hidden = !ops;
  $("#nodes-note").hidden = ops;
  if (!ops) {
    setText($("#nodes-note"), `The nodes are listed for ops tokens only; this is the token ` +
      `of user ${state.viewer.user_id}, which sees its own runs.`);
    return;
  }
  place($("#nodes tbody"), state.nodeRows, nodes, (node) => node.node_id, makeNodeRow, updateNodeRow);
  const hereRow = state.nodeRows.get(here);
  if (hereRow) $(".node button", hereRow).title = "the node serving this page";
  const late = nodes.filter((node) => node.state !== "alive").length;
  setText($("#node-count"), `${nodes.length} node(s)` + (late ? ` · ${late} late or expired` : ""));
  const ids = nodes.map((node) => element("option", {value: node.node_id}));
  $("#node-ids").replaceChildren(...ids);
}

// -- tombstones -----------------------------------------------------------------------------

function makeTombstoneRow(tombstone) {
  const id = tombstone.tombstone_id;
  const remove = element("button", {type: "button", class: "danger remove",
    "aria-label": "Remove tombstone " + id}, "Remove");
  remove.addEventListener("click", () => removeTombstone(tombstone, remove));
  return element("tr", {"data-tombstone-id": id},
    element("td", {class: "id"}, id), element("td", {class: "selector"}),
    element("td", {class: "mode wide"}), element("td", {class: "by wide"}),
    element("td", {class: "reason wide"}), element("td", {class: "expires"}),
    element("td", {class: "actions"}, remove));
}

function updateTombstoneRow(row, tombstone) {
  setText($(".selector", row), describe(tombstone.selector));
  setText($(".mode", row), tombstone.mode);
  setText($(".by", row), tombstone.requested_by || "—");
  setText($(".reason", row), tombstone.reason || "—");
  setText($(".expires", row), "in " + span(Math.max(0, tombstone.expires_at - state.at)));
  $(".expires", row).title = clock(tombstone.expires_at);
}

function renderTombstones(tombstones) {
  $("#tombstones-section").hidden = !tombstones.length;
  place($("#tombstones tbody"), state.tombstoneRows, tombstones, (t) => t.tombstone_id,
    makeTombstoneRow, updateTombstoneRow);
  setText($("#tombstone-count"), `${tombstones.length} live`);
}

async function removeTombstone(tombstone, button) {
  button.disabled = true;
  const id = tombstone.tombstone_id;
  const response = await request("DELETE", "/v1/tombstones/" + encodeURIComponent(id));
  if (response.status === 200) {
    notify("ok", "tombstone-removed",
      `Tombstone ${id} removed: runs of ${describe(tombstone.selector)} start again.`);
  } else {
    notify("bad", "error", `Removing tombstone ${id} failed: ${failure(response)}`);
    button.disabled = false;
  }
}

// -- run detail -----------------------------------------------------------------------------

async function openDetail(runId, opener) {
  closeDetailTimer();
  state.detail = {runId, opener, timer: null};
  await refreshDetail();
  if (!$("#detail").open) $("#detail").showModal();
  state.detail.timer = setInterval(refreshDetail, 1000);
}

function closeDetailTimer() {
  if (state.detail) clearInterval(state.detail.timer);
}

function showRun(runId) {
  // another run of the tree, in the same dialog: closing it returns to where it was opened
  openDetail(runId, state.detail ? state.detail.opener : null);
}

function runLink(runId) {
  const link = element("button", {type: "button", class: "link id",
    "aria-label": "Details of run " + runId}, runId);
  link.addEventListener("click", () => showRun(runId));
  return link;
}

async function refreshDetail() {
  const detail = state.detail;
  if (!detail) return;
  const path = "/v1/runs/" + encodeURIComponent(detail.runId);
  const below = "/v1/runs?status=all&limit=100&parent=" + encodeURIComponent(detail.runId);
  const [run, events, children] = await Promise.all(
    [api("GET", path), api("GET", path + "/events"), api("GET", below)]);
  if (state.detail !== detail) return;
  if (run.status !== 200) {
    setText($("#d-id"), detail.runId);
    $("#d-fields").replaceChildren(element("dt", {}, "error"), element("dd", {}, failure(run)));
    return;
  }
  renderDetail(run.answer, events.status === 200 ? events.answer.events : [],
    children.status === 200 ? children.answer.runs : []);
  if (!isActive(run.answer)) clearInterval(detail.timer);
}

function leakOf(leak) {
  // "emit 3, phase 1 — first: emit at agent.py:30"
  if (!leak) return null;
  const calls = Object.entries(leak.calls || {}).map(([call, n]) => `${call} ${n}`).join(", ");
  return calls + (leak.first_call ? ` — first: ${leak.first_call} at ${leak.first_site || "?"}` : "");
}

function renderDetail(run, events, children) {
  setText($("#d-id"), run.run_id);
  const fields = [
    ["status", run.stopping ? "stopping (a cancel is on its way)" : run.status],
    ["end reason", run.end_reason],
    ["owner", run.owner],
    ["app / user / session", sessionOf(run)],
    ["parent", run.parent && runLink(run.parent)],
    ["children", children.length && element("span", {class: "children"},
      ...children.flatMap((child, i) => [i ? ", " : "", runLink(child.run_id),
        ` (${child.stopping ? "stopping" : child.status})`]))],
    ["created", `${clock(run.created_at)} (${ago(run.created_at)})`],
    ["started", run.started_at && clock(run.started_at)],
    ["finished", run.finished_at && `${clock(run.finished_at)} (${ago(run.finished_at)})`],
    ["ran for", run.finished_at && span(run.finished_at - (run.started_at || run.created_at))],
    ["phase", run.phase],
    ["cancel", run.cancel_mode && `${run.cancel_mode}, asked by ${run.requested_by || "?"}` +
      ` (${run.cancel_cause || "user"})`],
    ["cancel reason", run.cancel_reason],
    ["error", run.error],
    ["leaked after its end", leakOf(run.leaked_after_cancel)],
    ["metadata", run.metadata && JSON.stringify(run.metadata)],
  ];
  $("#d-fields").replaceChildren(...fields.filter(([, value]) => value)
    .flatMap(([name, value]) => [element("dt", {}, name), element("dd", {}, value)]));
  renderPhases(run);
  renderSlowest(run.slowest_checkpoints);
  const first = events.length ? events[0].at : 0;
  $("#d-events tbody").replaceChildren(...events.map((event) => element("tr", {},
    element("td", {}, event.type), element("td", {}, clock(event.at).slice(11)),
    element("td", {}, ((event.at - first) * 1000).toFixed(1)),
    element("td", {}, Object.entries(event.data).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ")))));
  const output = $("#d-output");
  const atBottom = output.scrollTop + output.clientHeight >= output.scrollHeight - 4;
  setText(output, isActive(run) ? "(recorded when the run ends)" : run.output);
  if (atBottom) output.scrollTop = output.scrollHeight;
  const size = `(${run.output.length} chars${run.output_truncated ? ", truncated" : ""})`;
  setText($("#d-output-size"), isActive(run) ? "" : size);
  const cancel = $("#d-cancel");
  cancel.hidden = !isActive(run) || run.stopping;
  cancel.disabled = false;
  cancel.onclick = () => askCancel(run, cancel);
}

function renderSlowest(slowest) {
  const worst = Object.entries(slowest || {}).sort((a, b) => b[1] - a[1]).slice(0, SLOWEST_SHOWN);
  $("#d-slow-wrap").hidden = !worst.length;
  $("#d-slow tbody").replaceChildren(...worst.map(([site, ms]) => element("tr", {},
    element("td", {}, span(ms / 1000)), element("td", {class: "id"}, site))));
}

function renderPhases(run) {
  const requested = run.cancel_requested_at;
  const steps = requested === null ? [["no cancel was requested", ""]] : [
    ["requested", clock(requested)],
    ["delivered", run.cancel_delivered_at],
    ["observed", run.cancel_observed_at],
    ["finished", run.finished_at],
  ].map(([name, at], i) => [name, i === 0 ? at : at ? "+" + span(at - requested) : "…"]);
  $("#d-phases").replaceChildren(...steps.map(([name, value]) =>
    element("li", {"data-phase": name}, element("b", {}, name), value ? " " + value : "")));
}

// -- cancel, confirmed (one run, or every matching run) -----------------------------------------

function openConfirm(title, what, submit, keep, bulk) {
  setText($("#confirm-title"), title);
  setText($("#confirm-what"), what);
  $("#confirm-form").reset();
  $("#c-hold-field").hidden = !bulk;
  $("#confirm-ids").hidden = !bulk || !bulk.ids.length;
  $("#confirm-ids").replaceChildren(...(bulk ? bulk.ids : []).map((id) =>
    element("li", {class: "id"}, id)));
  setText($("#c-submit"), submit);
  setText($("#c-keep"), keep);
  updateSubmit();
  $("#confirm").showModal();
}

function updateSubmit() {
  // a cancel of every matching run that matches none only makes sense with a tombstone
  const {confirm} = state;
  const nothing = confirm && confirm.selector && !confirm.matched;
  $("#c-submit").disabled = Boolean(nothing) && !$("#c-hold").checked;
  $("#c-ttl").disabled = !$("#c-hold").checked;
}

function askCancel(run, opener) {
  state.confirm = {run, opener};
  const where = run.owner ? `on node ${run.owner}` : "not on a node yet";
  openConfirm("Cancel this run?",
    `Run ${run.run_id} (${sessionOf(run)}), ${run.status}${run.phase ? " in " + run.phase : ""}, ` +
    `${where}. The runs started below it are cancelled too.`,
    "Cancel the run", "Keep it running", null);
}

async function askBulk(opener) {
  // the preview first: how many runs match now, and which
  const {selector} = bulkSelector();
  if (!selector) return;
  opener.disabled = true;
  const preview = await request("POST", "/v1/cancel-where", {...selector, dry_run: true});
  opener.disabled = false;
  if (preview.status !== 200) {
    notify("bad", "error", `Counting the matching runs failed: ${failure(preview)}`);
    return;
  }
  const {matched, run_ids: ids} = preview.answer;
  state.confirm = {selector, opener, matched};
  const which = matched > SHOWN_IDS ? `; the first ${SHOWN_IDS}:` : matched ? ":" : ".";
  openConfirm("Cancel every matching run?",
    `${matched} active run(s) match ${describe(selector)} now, with the runs below them${which}`,
    `Cancel ${matched} run(s)`, "Keep them running", {ids: ids.slice(0, SHOWN_IDS)});
}

async function confirmCancel(event) {
  event.preventDefault();
  const {run, selector, opener} = state.confirm;
  const form = new FormData($("#confirm-form"));
  $("#confirm").close();
  opener.disabled = true;
  const body = {mode: form.get("mode"), reason: form.get("reason").trim() || null, wait: true, timeout: 5};
  if (selector) {
    if (form.get("hold")) body.ttl = Number(form.get("ttl"));
    const response = await request("POST", "/v1/cancel-where", {...selector, ...body, dry_run: false});
    showBulkOutcome(selector, response);
    opener.disabled = false;
    updateBulk();
    return;
  }
  const response = await request("POST", "/v1/runs/" + encodeURIComponent(run.run_id) + "/cancel", body);
  showOutcome(run.run_id, response);
  if (![200, 202, 409].includes(response.status)) opener.disabled = false;
  if (state.detail && state.detail.runId === run.run_id) refreshDetail();
}

function notify(tone, outcome, text) {
  const notice = $("#notice");
  notice.dataset.tone = tone;
  notice.dataset.outcome = outcome;
  notice.textContent = text;
  notice.hidden = false;
}

function showOutcome(runId, response) {
  const outcome = response.answer.outcome;
  const run = response.answer.run;
  const messages = {
    cancelled: () => ["ok", `Run ${runId}: cancelled — it stopped ` +
      `${span(run.finished_at - run.cancel_requested_at)} after the request.`],
    stopping: () => ["warn", `Run ${runId}: stopping — the cancel is recorded and will be ` +
      "honoured; the run had not confirmed within 5 s."],
    owner_lost: () => ["warn", `Run ${runId}: its node had died; it was resolved as owner_lost.`],
    already_finished: () => ["warn", `Run ${runId} had already finished (${run.status}).`],
    not_found: () => ["bad", `Run ${runId}: not found (it may have expired).`],
  };
  const [tone, text] = messages[outcome] ? messages[outcome]() :
    ["bad", `Cancelling run ${runId} failed: ${failure(response)}`];
  const below = response.answer.descendants || [];
  const tree = below.length ? ` ${below.length} run(s) below it: ${counts(below)}.` : "";
  notify(tone, outcome || "error", text + tree);
}

function showBulkOutcome(selector, response) {
  if (response.status !== 200) {
    notify("bad", "error", `Cancelling the runs of ${describe(selector)} failed: ${failure(response)}`);
    return;
  }
  const {matched, results, tombstones} = response.answer;
  const below = results.flatMap((result) => result.descendants);
  let text = `${matched} run(s) of ${describe(selector)} matched` +
    (results.length ? `: ${counts(results)}.` : ".");
  if (below.length) text += ` ${below.length} run(s) below them: ${counts(below)}.`;
  for (const tombstone of tombstones) {
    text += ` Tombstone ${tombstone.tombstone_id} cancels matching runs started until ` +
      `${clock(tombstone.expires_at).slice(11, 19)}.`;
  }
  const done = [...results, ...below].every((r) => ["cancelled", "owner_lost"].includes(r.outcome));
  notify(done ? "ok" : "warn", "bulk", text);
}

function restoreFocus(opener) {
  // the button that opened the dialog, else its row's first one (a cancel button is
  // disabled once used), else the dialog under it, else the runs
  const row = opener && opener.isConnected ? opener.closest("tr") : null;
  const dialog = opener && opener.closest("dialog[open]");
  const usable = (button) => button && button.isConnected && !button.hidden && !button.disabled;
  const target = [opener, row && $("button", row), dialog && $(".close", dialog)].find(usable);
  if (target) target.focus();
  else $("#runs-section").focus();
}

// -- wiring ---------------------------------------------------------------------------------

function start() {
  loadFilters();
  const filters = $("#filters");
  filters.addEventListener("input", onFilterInput);
  filters.addEventListener("submit", (event) => event.preventDefault());
  filters.addEventListener("reset", () => setTimeout(() => {
    state.offset = 0;
    applyFilters();
  }));
  $("#newer").addEventListener("click", () => turnPage(-PAGE_SIZE));
  $("#older").addEventListener("click", () => turnPage(PAGE_SIZE));
  $("#auth").addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = $("#token").value.trim();
    sessionStorage.setItem(TOKEN_KEY, state.token);
    $("#auth").hidden = true;
    follow();
  });
  $("#forget-token").addEventListener("click", () => {
    state.token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    follow();
  });
  for (const button of document.querySelectorAll("#detail .close")) {
    button.addEventListener("click", () => $("#detail").close());
  }
  $("#detail").addEventListener("close", () => {
    closeDetailTimer();
    const opener = state.detail && state.detail.opener;
    state.detail = null;
    restoreFocus(opener);
  });
  $("#confirm-form").addEventListener("submit", confirmCancel);
  $("#c-hold").addEventListener("change", updateSubmit);
  $("#bulk-cancel").addEventListener("click", (event) => askBulk(event.currentTarget));
  $("#c-keep").addEventListener("click", () => $("#confirm").close());
  $("#confirm").addEventListener("close", () => restoreFocus(state.confirm && state.confirm.opener));
  document.addEventListener("keydown", (event) => {
    const typingHere = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
    if (event.key === "/" && !typingHere && !document.querySelector("dialog[open]")) {
      event.preventDefault();
      $("#f-id").focus();
    }
  });
  applyFilters();
}

start();
