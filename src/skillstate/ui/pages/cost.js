// Cost: totals, baseline vs actual by day (chart), and tables by model, upstream, key, day, session.
import { cost } from "../api.js";
import { barChart } from "../chart.js";
import { fmt, h, put } from "../dom.js";

const WINDOWS = [["24h", "24 hours"], ["7d", "7 days"], ["30d", "30 days"], ["all", "all time"]];
const GROUPS = [["model", "Model"], ["upstream", "Upstream"], ["key", "Key"], ["day", "Day"], ["session", "Session"]];

function groupTable(groups, label) {
  if (!groups.length) return h("p", { class: "muted" }, "Nothing recorded in this window.");
  return h("div", { class: "table-wrap" }, h("table", {},
    h("thead", {}, h("tr", {}, [label, "Requests", "Retries", "Input", "Output", "Spend", "Baseline", "Saved"].map((t) => h("th", {}, t)))),
    h("tbody", {}, groups.map((g) => h("tr", {},
      h("td", { class: "strong id-cell" }, g.key === null ? "(none)" : g.key),
      h("td", { class: "num" }, fmt.int(g.requests)),
      h("td", { class: "num" }, fmt.int((g.attempts["rollback-retry"] || 0) + (g.attempts["transport-retry"] || 0))),
      h("td", { class: "num" }, fmt.int(g.input_tokens)),
      h("td", { class: "num" }, fmt.int(g.output_tokens)),
      h("td", { class: "num" }, fmt.usd(g.cost_usd)),
      h("td", { class: "num" }, fmt.usd(g.baseline_cost_usd)),
      h("td", { class: `num ${g.saved_cost_usd > 0 ? "good" : g.saved_cost_usd < 0 ? "bad" : ""}` }, fmt.usd(g.saved_cost_usd)))))));
}

export async function render(main) {
  let since = "7d";
  let group = "model";
  const body = h("div", { class: "page" });
  const windowPick = h("div", { class: "seg", role: "group", "aria-label": "Window" });
  const groupPick = h("div", { class: "seg", role: "group", "aria-label": "Group by" });

  function seg(box, options, value, set) {
    put(box, options.map(([v, label]) => h("button", {
      type: "button", class: v === value ? "on" : "", "aria-pressed": String(v === value),
      onclick: () => set(v),
    }, label)));
  }

  async function refresh() {
    const [byDay, grouped] = await Promise.all([
      cost({ since, group_by: "day" }),
      cost({ since, group_by: group }),
    ]);
    const t = byDay.totals;
    const days = byDay.groups.filter((g) => g.key !== null);
    seg(windowPick, WINDOWS, since, (v) => { since = v; refresh(); });
    seg(groupPick, GROUPS, group, (v) => { group = v; refresh(); });
    put(body, 
      h("section", { class: "grid4" },
        h("div", { class: "stat" }, h("div", { class: "stat-label" }, "Spend"), h("div", { class: "stat-value" }, fmt.usd(t.cost_usd))),
        h("div", { class: "stat" }, h("div", { class: "stat-label" }, "Baseline"), h("div", { class: "stat-value" }, fmt.usd(t.baseline_cost_usd))),
        h("div", { class: `stat ${t.saved_cost_usd < 0 ? "bad" : "good"}` }, h("div", { class: "stat-label" }, "Saved"), h("div", { class: "stat-value" }, fmt.usd(t.saved_cost_usd)),
          h("div", { class: "stat-note" }, t.saved_pct === null ? "no baseline yet" : `${fmt.pct(t.saved_pct)} of input tokens`)),
        h("div", { class: "stat" }, h("div", { class: "stat-label" }, "Requests"), h("div", { class: "stat-value" }, fmt.int(t.requests)),
          h("div", { class: "stat-note" }, `${fmt.int(t.input_tokens)} in · ${fmt.int(t.output_tokens)} out`))),
      h("section", { class: "card" }, h("h2", {}, "Baseline vs actual spend, by day"),
        days.length ? barChart({
          categories: days.map((g) => g.key.slice(5)),
          series: [
            { name: "baseline (full transcript)", cls: "s-base", values: days.map((g) => g.baseline_cost_usd || 0) },
            { name: "actual", cls: "s-a", values: days.map((g) => g.cost_usd || 0) },
          ],
          yFormat: fmt.usd,
          label: "baseline vs actual spend per day",
        }) : h("p", { class: "muted" }, "Nothing recorded in this window.")),
      h("section", { class: "card" }, h("div", { class: "card-head" }, h("h2", {}, "Breakdown"), groupPick),
        groupTable(grouped.groups, GROUPS.find(([v]) => v === group)[1])),
      h("p", { class: "muted small" }, byDay.note));
  }

  await refresh();
  put(main, h("div", { class: "page" },
    h("div", { class: "page-head" }, h("h1", {}, "Cost"), windowPick), body));
  return { refresh, every: 30000 };
}
