// Hand-drawn SVG charts (no library): grouped bars with a y axis, a legend and tooltips.
// The SVG is redrawn at its container's pixel width so text keeps its size on any screen.
import { clear, h, s } from "./dom.js";

const TICKS = 4;

function niceStep(v, integer) {
  if (!(v > 0)) return integer ? 1 : 0.25;
  const p = 10 ** Math.floor(Math.log10(v));
  const step = [1, 2, 2.5, 5, 10].map((m) => m * p).find((x) => x >= v) || 10 * p;
  return integer ? Math.max(1, Math.ceil(step)) : step;
}

function draw({ categories, series, yFormat, label, integer }, width, height) {
  const pad = { top: 12, right: 8, bottom: 28, left: 72 };
  const iw = width - pad.left - pad.right;
  const ih = height - pad.top - pad.bottom;
  const top = Math.max(0, ...series.flatMap((x) => x.values.map((v) => v || 0)));
  const step = niceStep(top / TICKS, integer);
  const max = step * TICKS;
  const y = (v) => pad.top + ih - (ih * (v || 0)) / max;
  const band = iw / Math.max(1, categories.length);
  const gap = Math.min(16, band * 0.25);
  const bw = Math.min(48, (band - gap) / series.length);
  const x0 = (i) => pad.left + i * band + (band - bw * series.length) / 2;
  const grid = Array.from({ length: TICKS + 1 }, (_, i) => s("g", { class: "grid" },
    s("line", { x1: pad.left, x2: width - pad.right, y1: y(i * step), y2: y(i * step) }),
    s("text", { x: pad.left - 8, y: y(i * step) + 4, "text-anchor": "end" }, yFormat(i * step))));
  const labelEvery = Math.ceil(categories.length / Math.max(2, Math.floor(iw / 64)));
  const bars = categories.map((cat, i) => s("g", {},
    series.map((ser, j) => {
      const v = ser.values[i] || 0;
      return s("rect", {
        class: `bar ${ser.cls}`, x: x0(i) + j * bw, y: y(v), width: Math.max(1, bw - 2),
        height: Math.max(0, pad.top + ih - y(v)), rx: 2,
      }, s("title", {}, `${cat} · ${ser.name}: ${yFormat(v)}`));
    }),
    (categories.length - 1 - i) % labelEvery === 0
      ? s("text", { class: "xlabel", x: pad.left + i * band + band / 2, y: height - 8, "text-anchor": "middle" }, cat)
      : null));
  return s("svg", {
    class: "chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": label || series.map((x) => x.name).join(" vs "),
  }, grid, bars);
}

/**
 * barChart({categories: ["a", ...], series: [{name, cls, values: [n, ...]}], yFormat, label,
 * integer}) -> a <figure> with the chart and its legend; every bar has a <title> tooltip.
 */
export function barChart(spec, height = 220) {
  const opts = { yFormat: String, integer: false, ...spec };
  const plot = h("div", { class: "chart-plot" });
  let drawn = 0;
  const redraw = () => {
    const width = Math.floor(plot.clientWidth);
    if (width > 0 && width !== drawn) {
      drawn = width;
      clear(plot).append(draw(opts, width, height));
    }
  };
  new ResizeObserver(() => requestAnimationFrame(redraw)).observe(plot);
  const legend = h("div", { class: "legend" },
    opts.series.map((ser) => h("span", { class: "legend-item" }, h("i", { class: `swatch ${ser.cls}` }), ser.name)));
  return h("figure", { class: "chart-box" }, plot, legend);
}
