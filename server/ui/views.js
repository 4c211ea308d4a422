// The dashboard's views. Each has a root element, show(params) when it becomes visible and
// refresh() that fetches its data (the shell calls it every few seconds while visible).

import { get, post } from "./api.js";
import { PagedTable, el, button, setText, setBadge } from "./table.js";
import { drawRefusals, colorFor } from "./chart.js";
import * as f from "./format.js";

const SANDBOX_STATES = ["pending", "starting", "running", "stopping", "stopped", "failed", "lost", "evicted",
  "evacuating", "reconstructed", "migrated", "pausing", "paused", "resuming", "snapshotting"];
const APP_STATES = ["deploying", "waking", "running", "waiting_capacity", "hibernated", "stopped", "error"];
const AGENT_STATES = ["active", "draining", "stale", "quarantined", "dead"];

function section(id, title, subtitle) {
  const s = el("section", "view");
  s.id = "view-" + id;
  s.hidden = true;
  const h = el("div", "view-head");
  const h2 = el("h2");
  h2.textContent = title;
  const p = el("p", "subtitle");
  p.textContent = subtitle;
  h.append(h2, p);
  s.appendChild(h);
  return s;
}

function toolbar(parent) {
  const t = el("div", "toolbar");
  parent.appendChild(t);
  return t;
}

function labelled(text, control) {
  const l = el("label", "field");
  const s = el("span");
  s.textContent = text;
  l.append(s, control);
  return l;
}

function select(name, options, onChange) {
  const s = el("select");
  s.name = name;
  for (const [value, text] of options) {
    const o = el("option");
    o.value = value;
    o.textContent = text;
    s.appendChild(o);
  }
  s.addEventListener("change", onChange);
  return s;
}

function input(name, placeholder, onInput) {
  const i = el("input");
  i.type = "search";
  i.name = name;
  i.placeholder = placeholder;
  i.autocomplete = "off";
  i.spellcheck = false;
  let t;
  i.addEventListener("input", () => { clearTimeout(t); t = setTimeout(onInput, 250); });
  return i;
}

function stat(parent, label) {
  const c = el("div", "stat");
  const v = el("div", "stat-value");
  const l = el("div", "stat-label");
  l.textContent = label;
  c.append(v, l);
  parent.appendChild(c);
  return v;
}

// eventsLink makes td hold a link to the events of entity.
function eventsLink(td, entity) {
  let a = td.firstElementChild;
  if (!a || a.tagName !== "A") {
    td.textContent = "";
    a = el("a", "link");
    a.textContent = "Events";
    td.appendChild(a);
  }
  const href = "#events?entity=" + encodeURIComponent(entity);
  if (a.getAttribute("href") !== href) a.setAttribute("href", href);
}

