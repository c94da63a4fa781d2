// Cancel, confirmed: one run, or every run the filters select (a preview first); the outcome is
// said in the notice line.

import {failure, request, runPath} from "./api.js";
import {refreshDetail} from "./detail.js";
import {$, element, setText} from "./dom.js";
import {clock, counts, describe, sessionOf, span} from "./format.js";
import {blocked} from "./health.js";
import {bulkSelector, updateBulk} from "./filters.js";
import {state} from "./state.js";

const SHOWN_IDS = 10; // of the runs a bulk cancel's preview matched

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

export function updateSubmit() {
  // a cancel of every matching run that matches none only makes sense with a tombstone; and
  // nothing is sent through a node that cannot be trusted with it
  const {confirm} = state;
  const nothing = confirm && confirm.selector && !confirm.matched;
  const why = blocked();
  $("#c-submit").disabled = Boolean(why) || (Boolean(nothing) && !$("#c-hold").checked);
  $("#c-submit").title = why ? `Off: ${why}` : "";
  $("#c-ttl").disabled = !$("#c-hold").checked;
}

export function askCancel(run, opener) {
  state.confirm = {run, opener};
  const where = run.owner ? `on node ${run.owner}` : "not on a node yet";
  openConfirm("Cancel this run?",
    `Run ${run.run_id} (${sessionOf(run)}), ${run.status}${run.phase ? " in " + run.phase : ""}, ` +
    `${where}. The runs started below it are cancelled too.`,
    "Cancel the run", "Keep it running", null);
}

export async function askBulk(opener) {
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

export async function confirmCancel(event) {
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
  const response = await request("POST", runPath(run.run_id, "/cancel"), body);
  showOutcome(run.run_id, response);
  if (![200, 202, 409].includes(response.status)) opener.disabled = false;
  if (state.detail && state.detail.runId === run.run_id) refreshDetail();
}

export function notify(tone, outcome, text) {
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

export function restoreFocus(opener) {
  // the button that opened the dialog, else its row's first one (a cancel button is
  // disabled once used), else the dialog under it, else the runs
  const row = opener && opener.isConnected ? opener.closest("tr") : null;
  const dialog = opener && opener.closest("dialog[open]");
  const usable = (button) => button && button.isConnected && !button.hidden && !button.disabled;
  const target = [opener, row && $("button:not([hidden])", row), dialog && $(".close", dialog)].find(usable);
  if (target) target.focus();
  else $("#runs-section").focus();
}
