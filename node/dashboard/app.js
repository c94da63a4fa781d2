// The cancel-bus ops dashboard: plain ES modules, no build step. One server-sent event feed
// (/v1/dashboard/feed, feed.js) brings, once a second, the page of runs the filters ask for,
// the tombstones this token may see and (for an ops token) the nodes; the rows are kept in
// place (runs.js, tables.js). The view lives in the URL's hash (route.js): the filters, the
// page and the run whose detail is open (detail.js: its tree, tree.js; its live output,
// live.js). Cancels are confirmed (cancel.js); while the serving node drains or is gone, a
// banner says so and they are off (health.js). The theme follows the system, or the toggle
// (theme.js, loaded first).

import {askBulk, confirmCancel, restoreFocus, updateSubmit} from "./dashboard/cancel.js";
import {onDetailClosed, updateDetailCancel} from "./dashboard/detail.js";
import {$} from "./dashboard/dom.js";
import {follow} from "./dashboard/feed.js";
import {updateBulk} from "./dashboard/filters.js";
import {onServingChange} from "./dashboard/health.js";
import {onFollowToggle} from "./dashboard/live.js";
import {applyFilters, leaveRun, route} from "./dashboard/route.js";
import {refreshRunActions} from "./dashboard/runs.js";
import {PAGE_SIZE, TOKEN_KEY, state} from "./dashboard/state.js";
import {refreshTombstoneActions} from "./dashboard/tables.js";

let typing = null;
function onFilterInput(event) {
  if (!event.target.name) return;
  clearTimeout(typing);
  state.offset = 0;
  typing = setTimeout(applyFilters, event.target.tagName === "SELECT" ? 0 : 300);
}

function turnPage(delta) {
  state.offset = Math.max(0, state.offset + delta);
  applyFilters();
}

function wireFilters() {
  const filters = $("#filters");
  filters.addEventListener("input", onFilterInput);
  filters.addEventListener("submit", (event) => event.preventDefault());
  filters.addEventListener("reset", () => setTimeout(() => {
    state.offset = 0;
    applyFilters();
  }));
  $("#newer").addEventListener("click", () => turnPage(-PAGE_SIZE));
  $("#older").addEventListener("click", () => turnPage(PAGE_SIZE));
  $("#bulk-cancel").addEventListener("click", (event) => askBulk(event.currentTarget));
}

function wireToken() {
  $("#auth").addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = $("#token").value.trim();
    sessionStorage.setItem(TOKEN_KEY, state.token);
    $("#auth").hidden = true;
    follow();
    route(); // a run the link named, waiting for the token
  });
  $("#forget-token").addEventListener("click", () => {
    state.token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    follow();
  });
}

function wireDialogs() {
  for (const button of document.querySelectorAll("#detail .close")) {
    button.addEventListener("click", () => $("#detail").close());
  }
  $("#detail").addEventListener("close", () => {
    const opener = onDetailClosed();
    leaveRun();
    restoreFocus(opener);
  });
  $("#d-follow").addEventListener("change", () => onFollowToggle(state.detail && state.detail.run));
  $("#confirm-form").addEventListener("submit", confirmCancel);
  $("#c-hold").addEventListener("change", updateSubmit);
  $("#c-keep").addEventListener("click", () => $("#confirm").close());
  $("#confirm").addEventListener("close", () => restoreFocus(state.confirm && state.confirm.opener));
}

function start() {
  wireFilters();
  wireToken();
  wireDialogs();
  onServingChange(() => {
    refreshRunActions();
    refreshTombstoneActions();
    updateBulk();
    updateDetailCancel();
    if ($("#confirm").open) updateSubmit();
  });
  document.addEventListener("keydown", (event) => {
    const typingHere = ["INPUT", "SELECT", "TEXTAREA"].includes(document.activeElement.tagName);
    if (event.key === "/" && !typingHere && !document.querySelector("dialog[open]")) {
      event.preventDefault();
      $("#f-id").focus();
    }
  });
  window.addEventListener("hashchange", route);
  route();
}

start();
