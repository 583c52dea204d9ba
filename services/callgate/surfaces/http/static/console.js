// The callgate approval console: a client of the HTTP API like any other (ADR 0018).
// No build step, no dependencies. A pasted or development session token lives in this
// module's memory only and travels in the Authorization header; a sign-in with the identity
// provider (OpenID Connect) is an HttpOnly cookie this script never sees, and every
// state-changing request then repeats its CSRF token in X-CSRF-Token (ADR 0031). Every
// text from the server is set with textContent, never parsed as HTML.

const $ = (id) => document.getElementById(id);

const state = {
  token: null,
  csrf: null, // the cookie session's CSRF token (GET /v1/session gives it)
  me: null,
  items: [],
  selected: null,
  decided: new Map(), // invocation id -> what this console did to it
  feed: null,
  watch: null, // the stream of the selected invocation's status (ADR 0029)
  live: null, // its last status value
};

// --- refusals in words -------------------------------------------------------------------

const WORDS = {
  approver_forbidden: "You may not decide on this call.",
  not_pending: "This call is no longer pending: it was already decided, or it expired.",
  approval_expired: "Too late: the approval window of this call has closed.",
  unauthenticated: "Your session is not valid (expired, revoked, or not a callgate token). Sign in again.",
  csrf_failed: "The request lacked this page's CSRF token, so nothing was done. Reload the page.",
  not_found: "No such invocation in your tenant.",
  rate_limited: "Too many requests; wait a moment and try again.",
  timeout: "The service did not answer in time; the decision may still arrive. Refresh in a moment.",
  payload_too_large: "The request is too large.",
  invalid_request: "The request was not understood.",
  internal_error: "The service failed; nothing was decided. Try again.",
};

function explain(code, message) {
  if (code === "approver_forbidden") {
    if (/own call/.test(message)) {
      return "You proposed this call yourself, and self-approval is not allowed: another approver must decide.";
    }
    if (/roles?:/.test(message)) {
      return `You do not hold an approver role for this tool (${message.replace(/^.*roles?:\s*/, "needs: ")}).`;
    }
    if (/session owner/.test(message)) {
      return "Only the person who owns the session that proposed this call may confirm it.";
    }
    if (/another tenant/.test(message)) {
      return "This call belongs to another tenant.";
    }
  }
  const words = WORDS[code];
  return words ? `${words} (${code})` : `${message} (${code})`;
}

class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

async function api(path, { method = "GET", body } = {}) {
  const headers = { Accept: "application/json" };
  if (state.token) headers.Authorization = `Bearer ${state.token}`;
  else if (state.csrf && method !== "GET") headers["X-CSRF-Token"] = state.csrf;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
    cache: "no-store",
  });
  let data = null;
  try {
    data = await response.json();
  } catch {
    data = null;
  }
  if (!response.ok) {
    const err = (data && data.error) || { code: "internal_error", message: response.statusText };
    throw new ApiError(response.status, err.code, err.message);
  }
  return data;
}

// --- small DOM helpers -------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child);
  return node;
}

function show(node, visible) {
  node.hidden = !visible;
}

function say(text) {
  const n = $("notice");
  n.textContent = text;
  show(n, Boolean(text));
}

function alarm(text) {
  const n = $("alert");
  n.textContent = text;
  show(n, Boolean(text));
}

function plain(value) {
  if (value === null || value === undefined) return "—";
  if (typeof value === "string") return value;
  return JSON.stringify(value);
}

function money(key, value, currency) {
  if (typeof value === "number" && /_cents$/.test(key)) {
    return `${(value / 100).toFixed(2)}${currency ? ` ${currency}` : ""} (${value} cents)`;
  }
  return plain(value);
}

// One time format everywhere (the command line's too): ISO-8601 UTC with milliseconds.
function when(ms) {
  return ms ? new Date(ms).toISOString() : "—";
}

function left(ms) {
  const s = Math.max(0, Math.round((ms - Date.now()) / 1000));
  const m = Math.floor(s / 60);
  return `${m}:${String(s % 60).padStart(2, "0")}`;
}

