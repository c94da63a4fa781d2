// A run's detail, in a dialog: its fields, the cancel phase by phase, its tree, where it went
// longest without a checkpoint, its timeline and its output (live while it runs). Refreshed
// every second while a run of its tree is active.

import {failure, request, runPath} from "./api.js";
import {askCancel} from "./cancel.js";
import {$, element, setText} from "./dom.js";
import {ago, clock, isActive, sessionOf, span} from "./format.js";
import {blocked} from "./health.js";
import {endLive, followLive, stopLive} from "./live.js";
import {showRun} from "./route.js";
import {state} from "./state.js";
import {drawTree, loadTree, treeActive} from "./tree.js";

const SLOWEST_SHOWN = 5; // checkpoint sites of a run's profile
const REPLACED = new Set(["interrupt", "rollback"]); // causes whose requester replaced the run

export async function openDetail(runId, opener) {
  if (state.detail && state.detail.runId === runId) return;
  const keep = state.detail ? state.detail.opener : opener; // within a tree: where it began
  stopTimer();
  endLive();
  state.detail = {runId, opener: keep, timer: null, cache: new Map(), run: null};
  setText($("#d-id"), runId);
  $("#d-fields").replaceChildren();
  setText($("#d-output"), "");
  setText($("#d-output-size"), "");
  $("#d-follow").checked = true;
  $("#d-tree-wrap").hidden = true;
  updateDetailCancel(); // none until the run is read: no cancel of the run shown before
  const status = await refreshDetail();
  if (!state.detail || state.detail.runId !== runId) return;
  if (status === 401) {
    state.detail = null; // the token first (a link opened in a new tab): then route() again
    return;
  }
  if (!$("#detail").open) $("#detail").showModal();
  state.detail.timer = setInterval(refreshDetail, 1000);
}

export function closeDetail() {
  // the hash no longer names a run: the dialog closes (its close event tidies up)
  if ($("#detail").open) $("#detail").close();
}

export function onDetailClosed() {
  stopTimer();
  stopLive();
  const opener = state.detail && state.detail.opener;
  state.detail = null;
  return opener;
}

function stopTimer() {
  if (state.detail) clearInterval(state.detail.timer);
}

function runLink(runId) {
  const link = element("button", {type: "button", class: "link id",
    "aria-label": "Details of run " + runId}, runId);
  link.addEventListener("click", () => showRun(runId, null));
  return link;
}

export async function refreshDetail() {
  // the run's record, events, children and tree read again; the status of the run's read
  const detail = state.detail;
  if (!detail) return 0;
  const path = runPath(detail.runId);
  const below = "/v1/runs?status=all&limit=100&parent=" + encodeURIComponent(detail.runId);
  const [run, events, children] = await Promise.all(
    [request("GET", path), request("GET", path + "/events"), request("GET", below)]);
  if (state.detail !== detail) return run.status;
  if (run.status === 0 && detail.run) return 0; // the node does not answer: what was shown stays
  if (run.status !== 200) {
    $("#d-fields").replaceChildren(element("dt", {}, "error"), element("dd", {}, failure(run)));
    return run.status;
  }
  const kids = children.status === 200 ? children.answer.runs : [];
  detail.run = run.answer;
  renderDetail(run.answer, events.status === 200 ? events.answer.events : [], kids);
  const tree = run.answer.parent || kids.length ? await loadTree(run.answer, kids, detail.cache) : null;
  if (state.detail !== detail) return 200;
  $("#d-tree-wrap").hidden = !tree;
  if (tree) drawTree($("#d-tree"), tree, detail.runId, runLink);
  if (!isActive(run.answer) && !(tree && treeActive(tree))) clearInterval(detail.timer);
  return 200;
}

function leakOf(leak) {
  // "emit 3, phase 1 — first: emit at agent.py:30"
  if (!leak) return null;
  const calls = Object.entries(leak.calls || {}).map(([call, n]) => `${call} ${n}`).join(", ");
  return calls + (leak.first_call ? ` — first: ${leak.first_call} at ${leak.first_site || "?"}` : "");
}

function renderDetail(run, events, children) {
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
    ["replaced", run.interrupted && runLink(run.interrupted)], // the run it interrupted to start
    ["cancel", run.cancel_mode && `${run.cancel_mode}, asked by ${run.requested_by || "?"}` +
      ` (${run.cancel_cause || "user"})`],
    ["replaced by", REPLACED.has(run.cancel_cause) && run.requested_by && runLink(run.requested_by)],
    ["cancel reason", run.cancel_reason],
    ["error", run.error],
    ["leaked after its end", leakOf(run.leaked_after_cancel)],
    ["metadata", run.metadata && JSON.stringify(run.metadata)],
  ];
  renderFields(fields.filter(([, value]) => value));
  renderPhases(run);
  renderSlowest(run.slowest_checkpoints);
  renderTimeline(events);
  if (isActive(run)) {
    followLive(run);
  } else {
    endLive(run.output_truncated ? "the run ended; its recorded output was truncated" : "");
    setText($("#d-output"), run.output);
    setText($("#d-output-size"), `(${run.output.length} chars${run.output_truncated ? ", truncated" : ""})`);
  }
  updateDetailCancel();
}

export function updateDetailCancel() {
  const run = state.detail && state.detail.run;
  const cancel = $("#d-cancel");
  const why = blocked();
  cancel.hidden = !run || !isActive(run) || run.stopping;
  cancel.disabled = Boolean(why);
  setText($("#d-cancel-why"), why && !cancel.hidden ? `Off: ${why}.` : "");
  cancel.onclick = () => askCancel(run, cancel);
}

function renderFields(rows) {
  // A refresh (every tick while the run is active) replaces only the values that changed: a
  // link the user is clicking stays the node it was (a click on a node replaced under the
  // pointer is lost)
  const box = $("#d-fields");
  const old = box.children;
  const sameNames = old.length === 2 * rows.length &&
    rows.every(([name], i) => old[2 * i].textContent === name);
  if (!sameNames) {
    box.replaceChildren(...rows.flatMap(([name, value]) =>
      [element("dt", {}, name), element("dd", {}, value)]));
    return;
  }
  rows.forEach(([, value], i) => {
    const fresh = element("dd", {}, value);
    if (old[2 * i + 1].innerHTML !== fresh.innerHTML) old[2 * i + 1].replaceWith(fresh);
  });
}

function renderTimeline(events) {
  const first = events.length ? events[0].at : 0;
  $("#d-events tbody").replaceChildren(...events.map((event) => element("tr", {},
    element("td", {class: "event"}, event.type),
    element("td", {class: "at"}, clock(event.at).slice(11)),
    element("td", {class: "ms"}, ((event.at - first) * 1000).toFixed(1)),
    element("td", {class: "data"},
      Object.entries(event.data).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ")))));
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
