// The pieces of the retry contract (SDK-1) that do not touch the network: the full-jitter
// window, the jitter itself and the reading of a Retry-After value. They mirror the Go SDK's
// client/retry.go and the shared berth.Backoff (backoff.go) so both SDKs wait alike.

/** Full-jitter base of SDK-1, seconds. */
export const DEFAULT_BACKOFF_BASE_S = 0.25;
/** Full-jitter cap of SDK-1, seconds. */
export const DEFAULT_BACKOFF_CAP_S = 8;
/** Overall deadline of a retried call, seconds from its first attempt (SDK-1, SDK-2). */
export const DEFAULT_DEADLINE_S = 90;

/**
 * The full-jitter window min(cap, base·2^attempt) of SDK-1, in seconds: the caller sleeps
 * uniform [0, window). `attempt` counts from 0 (the wait after the first failure). The window
 * is always in (0, cap] for any attempt (64, 10,000, negative or NaN, which count as 0) (C04).
 * A non-positive base or cap takes its default (0.25 s, 8 s); a base above the cap is lowered
 * to the cap.
 */
export function backoff(attempt: number, baseS: number = DEFAULT_BACKOFF_BASE_S, capS: number = DEFAULT_BACKOFF_CAP_S): number {
  if (!(capS > 0) || !Number.isFinite(capS)) capS = DEFAULT_BACKOFF_CAP_S;
  if (!(baseS > 0) || !Number.isFinite(baseS)) baseS = DEFAULT_BACKOFF_BASE_S;
  if (baseS > capS) baseS = capS;
  const n = attempt > 0 ? Math.floor(attempt) : 0; // NaN and negatives count as 0; Infinity stays huge
  // 2 ** n is Infinity from n = 1024 on: Math.min then picks the cap, never NaN.
  return Math.min(capS, baseS * 2 ** n);
}

/** The largest double below 1. */
const BELOW_ONE = 1 - 2 ** -53;

/**
 * A full-jitter sleep: r·window with r from a uniform [0, 1) source, clamped into [0, 1) so a
 * faulty source (NaN, negative, 1 or more) can never stretch the sleep to or past the window.
 * Same unit as `window`.
 */
export function jitter(window: number, r: number): number {
  if (!(r > 0)) return 0; // also NaN
  if (r >= 1) r = BELOW_ONE;
  let d = r * window;
  if (d >= window) d = window * (1 - 2 ** -52); // r just below 1 can round up
  return d;
}

const DAYS = "(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)";
const LONG_DAYS = "(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday)";
const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const MON = `(${MONTHS.join("|")})`;
const TIME = "(\\d{2}):(\\d{2}):(\\d{2})";
// IMF-fixdate: "Sun, 06 Nov 1994 08:49:37 GMT".
const IMF_FIXDATE = new RegExp(`^${DAYS}, (\\d{2}) ${MON} (\\d{4}) ${TIME} GMT$`);
// Obsolete RFC 850: "Sunday, 06-Nov-94 08:49:37 GMT".
const RFC850 = new RegExp(`^${LONG_DAYS}, (\\d{2})-${MON}-(\\d{2}) ${TIME} GMT$`);
// Obsolete asctime: "Sun Nov  6 08:49:37 1994".
const ASCTIME = new RegExp(`^${DAYS} ${MON} ( \\d|\\d{2}) ${TIME} (\\d{4})$`);

/**
 * Parses an HTTP-date (RFC 9110 §5.6.7) in any of its three forms — IMF-fixdate, RFC 850,
 * asctime, the forms Go's http.ParseTime accepts — to milliseconds since the epoch, or
 * undefined when `v` is none of them or names no real instant (31 Feb, 25:00). Unlike
 * Date.parse it accepts nothing else: "-3", "1.5" or "tomorrow" are not dates.
 */
export function parseHttpDate(v: string): number | undefined {
  let day: string, mon: string, year: number, hh: string, mm: string, ss: string;
  let m: RegExpExecArray | null;
  if ((m = IMF_FIXDATE.exec(v))) {
    [day, mon, year, hh, mm, ss] = [m[1]!, m[2]!, Number(m[3]), m[4]!, m[5]!, m[6]!];
  } else if ((m = RFC850.exec(v))) {
    const yy = Number(m[3]);
    // A two-digit year reads as Go's time.Parse reads "06": 69–99 → 19xx, 00–68 → 20xx.
    [day, mon, year, hh, mm, ss] = [m[1]!, m[2]!, yy >= 69 ? 1900 + yy : 2000 + yy, m[4]!, m[5]!, m[6]!];
  } else if ((m = ASCTIME.exec(v))) {
    [mon, day, hh, mm, ss, year] = [m[1]!, m[2]!, m[3]!, m[4]!, m[5]!, Number(m[6])];
  } else {
    return undefined;
  }
  const month = MONTHS.indexOf(mon);
  const d = Number(day.trim()), h = Number(hh), mi = Number(mm), s = Number(ss);
  if (h > 23 || mi > 59 || s > 60) return undefined;
  const t = new Date(Date.UTC(year, month, d, h, mi, Math.min(s, 59)));
  t.setUTCFullYear(year); // Date.UTC maps years 0–99 to 1900–1999
  if (t.getUTCDate() !== d || t.getUTCMonth() !== month) return undefined; // 31 Feb
  return t.getTime();
}

/**
 * Reads a Retry-After value (RFC 9110 §10.2.3) against `nowMs` (milliseconds since the epoch)
 * and returns the wait in seconds, or undefined when the hint is to be treated as absent
 * (SDK-1):
 *
 *  - delta-seconds, one or more ASCII digits: that many seconds whatever its size. "86401",
 *    "20251231" and twenty nines are long waits, not garbage (C30); a value too large for a
 *    number is Infinity. The retry loop gives up at once when the wait ends past its deadline.
 *  - an HTTP-date (see parseHttpDate): the time until that instant; a date at or before now
 *    gives 0, "retry at once" (C01) — the loop never does that twice in a row.
 *  - anything else — negative, signed, fractional, empty, garbage, or a date that does not
 *    parse — gives undefined: the loop uses full jitter instead (C02).
 *
 * Surrounding whitespace is ignored.
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | undefined {
  const v = (value ?? "").trim();
  if (v === "") return undefined;
  if (/^[0-9]+$/.test(v)) return Number(v); // never NaN; Infinity past 1.8e308
  const t = parseHttpDate(v);
  if (t === undefined) return undefined;
  const d = (t - nowMs) / 1000;
  return d > 0 ? d : 0;
}

/**
 * Reads an answer's Retry-After header, in seconds (see parseRetryAfter). An HTTP-date is
 * read against the answer's own Date header when it has a valid one, so the wait is the
 * server's "date minus now" whatever the skew between the two clocks; otherwise against
 * `localNowMs`.
 */
export function retryAfterFromHeaders(headers: { get(name: string): string | null }, localNowMs: number): number | undefined {
  const v = headers.get("retry-after");
  if (v === null || v === "") return undefined;
  const serverNow = parseHttpDate((headers.get("date") ?? "").trim());
  return parseRetryAfter(v, serverNow ?? localNowMs);
}