function short(hash) {
  return hash ? `${hash.slice(0, 16)}…` : "—";
}

// --- the dry-run as before/after ---------------------------------------------------------

// Providers describe a change in a few shapes: {before, after}; X and X_after;
// current_X and new_X; state and after. Everything else is context.
function dryRunRows(dry) {
  if (!dry || typeof dry !== "object") return [["result", null, dry, false]];
  if (dry.before && dry.after && typeof dry.before === "object") {
    const keys = [...new Set([...Object.keys(dry.before), ...Object.keys(dry.after)])].sort();
    const rows = keys.map((k) => [k, dry.before[k], dry.after[k], plain(dry.before[k]) !== plain(dry.after[k])]);
    for (const [k, v] of Object.entries(dry)) if (k !== "before" && k !== "after") rows.push([k, v, v, false]);
    return rows;
  }
  const used = new Set();
  const rows = [];
  for (const key of Object.keys(dry)) {
    if (used.has(key)) continue;
    let pair = null;
    if (key.includes("_after")) {
      const base = key.replace("_after", "");
      if (base in dry) pair = [base, base, key];
    } else if (key.startsWith("current_") && `new_${key.slice(8)}` in dry) {
      pair = [key.slice(8), key, `new_${key.slice(8)}`];
    } else if (key === "state" && "after" in dry) {
      pair = ["state", "state", "after"];
    } else if (`${key.replace(/_cents$/, "")}_after_cents` in dry) {
      const after = `${key.replace(/_cents$/, "")}_after_cents`;
      pair = [key, key, after];
    }
    if (pair) {
      const [label, b, a] = pair;
      used.add(b).add(a);
      rows.push([label, dry[b], dry[a], plain(dry[b]) !== plain(dry[a])]);
    }
  }
  for (const [k, v] of Object.entries(dry)) if (!used.has(k)) rows.push([k, v, v, false]);
  return rows;
}

// --- rendering ---------------------------------------------------------------------------

function renderList() {
  const list = $("pending-list");
  // Keep the keyboard where it was: the focused item is rebuilt, so focus it again.
  const focused = list.contains(document.activeElement) ? document.activeElement.getAttribute("data-id") : null;
  list.replaceChildren();
  $("pending-count").textContent = String(state.items.length);
  show($("pending-empty"), state.items.length === 0);
  for (const item of state.items) {
    const high = item.confirmation === "approver";
    const label = el(
      "button",
      { type: "button", "data-id": item.invocation_id, "aria-current": String(item.invocation_id === state.selected) },
      el("span", { class: "tool", text: item.tool }, el("span", { class: `badge ${high ? "high" : "owner"}`, text: high ? "approver" : "owner" })),
      el("span", { class: "meta" }, el("span", { class: "figure", text: keyFigure(item) }), ` · ${item.target} · by ${item.actor}`),
      ...(quorum(item) ? [el("span", { class: "meta quorum", text: quorum(item) })] : []),
      el("span", { class: "meta" }, "expires in ", el("span", { class: "countdown", "data-expires": String(item.expires_at), text: left(item.expires_at) })),
    );
    label.addEventListener("click", () => select(item.invocation_id));
    list.append(el("li", {}, label));
    if (item.invocation_id === focused) label.focus();
  }
  renderDetail();
}

// The figure an approver decides on: the amount, else where it goes and what.
function keyFigure(item) {
  const args = item.args || {};
  if (args.amount_cents !== undefined) return money("amount_cents", args.amount_cents, args.currency);
  if (args.environment !== undefined) return `${args.environment}${args.version ? ` ${args.version}` : ""}`;
  const first = Object.entries(args)[0];
  return first ? `${first[0]} ${plain(first[1])}` : item.tool;
}

// "1 of 2 granted (mona)" for a quorum (ADR 0030); "" for a single approver.
function quorum(item) {
  const required = item.approvals_required || item.required || 1;
  if (required <= 1) return "";
  const grants = item.grants || [];
  return `${grants.length} of ${required} granted${grants.length ? ` (${grants.join(", ")})` : ""}`;
}

