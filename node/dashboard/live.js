// A running run's output, live in its detail: the node's stream of the run
// (GET /v1/runs/{id}/stream?from_start=true), appended as it comes. "Follow live" on: streamed
// and kept scrolled to its end; off: the stream is closed and the text stays as it was.

import {headers, readEvents, runPath} from "./api.js";
import {refreshDetail} from "./detail.js";
import {$, setText} from "./dom.js";

let live = null; // {runId, controller, chars, finished, retry}

function say(text) {
  setText($("#d-live"), text);
}

export function followLive(run) {
  // the detail shows ``run``, active: stream its output unless the toggle says not to
  $("#d-follow-field").hidden = false;
  if (!$("#d-follow").checked) return;
  if (live && live.runId === run.run_id) return;
  stopLive();
  open(run.run_id);
}

export function stopLive() {
  if (!live) return;
  clearTimeout(live.retry);
  live.controller.abort();
  live = null;
}

export function endLive(note) {
  // the run ended (or the detail shows another): no stream, no toggle
  stopLive();
  $("#d-follow-field").hidden = true;
  say(note || "");
}

export function onFollowToggle(run) {
  if ($("#d-follow").checked) {
    if (run) followLive(run);
  } else {
    const chars = live ? live.chars : $("#d-output").textContent.length;
    stopLive();
    say(`paused: ${chars} chars shown; follow again to catch up`);
  }
}

async function open(runId) {
  const me = {runId, controller: new AbortController(), chars: 0, finished: false, retry: null,
    draining: false};
  live = me;
  say("connecting…");
  let why = "";
  try {
    const response = await fetch(runPath(runId, "/stream?from_start=true"),
      {headers: headers(), signal: me.controller.signal});
    if (!response.ok) throw new Error("HTTP " + response.status);
    say("live");
    await readEvents(response.body.getReader(), (name, data) => {
      if (live !== me) return;
      if (name === "output") append(me, data.text);
      else if (name === "run.finished") me.finished = true;
      else if (name === "node.draining") me.draining = true;
      else if (name === "unavailable") why = "the stream stopped: " + data.detail;
    });
  } catch (error) {
    if (me.controller.signal.aborted) return;
    why = "the stream stopped: " + error.message;
  }
  if (live !== me) return;
  if (me.finished) {
    say("the run ended");
    refreshDetail(); // its final record: status, recorded output
    return;
  }
  if (me.draining) {
    say("this node stopped streaming the run (it drains): open the run on another node");
    return;
  }
  say(why ? `${why}; trying again…` : "the stream ended early; trying again…");
  me.retry = setTimeout(() => {
    if (live === me) {
      live = null;
      open(runId);
    }
  }, 1000);
}

function append(me, text) {
  const output = $("#d-output");
  if (!me.chars) output.textContent = ""; // from the start again: what was shown goes
  output.append(text);
  me.chars += text.length;
  setText($("#d-output-size"), `(${me.chars} chars so far)`);
  if ($("#d-follow").checked) output.scrollTop = output.scrollHeight;
}
