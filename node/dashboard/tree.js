// A run's tree in its detail: from its root down, each run with its outcome, the run shown
// marked. Read through the API (a run's parent, a run's children), at most MAX_RUNS runs; the
// children of a run that has ended are read once per detail (no run starts under an ended one).

import {request, runPath} from "./api.js";
import {element, pill} from "./dom.js";
import {isActive, outcome} from "./format.js";

const MAX_RUNS = 100;
const MAX_UP = 20; // ancestors looked for

async function childrenOf(runId) {
  const path = "/v1/runs?status=all&limit=100&parent=" + encodeURIComponent(runId);
  const response = await request("GET", path);
  return response.status === 200 ? response.answer.runs : null; // null: not read
}

export async function loadTree(run, children, cache) {
  // {root, below: run_id -> [child runs], count, more} for ``run`` (its children given)
  let root = run;
  for (let up = 0; root.parent && up < MAX_UP; up++) {
    const parent = await request("GET", runPath(root.parent));
    if (parent.status !== 200) break;
    root = parent.answer;
  }
  const below = new Map();
  let level = [root];
  let count = 1;
  let more = false;
  while (level.length) {
    const lists = await Promise.all(level.map((node) => {
      if (node.run_id === run.run_id) return children;
      if (cache.has(node.run_id)) return cache.get(node.run_id);
      return childrenOf(node.run_id).then((kids) => {
        if (kids && !isActive(node)) cache.set(node.run_id, kids);
        return kids || [];
      });
    }));
    const next = [];
    level.forEach((node, i) => {
      const kids = lists[i].filter((kid) => !below.has(kid.run_id) && kid.run_id !== root.run_id);
      const room = Math.max(0, MAX_RUNS - count);
      more = more || kids.length > room;
      below.set(node.run_id, kids.slice(0, room));
      count += Math.min(kids.length, room);
      next.push(...kids.slice(0, room));
    });
    level = next;
  }
  return {root, below, count, more};
}

export function drawTree(list, tree, currentId, link) {
  // nested lists: each run's id (a link to its detail; the run shown is marked) and outcome
  const item = (run) => {
    const [key, text] = outcome(run);
    const status = element("span", {class: "tree-status"});
    pill(status, key, text);
    const name = run.run_id === currentId ?
      element("strong", {class: "id", "aria-current": "true"}, run.run_id) : link(run.run_id);
    const li = element("li", {"data-run-id": run.run_id, "data-status": key}, name, " ", status);
    const kids = tree.below.get(run.run_id) || [];
    if (kids.length) li.append(element("ul", {}, ...kids.map(item)));
    return li;
  };
  list.replaceChildren(item(tree.root));
  if (tree.more) list.append(element("li", {class: "dim"}, `(the first ${MAX_RUNS} runs of the tree)`));
}

export function treeActive(tree) {
  // some run of the tree is still going
  if (isActive(tree.root)) return true;
  for (const kids of tree.below.values()) if (kids.some(isActive)) return true;
  return false;
}
