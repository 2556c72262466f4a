// Hash router, live polling and the admin-key prompt. Each page module exports
// render(main, params) -> {refresh?: () => Promise<void>, every?: ms | () => ms, stop?: () => void}.
import { ApiError, adminKey } from "./api.js";
import { h, put } from "./dom.js";
import * as cost from "./pages/cost.js";
import * as overview from "./pages/overview.js";
import * as session from "./pages/session.js";
import * as sessions from "./pages/sessions.js";

const main = document.getElementById("main");
const live = document.getElementById("live");

const routes = [
  [/^#?\/?$/, overview, "overview"],
  [/^#\/sessions\/?$/, sessions, "sessions"],
  // #/session/ID, or #/session/KEY/ID with client keys on (KEY "(none)": made before any key).
  [/^#\/sessions?\/(?:([A-Za-z0-9_-]{1,64}|\(none\))\/)?([A-Za-z0-9_-]{1,128})$/, session, "sessions"],
  [/^#\/cost\/?$/, cost, "cost"],
];

let current = null;
let timer = null;

function stop() {
  clearTimeout(timer);
  timer = null;
  if (current && current.stop) current.stop();
  current = null;
}

export function showError(err, into = main) {
  if (err instanceof ApiError && (err.status === 401 || err.status === 403)) {
    put(into, keyForm(err.message));
    return;
  }
  put(into, h("div", { class: "callout error", role: "alert" },
    h("strong", {}, "Could not load: "), err.message || String(err)));
}

function keyForm(message) {
  const input = h("input", { type: "password", name: "key", autocomplete: "off", required: true,
    "aria-label": "Admin key", placeholder: "admin key" });
  return h("form", {
    class: "card keyform",
    onsubmit: (e) => {
      e.preventDefault();
      adminKey.set(input.value.trim());
      route();
    },
  }, h("h2", {}, "Admin key needed"),
  h("p", { class: "muted" }, message, " The key is kept in this tab's sessionStorage only."),
  h("div", { class: "row" }, input, h("button", { type: "submit", class: "primary" }, "Use key")));
}

function schedule() {
  if (!current || !current.refresh) return;
  const every = typeof current.every === "function" ? current.every() : current.every;
  live.textContent = every ? "Live" : "";
  live.classList.toggle("on", Boolean(every));
  if (!every) return;
  const page = current;
  timer = setTimeout(async () => {
    if (page !== current) return;
    if (!document.hidden) {
      try {
        await page.refresh();
        live.title = `updated ${new Date().toLocaleTimeString("en-GB")}`;
      } catch (err) {
        live.title = `last refresh failed: ${err.message}`;
      }
    }
    if (page === current) schedule();
  }, every);
}

async function route() {
  stop();
  const hash = location.hash || "#/";
  const match = routes.find(([re]) => re.test(hash));
  for (const a of document.querySelectorAll("[data-nav]")) {
    a.classList.toggle("active", Boolean(match) && a.dataset.nav === match[2]);
    if (match && a.dataset.nav === match[2]) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (!match) {
    put(main, h("div", { class: "callout" }, "No such page. ", h("a", { href: "#/" }, "Back to the overview")));
    return;
  }
  const [re, page] = match;
  const params = hash.match(re).slice(1).map((v) => (v === undefined ? undefined : decodeURIComponent(v)));
  put(main, h("p", { class: "muted" }, "Loading…"));
  try {
    const handle = await page.render(main, ...params);
    current = handle || {};
    schedule();
  } catch (err) {
    showError(err);
  }
}

window.addEventListener("hashchange", route);
route();