// FleetView: one row per host from GET /v1/agents?held=count (held lists counted, not sent),
// with the ledger's reservations per host from GET /v1/reservations, and drain / undrain for
// each (admin only).
export class FleetView {
  constructor(ctx) {
    this.ctx = ctx;
    this.id = "fleet";
    this.title = "Fleet";
    this.admin = true;
    this.root = section("fleet", "Fleet", "Every host, as its latest heartbeat and the ledger report it. Memory in MiB/GiB; admittable is the host's own verdict (ADM-6), reserved the ledger's outstanding reservations on it.");
    const cards = el("div", "stats");
    this.s = {
      hosts: stat(cards, "hosts"), active: stat(cards, "active"), draining: stat(cards, "draining"),
      unhealthy: stat(cards, "stale / dead / quarantined"), total: stat(cards, "memory total"),
      committed: stat(cards, "committed"), admittable: stat(cards, "admittable"),
    };
    this.root.appendChild(cards);
    const tb = toolbar(this.root);
    this.q = input("host", "Filter by host id", () => this.draw());
    this.state = select("status", [["", "All states"], ...AGENT_STATES.map((s) => [s, s])], () => this.draw());
    this.pool = select("pool", [["", "All pools"], ["ephemeral", "ephemeral"], ["stateful", "stateful"]], () => this.draw());
    tb.append(labelled("Host", this.q), labelled("State", this.state), labelled("Pool", this.pool));
    this.confirm = new Map(); // agent id → time until which "Confirm drain" shows
    this.agents = [];
    this.reserved = new Map();
    const num = true;
    this.table = new PagedTable(this.root, {
      label: "Hosts",
      rowKey: (a) => a.agent_id,
      sort: { key: "agent_id", dir: 1 },
      empty: "No host matches.",
      columns: [
        { key: "agent_id", label: "Host", text: (a) => a.agent_id, cls: () => "mono" },
        { key: "status", label: "State", text: (a) => a.status, render: (td, a) => setBadge(td, a.status, f.kind(a.status)) },
        { key: "pool", label: "Pool", text: (a) => a.pool || "—" },
        { key: "total", label: "Total", num, text: (a) => f.mib(a.memory_mb_total), sort: (a) => a.memory_mb_total || 0 },
        { key: "committed", label: "Committed", num, text: (a) => f.mib(a.memory_mb_committed), sort: (a) => a.memory_mb_committed || 0 },
        { key: "resident", label: "Resident", num, text: (a) => f.mib(a.memory_mb_used), sort: (a) => a.memory_mb_used || 0 },
        { key: "reserved", label: "Reserved", num, text: (a) => f.mib(this.reserved.get(a.agent_id) || 0), sort: (a) => this.reserved.get(a.agent_id) || 0 },
        { key: "admittable", label: "Admittable", num, text: (a) => f.mib(a.memory_mb_admittable), sort: (a) => a.memory_mb_admittable || 0 },
        // memory_pressure is PSI "some avg10", a percentage; hot from the agents' default
        // pressure-gate close line (10 %, ADM-8).
        { key: "pressure", label: "Pressure", num, text: (a) => f.psi(a.memory_pressure), sort: (a) => a.memory_pressure || 0,
          cls: (a) => (a.memory_pressure >= 10 ? "hot" : "") },
        { key: "intake", label: "Intake", text: (a) => (a.intake_open ? "open" : "closed"), cls: (a) => (a.intake_open ? "" : "warn-text") },
        { key: "heartbeat", label: "Heartbeat", num, text: (a) => f.age(a.last_seen_s) + " ago", sort: (a) => a.last_seen_s || 0 },
        { key: "quarantine", label: "Quarantine", text: (a) => quarantine(a), sort: (a) => a.create_failures || 0 },
        { key: "sandboxes", label: "Sandboxes", num, text: (a) => f.count(held(a)), sort: held },
        { key: "action", label: "", sortable: false, text: () => "", render: (td, a) => this.action(td, a) },
      ],
    });
  }

  show() {}

  async refresh() {
    const [ag, rs] = await Promise.all([get("/v1/agents?held=count"), get("/v1/reservations")]);
    const reserved = new Map();
    for (const r of rs.reservations || []) reserved.set(r.agent_id, (reserved.get(r.agent_id) || 0) + (r.mb || 0));
    this.reserved = reserved;
    this.agents = ag.agents || [];
    this.draw();
  }

  draw() {
    const q = this.q.value.trim().toLowerCase();
    const st = this.state.value;
    const pool = this.pool.value;
    const rows = this.agents.filter((a) => (!q || a.agent_id.toLowerCase().includes(q)) && (!st || a.status === st) && (!pool || a.pool === pool));
    const by = {};
    let total = 0, committed = 0, admittable = 0;
    for (const a of this.agents) {
      by[a.status] = (by[a.status] || 0) + 1;
      total += a.memory_mb_total || 0;
      committed += a.memory_mb_committed || 0;
      admittable += a.memory_mb_admittable || 0;
    }
    setText(this.s.hosts, f.count(this.agents.length));
    setText(this.s.active, f.count(by.active));
    setText(this.s.draining, f.count(by.draining));
    setText(this.s.unhealthy, f.count((by.stale || 0) + (by.dead || 0) + (by.quarantined || 0)));
    setText(this.s.total, f.mib(total));
    setText(this.s.committed, f.mib(committed));
    setText(this.s.admittable, f.mib(admittable));
    this.table.setRows(rows);
  }

