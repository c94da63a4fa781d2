// The nodes table (an ops token) and the tombstones table, rows kept in place.

import {failure, request} from "./api.js";
import {notify} from "./cancel.js";
import {$, element, pill, place, setText} from "./dom.js";
import {ago, clock, describe, span} from "./format.js";
import {blocked} from "./health.js";
import {applyFilters} from "./route.js";
import {state} from "./state.js";

const NODE_STATES = {
  alive: "alive",
  late: "late · lease expiring",
  expired: "expired",
  draining: "draining · takes no new runs",
};

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
  pill($(".state", row), node.state, NODE_STATES[node.state] || node.state);
  setText($(".heartbeat", row), span(node.heartbeat_age) + " ago");
  setText($(".lease", row), node.state === "expired" ? "—" : span(node.lease_left));
  const probed = node.probe_at !== null && node.probe_latency_ms !== null;
  setText($(".probe", row), probed ? `${span(node.probe_latency_ms / 1000)} · ${ago(node.probe_at)}` : "—");
  $(".probe", row).title = "the last probe of its own channel through Redis: latency, when";
  setText($(".runs", row), String(node.active_runs));
  setText($(".up", row), span(Math.max(0, state.at - node.started_at)));
  setText($(".version", row), node.version);
}

export function renderNodes(nodes, here) {
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
  const late = nodes.filter((node) => ["late", "expired"].includes(node.state)).length;
  const draining = nodes.filter((node) => node.state === "draining").length;
  setText($("#node-count"), `${nodes.length} node(s)` + (late ? ` · ${late} late or expired` : "") +
    (draining ? ` · ${draining} draining` : ""));
  const ids = nodes.map((node) => element("option", {value: node.node_id}));
  $("#node-ids").replaceChildren(...ids);
}

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
  updateRemove(row);
}

function updateRemove(row) {
  const remove = $(".remove", row);
  const why = blocked();
  if (remove.dataset.busy) return;
  remove.disabled = Boolean(why);
  remove.title = why ? `Off: ${why}` : "";
}

export function refreshTombstoneActions() {
  for (const row of state.tombstoneRows.values()) updateRemove(row);
}

export function renderTombstones(tombstones) {
  $("#tombstones-section").hidden = !tombstones.length;
  place($("#tombstones tbody"), state.tombstoneRows, tombstones, (t) => t.tombstone_id,
    makeTombstoneRow, updateTombstoneRow);
  setText($("#tombstone-count"), `${tombstones.length} live`);
}

async function removeTombstone(tombstone, button) {
  button.disabled = true;
  button.dataset.busy = "1";
  const id = tombstone.tombstone_id;
  const response = await request("DELETE", "/v1/tombstones/" + encodeURIComponent(id));
  if (response.status === 200) {
    notify("ok", "tombstone-removed",
      `Tombstone ${id} removed: runs of ${describe(tombstone.selector)} start again.`);
  } else {
    notify("bad", "error", `Removing tombstone ${id} failed: ${failure(response)}`);
    delete button.dataset.busy;
    button.disabled = false;
  }
}
