// The refusals chart: one stacked bar per minute, one colour per refusal code, drawn as
// inline SVG (no library). Data is GET /v1/refusals (server/refusals.go: RefusalWindow).

const SVG = "http://www.w3.org/2000/svg";
const W = 1400, H = 300, L = 44, R = 12, T = 14, B = 30;

const KNOWN = {
  no_capacity: "#d97706",
  no_healthy_agents: "#dc2626",
  host_starts_saturated: "#7c3aed",
  tenant_over_quota: "#2563eb",
};
const PALETTE = ["#0891b2", "#65a30d", "#db2777", "#4b5563", "#ca8a04", "#0d9488"];

export function colorFor(code, codes) {
  if (KNOWN[code]) return KNOWN[code];
  const others = codes.filter((c) => !KNOWN[c]);
  return PALETTE[Math.max(0, others.indexOf(code)) % PALETTE.length];
}

function node(tag, attrs, parent) {
  const n = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, String(v));
  if (parent) parent.appendChild(n);
  return n;
}

// niceStep returns a 1, 2 or 5 × 10^k step giving at most 5 ticks up to max.
function niceStep(max) {
  const raw = Math.max(1, max / 5);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (m * p >= raw) return m * p;
  return 10 * p;
}

const hhmm = (d) => d.toLocaleTimeString("en-GB", { hour: "2-digit", minute: "2-digit" });

// drawRefusals replaces the contents of box with the chart of data.
export function drawRefusals(box, data) {
  const codes = data.codes || [];
  const buckets = data.buckets || [];
  const totals = buckets.map((b) => Object.values(b.counts || {}).reduce((a, c) => a + c, 0));
  const max = Math.max(0, ...totals);
  const step = niceStep(max);
  const top = Math.max(step, Math.ceil(max / step) * step);

  const svg = node("svg", { viewBox: `0 0 ${W} ${H}`, class: "chart", role: "img",
    "aria-label": `Refusals per minute by code over the last ${Math.round((data.window_s || 0) / 60)} minutes` });
  const pw = W - L - R, ph = H - T - B;
  const y = (v) => T + ph - (v / top) * ph;

  for (let v = 0; v <= top; v += step) {
    node("line", { x1: L, x2: W - R, y1: y(v), y2: y(v), class: v === 0 ? "axis" : "grid" }, svg);
    const t = node("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end", class: "tick" }, svg);
    t.textContent = String(v);
  }

  const n = Math.max(1, buckets.length);
  const slot = pw / n;
  const bw = Math.max(1, slot * 0.72);
  buckets.forEach((b, i) => {
    const x = L + i * slot + (slot - bw) / 2;
    let acc = 0;
    const start = new Date(b.start);
    for (const code of codes) {
      const c = (b.counts || {})[code] || 0;
      if (!c) continue;
      const r = node("rect", { x: x.toFixed(1), y: y(acc + c).toFixed(1), width: bw.toFixed(1),
        height: Math.max(0.5, y(acc) - y(acc + c)).toFixed(1), fill: colorFor(code, codes), class: "bar" }, svg);
      node("title", {}, r).textContent = `${hhmm(start)} — ${code}: ${c}`;
      acc += c;
    }
    if (i % 10 === 0 || i === buckets.length - 1) {
      const t = node("text", { x: (L + i * slot + slot / 2).toFixed(1), y: H - 8, "text-anchor": "middle", class: "tick" }, svg);
      t.textContent = i === buckets.length - 1 ? "now" : hhmm(start);
    }
  });
  if (max === 0) {
    const t = node("text", { x: L + pw / 2, y: T + ph / 2, "text-anchor": "middle", class: "chart-empty" }, svg);
    t.textContent = "No refusals in this window";
  }
  box.replaceChildren(svg);
}