function fact(dl, term, value, attrs = {}) {
  dl.append(el("dt", { text: term }), el("dd", attrs, value));
}

function renderDetail() {
  const item = state.items.find((i) => i.invocation_id === state.selected);
  const detail = $("detail");
  const result = $("detail-result");
  if (!state.selected) {
    show(detail, false);
    return;
  }
  show(detail, true);
  if (!item) {
    show($("decide-form"), false);
    show($("usage-card"), false);
    const done = state.decided.get(state.selected);
    if (!done) {
      result.className = "result";
      result.textContent = "This call is no longer pending: it was decided elsewhere or its approval window closed.";
      show(result, true);
    }
    return;
  }
  $("detail-h").textContent = `${item.tool} on ${item.target}`;
  const facts = $("facts");
  facts.replaceChildren();
  fact(facts, "Tool", item.tool);
  fact(facts, "Actor", item.actor);
  fact(facts, "Target", item.target);
  fact(facts, "Confirmation", item.confirmation === "approver"
    ? `an approver (${(item.approver_roles || []).join(", ")}); not the actor`
    : "the session owner");
  fact(facts, "Requested", when(item.requested_at));
  fact(facts, "Invocation", item.invocation_id, { class: "mono" });
  if (quorum(item)) fact(facts, "Approvals", quorum(item));

  const args = $("args");
  args.replaceChildren();
  const currency = item.args && item.args.currency;
  for (const [k, v] of Object.entries(item.args || {})) {
    args.append(el("tr", {}, el("th", { scope: "row", text: k }), el("td", { text: money(k, v, currency) })));
  }

  const dry = $("dry-run");
  dry.replaceChildren();
  for (const [k, before, after, changed] of dryRunRows(item.dry_run)) {
    dry.append(el("tr", {},
      el("th", { scope: "row", text: k }),
      el("td", { class: `before${changed ? " changed" : ""}`, text: money(k, before, currency) }),
      el("td", { class: `after${changed ? " changed" : ""}`, text: money(k, after, currency) })));
  }

  const binds = $("binds");
  binds.replaceChildren();
  fact(binds, "Tenant", item.tenant);
  fact(binds, "Actor", item.actor);
  fact(binds, "Tool", item.tool);
  fact(binds, "Target", item.target);
  fact(binds, "Policy version", short(item.policy_version), { class: "mono", title: item.policy_version });
  fact(binds, "Arguments hash", short(item.args_hash), { class: "mono", title: item.args_hash || "" });
  fact(binds, "Dry-run hash", short(item.dry_run_hash), { class: "mono", title: item.dry_run_hash || "" });
  const countdown = el("span", { class: "countdown", "data-expires": String(item.expires_at), text: left(item.expires_at) });
  fact(binds, "Decide before", el("span", {}, `${when(item.expires_at)} (in `, countdown, ")"));
  show($("decide-form"), true);
  tick();
}

function tick() {
  const now = Date.now();
  for (const node of document.querySelectorAll("[data-expires]")) {
    const at = Number(node.getAttribute("data-expires"));
    const gone = at <= now;
    node.textContent = gone ? "expired" : left(at);
    node.classList.toggle("gone", gone);
    node.classList.toggle("soon", !gone && at - now < 60_000);
  }
  const item = state.items.find((i) => i.invocation_id === state.selected);
  const expired = item ? item.expires_at <= now : false;
  $("approve").disabled = expired;
  $("deny").disabled = expired;
  if (item && expired && !state.decided.has(item.invocation_id)) {
    const r = $("detail-result");
    r.className = "result bad";
    r.textContent = explain("approval_expired", "");
    show(r, true);
  }
}

function select(id) {
  if (state.selected !== id) {
    watch(id);
    show($("usage-card"), false);
  }
  state.selected = id;
  show($("detail-result"), false);
  $("reason").value = "";
  renderList();
  $("timeline-id").value = id;
  loadTimeline(id);
  loadUsage();
}

