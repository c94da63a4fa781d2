// The runs table: rows updated in place and never reordered (a new row is put where the server
// lists it, next to the rows already shown; a row that no longer matches is removed), a run's
// children right under it, indented, and foldable.

import {askCancel} from "./cancel.js";
import {$, element, pill, place, setText} from "./dom.js";
import {ago, isActive, outcome, sessionOf, span} from "./format.js";
import {blocked} from "./health.js";
import {showRun} from "./route.js";
import {state} from "./state.js";

let last = {runs: [], more: false};

export function clearRuns() {
  $("#runs tbody").replaceChildren();
  state.runRows.clear();
  state.runs.clear();
  last = {runs: [], more: false};
}

export function treeOrder(runs) {
  // [{run, depth, parent, kids}], in the server's order, each run's children (those on this
  // page) right after it; ``parent``: its parent's id when that is on the page too
  const listed = new Set(runs.map((run) => run.run_id));
  const below = new Map();
  for (const run of runs) {
    if (run.parent && listed.has(run.parent) && run.parent !== run.run_id) {
      if (!below.has(run.parent)) below.set(run.parent, []);
      below.get(run.parent).push(run);
    }
  }
  const ordered = [];
  const placed = new Set();
  const visit = (run, depth, parent) => {
    if (placed.has(run.run_id)) return;
    placed.add(run.run_id);
    const kids = below.get(run.run_id) || [];
    ordered.push({run, depth, parent, kids: kids.length});
    for (const kid of kids) visit(kid, depth + 1, run.run_id);
  };
  for (const run of runs) if (!(run.parent && listed.has(run.parent))) visit(run, 0, "");
  for (const run of runs) visit(run, 0, ""); // a cycle, which the bus never makes
  return ordered;
}

function makeRunRow({run}) {
  const id = run.run_id;
  const fold = element("button", {type: "button", class: "fold", "aria-expanded": "true",
    "aria-label": "Hide the runs below " + id}, "▾");
  fold.addEventListener("click", () => toggleFold(id));
  const open = element("button", {type: "button", class: "link id", title: id,
    "aria-label": "Details of run " + id}, id);
  open.addEventListener("click", () => showRun(id, open));
  const cancel = element("button", {type: "button", class: "danger cancel",
    "aria-label": "Cancel run " + id}, "Cancel…");
  cancel.addEventListener("click", () => askCancel(state.runs.get(id), cancel));
  const marker = element("span", {class: "child-mark", "aria-hidden": "true"}, "↳");
  return element("tr", {"data-run-id": id},
    element("td", {class: "run"}, element("span", {class: "tree-cell"}, fold, marker, open)),
    element("td", {class: "status"}),
    element("td", {class: "owner id wide"}), element("td", {class: "phase wide"}),
    element("td", {class: "session wide"}), element("td", {class: "age"}),
    element("td", {class: "actions"}, cancel));
}

function updateRunRow(row, {run, depth, parent, kids}) {
  state.runs.set(run.run_id, run);
  const [key, text] = outcome(run);
  pill($(".status", row), key, text);
  row.dataset.status = key;
  row.dataset.depth = depth;
  row.style.setProperty("--depth", depth);
  if (run.parent) row.dataset.parent = run.parent;
  const mark = $(".child-mark", row);
  mark.hidden = !run.parent;
  mark.title = parent ? "" : `a child of ${run.parent} (not on this page)`;
  const fold = $(".fold", row);
  fold.hidden = !kids;
  const open = !state.collapsed.has(run.run_id);
  fold.setAttribute("aria-expanded", String(open));
  setText(fold, open ? "▾" : "▸");
  fold.title = `${kids} run(s) below`;
  setText($(".owner", row), run.owner || "—");
  setText($(".phase", row), run.phase || "—");
  setText($(".session", row), sessionOf(run));
  const age = $(".age", row);
  setText(age, run.finished_at ? "ended " + ago(run.finished_at) : span(Math.max(0, state.at - run.created_at)));
  age.title = "created " + ago(run.created_at);
  updateCancel(row, run);
}

function updateCancel(row, run) {
  const cancel = $(".cancel", row);
  const why = blocked();
  cancel.hidden = !isActive(run);
  cancel.disabled = run.stopping || Boolean(why);
  cancel.title = why ? `Off: ${why}` : "";
  setText(cancel, run.stopping ? "stopping…" : "Cancel…");
}

export function refreshRunActions() {
  // the Cancel buttons, as the serving node now allows
  for (const [id, row] of state.runRows) updateCancel(row, state.runs.get(id));
}

function toggleFold(runId) {
  if (state.collapsed.has(runId)) state.collapsed.delete(runId);
  else state.collapsed.add(runId);
  renderRuns(last.runs, last.more);
}

export function renderRuns(runs, more) {
  last = {runs, more};
  const ordered = treeOrder(runs);
  place($("#runs tbody"), state.runRows, ordered, (item) => item.run.run_id, makeRunRow,
    updateRunRow, (item) => item.parent);
  const folded = new Set(); // runs hidden under a folded one
  for (const {run, parent} of ordered) {
    if (parent && (state.collapsed.has(parent) || folded.has(parent))) folded.add(run.run_id);
    state.runRows.get(run.run_id).hidden = folded.has(run.run_id);
  }
  $("#no-runs").hidden = runs.length > 0;
  setText($("#run-count"), `${runs.length}${more ? "+" : ""} shown`);
  setText($("#page-label"), runs.length ? `${state.offset + 1}–${state.offset + runs.length}` : "");
  $("#newer").disabled = state.offset === 0;
  $("#older").disabled = !more;
}
