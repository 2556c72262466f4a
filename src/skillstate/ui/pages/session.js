// One session: the state as a tree, history stepping, the timeline with diffs and costs, an
// operator patch and reset.
import { ApiError, api, cost, sessionWithHistory } from "../api.js";
import { fmt, h, put } from "../dom.js";
import { INITIAL_NOTE, UNKNOWN, compact, diff, hasUnknown, jsonTree, pathText, replay } from "../json.js";

const TIMELINE_PAGE = 20;
const RUNNING_S = 120; // a session updated this recently is "running": poll fast

function statusBadge(status) {
  const cls = { valid: "ok", operator: "info", invalid: "bad", "tool-noop": "muted-badge", "format-noop": "muted-badge" }[status] || "";
  return h("span", { class: `badge ${cls}` }, status);
}

function diffTable(before, after) {
  const changes = diff(before, after);
  if (!changes.length) return h("p", { class: "muted small" }, "No state change.");
  return h("table", { class: "diff" }, h("tbody", {}, changes.map((c) => h("tr", { class: `d-${c.kind}` },
    h("td", { class: "d-path" }, pathText(c.path)),
    h("td", { class: "d-before" }, c.kind === "added" ? ""
      : c.before === UNKNOWN ? h("span", { class: "j-unknown", title: INITIAL_NOTE }, "(initial)")
        : h("del", {}, compact(c.before))),
    h("td", { class: "d-after" }, c.kind === "removed" ? h("span", { class: "muted" }, "removed") : h("ins", {}, compact(c.after)))))));
}