// --- the actor's usage beside the approval (ADR 0079) ---------------------------------------

// A window as profiles write it (24h rather than 1d; days from two on).
function windowText(ms) {
  if (!ms) return "in flight";
  const units = [["d", 86_400_000], ["h", 3_600_000], ["m", 60_000], ["s", 1000]];
  for (const [unit, size] of units) {
    if (ms % size === 0 && (unit !== "d" || ms >= 2 * size)) return `${ms / size}${unit}`;
  }
  return `${ms} ms`;
}

function count(n) {
  return Number(n).toLocaleString("en-US");
}

// The limits a call of this tool by this actor counts in (GET /v1/usage picks them), used
// now against each limit; for an approval a limit asked for (over: approve), what this call
// adds and whether it goes over.
async function loadUsage() {
  const item = state.items.find((i) => i.invocation_id === state.selected);
  if (!item) return;
  let rows = [];
  try {
    const query = new URLSearchParams({ actor: item.actor, tool: item.tool });
    rows = await api(`/v1/usage?${query}`);
  } catch {
    rows = []; // the card stays hidden; the approval does not depend on it
  }
  if (state.selected !== item.invocation_id) return; // another item was opened meanwhile
  rows = rows.filter((r) => r.scope.tenant === item.tenant);
  const asked = item.usage || {};
  $("usage-rows").replaceChildren(...rows.map((r) => {
    const scope = Object.entries(r.scope)
      .filter(([k]) => k !== "tenant")
      .map(([k, v]) => `${k} ${v}`)
      .join(", ") || `tenant ${r.scope.tenant}`;
    const full = r.used >= r.max;
    const used = el("td", { class: `used${full ? " full" : ""}` },
      el("meter", { min: "0", max: String(r.max), value: String(Math.min(r.used, r.max)), "aria-hidden": "true" }),
      el("span", { class: "figures", text: `${count(r.used)} of ${count(r.max)}` }),
      r.held ? el("span", { class: "held", text: ` (${count(r.held)} held)` }) : "");
    const mine = asked[r.limit];
    if (mine) {
      used.append(el("span", { class: `this-call${mine.over ? " over" : ""}`,
        text: `This call: +${count(mine.amount)}${mine.over ? ", over the limit" : ""}` }));
    }
    return el("tr", {},
      el("th", { scope: "row", text: r.limit }),
      el("td", { text: scope }),
      used,
      el("td", { text: windowText(r.window_ms) }));
  }));
  show($("usage-card"), rows.length > 0);
}

// --- deciding ----------------------------------------------------------------------------

async function decide(kind) {
  const id = state.selected;
  if (!id) return;
  const result = $("detail-result");
  $("approve").disabled = true;
  $("deny").disabled = true;
  try {
    if (kind === "approve") {
      const out = await api(`/v1/invocations/${encodeURIComponent(id)}/approve`, { method: "POST" });
      state.decided.set(id, "approved");
      result.className = "result ok";
      result.textContent = out.approval_id
        ? `Approved. ${out.outcome ? `The call ${out.outcome === "executed" ? "ran: executed" : `ended: ${out.outcome}`}.` : "The approved call continues."}`
        : `Your grant is recorded: ${out.granted} of ${out.required}. Another approver must grant too.`;
    } else {
      const reason = $("reason").value.trim();
      const out = await api(`/v1/invocations/${encodeURIComponent(id)}/deny`, { method: "POST", body: { reason } });
      state.decided.set(id, "denied");
      result.className = "result ok";
      result.textContent = `Denied${out.reason ? `: ${out.reason}` : ""}. The call will not run.`;
    }
    show($("decide-form"), false);
  } catch (e) {
    result.className = "result bad";
    result.textContent = e instanceof ApiError ? explain(e.code, e.message) : `The service is unreachable: ${e.message}`;
    $("approve").disabled = false;
    $("deny").disabled = false;
    if (e instanceof ApiError && e.code === "unauthenticated") signOut(result.textContent);
  }
  show(result, true);
  loadTimeline(id);
}