  action(td, a) {
    let b = td.firstElementChild;
    if (!b) {
      b = button("", () => this.toggle(td.parentElement.dataset.key), "btn btn-small");
      td.appendChild(b);
    }
    const draining = a.status === "draining" || !!a.drain_reason;
    const confirming = !draining && (this.confirm.get(a.agent_id) || 0) > Date.now();
    const text = draining ? "Undrain" : confirming ? "Confirm drain" : "Drain";
    const cls = "btn btn-small " + (draining ? "undrain" : confirming ? "drain confirm" : "drain");
    setText(b, text);
    if (b.className !== cls) b.className = cls;
    b.disabled = false;
    b.title = draining ? `Drained: ${a.drain_reason || "operator"}. Undrain lets placement use it again.` : "Stop placing sandboxes on this host; those on it run on.";
  }

  async toggle(id) {
    const a = this.agents.find((x) => x.agent_id === id);
    if (!a) return;
    const draining = a.status === "draining" || !!a.drain_reason;
    if (!draining && !((this.confirm.get(id) || 0) > Date.now())) {
      this.confirm.set(id, Date.now() + 5000);
      this.draw();
      setTimeout(() => this.draw(), 5100);
      return;
    }
    this.confirm.delete(id);
    try {
      if (draining) await post(`/v1/agents/${encodeURIComponent(id)}/undrain`);
      else await post(`/v1/agents/${encodeURIComponent(id)}/drain`, { reason: "dashboard" });
      this.ctx.toast(`${draining ? "Undrain" : "Drain"} of ${id} accepted.`);
    } catch (e) {
      this.ctx.fail(e);
    }
    this.ctx.refreshNow();
  }
}

// held is how many sandboxes a host holds: held_count, or the length of its list from a
// replica that predates held_count (it ignores ?held=count and sends the lists).
function held(a) {
  return a.held_count ?? (a.sandboxes || []).length;
}

function quarantine(a) {
  const until = a.quarantined_until ? Date.parse(a.quarantined_until) : 0;
  if (until > Date.now()) return `until ${new Date(until).toLocaleTimeString("en-GB")} (${a.create_failures} failures)`;
  if (a.create_failures) return `no (${a.create_failures} failed)`;
  return "no";
}

// SandboxesView: GET /v1/sandboxes?state=…, the tenant filter applied here (the API gives an
// admin key every tenant's, a tenant key only its own).
export class SandboxesView {
  constructor(ctx) {
    this.ctx = ctx;
    this.id = "sandboxes";
    this.title = "Sandboxes";
    this.root = section("sandboxes", "Sandboxes", "Newest first. A tenant key lists its own sandboxes only.");
    const tb = toolbar(this.root);
    this.state = select("state", [["", "All states"], ...SANDBOX_STATES.map((s) => [s, s])], () => ctx.refreshNow());
    this.tenant = input("tenant", "Tenant", () => this.draw());
    this.q = input("id", "Sandbox id", () => this.draw());
    this.tenantField = labelled("Tenant", this.tenant);
    tb.append(labelled("State", this.state), this.tenantField, labelled("Sandbox", this.q));
    this.rows = [];
    const num = true;
    this.table = new PagedTable(this.root, {
      label: "Sandboxes",
      rowKey: (s) => s.id,
      empty: "No sandbox matches.",
      columns: [
        { key: "id", label: "Sandbox", text: (s) => s.id, cls: () => "mono" },
        { key: "tenant", label: "Tenant", text: (s) => s.tenant },
        { key: "state", label: "State", text: (s) => s.state, render: (td, s) => setBadge(td, s.state, f.kind(s.state)) },
        { key: "template", label: "Template", text: (s) => s.template },
        { key: "memory", label: "Memory", num, text: (s) => f.mib(s.memory_mb), sort: (s) => s.memory_mb || 0 },
        { key: "vcpus", label: "vCPUs", num, text: (s) => f.count(s.vcpus), sort: (s) => s.vcpus || 0 },
        { key: "host", label: "Host", text: (s) => s.agent_id || "—", cls: () => "mono" },
        { key: "created", label: "Created", num, text: (s) => f.since(s.created_at), sort: (s) => s.created_at || "" },
        { key: "expires", label: "Expires", num, text: (s) => f.until(s.expires_at), sort: (s) => s.expires_at || "" },
        { key: "reason", label: "Reason", text: (s) => s.reason || "", cls: () => "reason" },
        { key: "events", label: "", sortable: false, text: () => "", render: (td, s) => eventsLink(td, "sandbox/" + s.id) },
      ],
    });
  }

