// How times, runs and selectors read.

import {state} from "./state.js";

export function span(seconds) {
  if (seconds < 1) return (seconds * 1000).toFixed(seconds < 0.01 ? 2 : 0) + " ms";
  if (seconds < 120) return seconds.toFixed(seconds < 10 ? 1 : 0) + " s";
  if (seconds < 7200) return Math.round(seconds / 60) + " min";
  if (seconds < 172800) return Math.round(seconds / 3600) + " h";
  return Math.round(seconds / 86400) + " d";
}

export function ago(at) {
  return span(Math.max(0, state.at - at)) + " ago";
}

export function clock(at) {
  const d = new Date(at * 1000);
  const pad = (n, width = 2) => String(n).padStart(width, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
    `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function sessionOf(run) {
  return [run.app_name, run.user_id, run.session_id].filter(Boolean).join(" / ") || "—";
}

export function isActive(run) {
  return ["queued", "running", "waiting"].includes(run.status);
}

export function outcome(run) {
  // [key, text]: "stopping", "running", "cancelled", "failed · owner_lost"
  const key = run.stopping ? "stopping" : run.status;
  const ended = run.end_reason && run.end_reason !== "completed" && run.end_reason !== run.status;
  return [key, ended ? `${key} · ${run.end_reason}` : key];
}

export function counts(outcomes) {
  // "3 cancelled, 1 stopping"
  const by = new Map();
  for (const {outcome: name} of outcomes) by.set(name, (by.get(name) || 0) + 1);
  return [...by].map(([name, n]) => `${n} ${name}`).join(", ");
}

export function describe(selector) {
  // "app=shop user=alice started 1 min ago or earlier"
  const names = {app_name: "app", user_id: "user", session_id: "session", node_id: "node"};
  return Object.entries(selector).map(([key, value]) => {
    if (key === "min_age") return `started ${span(value)} ago or earlier`;
    if (key === "started_before") return `started before ${clock(value).slice(11, 19)}`;
    if (key === "metadata") return Object.entries(value).map(([k, v]) => `${k}=${v}`).join(" ");
    return `${names[key] || key}=${value}`;
  }).join(" ");
}
