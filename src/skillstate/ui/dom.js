// Element builders. Text always goes in as text nodes, never parsed as HTML: session state holds
// untrusted model output.

const SVG_NS = "http://www.w3.org/2000/svg";

function fill(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.setAttribute("class", v);
    else if (k === "text") el.textContent = String(v);
    else if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** h("div", {class: "x"}, "text", child, [more]) */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG_NS, tag), attrs, children);
}

export function clear(el) {
  while (el.firstChild) el.firstChild.remove();
  return el;
}

/** Replace el's children (null/false children are skipped, unlike Element.append). */
export function put(el, ...children) {
  return append(clear(el), children);
}

export const fmt = {
  int(v) {
    return v === null || v === undefined ? "—" : Number(v).toLocaleString("en-US");
  },
  usd(v) {
    if (v === null || v === undefined) return "—";
    const a = Math.abs(v);
    const digits = a === 0 ? 2 : a < 0.01 ? 6 : a < 100 ? 4 : 2;
    return (v < 0 ? "-$" : "$") + a.toLocaleString("en-US", {
      minimumFractionDigits: Math.min(digits, 2), maximumFractionDigits: digits,
    });
  },
  pct(v) {
    return v === null || v === undefined ? "—" : `${Number(v).toFixed(1)}%`;
  },
  time(ts) {
    if (!ts) return "—";
    const d = new Date(ts * 1000);
    return d.toLocaleString("en-GB", {
      year: "numeric", month: "short", day: "2-digit",
      hour: "2-digit", minute: "2-digit", second: "2-digit", hour12: false,
    });
  },
  ago(ts) {
    if (!ts) return "—";
    const s = Math.max(0, Date.now() / 1000 - ts);
    if (s < 60) return `${Math.round(s)}s ago`;
    if (s < 3600) return `${Math.round(s / 60)}m ago`;
    if (s < 86400) return `${Math.round(s / 3600)}h ago`;
    return `${Math.round(s / 86400)}d ago`;
  },
  bytes(v) {
    if (v === null || v === undefined) return "—";
    if (v < 1024) return `${v} B`;
    if (v < 1024 * 1024) return `${(v / 1024).toFixed(1)} KiB`;
    return `${(v / 1024 / 1024).toFixed(1)} MiB`;
  },
};