  show() {
    this.tenantField.hidden = !this.ctx.isAdmin();
  }

  async refresh() {
    const st = this.state.value;
    const data = await get("/v1/sandboxes" + (st ? "?state=" + encodeURIComponent(st) : ""));
    this.rows = data.sandboxes || [];
    this.draw();
  }

  draw() {
    const t = this.tenant.value.trim().toLowerCase();
    const q = this.q.value.trim().toLowerCase();
    this.table.setRows(this.rows.filter((s) => (!t || (s.tenant || "").toLowerCase().includes(t)) && (!q || s.id.toLowerCase().includes(q))));
  }
}

// AppsView: GET /v1/apps, with their desired and actual states.
export class AppsView {
  constructor(ctx) {
    this.ctx = ctx;
    this.id = "apps";
    this.title = "Apps";
    this.root = section("apps", "Apps", "Long-lived servers and the state the reconciler has them in; waiting_capacity retries by itself.");
    const tb = toolbar(this.root);
    this.state = select("state", [["", "All states"], ...APP_STATES.map((s) => [s, s])], () => this.draw());
    this.q = input("name", "App name or tenant", () => this.draw());
    tb.append(labelled("State", this.state), labelled("Search", this.q));
    this.rows = [];
    const num = true;
    this.table = new PagedTable(this.root, {
      label: "Apps",
      rowKey: (a) => a.name,
      sort: { key: "name", dir: 1 },
      empty: "No app matches.",
      columns: [
        { key: "name", label: "App", text: (a) => a.name, cls: () => "mono" },
        { key: "tenant", label: "Tenant", text: (a) => a.tenant },
        { key: "state", label: "State", text: (a) => a.state, render: (td, a) => setBadge(td, a.state, f.kind(a.state)) },
        { key: "desired", label: "Desired", text: (a) => a.desired },
        { key: "version", label: "Version", num, text: (a) => `v${a.version}` + (a.serving_version && a.serving_version !== a.version ? ` (serving v${a.serving_version})` : ""), sort: (a) => a.version },
        { key: "sandbox", label: "Sandbox", text: (a) => a.sandbox_id || a.paused_sandbox || "—", cls: () => "mono" },
        { key: "host", label: "Host", text: (a) => a.agent_id || "—", cls: () => "mono" },
        { key: "updated", label: "Updated", num, text: (a) => f.since(a.updated_at), sort: (a) => a.updated_at || "" },
        { key: "reason", label: "Reason", text: (a) => a.reason || "", cls: () => "reason" },
        { key: "events", label: "", sortable: false, text: () => "", render: (td, a) => eventsLink(td, "app/" + a.name) },
      ],
    });
  }

  show() {}

  async refresh() {
    const data = await get("/v1/apps");
    this.rows = data.apps || [];
    this.draw();
  }

  draw() {
    const st = this.state.value;
    const q = this.q.value.trim().toLowerCase();
    this.table.setRows(this.rows.filter((a) => (!st || a.state === st) && (!q || a.name.includes(q) || (a.tenant || "").includes(q))));
  }
}

// RefusalsView: the chart of GET /v1/refusals (admin), this replica's last hour.
export class RefusalsView {
  constructor(ctx) {
    this.ctx = ctx;
    this.id = "refusals";
    this.title = "Refusals";
    this.admin = true;
    this.root = section("refusals", "Refusals by code", "Creates this replica refused, per minute over the last hour (MET-1). Capacity refusals are answers the SDKs retry, not failures.");
    this.meta = el("p", "chart-meta");
    this.box = el("div", "chart-box");
    this.legend = el("div", "legend");
    this.root.append(this.box, this.legend, this.meta);
  }

  show() {}

