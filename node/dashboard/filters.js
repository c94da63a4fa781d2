// The filter bar: the runs the feed asks for, and the selector of a cancel of every matching run.

import {$, setText} from "./dom.js";
import {blocked} from "./health.js";
import {state} from "./state.js";

const SELECTOR_FILTERS = ["app_name", "user_id", "session_id", "node_id"];
const NOT_SELECTORS = {id_prefix: "run id prefix", phase: "phase", max_age: "“started in the last…”"};

export function filterParams() {
  const params = new URLSearchParams();
  for (const field of $("#filters").elements) {
    const value = field.name ? field.value.trim() : "";
    if (!value) continue;
    if (field.name === "age") params.set(...value.split("="));
    else params.set(field.name, value);
  }
  return params;
}

export function loadFilters(params) {
  // the form as ``params`` says (a field they do not name: its default)
  for (const field of $("#filters").elements) {
    if (field.name && field.name !== "age") field.value = params.get(field.name) || field.defaultValue;
  }
  const age = ["min_age", "max_age"].find((name) => params.has(name));
  $("#f-age").value = age ? `${age}=${params.get(age)}` : "";
  if (!$("#f-status").value) $("#f-status").value = "active";
  state.offset = Number(params.get("offset")) || 0;
}

export function bulkSelector() {
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

export function updateBulk() {
  const why = blocked() ? `Off: ${blocked()}.` : bulkSelector().why;
  $("#bulk-cancel").disabled = Boolean(why);
  setText($("#bulk-why"), why || "");
}
