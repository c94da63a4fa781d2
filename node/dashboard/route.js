// The view is the URL's hash: the filters, the page and the run whose detail is open
// (``#status=all&app_name=shop&run=<id>``). Filters typed replace the history entry; opening
// or closing a run's detail adds one, so Back and Forward go from view to view, and a link
// opened afresh shows the same view.

import {openDetail, closeDetail} from "./detail.js";
import {follow} from "./feed.js";
import {filterParams, loadFilters, updateBulk} from "./filters.js";
import {clearRuns} from "./runs.js";
import {state} from "./state.js";

let shown = null; // the filters and page the rows are of, as in the hash

function view() {
  const params = filterParams();
  if (state.offset) params.set("offset", state.offset);
  return params.toString();
}

function hashOf(runId) {
  const params = new URLSearchParams(view());
  if (runId) params.set("run", runId);
  return "#" + params;
}

export function applyFilters(runId = state.detail && state.detail.runId) {
  // the filters as the form has them now: a new feed, the hash replaced (not a new entry)
  shown = view();
  history.replaceState(null, "", hashOf(runId));
  clearRuns();
  updateBulk();
  follow();
}

export function route() {
  // show the view the hash names (at the start, and on every hashchange: Back, Forward, a link)
  const params = new URLSearchParams(location.hash.slice(1));
  const runId = params.get("run");
  loadFilters(params);
  if (view() !== shown) applyFilters(runId);
  if (runId) {
    const opener = state.opener;
    state.opener = null;
    openDetail(runId, opener);
  } else {
    closeDetail();
  }
}

export function showRun(runId, opener) {
  // a new history entry: the detail of ``runId``
  state.opener = opener;
  const hash = hashOf(runId);
  if (location.hash === hash) route();
  else location.hash = hash;
}

export function leaveRun() {
  // the detail was closed: a new history entry without it (Back opens it again)
  if (new URLSearchParams(location.hash.slice(1)).has("run")) location.hash = hashOf(null);
}