  async refresh() {
    const data = await get("/v1/refusals?window=3600");
    drawRefusals(this.box, data);
    const codes = data.codes || [];
    this.legend.replaceChildren(...(codes.length ? codes : []).map((c) => {
      const item = el("span", "legend-item");
      const sw = el("span", "swatch");
      sw.style.backgroundColor = colorFor(c, codes);
      const t = el("span");
      t.textContent = `${c} — ${f.count(data.totals[c])}`;
      item.append(sw, t);
      return item;
    }));
    setText(this.meta, `Counted by replica ${data.replica} since ${f.clock(data.since)}; each replica counts the creates it refused (behind a load balancer, sum them or use berth_scheduler_refusals_total). Hover a bar for its minute.`);
  }
}

const TENANT_EVENTS_HINT = "A tenant key reads the events of one of its own sandboxes or apps: type sandbox/<id> or app/<name>, or follow an Events link in the Sandboxes or Apps view.";
const KIND_EVENTS_HINT = "An entity is <kind>/<id> — sandbox, agent, reservation, app, tenant or volume — or <kind>/ for every one of a kind.";

// EventsView: GET /v1/events, newest first, filtered by entity (exact, or a prefix ending in
// "/") and kind. A tenant key reads one of its own sandboxes or apps at a time.
export class EventsView {
  constructor(ctx) {
    this.ctx = ctx;
    this.id = "events";
    this.title = "Events";
    this.root = section("events", "Events", "Every state change, newest first (the latest 500 that match).");
    const tb = toolbar(this.root);
    this.entity = input("entity", "sandbox/<id>, app/<name>, agent/<id>, or a prefix: sandbox/", () => this.changed());
    this.entity.classList.add("wide");
    this.kind = select("type", [["", "All kinds"], ["sandbox", "sandbox"], ["app", "app"], ["agent", "agent"], ["reservation", "reservation"], ["tenant", "tenant"], ["volume", "volume"]], () => this.changed());
    tb.append(labelled("Entity", this.entity), labelled("Kind", this.kind));
    this.hint = el("p", "hint");
    this.hint.hidden = true;
    this.hint.textContent = TENANT_EVENTS_HINT;
    this.root.appendChild(this.hint);
    this.table = new PagedTable(this.root, {
      label: "Events",
      rowKey: (e) => String(e.id || e.at + e.entity + e.to),
      empty: "No event matches.",
      columns: [
        { key: "at", label: "Time", text: (e) => f.clock(e.at), cls: () => "mono nowrap" },
        { key: "entity", label: "Entity", text: (e) => e.entity, cls: () => "mono" },
        { key: "from", label: "From", text: (e) => e.from || "—", render: (td, e) => setBadge(td, e.from || "—", f.kind(e.from)) },
        { key: "to", label: "To", text: (e) => e.to, render: (td, e) => setBadge(td, e.to, f.kind(e.to)) },
        { key: "reason", label: "Reason", text: (e) => e.reason || "", cls: () => "reason" },
        { key: "actor", label: "Actor", text: (e) => e.actor || "" },
      ],
    });
  }

  show(params) {
    if (params.has("entity")) this.entity.value = params.get("entity");
  }

  changed() {
    this.ctx.refreshNow();
  }

  async refresh() {
    const entity = this.entity.value.trim();
    const kind = this.kind.value;
    const tenantNeedsEntity = !this.ctx.isAdmin() && !/^(sandbox|app)\/./.test(entity);
    // The server refuses an entity of no kind (400); one half typed waits for its "<kind>/".
    const incomplete = entity !== "" && !/^(sandbox|agent|reservation|app|tenant|volume)\//.test(entity);
    this.hint.hidden = !tenantNeedsEntity && !incomplete;
    this.hint.textContent = tenantNeedsEntity ? TENANT_EVENTS_HINT : KIND_EVENTS_HINT;
    if (tenantNeedsEntity || incomplete) {
      this.table.setRows([]);
      this.table.setEmptyText(tenantNeedsEntity ? "Pick a sandbox or an app." : "Type <kind>/<id>, or <kind>/ for every one of a kind.");
      return;
    }
    this.table.setEmptyText("No event matches.");
    const q = new URLSearchParams({ limit: "500" });
    if (entity) q.set("entity", entity);
    if (kind) q.set("type", kind);
    const data = await get("/v1/events?" + q.toString());
    this.table.setRows((data.events || []).slice().reverse());
  }
}
