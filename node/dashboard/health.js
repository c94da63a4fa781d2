// The state of the node serving this page, said in the header and, when it cannot be trusted
// (it drains, it is gone, its Redis is), in a banner; actions are then off, with the reason.

import {$, setText} from "./dom.js";
import {clock} from "./format.js";
import {state} from "./state.js";

const serving = {kind: "live", reason: ""};
const listeners = [];

export function setStatus(text, tone) {
  setText($("#status"), text);
  $("#status").className = tone || "";
}

export function showAuth() {
  $("#auth").hidden = false;
  $("#forget-token").hidden = true;
  setStatus(state.token ? "this token is not accepted" : "a token is needed", "down");
}

export function blocked() {
  // why actions are off ("" when they are not)
  return serving.reason;
}

export function onServingChange(listener) {
  listeners.push(listener);
}

function nodeName() {
  return state.nodeId ? `Node ${state.nodeId}` : "The node serving this page";
}

function seen() {
  return state.at ? clock(state.at).slice(11, 19) : "—";
}

const SAYS = {
  draining: (info) => [
    `${nodeName()} is draining`,
    "It takes no new runs and stops serving this page" +
      (info.until && info.until > state.at + 0.5 ?
        `; the runs it still holds are cancelled at ${clock(info.until).slice(11, 19)}` : "") +
      `. What is shown is as of ${seen()}; cancels are off here: open the dashboard of another node.`,
    "the node serving this page is draining: open the dashboard of another node",
  ],
  gone: (info) => [
    `${nodeName()} does not answer`,
    `Since ${clock(info.since).slice(11, 19)} (${info.detail}). What is shown is as of ${seen()}; ` +
      "cancels are off until it answers again (this page keeps trying), or open the dashboard " +
      "of another node.",
    "the node serving this page does not answer",
  ],
  unavailable: (info) => [
    "Redis is unreachable",
    `${nodeName()} cannot reach Redis (${info.detail}). What is shown is as of ${seen()}; ` +
      "cancels are off until it can.",
    "Redis is unreachable from the node serving this page",
  ],
};

export function setServing(kind, info = {}) {
  // "live", or what is wrong with the node serving the page: "draining", "gone", "unavailable"
  if (kind === "gone" && serving.kind === "gone") return; // the first failure's time stays
  const banner = $("#banner");
  banner.hidden = kind === "live";
  banner.dataset.kind = kind;
  let reason = "";
  if (kind !== "live") {
    const [title, text, why] = SAYS[kind]({since: Date.now() / 1000, ...info});
    setText($("#banner-title"), title);
    setText($("#banner-text"), text);
    reason = why;
  }
  const changed = serving.kind !== kind || serving.reason !== reason;
  serving.kind = kind;
  serving.reason = reason;
  if (changed) for (const listener of listeners) listener();
}