// --- the timeline from the audit trail -----------------------------------------------------

async function loadTimeline(id) {
  const list = $("timeline");
  const status = $("timeline-status");
  const chain = $("chain");
  list.replaceChildren();
  try {
    const [records, verified, inv] = await Promise.all([
      api(`/v1/audit?invocation=${encodeURIComponent(id)}`),
      api("/v1/audit/verify"),
      api(`/v1/invocations/${encodeURIComponent(id)}`),
    ]);
    chain.className = `chain ${verified.ok ? "ok" : "bad"}`;
    chain.textContent = verified.ok
      ? `Audit chain verified: ${verified.records} record${verified.records === 1 ? "" : "s"} of your tenant, every hash links to the one before.`
      : `Audit chain BROKEN at ${verified.first_bad}: ${verified.reason}`;
    show(chain, true);
    status.textContent = `Now: ${inv.outcome}${inv.settled ? "" : " (in progress)"}${inv.error ? ` — ${inv.error.message}` : ""}`;
    show(status, true);
    if (records.length === 0) {
      list.append(el("li", {}, el("span", { class: "what", text: "No audit record yet: the call has not reached an outcome." })));
    }
    for (const r of records) {
      const by = r.authorized_by || {};
      const who = by.principal ? `${by.principal.user}@${by.principal.tenant}` : "no session";
      const lines = [`policy ${by.decision || "none"} for ${who}`];
      const request = r.approval_request;
      if (request && request.state) lines.push(`approval ${request.state}${request.approver ? ` by ${request.approver}` : ""}`);
      if (by.approval) lines.push(`presented approval of ${by.approval.approver || "?"}`);
      list.append(el("li", {},
        el("div", { class: "what", text: `${r.outcome} (record ${r.seq}, revision ${r.revision})` }),
        el("div", { class: "when", text: when(r.occurred_at) }),
        el("div", { text: lines.join(" · ") }),
        el("div", { class: "hash mono", text: `hash ${short(r.hash)} ← ${short(r.prev_hash)}` })));
    }
  } catch (e) {
    show(chain, false);
    status.textContent = e instanceof ApiError ? explain(e.code, e.message) : `The service is unreachable: ${e.message}`;
    show(status, true);
  }
}

// --- the live feed (server-sent events over fetch: EventSource cannot send headers) --------

function setLive(text, on) {
  const live = $("live");
  live.textContent = text;
  live.classList.toggle("on", on);
}

async function follow(controller) {
  while (!controller.signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (state.token) headers.Authorization = `Bearer ${state.token}`;
      const response = await fetch("/v1/pending/events", {
        headers,
        signal: controller.signal,
        credentials: "same-origin",
        cache: "no-store",
      });
      if (response.status === 401) {
        signOut(explain("unauthenticated", ""));
        return;
      }
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      setLive("live", true);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          handleEvent(block);
        }
      }
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    setLive("reconnecting…", false);
    await new Promise((r) => setTimeout(r, 1500));
  }
}

function handleEvent(block) {
  let event = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith("event:")) event = line.slice(6).trim();
    else if (line.startsWith("data:")) data.push(line.slice(5).trimStart());
  }
  if (event === "pending") {
    state.items = JSON.parse(data.join("\n"));
    renderList();
    loadUsage(); // the actor's other calls may have used more meanwhile
  } else if (event === "expired") {
    signOut("Your session has expired. Sign in again.");
  }
}

// --- one invocation, live (ADR 0029): its status stream ------------------------------------

