// Small DOM helpers shared by the dashboard's modules.

export const $ = (selector, root = document) => root.querySelector(selector);

export function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  node.append(...children);
  return node;
}

export function setText(node, text) {
  if (node.textContent !== text) node.textContent = text;
}

export function pill(node, key, text) {
  // the first child of ``node``, a badge coloured by ``key``
  let badge = node.firstElementChild;
  if (!badge) node.append(badge = element("span"));
  badge.className = "pill " + key;
  setText(badge, text);
}

export function place(body, rows, items, keyOf, make, update, anchorOf = () => "") {
  // Rows kept in place: a new item's row goes where the server lists it, next to the rows
  // already shown, and an item no longer listed loses its row. A row moves only when its
  // anchor changes (a run's parent row appears or goes): it is put back where it belongs.
  const seen = new Set();
  let previous = null;
  for (const item of items) {
    const key = keyOf(item);
    seen.add(key);
    let row = rows.get(key);
    const anchor = anchorOf(item);
    if (!row || row.dataset.anchor !== anchor) {
      row = row || make(item);
      row.dataset.anchor = anchor;
      rows.set(key, row);
      body.insertBefore(row, previous ? previous.nextSibling : body.firstChild);
    }
    update(row, item);
    previous = row;
  }
  for (const [key, row] of rows) {
    if (seen.has(key)) continue;
    const hadFocus = row.contains(document.activeElement);
    row.remove();
    rows.delete(key);
    if (hadFocus) $("#runs-section").focus();
  }
}
