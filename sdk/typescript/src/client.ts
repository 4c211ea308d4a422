// The Berth client: one transport with the retry loop of SDK-1 (client/do.go in the Go SDK)
// and the resources built on it.

import { randomBytes } from "node:crypto";

import { BerthError, CapacityUnavailable, TransportError } from "./errors.js";
import {
  backoff, DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_CAP_S, DEFAULT_DEADLINE_S, jitter, retryAfterFromHeaders,
} from "./retry.js";
import type {
  APIKeySecret, App, AppAction, AppSpec, CreateAppRequest, CreateSandboxRequest, Event, EventFilter,
  ExecRequest, ExecResult, Sandbox, SandboxState, Tenant,
} from "./types.js";

/** The URL a client talks to when neither `url` nor BERTH_URL says otherwise (`berth dev`). */
export const DEFAULT_URL = "http://127.0.0.1:7070";
/** One attempt of an ordinary call, seconds from sending to the answer's last byte (C28). */
export const DEFAULT_ATTEMPT_TIMEOUT_S = 60;
/** The User-Agent of every request unless `userAgent` says otherwise. */
export const DEFAULT_USER_AGENT = "berth-typescript-client/1";

/**
 * The client's source of time (tests inject a fake so nothing really sleeps): `now` in
 * milliseconds since the epoch, like Date.now; `sleep` resolves after `ms` milliseconds, or
 * rejects with the signal's reason as soon as `signal` aborts.
 */
export interface Clock {
  now(): number;
  sleep(ms: number, signal?: AbortSignal): Promise<void>;
}

/** A retry the client is about to wait for (see BerthOptions.onRetry). */
export interface RetryInfo {
  /** The attempt that was refused, from 1. */
  attempt: number;
  /** How long the client will wait, seconds. */
  waitS: number;
  /** True when the wait is the server's Retry-After, false when it is full jitter (SDK-1). */
  fromRetryAfter: boolean;
  /** The refusal (code "unavailable" for an attempt that got no answer). */
  last: BerthError;
  /** The TransportError when the attempt got no answer. */
  transportError?: TransportError | undefined;
}

/** Options of `new Berth(…)`. Every one is optional. */
export interface BerthOptions {
  /** The server's base URL; default: env BERTH_URL, else http://127.0.0.1:7070. */
  url?: string;
  /** A tenant or admin API key, sent as "Authorization: Bearer <key>"; default: env BERTH_KEY. */
  key?: string;
  /** Overall deadline of a retried call, seconds from its first attempt (default 90; SDK-1). */
  deadlineS?: number;
  /** Bound of one attempt of an ordinary call, seconds (default 60; C28). Longer calls get their own. */
  attemptTimeoutS?: number;
  /** Full-jitter base, seconds (default 0.25). */
  backoffBaseS?: number;
  /** Full-jitter cap, seconds (default 8). */
  backoffCapS?: number;
  /** Source of time; default the real clock. */
  clock?: Clock;
  /** Uniform [0, 1) source of the jitter; default Math.random. */
  random?: () => number;
  /** The fetch to send requests with; default globalThis.fetch (Node ≥ 18). */
  fetch?: typeof globalThis.fetch;
  /** User-Agent header (default "berth-typescript-client/1"); "" sends none of the SDK's own. */
  userAgent?: string;
  /** Called before every wait between attempts, so a caller can say what is happening. */
  onRetry?: (r: RetryInfo) => void;
}