function targetFromLocation() {
  const hash = location.hash.match(/^#invocation=(.+)$/);
  if (hash) return decodeURIComponent(hash[1]);
  const path = location.pathname.match(/^\/invocations\/([^/]+)$/);
  return path ? decodeURIComponent(path[1]) : null;
}

async function watch(id) {
  if (state.watch) state.watch.abort();
  state.live = null;
  renderLive();
  const controller = new AbortController();
  state.watch = controller;
  while (!controller.signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (state.token) headers.Authorization = `Bearer ${state.token}`;
      const response = await fetch(`/v1/invocations/${encodeURIComponent(id)}/events`, {
        headers,
        signal: controller.signal,
        credentials: "same-origin",
        cache: "no-store",
      });
      if (!response.ok || !response.body) {
        const body = await response.json().catch(() => ({}));
        state.live = { error: body.error || { code: "internal_error", message: "" } };
        renderLive();
        return;
      }
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("\n");
          if (data) {
            state.live = JSON.parse(data);
            renderLive();
          }
        }
      }
      if (state.live && state.live.final) return;
    } catch (e) {
      if (controller.signal.aborted) return;
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
}

// Pending with its countdown, approved with the approval id, executed with the result,
// denied, expired: what became of the selected invocation.
function renderLive() {
  const box = $("live-state");
  const s = state.live;
  if (!s) {
    show(box, false);
    return;
  }
  show(box, true);
  show($("detail"), true);
  const approval = s.approval || {};
  const parts = [];
  let kind = "pending";
  if (s.error && !s.outcome) {
    kind = "failed";
    parts.push(explain(s.error.code, s.error.message));
  } else if (s.outcome === "approval_required" && approval.state === "pending") {
    parts.push(el("strong", { text: "Pending approval" }), " · decide within ",
      el("span", { class: "countdown", "data-expires": String(approval.expires_at), text: left(approval.expires_at) }));
    if (s.quorum && quorum(s.quorum)) parts.push(` · ${quorum(s.quorum)}`);
  } else if (approval.state === "denied") {
    kind = "denied";
    parts.push(el("strong", { text: "Denied" }), ` by ${approval.approver || "?"}${approval.reason ? `: ${approval.reason}` : ""}. The call did not run.`);
  } else if (approval.state === "expired" && s.outcome === "approval_required") {
    kind = "expired";
    parts.push(el("strong", { text: "Expired" }), ": nobody decided in time. The call did not run.");
  } else if (s.outcome === "executed" || s.outcome === "replayed") {
    kind = "executed";
    parts.push(el("strong", { text: "Executed" }), ` · result ${JSON.stringify(s.result)}`);
  } else if (s.outcome === "approval_required" || s.outcome === "allowed") {
    parts.push(el("strong", { text: "Approved" }), " · the approved call is running");
  } else {
    kind = "failed";
    parts.push(el("strong", { text: s.outcome }), s.error ? ` · ${s.error.message}` : "");
  }
  if (approval.approval_id) {
    parts.push(el("br"), "Approval id ", el("span", { class: "mono", text: approval.approval_id }));
    const by = s.quorum && s.quorum.grants.length ? s.quorum.grants : [approval.approver];
    parts.push(` · granted by ${by.join(", ")}`);
  }
  box.className = `live-state ${kind}`;
  box.replaceChildren(...parts);
  if (!state.items.find((i) => i.invocation_id === s.invocation_id) && s.tool) {
    $("detail-h").textContent = `${s.tool} on ${s.target}`;
  }
  tick();
}

// --- signing in and out --------------------------------------------------------------------

async function signIn(token) {
  state.token = token.trim();
  alarm("");
  try {
    state.me = await api("/v1/session");
  } catch (e) {
    state.token = null;
    alarm(e instanceof ApiError ? explain(e.code, e.message) : `The service is unreachable: ${e.message}`);
    return;
  }
  await enter();
}

// A session cookie from the identity provider's sign-in, if this browser has one.
async function resume() {
  try {
    state.me = await api("/v1/session");
  } catch {
    return false;
  }
  state.csrf = state.me.csrf_token || null;
  await enter();
  return true;
}

async function enter() {
  const me = state.me;
  $("token").value = "";
  $("who-text").textContent = `${me.user} @ ${me.tenant} (${me.roles.join(", ") || "no roles"})`;
  show($("who"), true);
  show($("signin"), false);
  show($("workspace"), true);
  const items = await api("/v1/pending");
  // Signed out (or in as someone else) while the list was on its way: this entry is over.
  if (state.me !== me) return;
  state.items = items;
  renderList();
  state.feed = new AbortController();
  follow(state.feed);
  const target = targetFromLocation();
  if (target) select(target);
  if (me.roles.includes(OPERATOR_ROLE)) loadShadow();
  $("main").focus();
}

