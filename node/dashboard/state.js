// What the page holds between events, shared by its modules.

export const PAGE_SIZE = 50;
export const TOKEN_KEY = "cancel-bus-token";

export const state = {
  token: sessionStorage.getItem(TOKEN_KEY) || "",
  offset: 0,
  at: 0, // the server clock of the last snapshot
  nodeId: null, // the node serving this page, as its last snapshot said
  viewer: null,
  runRows: new Map(), // run_id -> <tr>
  runs: new Map(), // run_id -> the run as last seen
  collapsed: new Set(), // run ids whose children rows are folded away
  nodeRows: new Map(), // node_id -> <tr>
  tombstoneRows: new Map(), // tombstone_id -> <tr>
  detail: null, // {runId, opener, timer, cache}
  opener: null, // the button that asked for the next detail (its focus returns there)
  confirm: null, // {opener, run} (one run) or {opener, selector, matched} (every matching run)
};
