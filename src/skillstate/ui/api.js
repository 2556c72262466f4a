// The dashboard reads the proxy's public JSON endpoints, nothing else.

const KEY_SLOT = "skillstate.adminKey";
// The UI lives at <base>/ui/; the endpoints at <base>/.
const BASE = new URL("..", document.baseURI);

export class ApiError extends Error {
  constructor(status, message, param) {
    super(message);
    this.status = status;
    this.param = param;
  }
}

export const adminKey = {
  get: () => sessionStorage.getItem(KEY_SLOT) || "",
  set: (v) => (v ? sessionStorage.setItem(KEY_SLOT, v) : sessionStorage.removeItem(KEY_SLOT)),
};

export function url(path, params) {
  const u = new URL(path.replace(/^\//, ""), BASE);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== null && v !== undefined && v !== "") u.searchParams.set(k, String(v));
  }
  return u;
}

export async function api(path, { params, method = "GET", body } = {}) {
  const headers = { accept: "application/json" };
  if (body !== undefined) headers["content-type"] = "application/json";
  const key = adminKey.get();
  if (key) headers.authorization = `Bearer ${key}`;
  const r = await fetch(url(path, params), {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
  });
  if (r.status === 204) return null;
  const text = await r.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!r.ok) {
    const err = data && data.error;
    const message = (err && err.message) || text || `HTTP ${r.status}`;
    throw new ApiError(r.status, message, err && err.param);
  }
  return data;
}

// ?key= of the sessions made before the first client key (listed with "key": null).
export const UNKEYED = "(none)";

/** The name /state and /cost take in ?key= for a listed session's key: with client keys on a
 * listing row has `key`, null for a session made before the first key. Undefined: keys off. */
export function keyParam(row) {
  if (!("key" in row)) return undefined;
  return row.key === null ? UNKEYED : row.key;
}

/** GET /state?session=ID&history=1, following pagination cursors when the proxy has them;
 * `key`: the session's key (keyParam), for an admin looking at another key's session. */
export async function sessionWithHistory(id, key) {
  const first = await api("/state", { params: { session: id, key, history: 1 } });
  let history = first.history || [];
  let cursor = first.next_cursor || first.history_next_cursor || null;
  for (let pages = 0; cursor && pages < 1000; pages++) {
    const more = await api("/state", { params: { session: id, key, history: 1, cursor } });
    const batch = more.history || [];
    if (!batch.length) break;
    history = history.concat(batch);
    cursor = more.next_cursor || more.history_next_cursor || null;
  }
  history.sort((a, b) => a.step - b.step);
  return { ...first, history };
}

/** GET /state: one page of sessions. Uses limit/cursor when the proxy paginates; otherwise
 * pages client-side over the full list. */
export async function listSessions({ limit, cursor }) {
  const data = await api("/state", { params: { limit, cursor } });
  const sessions = data.sessions || [];
  const paged = "next_cursor" in data || sessions.length <= limit;
  if (paged) return { sessions: sessions.slice(0, limit), next: data.next_cursor || null, all: null };
  return { sessions, next: null, all: sessions };
}

/** Every session (all pages), for a search across them; stops after `max` sessions. */
export async function allSessions(max = 20000) {
  let out = [];
  let cursor = null;
  do {
    const data = await api("/state", { params: { limit: 1000, cursor } });
    out = out.concat(data.sessions || []);
    cursor = data.next_cursor || null;
  } while (cursor && out.length < max);
  return out;
}

/** /cost as of a window; since/until as unix seconds (sent as ISO with microseconds). */
export function cost({ since, until, group_by, session, key } = {}) {
  return api("/cost", {
    params: { since: isoTime(since), until: isoTime(until), group_by, session, key },
  });
}

export function isoTime(ts) {
  if (ts === null || ts === undefined) return null;
  if (typeof ts === "string") return ts;
  const whole = Math.floor(ts);
  const micros = Math.round((ts - whole) * 1e6);
  const base = new Date(whole * 1000).toISOString().slice(0, 19);
  return `${base}.${String(Math.min(micros, 999999)).padStart(6, "0")}+00:00`;
}