/** Options every call takes. */
export interface CallOptions {
  /** Aborting it stops the call at once, also while it waits to retry; the call rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** Options of the calls that carry an Idempotency-Key (sandbox and app create, deploy). */
export interface IdempotentCallOptions extends CallOptions {
  /**
   * The Idempotency-Key to send (≤ 255 bytes of printable ASCII, API-4); default a fresh
   * random one per call. Give your own to survive your own restart without creating twice.
   */
  idempotencyKey?: string;
}

/** One API call as the retry loop sees it. */
interface Request {
  method: string;
  /** Escaped, starting with /v1. */
  path: string;
  query?: Record<string, string>;
  /** Sent again from the start on every attempt. */
  body?: Uint8Array | string;
  contentType?: string;
  /** Idempotent calls are retried (SDK-1). */
  idempotent: boolean;
  /** When set, sent with the first attempt's time and the attempt number (SDK-3). */
  idempotencyKey?: string;
  /** This call's own per-attempt bound, seconds, when longer than the client's (C28). */
  ownAttemptS?: number;
  /**
   * Sent twice, it does its work twice (exec: the command runs again). When it may have
   * reached Berth and no answer of Berth's came back, it rejects with outcome_unknown, never
   * a retryable error.
   */
  runsTwice?: boolean;
  signal?: AbortSignal | undefined;
}

/** A 2xx answer, its body read in full. */
interface Answer {
  status: number;
  headers: Headers;
  body: Uint8Array;
}

/** Per-attempt bounds (C28), seconds: each the server's own bound on that work plus 30 s. */
const ATTEMPT_MARGIN_S = 30;
const DEFAULT_EXEC_S = 60;
const MAX_EXEC_S = 3600;
/** File read or write, pause: the server gives the agent 10 minutes. */
const TRANSFER_ATTEMPT_S = 600 + ATTEMPT_MARGIN_S;
/** Create, resume: the server tries up to 3 hosts for 30 s each. */
const PLACEMENT_ATTEMPT_S = 90 + ATTEMPT_MARGIN_S;
/** How much of a non-2xx body is read (a proxy's page can be large). */
const MAX_ERROR_BODY = 1 << 20;
/** What net/http's TLS server answers (400) to a request sent in clear. */
const PLAINTEXT_TO_TLS = "Client sent an HTTP request to an HTTPS server";

/**
 * Transport failure codes SDK-1 retries for idempotent calls: the request never got an answer
 * (dial errors — refused, unreachable, DNS, connect timeout —, resets and aborts, the server
 * closing the connection before answering). TLS errors are not among them: retrying later
 * does not fix them.
 */
const CONNECTION_FAILURES = new Set([
  "ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EPIPE", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH",
  "ENETUNREACH", "ETIMEDOUT", "UND_ERR_SOCKET", "UND_ERR_CONNECT_TIMEOUT", "UND_ERR_CLOSED",
]);

/** The longest delay setTimeout takes; a longer one fires at once. */
const MAX_TIMER_MS = 2 ** 31 - 1;

/** The real clock. Its sleep takes any length (in steps setTimeout can hold). */
const systemClock: Clock = {
  now: () => Date.now(),
  sleep: (ms, signal) =>
    new Promise<void>((resolve, reject) => {
      if (signal?.aborted) {
        reject(abortReason(signal));
        return;
      }
      let left = Math.max(0, ms);
      let t: ReturnType<typeof setTimeout>;
      const onAbort = () => {
        clearTimeout(t);
        reject(abortReason(signal!));
      };
      const step = () => {
        const d = Math.min(left, MAX_TIMER_MS);
        left -= d;
        t = setTimeout(() => {
          if (left > 0) return step();
          signal?.removeEventListener("abort", onAbort);
          resolve();
        }, d);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      step();
    }),
};

function abortReason(signal: AbortSignal): unknown {
  return signal.reason ?? new DOMException("This operation was aborted", "AbortError");
}

/** The per-attempt bound cut an attempt (C28): a transport failure that SDK-1 retries. */
class AttemptTimeout extends Error {
  constructor(readonly withinS: number) {
    super(`timed out after ${withinS}s`);
    this.name = "AttemptTimeout";
  }
}

/**
 * A client of one Berth server (the Go SDK's client.Client). Safe to share: calls do not
 * interfere. Resources: `sandboxes`, `apps`, `events`, `tenants`.
 *
 * Retry policy (SDK-1, as the Go SDK's): only idempotent calls are retried — GET, DELETE,
 * file writes, pause/resume, app actions, and sandbox/app create and deploy, which always carry
 * an Idempotency-Key (one per call, reused on every attempt) with Berth-First-Attempt and
 * Berth-Attempt (API-4, SDK-3). Exec and tenant/key creation are sent again only after a 429
 * rate_limited, which the server answers before doing anything (a tenant over its request
 * rate, or an exec over a bound of exec requests in flight); any other failure throws. A retried
 * call retries 502/503/504, 429 rate_limited, connection failures and attempts cut by their
 * per-attempt bound; every other non-2xx answer throws a BerthError at once. Between attempts
 * it sleeps as the answer's Retry-After says (delta-seconds or an HTTP-date, read against the
 * answer's Date header; a date in the past means "at once", never twice in a row), otherwise
 * full jitter: uniform [0, min(8 s, 0.25 s·2^attempt)). When the next wait would end past the
 * deadline (90 s from the first attempt) it does not sleep: it throws CapacityUnavailable at
 * once (SDK-2, C30).
 */
export class Berth {
  /** The base URL, without a trailing slash. */
  readonly url: string;
  readonly sandboxes: Sandboxes;
  readonly apps: Apps;
  readonly events: Events;
  readonly tenants: Tenants;

  readonly #key: string;
  readonly #deadlineMs: number;
  readonly #attemptS: number;
  readonly #baseS: number;
  readonly #capS: number;
  readonly #clock: Clock;
  readonly #random: () => number;
  readonly #fetch: typeof globalThis.fetch;
  readonly #userAgent: string;
  readonly #onRetry: ((r: RetryInfo) => void) | undefined;

  /**
   * Throws a BerthError with code invalid_request when the URL is not an http:// or https://
   * URL, or when no fetch exists (Node < 18 without a `fetch` option).
   */
  constructor(options: BerthOptions = {}) {
    const env = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process?.env ?? {};
    const url = (options.url ?? env["BERTH_URL"] ?? "") || DEFAULT_URL;
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new BerthError({ code: "invalid_request", message: `berth: server URL ${JSON.stringify(url)} is not a URL: want http://host:port` });
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new BerthError({ code: "invalid_request", message: `berth: server URL ${JSON.stringify(url)} is not http:// or https://` });
    }
    this.url = url.replace(/\/+$/, "");
    this.#key = options.key ?? env["BERTH_KEY"] ?? "";
    this.#deadlineMs = 1000 * positive(options.deadlineS, DEFAULT_DEADLINE_S);
    this.#attemptS = positive(options.attemptTimeoutS, DEFAULT_ATTEMPT_TIMEOUT_S);
    this.#baseS = positive(options.backoffBaseS, DEFAULT_BACKOFF_BASE_S);
    this.#capS = positive(options.backoffCapS, DEFAULT_BACKOFF_CAP_S);
    this.#clock = options.clock ?? systemClock;
    this.#random = options.random ?? Math.random;
    const f = options.fetch ?? globalThis.fetch;
    if (typeof f !== "function") {
      throw new BerthError({ code: "invalid_request", message: "berth: no fetch: use Node.js 18 or later, or pass options.fetch" });
    }
    this.#fetch = f;
    this.#userAgent = options.userAgent ?? DEFAULT_USER_AGENT;
    this.#onRetry = options.onRetry;
    const send = this.#do.bind(this);
    this.sandboxes = new Sandboxes(send);
    this.apps = new Apps(send);
    this.events = new Events(send);
    this.tenants = new Tenants(send);
  }

  /**
   * Sends r, retrying it by SDK-1 when it is idempotent. Resolves to the 2xx answer; rejects
   * with a BerthError for any other answer it does not retry, a CapacityUnavailable when the
   * next wait would end past the deadline (at once, without sleeping, when a Retry-After of
   * any size does; C30), a TransportError for a request that got no answer and is not
   * retried, or the signal's reason when r.signal aborts.
   */
  async #do(r: Request): Promise<Answer> {
    const start = this.#clock.now();
    const deadline = start + this.#deadlineMs;
    let last: BerthError;
    let prevImmediate = false;
    for (let attempt = 0; ; attempt++) {
      let hintS: number | undefined;
      let noAnswer: TransportError | undefined;
      let answer: Answer | undefined;
      try {
        answer = await this.#once(r, start, attempt + 1);
      } catch (err) {
        if (r.signal?.aborted) throw abortReason(r.signal);
        noAnswer = new TransportError(r.method, r.path, this.url, transportReason(err, this.url), err);
        if (r.runsTwice && !notSent(err)) throw outcomeUnknown(`no answer from ${this.url}: ${noAnswer.reason}`, noAnswer);
        if (!r.idempotent || !(err instanceof AttemptTimeout || connectionFailure(err))) throw noAnswer;
        last = new BerthError({
          code: "unavailable", message: `no answer from ${this.url}: ${noAnswer.reason}`, retryable: true, cause: noAnswer,
        });
      }
      if (answer !== undefined) {
        if (answer.status >= 200 && answer.status <= 299) return answer;
        const now = this.#clock.now();
        const e = decodeError(answer, now);
        // A 429 is retried only as rate_limited (a tenant over its request rate, or an exec
        // over a bound of execs in flight), for any call: the server refused it before doing
        // anything.
        const rateLimited = answer.status === 429 && e.code === "rate_limited";
        // A proxy's 502/503/504 page: whether Berth got the call is unknown.
        if (r.runsTwice && retryableStatus(answer.status) && errorDetail(bodyText(answer.body)) === undefined) {
          throw outcomeUnknown(e.message, e);
        }
        if (!rateLimited && !(r.idempotent && retryableStatus(answer.status))) throw e;
        last = e;
        hintS = retryAfterFromHeaders(answer.headers, now);
      }

      // Honour the server's hint, except a second "at once" in a row: a server whose clock
      // lags must not drive a hot loop.
      let waitMs: number;
      let immediate = hintS === 0;
      const fromHint = hintS !== undefined && !(immediate && prevImmediate);
      if (fromHint) {
        waitMs = hintS! * 1000;
      } else {
        waitMs = jitter(backoff(attempt, this.#baseS, this.#capS), this.#random()) * 1000;
        immediate = false;
      }
      prevImmediate = immediate;

      // Never sleep past the deadline: if the wait would end beyond it, stop now.
      const now = this.#clock.now();
      if (waitMs > deadline - now) {
        throw new CapacityUnavailable({
          elapsedS: (now - start) / 1000, attempts: attempt + 1, last: last!, retryAfterS: hintS ?? 0, transportError: noAnswer,
        });
      }
      this.#onRetry?.({ attempt: attempt + 1, waitS: waitMs / 1000, fromRetryAfter: fromHint, last: last!, transportError: noAnswer });
      await this.#clock.sleep(waitMs, r.signal);
      if (r.signal?.aborted) throw abortReason(r.signal);
    }
  }

  /**
   * Sends one attempt of r, bounded by its per-attempt bound from sending the request to the
   * answer's last byte, which it reads in full before the bound is released (C28). An attempt
   * the bound cut rejects with an AttemptTimeout; one r.signal cut, with the signal's reason.
   */
  async #once(r: Request, first: number, attempt: number): Promise<Answer> {
    const withinS = Math.max(this.#attemptS, r.ownAttemptS ?? 0);
    const ac = new AbortController();
    const cut = new AttemptTimeout(withinS);
    const timer = setTimeout(() => ac.abort(cut), Math.min(withinS * 1000, MAX_TIMER_MS));
    const onAbort = () => ac.abort(abortReason(r.signal!));
    if (r.signal?.aborted) onAbort();
    r.signal?.addEventListener("abort", onAbort, { once: true });
    try {
      let u = this.url + r.path;
      if (r.query !== undefined && Object.keys(r.query).length > 0) u += "?" + new URLSearchParams(r.query).toString();
      const headers: Record<string, string> = { accept: "application/json" };
      if (this.#key !== "") headers["authorization"] = `Bearer ${this.#key}`;
      if (this.#userAgent !== "") headers["user-agent"] = this.#userAgent;
      if (r.contentType !== undefined) headers["content-type"] = r.contentType;
      if (r.idempotencyKey !== undefined) {
        headers["idempotency-key"] = r.idempotencyKey;
        headers["berth-first-attempt"] = new Date(first).toISOString();
        headers["berth-attempt"] = String(attempt);
      }
      try {
        const res = await this.#fetch(u, { method: r.method, headers, body: r.body ?? null, signal: ac.signal });
        const ok = res.status >= 200 && res.status <= 299;
        const body = ok ? new Uint8Array(await res.arrayBuffer()) : await readLimited(res, MAX_ERROR_BODY);
        return { status: res.status, headers: res.headers, body };
      } catch (err) {
        if (ac.signal.aborted && ac.signal.reason === cut) throw cut;
        throw err;
      }
    } finally {
      clearTimeout(timer);
      r.signal?.removeEventListener("abort", onAbort);
    }
  }
}

function positive(v: number | undefined, dflt: number): number {
  return v !== undefined && v > 0 && Number.isFinite(v) ? v : dflt;
}

/** Reads at most `limit` bytes of a body and drops the rest. */
async function readLimited(res: Response, limit: number): Promise<Uint8Array> {
  if (res.body === null) return new Uint8Array(0);
  const reader = res.body.getReader();
  const chunks: Uint8Array[] = [];
  let n = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    chunks.push(value);
    n += value.byteLength;
    if (n >= limit) {
      await reader.cancel().catch(() => {});
      break;
    }
  }
  const out = new Uint8Array(Math.min(n, limit));
  let off = 0;
  for (const c of chunks) {
    const take = Math.min(c.byteLength, out.byteLength - off);
    out.set(c.subarray(0, take), off);
    off += take;
    if (off === out.byteLength) break;
  }
  return out;
}

/** Whether an HTTP status is one SDK-1 retries. */
function retryableStatus(status: number): boolean {
  return status === 502 || status === 503 || status === 504;
}

const STATUS_TEXT: Record<number, string> = {
  400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found", 405: "Method Not Allowed",
  409: "Conflict", 413: "Request Entity Too Large", 422: "Unprocessable Entity", 429: "Too Many Requests",
  500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout",
};

/**
 * Turns a non-2xx answer into a BerthError (API-2). A body that is not Berth's error envelope
 * (a proxy's HTML page, say) yields code "unavailable" for 502/503/504 and "internal"
 * otherwise, with the status and the start of the body in the message; Go's answer to a
 * plaintext request at a TLS port is invalid_request saying to use https://. retryAfterS comes
 * from the body's retry_after_s, or else from the Retry-After header read against nowMs.
 */
function decodeError(a: Answer, nowMs: number): BerthError {
  const text = bodyText(a.body);
  const headerRequestId = a.headers.get("x-request-id") ?? "";
  const headerHint = retryAfterFromHeaders(a.headers, nowMs) ?? 0;
  const detail = errorDetail(text);
  if (detail !== undefined) {
    const bodyHint = typeof detail["retry_after_s"] === "number" ? detail["retry_after_s"] : 0;
    return new BerthError({
      code: detail["code"] as string,
      message: typeof detail["message"] === "string" ? detail["message"] : "",
      retryable: typeof detail["retryable"] === "boolean" ? detail["retryable"] : undefined,
      retryAfterS: bodyHint > 0 ? bodyHint : headerHint,
      requestId: typeof detail["request_id"] === "string" && detail["request_id"] !== "" ? detail["request_id"] : headerRequestId,
      status: a.status,
      hosts: detail["hosts"] !== null && typeof detail["hosts"] === "object" ? (detail["hosts"] as Record<string, number>) : undefined,
    });
  }
  if (a.status === 400 && text.includes(PLAINTEXT_TO_TLS)) {
    return new BerthError({
      code: "invalid_request", message: "the server speaks HTTPS and this request went in clear: use an https:// URL",
      status: a.status, requestId: headerRequestId,
    });
  }
  const code = retryableStatus(a.status) ? "unavailable" : "internal";
  let message = `HTTP ${a.status}${STATUS_TEXT[a.status] ? " " + STATUS_TEXT[a.status] : ""}`;
  let snippet = text.trim().split(/\s+/).join(" ");
  if (snippet !== "") {
    if (snippet.length > 200) snippet = snippet.slice(0, 200) + "…";
    message += ": " + snippet;
  }
  return new BerthError({ code, message, retryAfterS: headerHint, status: a.status, requestId: headerRequestId });
}

/** Every `code` on an error, its causes and the errors it aggregates (fetch nests them). */
function errorCodes(err: unknown, seen = new Set<unknown>()): string[] {
  if (err === null || typeof err !== "object" || seen.has(err)) return [];
  seen.add(err);
  const e = err as { code?: unknown; cause?: unknown; errors?: unknown };
  const out = typeof e.code === "string" ? [e.code] : [];
  out.push(...errorCodes(e.cause, seen));
  if (Array.isArray(e.errors)) for (const x of e.errors) out.push(...errorCodes(x, seen));
  return out;
}

/** Whether a fetch failure means the request never got an answer (SDK-1 retries it). */
function connectionFailure(err: unknown): boolean {
  return errorCodes(err).some((c) => CONNECTION_FAILURES.has(c));
}

/**
 * Failures in which nothing of the request reached the server: the connect failed (refused,
 * unreachable, the name did not resolve, the connect timed out) or the server's certificate
 * was refused. Any other failure may come after the request was written.
 */
const NOT_SENT = new Set([
  "ECONNREFUSED", "ENOTFOUND", "EAI_AGAIN", "EHOSTUNREACH", "ENETUNREACH", "UND_ERR_CONNECT_TIMEOUT",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE", "SELF_SIGNED_CERT_IN_CHAIN", "DEPTH_ZERO_SELF_SIGNED_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY", "CERT_HAS_EXPIRED", "ERR_TLS_CERT_ALTNAME_INVALID",
]);

function notSent(err: unknown): boolean {
  return errorCodes(err).some((c) => NOT_SENT.has(c));
}

/**
 * The inside of Berth's error envelope (API-2) in text, or undefined when text is not one:
 * JSON whose `error` holds a non-empty code (the Go SDK's berth.ParseErrorBody).
 */
function errorDetail(text: string): Record<string, unknown> | undefined {
  let eb: unknown;
  try {
    eb = JSON.parse(text);
  } catch {
    return undefined;
  }
  const detail = (eb as { error?: unknown } | null)?.error;
  if (detail === null || typeof detail !== "object") return undefined;
  const d = detail as Record<string, unknown>;
  return typeof d["code"] === "string" && d["code"] !== "" ? d : undefined;
}

/**
 * The rejection of a call that does its work again when sent again (exec) when the request may
 * have reached Berth but no answer of Berth's came back: outcome_unknown, not retryable — the
 * command may have run, so sending it again is the caller's decision (found by an attack: a
 * proxy's 504 page after the exec ran was "unavailable", retryable).
 */
function outcomeUnknown(why: string, cause: unknown): BerthError {
  return new BerthError({
    code: "outcome_unknown", retryable: false, cause,
    message: `${why}, after the request was sent: it may have been done; check before sending it again`,
  });
}

/** Why a request got no answer, in a few words, for people. */
function transportReason(err: unknown, url: string): string {
  if (err instanceof AttemptTimeout) return err.message;
  const codes = errorCodes(err);
  const has = (...cs: string[]) => cs.some((c) => codes.includes(c));
  if (has("ENOTFOUND", "EAI_AGAIN")) return `cannot resolve ${new URL(url).hostname}`;
  if (has("ECONNREFUSED")) return "connection refused";
  if (has("ECONNRESET", "ECONNABORTED", "EPIPE")) return "the connection was reset";
  if (has("UND_ERR_SOCKET", "UND_ERR_CLOSED")) return "the connection closed before an answer";
  if (has("ETIMEDOUT", "UND_ERR_CONNECT_TIMEOUT")) return "timed out";
  // The innermost message below fetch's "fetch failed".
  let e: unknown = err;
  while (e instanceof Error && e.cause instanceof Error) e = e.cause;
  return e instanceof Error ? e.message : String(e);
}

/** A fresh Idempotency-Key: 128 random bits in hex (API-4). */
function newIdempotencyKey(): string {
  return randomBytes(16).toString("hex");
}

type Send = (r: Request) => Promise<Answer>;

/**
 * The text of an answer's body, as Go's encoding/json reads it: UTF-8, invalid bytes becoming
 * U+FFFD, and a byte order mark kept — so JSON.parse refuses it, as the Go SDK does, instead of
 * TextDecoder's default of dropping it (the SDKs then disagreed on what an exec result is).
 */
function bodyText(body: Uint8Array): string {
  return new TextDecoder("utf-8", { ignoreBOM: true }).decode(body);
}

/** Decodes a 2xx answer's JSON body. */
function decodeJSON<T>(r: Request, a: Answer): T {
  const text = bodyText(a.body);
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    const bad = new Error(`berth: ${r.method} ${r.path}: the answer (HTTP ${a.status}) is not the JSON Berth sends: ${(err as Error).message}`);
    // An exec that ran, or may have: its result is lost (an empty 200, say).
    if (r.runsTwice) throw outcomeUnknown(`the answer (HTTP ${a.status}) is not the JSON Berth sends`, bad);
    throw bad;
  }
}

/**
 * The largest magnitude of an exec result's `exit_code`: Number.MAX_SAFE_INTEGER, 2^53 − 1, the
 * largest integer a JavaScript number holds exactly (the Go package's MaxExecExitCode), so
 * every SDK agrees on what an exec result is.
 */
const MAX_EXEC_EXIT_CODE = Number.MAX_SAFE_INTEGER;

/**
 * The ExecResult in `v`, an exec's 2xx body parsed from JSON, or undefined when it is not one
 * (the Go package's berth.ParseExecResult): an exec result is an object whose `exit_code` is a
 * number with an integer value of magnitude at most MAX_EXEC_EXIT_CODE, and whose `stdout`
 * and `stderr`, when present and not null, are strings (absent or null, they are ""). Anything
 * else — null, {}, [], {"stdout":"x"}, {"exit_code":"0"}, {"exit_code":1.5} — is no result of
 * the command, whose outcome is then unknown: never exit code 0.
 */
function execResult(v: unknown): ExecResult | undefined {
  if (v === null || typeof v !== "object" || Array.isArray(v)) return undefined;
  const o = v as Record<string, unknown>;
  const code = o["exit_code"];
  if (typeof code !== "number" || !Number.isInteger(code) || Math.abs(code) > MAX_EXEC_EXIT_CODE) return undefined;
  const out = (k: string): string | undefined => {
    const s = o[k];
    return s === undefined || s === null ? "" : typeof s === "string" ? s : undefined;
  };
  const stdout = out("stdout");
  const stderr = out("stderr");
  if (stdout === undefined || stderr === undefined) return undefined;
  return { ...o, exit_code: code, stdout, stderr };
}

async function call<T>(send: Send, r: Request): Promise<T> {
  return decodeJSON<T>(r, await send(r));
}

function jsonRequest(method: string, path: string, body: unknown, idempotent: boolean, o?: CallOptions): Request {
  return { method, path, body: JSON.stringify(body), contentType: "application/json", idempotent, signal: o?.signal };
}

const sandboxPath = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}`;
const appPath = (name: string) => `/v1/apps/${encodeURIComponent(name)}`;

/** Sandboxes (docs/API.md "Sandboxes"). */
export class Sandboxes {
  readonly #send: Send;
  constructor(send: Send) {
    this.#send = send;
  }

  /**
   * Asks for a sandbox (POST /v1/sandboxes, 201). Sends one Idempotency-Key (random, or
   * `options.idempotencyKey`) with the first attempt's time on every attempt, so a retry after
   * a lost answer returns the first sandbox instead of a second (API-4, SDK-3). Refusals throw
   * BerthError (tenant_over_quota, template_not_found, invalid_request…); retryable ones
   * (no_capacity, no_healthy_agents, host_starts_saturated, 502/503/504) are retried until the
   * deadline, then CapacityUnavailable (SDK-1, SDK-2).
   */
  create(req: CreateSandboxRequest, options?: IdempotentCallOptions): Promise<Sandbox> {
    const r = jsonRequest("POST", "/v1/sandboxes", req, true, options);
    r.idempotencyKey = options?.idempotencyKey || newIdempotencyKey();
    r.ownAttemptS = PLACEMENT_ATTEMPT_S;
    return call<Sandbox>(this.#send, r);
  }

  /** One sandbox (GET /v1/sandboxes/{id}); sandbox_not_found when none is visible to the key. */
  get(id: string, options?: CallOptions): Promise<Sandbox> {
    return call<Sandbox>(this.#send, { method: "GET", path: sandboxPath(id), idempotent: true, signal: options?.signal });
  }

  /** The sandboxes visible to the key, newest first (GET /v1/sandboxes?state=), only those in `state` when given. */
  async list(filter?: { state?: SandboxState }, options?: CallOptions): Promise<Sandbox[]> {
    const r: Request = { method: "GET", path: "/v1/sandboxes", idempotent: true, signal: options?.signal };
    if (filter?.state) r.query = { state: filter.state };
    return (await call<{ sandboxes: Sandbox[] | null }>(this.#send, r)).sandboxes ?? [];
  }

  /**
   * Runs a command and returns its exit code and output (POST /v1/sandboxes/{id}/exec). Resent
   * only on 429 rate_limited, which the server answers before running anything; any other
   * failure rejects as it came: running a command twice is not harmless. A BerthError
   * `outcome_unknown` means the command may have run: the server's 504 (the exec reached the
   * sandbox's host, its answer was lost), or no answer of Berth's after the request was sent
   * (the connection broke or timed out, or a proxy answered 502/503/504 with its own page),
   * or a 2xx whose body is not an exec result (an empty body, null, {}, an `exit_code` missing
   * or not an integer), which is never read as exit code 0. A non-zero exit code is a result,
   * not an error. `cmd` is the argv, or the whole request.
   */
  async exec(id: string, cmd: string[] | ExecRequest, options?: CallOptions): Promise<ExecResult> {
    const req: ExecRequest = Array.isArray(cmd) ? { cmd } : cmd;
    const r = jsonRequest("POST", `${sandboxPath(id)}/exec`, req, false, options);
    r.runsTwice = true;
    const s = req.timeout_s !== undefined && req.timeout_s > 0 ? req.timeout_s : DEFAULT_EXEC_S;
    r.ownAttemptS = Math.min(s, MAX_EXEC_S) + ATTEMPT_MARGIN_S;
    const a = await this.#send(r);
    const res = execResult(decodeJSON<unknown>(r, a));
    if (res === undefined) {
      const why = `the answer (HTTP ${a.status}) is not an exec result`;
      throw outcomeUnknown(why, new Error(`berth: ${r.method} ${r.path}: ${why}`));
    }
    return res;
  }

  /**
   * Writes `data` (bytes, or a string written as UTF-8) to the absolute `path` inside the
   * sandbox, replacing the file (PUT /v1/sandboxes/{id}/files?path=, ≤ 64 MiB, 204). Retried:
   * writing the same bytes twice leaves the same file.
   */
  async writeFile(id: string, path: string, data: Uint8Array | string, options?: CallOptions): Promise<void> {
    await this.#send({
      method: "PUT", path: `${sandboxPath(id)}/files`, query: { path },
      body: typeof data === "string" ? new TextEncoder().encode(data) : data,
      contentType: "application/octet-stream", idempotent: true, ownAttemptS: TRANSFER_ATTEMPT_S, signal: options?.signal,
    });
  }

  /** The bytes of the absolute `path` inside the sandbox (GET /v1/sandboxes/{id}/files?path=). */
  async readFile(id: string, path: string, options?: CallOptions): Promise<Uint8Array> {
    const a = await this.#send({
      method: "GET", path: `${sandboxPath(id)}/files`, query: { path },
      idempotent: true, ownAttemptS: TRANSFER_ATTEMPT_S, signal: options?.signal,
    });
    return a.body;
  }

  /** readFile decoded as UTF-8. */
  async readText(id: string, path: string, options?: CallOptions): Promise<string> {
    return new TextDecoder().decode(await this.readFile(id, path, options));
  }

  /** Stops and removes a sandbox (DELETE /v1/sandboxes/{id}, 204); idempotent, so retried. */
  async kill(id: string, options?: CallOptions): Promise<void> {
    await this.#send({ method: "DELETE", path: sandboxPath(id), idempotent: true, signal: options?.signal });
  }

  /**
   * Checkpoints a running sandbox and frees its host (POST /v1/sandboxes/{id}/pause,
   * PAUSE-1); resolves to it, paused. Retried (pausing a paused sandbox is harmless). Errors:
   * conflict (not running, or its runtime cannot checkpoint), sandbox_not_found.
   */
  pause(id: string, options?: CallOptions): Promise<Sandbox> {
    return call<Sandbox>(this.#send, {
      method: "POST", path: `${sandboxPath(id)}/pause`, idempotent: true, ownAttemptS: TRANSFER_ATTEMPT_S, signal: options?.signal,
    });
  }

  /**
   * Places a paused sandbox again and restores it (POST /v1/sandboxes/{id}/resume, PAUSE-1);
   * resolves to it, running. Refusals are retried until the deadline, then
   * CapacityUnavailable. Errors: conflict (not paused), sandbox_not_found.
   */
  resume(id: string, options?: CallOptions): Promise<Sandbox> {
    return call<Sandbox>(this.#send, {
      method: "POST", path: `${sandboxPath(id)}/resume`, idempotent: true, ownAttemptS: PLACEMENT_ATTEMPT_S, signal: options?.signal,
    });
  }
}

/** Apps (docs/API.md "Apps", APP-1, APP-2). */
export class Apps {
  readonly #send: Send;
  constructor(send: Send) {
    this.#send = send;
  }

  /**
   * Records an app (POST /v1/apps, 201); the server starts it in the background — watch
   * get(name).state or its events. One Idempotency-Key on every attempt (API-4, C26). Errors:
   * conflict (name taken), template_not_found, invalid_request.
   */
  create(req: CreateAppRequest, options?: IdempotentCallOptions): Promise<App> {
    const r = jsonRequest("POST", "/v1/apps", req, true, options);
    r.idempotencyKey = options?.idempotencyKey || newIdempotencyKey();
    return call<App>(this.#send, r);
  }

  /** One app (GET /v1/apps/{name}); app_not_found when none is visible to the key. */
  get(name: string, options?: CallOptions): Promise<App> {
    return call<App>(this.#send, { method: "GET", path: appPath(name), idempotent: true, signal: options?.signal });
  }

  /** The apps visible to the key, by name (GET /v1/apps). */
  async list(options?: CallOptions): Promise<App[]> {
    const out = await call<{ apps: App[] | null }>(this.#send, { method: "GET", path: "/v1/apps", idempotent: true, signal: options?.signal });
    return out.apps ?? [];
  }

  /**
   * Makes `spec` the app's next version (POST /v1/apps/{name}/deploy, 202): it starts beside
   * the old one, which serves until the new one answers (APP-2). One Idempotency-Key on every
   * attempt, so a retry is not a second version.
   */
  deploy(name: string, spec: AppSpec, options?: IdempotentCallOptions): Promise<App> {
    const r = jsonRequest("POST", `${appPath(name)}/deploy`, spec, true, options);
    r.idempotencyKey = options?.idempotencyKey || newIdempotencyKey();
    return call<App>(this.#send, r);
  }

  /** Records what the owner wants (POST /v1/apps/{name}/{action}, 202); retried: asking twice is asking once. */
  action(name: string, action: AppAction, options?: CallOptions): Promise<App> {
    return call<App>(this.#send, {
      method: "POST", path: `${appPath(name)}/${encodeURIComponent(action)}`, idempotent: true, signal: options?.signal,
    });
  }

  hibernate(name: string, options?: CallOptions): Promise<App> {
    return this.action(name, "hibernate", options);
  }
  wake(name: string, options?: CallOptions): Promise<App> {
    return this.action(name, "wake", options);
  }
  stop(name: string, options?: CallOptions): Promise<App> {
    return this.action(name, "stop", options);
  }
  start(name: string, options?: CallOptions): Promise<App> {
    return this.action(name, "start", options);
  }

  /** Seconds without a request before the app hibernates, 0 for never (POST /v1/apps/{name}/idle, 202). */
  setIdle(name: string, seconds: number, options?: CallOptions): Promise<App> {
    return call<App>(this.#send, jsonRequest("POST", `${appPath(name)}/idle`, { idle_seconds: seconds }, true, options));
  }

  /** Stops the app's sandboxes and removes it (DELETE /v1/apps/{name}, 204). */
  async delete(name: string, options?: CallOptions): Promise<void> {
    await this.#send({ method: "DELETE", path: appPath(name), idempotent: true, signal: options?.signal });
  }
}

/** Recorded state transitions (GET /v1/events, LIF-3). */
export class Events {
  readonly #send: Send;
  constructor(send: Send) {
    this.#send = send;
  }

  /**
   * The events matching `filter`, oldest first. A tenant key reads its own sandboxes' and
   * apps' events; the rest needs an admin key.
   */
  async list(filter: EventFilter = {}, options?: CallOptions): Promise<Event[]> {
    const q: Record<string, string> = {};
    if (filter.entity) q["entity"] = filter.entity;
    if (filter.type) q["type"] = filter.type;
    if (filter.since !== undefined) q["since"] = filter.since instanceof Date ? filter.since.toISOString() : filter.since;
    if (filter.until !== undefined) q["until"] = filter.until instanceof Date ? filter.until.toISOString() : filter.until;
    if (filter.to) q["to"] = filter.to;
    if (filter.limit !== undefined) q["limit"] = String(filter.limit);
    const out = await call<{ events: Event[] | null }>(this.#send, { method: "GET", path: "/v1/events", query: q, idempotent: true, signal: options?.signal });
    return out.events ?? [];
  }
}

/** Tenants and their API keys (admin key). */
export class Tenants {
  readonly #send: Send;
  constructor(send: Send) {
    this.#send = send;
  }

  /** Creates a tenant (POST /v1/tenants, 201). Sent once. Errors: conflict (exists), forbidden. */
  create(name: string, options?: CallOptions): Promise<Tenant> {
    return call<Tenant>(this.#send, jsonRequest("POST", "/v1/tenants", { name }, false, options));
  }

  /**
   * Makes an API key for a tenant (POST /v1/tenants/{name}/keys, 201); `key` is shown once.
   * Sent once, never retried: a retry would make a second key.
   */
  createKey(tenant: string, role: "tenant" | "admin" = "tenant", options?: CallOptions): Promise<APIKeySecret> {
    return call<APIKeySecret>(this.#send, jsonRequest("POST", `/v1/tenants/${encodeURIComponent(tenant)}/keys`, { role }, false, options));
  }
}
