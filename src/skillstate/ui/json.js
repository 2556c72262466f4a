// JSON helpers: RFC 7386 merge patch, history replay, structural diff and the collapsible tree.
import { h } from "./dom.js";

/** A value the recorded history cannot tell (it was set before the first recorded step). */
export const UNKNOWN = Object.freeze({ unknown: true });

export const INITIAL_NOTE = "the session's initial value (the proxy's initial_state, possibly absent): not in the recorded history";

const isObject = (v) => v !== null && typeof v === "object" && !Array.isArray(v) && v !== UNKNOWN;

export function mergePatch(target, patch) {
  if (!isObject(patch)) return patch;
  const out = isObject(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k], v);
  }
  return out;
}

// Every leaf path a merge patch writes (objects recurse; anything else, null included, is a leaf).
function patchLeaves(patch, prefix = []) {
  if (!isObject(patch)) return [prefix];
  return Object.entries(patch).flatMap(([k, v]) =>
    isObject(v) ? patchLeaves(v, [...prefix, k]) : [[...prefix, k]]);
}

function markUnknown(state, path) {
  if (!path.length) return UNKNOWN;
  const [head, ...rest] = path;
  const out = isObject(state) ? { ...state } : {};
  out[head] = rest.length ? markUnknown(out[head], rest) : UNKNOWN;
  return out;
}

const STATE_CHANGING = new Set(["valid", "operator"]);

/**
 * The state before and after every transition, replayed from the current state and the
 * recorded patches. Only "valid" and "operator" transitions change the state. What the first
 * recorded patches overwrote is not in the history: those values come back as UNKNOWN.
 * Returns [{before, after}] aligned with `history` (sorted by step).
 */
export function replay(current, history) {
  let start = current;
  for (const t of history) {
    if (STATE_CHANGING.has(t.status) && t.patch) {
      for (const path of patchLeaves(t.patch)) start = markUnknown(start, path);
    }
  }
  const out = [];
  let state = start;
  for (const t of history) {
    const before = state;
    if (STATE_CHANGING.has(t.status) && t.patch) state = mergePatch(state, t.patch);
    out.push({ before, after: state });
  }
  return out;
}

export function hasUnknown(v) {
  if (v === UNKNOWN) return true;
  return v !== null && typeof v === "object" && Object.values(v).some(hasUnknown);
}

const same = (a, b) => a === b || JSON.stringify(a) === JSON.stringify(b);

/** Leaf-level changes between two states: [{path, kind: added|removed|changed, before, after}]. */
export function diff(before, after, path = []) {
  if (isObject(before) && isObject(after)) {
    const keys = [...new Set([...Object.keys(before), ...Object.keys(after)])];
    return keys.flatMap((k) => {
      const p = [...path, k];
      if (!(k in after)) return [{ path: p, kind: "removed", before: before[k] }];
      if (!(k in before)) return [{ path: p, kind: "added", after: after[k] }];
      return diff(before[k], after[k], p);
    });
  }
  if (same(before, after)) return [];
  return [{ path, kind: "changed", before, after }];
}

export function pathText(path) {
  return path.map((k, i) => (/^[A-Za-z_$][\w$]*$/.test(k) ? (i ? "." : "") + k
    : `[${JSON.stringify(k)}]`)).join("") || "(root)";
}

export function compact(v, max = 160) {
  if (v === UNKNOWN) return "(initial)";
  const text = v === undefined ? "(absent)" : JSON.stringify(v);
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

function scalar(v) {
  if (v === UNKNOWN) return h("span", { class: "j-unknown", title: INITIAL_NOTE }, "(initial)");
  if (v === null) return h("span", { class: "j-null" }, "null");
  switch (typeof v) {
    case "string": return h("span", { class: "j-str" }, JSON.stringify(v));
    case "number": return h("span", { class: "j-num" }, String(v));
    case "boolean": return h("span", { class: "j-bool" }, String(v));
    default: return h("span", {}, String(v));
  }
}

/** A collapsible tree of <details> elements; containers deeper than `open` start closed. */
export function jsonTree(value, { open = 2, label = null, depth = 0 } = {}) {
  const key = label === null ? null : h("span", { class: "j-key" }, label);
  const container = Array.isArray(value) || isObject(value);
  if (!container) return h("div", { class: "j-row" }, key, key && ": ", scalar(value));
  const entries = Array.isArray(value) ? value.map((v, i) => [String(i), v]) : Object.entries(value);
  const [o, c] = Array.isArray(value) ? ["[", "]"] : ["{", "}"];
  const count = `${entries.length} ${Array.isArray(value) ? "item" : "key"}${entries.length === 1 ? "" : "s"}`;
  if (!entries.length) return h("div", { class: "j-row" }, key, key && ": ", h("span", { class: "j-punct" }, o + c));
  const details = h("details", { class: "j-node", open: depth < open },
    h("summary", {}, key, key && ": ", h("span", { class: "j-punct" }, o),
      h("span", { class: "j-count" }, count)),
    h("div", { class: "j-children" },
      entries.map(([k, v]) => jsonTree(v, { open, label: Array.isArray(value) ? k : k, depth: depth + 1 }))),
    h("span", { class: "j-punct" }, c));
  return details;
}