export async function render(main, key, id) {
  let data = await sessionWithHistory(id, key);
  let states = replay(data.state, data.history);
  let viewing = null; // null = the latest step; else an index into history
  let shown = TIMELINE_PAGE;
  const costCache = new Map();

  const head = h("div", { class: "page-head" });
  const stateBox = h("section", { class: "card state-card" });
  const timeline = h("section", { class: "card" });
  const patchBox = h("section", { class: "card" });

  function drawHead() {
    put(head, 
      h("a", { class: "back", href: "#/sessions" }, "← Sessions"),
      h("h1", { class: "session-id" }, data.session),
      h("span", { class: "muted small" }, `${key === undefined ? "" : `key ${key} · `}step ${data.step} · created ${fmt.time(data.created)} · updated ${fmt.ago(data.updated)}`),
      h("button", { type: "button", class: "danger push", onclick: confirmReset }, "Reset…"));
  }

  function drawState() {
    const n = data.history.length;
    const idx = viewing === null ? n - 1 : viewing;
    const stateAt = idx < 0 ? data.state : states[idx].after;
    const t = idx >= 0 ? data.history[idx] : null;
    const range = h("input", {
      type: "range", min: 0, max: Math.max(0, n - 1), value: Math.max(0, idx), "aria-label": "History step",
      disabled: n < 2,
      oninput: (e) => {
        const v = Number(e.target.value);
        viewing = v === n - 1 ? null : v;
        drawState();
      },
    });
    const stepTo = (v) => () => {
      viewing = v >= n - 1 ? null : Math.max(0, v);
      drawState();
    };
    put(stateBox, 
      h("div", { class: "card-head" }, h("h2", {}, viewing === null ? "Current state" : `State after step ${t.step}`),
        viewing === null ? null : h("span", { class: "badge warn" }, "history")),
      h("div", { class: "stepper" },
        h("button", { type: "button", "aria-label": "Previous step", disabled: idx <= 0, onclick: stepTo(idx - 1) }, "◀"),
        range,
        h("button", { type: "button", "aria-label": "Next step", disabled: idx >= n - 1, onclick: stepTo(idx + 1) }, "▶"),
        h("span", { class: "small muted step-label" }, t ? `step ${t.step} of ${data.step}` : "no transitions")),
      h("div", { class: "tree", "data-testid": "state-tree" }, jsonTree(stateAt)),
      hasUnknown(stateAt) ? h("p", { class: "muted small" }, `(initial): ${INITIAL_NOTE}.`) : null);
  }

  async function costOf(i) {
    const t = data.history[i];
    if (!costCache.has(t.step)) {
      const prev = i > 0 ? data.history[i - 1].ts : "all";
      costCache.set(t.step, cost({ session: data.session, key, since: prev, until: t.ts })
        .then((c) => c.totals).catch(() => null));
    }
    return costCache.get(t.step);
  }

  function costCell(i) {
    if (data.history[i].status === "operator") return h("span", { class: "t-cost muted small" }, "operator edit, no model call");
    const cell = h("span", { class: "t-cost muted small" }, "…");
    costOf(i).then((c) => {
      cell.textContent = c ? `${fmt.usd(c.cost_usd)} · ${fmt.int(c.input_tokens)} in / ${fmt.int(c.output_tokens)} out` : "—";
      if (c && c.attempts && (c.attempts["rollback-retry"] || c.attempts["transport-retry"])) {
        const n = (c.attempts["rollback-retry"] || 0) + (c.attempts["transport-retry"] || 0);
        cell.append(h("span", { class: "badge warn" }, `${n} ${n === 1 ? "retry" : "retries"}`));
      }
    });
    return cell;
  }

  function drawTimeline() {
    const n = data.history.length;
    const items = [];
    for (let i = n - 1; i >= Math.max(0, n - shown); i--) {
      const t = data.history[i];
      items.push(h("li", { class: `t-item ${viewing === i ? "selected" : ""}`, "data-step": t.step },
        h("div", { class: "t-head" },
          h("span", { class: "t-step" }, `#${t.step}`), statusBadge(t.status),
          t.action ? h("span", { class: "t-action" }, t.action) : h("span", { class: "muted small" }, "no action"),
          h("span", { class: "muted small t-time", title: fmt.time(t.ts) }, fmt.time(t.ts)),
          costCell(i),
          h("button", { type: "button", class: "link", onclick: () => { viewing = i === n - 1 ? null : i; drawState(); drawTimeline(); } }, "view state")),
        diffTable(states[i].before, states[i].after),
        t.errors && t.errors.length ? h("ul", { class: "t-errors" }, t.errors.map((e) => h("li", {}, e))) : null));
    }
    put(timeline, h("div", { class: "card-head" }, h("h2", {}, "Timeline"), h("span", { class: "muted small" }, `${fmt.int(n)} transition${n === 1 ? "" : "s"}`)),
      n ? h("ol", { class: "timeline" }, items) : h("p", { class: "muted" }, "No transitions recorded."),
      n > shown ? h("button", { type: "button", onclick: () => { shown += TIMELINE_PAGE; drawTimeline(); } }, `Show ${Math.min(TIMELINE_PAGE, n - shown)} older`) : null);
  }

  function drawPatch() {
    const area = h("textarea", { name: "patch", rows: 6, spellcheck: "false", "aria-label": "State patch (JSON merge patch)",
      placeholder: '{"notes": "checked by an operator"}' });
    const msg = h("p", { class: "form-msg", role: "status", "aria-live": "polite" });
    const submit = h("button", { type: "submit", class: "primary" }, "Apply patch");
    const fail = (text) => {
      msg.className = "form-msg error";
      msg.textContent = text;
      area.setAttribute("aria-invalid", "true");
    };
    const form = h("form", {
      class: "patch-form", novalidate: true,
      onsubmit: async (e) => {
        e.preventDefault();
        let patch;
        try {
          patch = JSON.parse(area.value);
        } catch (err) {
          fail(`Not valid JSON: ${err.message}`);
          return;
        }
        if (patch === null || typeof patch !== "object" || Array.isArray(patch)) {
          fail("The patch must be a JSON object (RFC 7386 merge patch: null deletes a key).");
          return;
        }
        submit.disabled = true;
        try {
          const r = await api("/state", { params: { session: data.session, key }, method: "PATCH", body: patch });
          area.removeAttribute("aria-invalid");
          area.value = "";
          msg.className = "form-msg ok";
          msg.textContent = `Committed as step ${r.step}.` + (r.warnings && r.warnings.length ? ` Warnings: ${r.warnings.join("; ")}` : "");
          viewing = null;
          await reload();
        } catch (err) {
          fail(err instanceof ApiError ? err.message : String(err));
        } finally {
          submit.disabled = false;
        }
      },
    }, area, h("div", { class: "row" }, submit, h("span", { class: "muted small" }, "Validated like a model's patch; recorded as an operator step.")), msg);
    put(patchBox, h("h2", {}, "Operator patch"), form);
  }

  function confirmReset() {
    const dialog = h("dialog", { class: "confirm" },
      h("h2", {}, "Reset this session?"),
      h("p", {}, "This deletes the state and the whole history of ", h("code", {}, data.session), ". It cannot be undone."),
      h("div", { class: "row end" },
        h("button", { type: "button", onclick: () => dialog.close() }, "Cancel"),
        h("button", {
          type: "button", class: "danger",
          onclick: async () => {
            try {
              await api("/state", { params: { session: data.session, key }, method: "DELETE" });
              dialog.close();
              location.hash = "#/sessions";
            } catch (err) {
              dialog.append(h("p", { class: "form-msg error" }, err.message));
            }
          },
        }, "Reset session")));
    dialog.addEventListener("close", () => dialog.remove());
    document.body.append(dialog);
    dialog.showModal();
  }

  async function reload() {
    data = await sessionWithHistory(id, key);
    states = replay(data.state, data.history);
    if (viewing !== null && viewing >= data.history.length) viewing = null;
    drawHead();
    drawState();
    drawTimeline();
  }

  drawHead();
  drawState();
  drawTimeline();
  drawPatch();
  put(main, h("div", { class: "page" }, head,
    h("div", { class: "split" }, h("div", { class: "col" }, stateBox, patchBox), h("div", { class: "col wide" }, timeline))));

  return {
    every: () => (Date.now() / 1000 - data.updated < RUNNING_S ? 2000 : 15000),
    refresh: async () => {
      const now = await api("/state", { params: { session: id, key } });
      if (now.step !== data.step) await reload();
      else drawHead();
    },
  };
}
