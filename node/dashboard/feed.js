// The feed (/v1/dashboard/feed): once a second, the page of runs the filters ask for, the
// tombstones this token may see and (for an ops token) the nodes. When the serving node drains
// it says so (``node.draining``) and ends; when it is gone, the fetch fails: both are shown.

import {headers, readEvents} from "./api.js";
import {$, setText} from "./dom.js";
import {filterParams, updateBulk} from "./filters.js";
import {setServing, setStatus, showAuth} from "./health.js";
import {renderRuns} from "./runs.js";
import {PAGE_SIZE, state} from "./state.js";
import {renderNodes, renderTombstones} from "./tables.js";

let feed = null; // the AbortController of the open feed
let retry = null;

export async function follow() {
  clearTimeout(retry);
  if (feed) feed.abort();
  const controller = new AbortController();
  feed = controller;
  const params = filterParams();
  params.set("limit", PAGE_SIZE);
  params.set("offset", state.offset);
  let draining = false;
  try {
    const response = await fetch("/v1/dashboard/feed?" + params, {headers: headers(), signal: controller.signal});
    if (response.status === 401) return showAuth();
    if (response.status === 422) {
      const answer = await response.json();
      return setStatus("check the filters: " + answer.detail, "down");
    }
    if (!response.ok) throw new Error("HTTP " + response.status);
    await readEvents(response.body.getReader(), (name, data) => {
      if (feed !== controller) return;
      if (name === "snapshot") onSnapshot(data);
      else if (name === "unavailable") onUnavailable(data);
      else if (name === "node.draining") draining = onDraining(data);
    });
    if (!draining) setStatus("reconnecting…", "down");
  } catch (error) {
    if (controller.signal.aborted) return;
    setStatus("reconnecting… (" + error.message + ")", "down");
    setServing("gone", {detail: error.message === "Failed to fetch" ? "no connection" : error.message});
  }
  if (feed === controller) retry = setTimeout(follow, 1000);
}

function onSnapshot(snapshot) {
  state.at = snapshot.at;
  state.nodeId = snapshot.node_id;
  state.viewer = snapshot.viewer;
  const who = snapshot.viewer.role === "ops" ? "ops" : "user " + snapshot.viewer.user_id;
  setText($("#me"), `via ${snapshot.node_id} · ${who}`);
  $("#forget-token").hidden = !state.token;
  renderRuns(snapshot.runs, snapshot.more);
  renderTombstones(snapshot.tombstones);
  renderNodes(snapshot.nodes, snapshot.node_id);
  if (snapshot.draining) {
    setServing("draining", {until: snapshot.drain_until});
    setStatus("draining", "down");
  } else {
    setServing("live");
    setStatus("live", "live");
  }
  updateBulk();
}

function onUnavailable(data) {
  setStatus("Redis unavailable", "down");
  setServing("unavailable", data);
}

function onDraining(data) {
  state.nodeId = data.node_id;
  setStatus("draining", "down");
  setServing("draining", data);
  return true;
}
