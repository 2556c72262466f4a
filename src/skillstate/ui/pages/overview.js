// Overview: upstream health and breakers, the last hour's traffic, spend vs baseline.
import { cost, api } from "../api.js";
import { barChart } from "../chart.js";
import { fmt, h, put } from "../dom.js";

const BUCKETS = 12; // 5-minute buckets over the last hour
const BUCKET_S = 300;

function stat(label, value, note, cls = "") {
  return h("div", { class: `stat ${cls}` }, h("div", { class: "stat-label" }, label),
    h("div", { class: "stat-value" }, value), note ? h("div", { class: "stat-note" }, note) : null);
}

function circuitBadge(circuit) {
  const cls = { closed: "ok", half_open: "warn", open: "bad" }[circuit] || "";
  return h("span", { class: `badge ${cls}` }, String(circuit || "unknown").replace("_", "-"));
}

function windowUse(w) {
  if (!w) return "—";
  return `${fmt.int(w.used)} / ${fmt.int(w.limit)}`;
}

function upstreamTable(upstreams) {
  if (!upstreams.length) return h("p", { class: "muted" }, "No upstream configured.");
  return h("div", { class: "table-wrap" }, h("table", {},
    h("thead", {}, h("tr", {}, ["Upstream", "Kind", "Breaker", "Failures", "Next probe", "RPM", "TPM"]
      .map((t) => h("th", {}, t)))),
    h("tbody", {}, upstreams.map((u) => h("tr", {},
      h("td", { class: "strong" }, u.name), h("td", {}, u.kind), h("td", {}, circuitBadge(u.circuit)),
      h("td", { class: "num" }, fmt.int(u.consecutive_failures)),
      h("td", {}, u.next_probe_in_s === null || u.next_probe_in_s === undefined ? "—" : `${u.next_probe_in_s.toFixed(1)} s`),
      h("td", { class: "num" }, windowUse(u.limits && u.limits.rpm)),
      h("td", { class: "num" }, windowUse(u.limits && u.limits.tpm)))))));
}

async function lastHour() {
  const now = Date.now() / 1000;
  const start = now - BUCKETS * BUCKET_S;
  const buckets = await Promise.all(Array.from({ length: BUCKETS }, (_, i) =>
    cost({ since: start + i * BUCKET_S, until: start + (i + 1) * BUCKET_S })));
  const labels = buckets.map((_, i) => {
    const d = new Date((start + (i + 1) * BUCKET_S) * 1000);
    return d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });
  });
  return { labels, totals: buckets.map((b) => b.totals) };
}

export async function render(main) {
  const body = h("div", { class: "page" });
  async function refresh() {
    const [health, day, hour] = await Promise.all([api("/health"), cost({ since: "24h" }), lastHour()]);
    const t = day.totals;
    const reqs = hour.totals.reduce((n, x) => n + x.requests, 0);
    const failed = hour.totals.reduce((n, x) => n + (x.attempts["transport-retry"] || 0), 0);
    const reasks = hour.totals.reduce((n, x) => n + (x.attempts["rollback-retry"] || 0), 0);
    put(body, 
      h("div", { class: "page-head" }, h("h1", {}, "Overview"),
        h("span", { class: `badge ${health.ok ? "ok" : "bad"}` }, health.ok ? "healthy" : "degraded"),
        h("span", { class: "muted small" }, `v${health.version} · store ${health.store} · ${fmt.int(health.active_sessions)} active sessions`)),
      h("section", { class: "grid4" },
        stat("Requests, last hour", fmt.int(reqs)),
        stat("Failed attempts, last hour", fmt.int(failed), `${fmt.int(reasks)} re-ask${reasks === 1 ? "" : "s"}`, failed ? "warn" : ""),
        stat("Spend, 24 h", fmt.usd(t.cost_usd), `baseline ${fmt.usd(t.baseline_cost_usd)}`),
        stat("Saved, 24 h", fmt.usd(t.saved_cost_usd), t.saved_pct === null ? "no baseline yet" : `${fmt.pct(t.saved_pct)} of input tokens`, t.saved_cost_usd < 0 ? "bad" : "good")),
      h("section", { class: "card" }, h("h2", {}, "Upstreams"), upstreamTable(health.upstreams || [])),
      h("section", { class: "card" }, h("h2", {}, "Requests and failed attempts, last hour"),
        barChart({
          categories: hour.labels,
          series: [
            { name: "requests", cls: "s-a", values: hour.totals.map((x) => x.requests) },
            { name: "failed attempts", cls: "s-bad", values: hour.totals.map((x) => x.attempts["transport-retry"] || 0) },
            { name: "re-asks", cls: "s-warn", values: hour.totals.map((x) => x.attempts["rollback-retry"] || 0) },
          ],
          yFormat: (v) => fmt.int(Math.round(v)),
          integer: true,
          label: "requests per 5 minutes",
        })),
      h("section", { class: "card" }, h("h2", {}, "Spend vs baseline, 24 h"),
        h("div", { class: "grid3" },
          stat("Actual spend", fmt.usd(t.cost_usd)),
          stat("Baseline (full transcript)", fmt.usd(t.baseline_cost_usd)),
          stat("Input tokens sent / baseline", `${fmt.int(t.input_tokens)} / ${fmt.int(t.baseline_input_tokens)}`)),
        h("p", { class: "muted small" }, day.note)),
    );
  }
  await refresh();
  put(main, body);
  return { refresh, every: 10000 };
}