// Operators see the shadow policy's disagreements (ADR 0050); the role compares exactly.
const OPERATOR_ROLE = "callgate-operator";

async function loadShadow() {
  try {
    const report = await api("/v1/policy/shadow");
    $("shadow-count").textContent = String(report.differed);
    $("shadow-rows").replaceChildren(...report.differences.map((d) => el("tr", {},
      el("td", { text: d.invocation_id }),
      el("td", { text: d.tool }),
      el("td", { text: d.active_outcome }),
      el("td", { text: d.candidate_outcome }),
      el("td", { text: d.reason }),
    )));
    show($("shadow"), true);
  } catch (err) {
    show($("shadow"), false);
  }
}

function signOut(message) {
  if (state.feed) state.feed.abort();
  if (state.watch) state.watch.abort();
  if (state.csrf && !state.token) {
    // Ends the cookie session on the server (the cookies are HttpOnly); CSRF-protected.
    api("/v1/session/sign-out", { method: "POST" }).catch(() => {});
  }
  Object.assign(state, { token: null, csrf: null, me: null, items: [], selected: null, feed: null });
  state.decided.clear();
  show($("who"), false);
  show($("workspace"), false);
  show($("signin"), true);
  say("");
  alarm(message || "");
  offerProviders();
  offerDevUsers();
  $("token").focus();
}

// Production: "Sign in with <provider>" links (OpenID Connect); the pasted token is for
// servers without one.
async function offerProviders() {
  let providers = [];
  try {
    providers = await api("/v1/oidc/providers");
  } catch {
    providers = [];
  }
  const list = $("oidc-list");
  list.replaceChildren();
  for (const p of providers) {
    list.append(el("li", {}, el("a", { class: "button", href: p.sign_in_url, text: `Sign in with ${p.name}` })));
  }
  show($("oidc"), providers.length > 0);
  show($("token-form"), providers.length === 0);
}

let devUsersOffered = false;

async function offerDevUsers() {
  if (devUsersOffered) return;
  devUsersOffered = true;
  let users;
  try {
    users = await api("/v1/dev/users");
  } catch {
    return; // not in development mode: the route does not exist
  }
  const select = $("dev-user");
  for (const u of users) {
    select.append(el("option", { value: u.user, text: `${u.user} @ ${u.tenant} (${u.roles.join(", ")})` }));
  }
  show($("dev-form"), true);
}

document.addEventListener("DOMContentLoaded", () => {
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    signIn($("token").value);
  });
  $("dev-form").addEventListener("submit", async (e) => {
    e.preventDefault();
    try {
      const { token } = await api("/v1/dev/sessions", { method: "POST", body: { user: $("dev-user").value } });
      await signIn(token);
    } catch (err) {
      alarm(err instanceof ApiError ? explain(err.code, err.message) : String(err));
    }
  });
  $("sign-out").addEventListener("click", () => signOut(""));
  $("approve").addEventListener("click", () => decide("approve"));
  $("deny").addEventListener("click", () => decide("deny"));
  $("timeline-form").addEventListener("submit", (e) => {
    e.preventDefault();
    loadTimeline($("timeline-id").value.trim());
  });
  window.addEventListener("hashchange", () => {
    const target = targetFromLocation();
    if (target && state.me) select(target);
  });
  setInterval(tick, 1000);
  const failed = new URLSearchParams(window.location.search).get("sign_in_error");
  if (failed) {
    history.replaceState(null, "", window.location.pathname + window.location.hash);
    alarm(`Sign-in failed. ${explain(failed, "")}`);
  }
  resume().then((signedIn) => {
    if (!signedIn) {
      offerProviders();
      offerDevUsers();
    }
  });
});
