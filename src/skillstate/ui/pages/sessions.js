// Sessions: a searchable, paginated list.
import { UNKEYED, allSessions, keyParam, listSessions } from "../api.js";
import { fmt, h, put } from "../dom.js";

const PAGE = 25;

export async function render(main) {
  let cursors = [null]; // server cursors of the pages seen so far (server-side pagination)
  let pageNo = 0;
  let all = null; // the whole list: the proxy does not paginate, or a search needs every page
  let paged = false; // the proxy paginates /state
  let query = "";
  let last = null;
  let searching = 0;

  const search = h("input", {
    type: "search", placeholder: "Search session ids", "aria-label": "Search sessions",
    oninput: async () => {
      query = search.value.trim().toLowerCase();
      pageNo = 0;
      const mine = ++searching;
      await load();
      if (mine === searching) draw();
    },
  });
  const count = h("span", { class: "muted small" });
  const table = h("div", { class: "table-wrap" });
  const pager = h("div", { class: "pager" });

  async function load() {
    if (paged && query) {
      // The proxy pages by recency only: a search looks through every page.
      all = await allSessions();
      return;
    }
    last = await listSessions({ limit: PAGE, cursor: cursors[pageNo] });
    paged = !last.all;
    all = last.all;
    if (!all && last.next) cursors[pageNo + 1] = last.next;
  }

  function visible() {
    const rows = (all || last.sessions).filter((r) => !query || r.session.toLowerCase().includes(query));
    if (!all) return { rows, total: null, hasNext: Boolean(last.next) };
    const start = pageNo * PAGE;
    return { rows: rows.slice(start, start + PAGE), total: rows.length, hasNext: start + PAGE < rows.length };
  }

  function link(r) {
    const key = keyParam(r);
    const path = key === undefined ? [r.session] : [key, r.session];
    return `#/session/${path.map(encodeURIComponent).join("/")}`;
  }

  function draw() {
    const { rows, total, hasNext } = visible();
    count.textContent = total === null ? "" : `${fmt.int(total)} session${total === 1 ? "" : "s"}`;
    const keyed = rows.some((r) => "key" in r); // client keys on: each row has its key
    const heads = keyed ? ["Session", "Key", "Step", "Updated", "State size"] : ["Session", "Step", "Updated", "State size"];
    put(table, rows.length ? h("table", { class: "sessions" },
      h("thead", {}, h("tr", {}, heads.map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.map((r) => h("tr", {},
        h("td", { class: "id-cell" }, h("a", { href: link(r) }, r.session)),
        keyed ? h("td", { class: "id-cell" }, r.key === null ? UNKEYED : r.key) : null,
        h("td", { class: "num" }, fmt.int(r.step)),
        h("td", { title: fmt.time(r.updated) }, fmt.ago(r.updated)),
        h("td", { class: "num" }, fmt.bytes(r.state_bytes))))))
      : h("p", { class: "muted empty" }, query ? "No session matches." : "No sessions yet. Send a turn with an x-skillstate-session header."));
    const pages = total === null ? null : Math.max(1, Math.ceil(total / PAGE));
    put(pager, 
      h("button", { type: "button", disabled: pageNo === 0, onclick: () => go(pageNo - 1) }, "← Newer"),
      h("span", { class: "muted small" }, pages ? `Page ${pageNo + 1} of ${pages}` : `Page ${pageNo + 1}`),
      h("button", { type: "button", disabled: !hasNext, onclick: () => go(pageNo + 1) }, "Older →"));
  }

  async function go(n) {
    pageNo = n;
    if (paged && !query) await load();
    draw();
  }

  await load();
  draw();
  put(main, h("div", { class: "page" },
    h("div", { class: "page-head" }, h("h1", {}, "Sessions"), count),
    h("section", { class: "card" }, h("div", { class: "toolbar" }, search), table, pager)));
  return {
    every: 10000,
    refresh: async () => {
      await load();
      draw();
    },
  };
}
