// Formatting shared by the views. Memory figures from the API are MiB.

const nf1 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 1 });
const nf0 = new Intl.NumberFormat("en-US", { maximumFractionDigits: 0 });

export function mib(v) {
  if (v === undefined || v === null) return "—";
  if (Math.abs(v) >= 1024 * 1024) return nf1.format(v / (1024 * 1024)) + " TiB";
  if (Math.abs(v) >= 1024) return nf1.format(v / 1024) + " GiB";
  return nf0.format(v) + " MiB";
}

export function count(v) {
  return nf0.format(v || 0);
}

export function pct(v) {
  return v === undefined || v === null ? "—" : nf0.format(v * 100) + "%";
}

// psi formats a PSI reading, already a percentage (memory_pressure: "some avg10", 0–100).
export function psi(v) {
  return v === undefined || v === null ? "—" : nf1.format(v) + "%";
}

// age formats seconds as "0.4 s", "12 s", "3 min", "2 h", "5 d".
export function age(s) {
  if (s === undefined || s === null || !isFinite(s)) return "—";
  if (s < 10) return nf1.format(Math.max(0, s)) + " s";
  if (s < 120) return nf0.format(s) + " s";
  if (s < 7200) return nf0.format(s / 60) + " min";
  if (s < 172800) return nf0.format(s / 3600) + " h";
  return nf0.format(s / 86400) + " d";
}

// since formats an RFC 3339 time as its age ("12 s ago"), "—" for none.
export function since(t) {
  if (!t) return "—";
  const ms = Date.parse(t);
  if (isNaN(ms)) return "—";
  return age((Date.now() - ms) / 1000) + " ago";
}

// until formats an RFC 3339 time still ahead as "in 5 min", a past one as "expired".
export function until(t) {
  if (!t) return "—";
  const ms = Date.parse(t);
  if (isNaN(ms)) return "—";
  const s = (ms - Date.now()) / 1000;
  return s <= 0 ? "expired" : "in " + age(s);
}

export function clock(t) {
  if (!t) return "—";
  const d = new Date(t);
  if (isNaN(d.getTime())) return "—";
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// Badge kinds by state: ok (green), info (blue), warn (amber), bad (red), muted (grey).
const KINDS = {
  active: "ok", running: "ok",
  draining: "warn", stale: "warn", waiting_capacity: "warn", evacuating: "warn",
  quarantined: "bad", dead: "bad", failed: "bad", lost: "bad", evicted: "bad", error: "bad",
  pending: "info", starting: "info", stopping: "info", pausing: "info", resuming: "info",
  snapshotting: "info", deploying: "info", waking: "info",
};

export function kind(state) {
  return KINDS[state] || "muted";
}
