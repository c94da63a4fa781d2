// The node's API, with the token the user gave; a 401 asks for another.

import {showAuth} from "./health.js";
import {state} from "./state.js";

export function headers(extra = {}) {
  return state.token ? {...extra, Authorization: "Bearer " + state.token} : extra;
}

export async function api(method, path, body) {
  const options = {method, headers: headers(body ? {"Content-Type": "application/json"} : {})};
  if (body) options.body = JSON.stringify(body);
  const response = await fetch(path, options);
  const answer = await response.json().catch(() => ({}));
  if (response.status === 401) showAuth();
  return {status: response.status, answer};
}

export async function request(method, path, body) {
  // as api(), with a network failure answered as status 0
  try {
    return await api(method, path, body);
  } catch (error) {
    return {status: 0, answer: {detail: error.message}};
  }
}

export function failure(response) {
  return `HTTP ${response.status}: ${response.answer.detail || "no detail"}`;
}

export function runPath(runId, tail = "") {
  return "/v1/runs/" + encodeURIComponent(runId) + tail;
}

export async function readEvents(reader, onEvent) {
  // A server-sent event stream, event by event: onEvent(name, data) until the stream ends.
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const name = /^event: (.*)$/m.exec(block);
      const data = /^data: (.*)$/m.exec(block);
      if (name && data) onEvent(name[1], JSON.parse(data[1]));
    }
  }
}
