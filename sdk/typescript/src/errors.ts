// The errors of the SDK (API-2, SDK-2), mirroring the Go SDK's *berth.Error,
// *client.CapacityUnavailable and *client.TransportError.

/** Codes that mean "does not fit now, try later" (berth.Error.Retryable in Go). */
const RETRYABLE_CODES = new Set([
  "no_capacity", "no_healthy_agents", "host_starts_saturated", "unavailable", "app_wake_timeout", "rate_limited",
]);

/** Fields of a BerthError. */
export interface BerthErrorInit {
  code: string;
  message: string;
  /** Defaults to whether `code` is one of the retryable codes. */
  retryable?: boolean;
  retryAfterS?: number;
  requestId?: string;
  status?: number;
  hosts?: Record<string, number>;
  cause?: unknown;
}

/**
 * An API refusal (API-2): every non-2xx answer the SDK does not retry, or stops retrying.
 * Branch on `code` (stable: "sandbox_not_found", "no_capacity", …), never on `message`.
 */
export class BerthError extends Error {
  /** The stable error code of API-2. */
  readonly code: string;
  /** Whether a later retry may succeed (the server's `retryable`). */
  readonly retryable: boolean;
  /** The server's estimate of when a retry may succeed, seconds; 0 when none. */
  readonly retryAfterS: number;
  /** The server's request id (body `request_id` or header X-Request-Id); "" when none. */
  readonly requestId: string;
  /** The HTTP status; 0 when the server gave no answer. */
  readonly status: number;
  /** Per-reason host counts of a capacity refusal ({"total":12,"insufficient_memory":8,…}). */
  readonly hosts: Record<string, number> | undefined;

  constructor(init: BerthErrorInit) {
    super(init.message, init.cause === undefined ? undefined : { cause: init.cause });
    this.name = "BerthError";
    this.code = init.code;
    this.retryable = init.retryable ?? RETRYABLE_CODES.has(init.code);
    this.retryAfterS = init.retryAfterS ?? 0;
    this.requestId = init.requestId ?? "";
    this.status = init.status ?? 0;
    this.hosts = init.hosts;
  }

  /** "BerthError [code]: message". */
  override toString(): string {
    return `${this.name} [${this.code}]: ${this.message}`;
  }
}

/**
 * A request that got no HTTP answer: the connection was refused or reset, the name did not
 * resolve, the attempt timed out, TLS failed, or the server hung up before answering. A call
 * that is not retried (exec, tenant and key creation) throws it at once; a retried call
 * retries connection failures and timeouts (SDK-1) and throws it only for the other kinds
 * (TLS, a bad URL). `cause` is what fetch threw.
 */
export class TransportError extends Error {
  readonly method: string;
  readonly path: string;
  /** The client's base URL. */
  readonly server: string;
  /** Why there was no answer, in a few words ("connection refused", "timed out after 60s"). */
  readonly reason: string;

  constructor(method: string, path: string, server: string, reason: string, cause: unknown) {
    super(`berth: ${method} ${path}: no answer from ${server}: ${reason}`, { cause });
    this.name = "TransportError";
    this.method = method;
    this.path = path;
    this.server = server;
    this.reason = reason;
  }
}

/** Fields of a CapacityUnavailable. */
export interface CapacityUnavailableInit {
  elapsedS: number;
  attempts: number;
  last: BerthError;
  retryAfterS: number;
  transportError?: TransportError | undefined;
}

/**
 * Thrown when a retried call ran out of patience on retryable refusals (503 no_capacity and
 * kin, 502/504, 429 rate_limited, connection failures): the next wait — the server's
 * Retry-After, or full jitter — would have ended past the deadline (SDK-2). It is transient:
 * park the work as waiting, not failed, and try again later.
 *
 * It is a BerthError whose `code` is the last refusal's code ("unavailable" when the last
 * attempt got no answer); `last` is that refusal and `cause` too.
 */
export class CapacityUnavailable extends BerthError {
  /** Seconds from the first attempt to giving up. */
  readonly elapsedS: number;
  /** Requests sent. */
  readonly attempts: number;
  /** The code of the last refusal; "unavailable" when the last attempt got no answer. */
  readonly lastCode: string;
  /** The last refusal itself. */
  readonly last: BerthError;
  /** The TransportError of the last attempt when it got no answer; undefined otherwise. */
  readonly transportError: TransportError | undefined;

  /**
   * `retryAfterS` is the wait the last answer's Retry-After header asked for (0 when it had
   * none, an unreadable one, or one that said "at once"): a hint past the deadline is why a
   * call gives up after a single attempt (C30).
   */
  constructor(init: CapacityUnavailableInit) {
    const what = init.last.code === "unavailable" ? "server unavailable" : "capacity unavailable";
    const attempts = init.attempts === 1 ? "1 attempt" : `${init.attempts} attempts`;
    const hint = init.retryAfterS > 0 ? `; Retry-After ${formatSeconds(init.retryAfterS)}` : "";
    super({
      code: init.last.code,
      message: `berth: ${what} after ${attempts} in ${formatSeconds(init.elapsedS)} (last: ${init.last.code}: ${init.last.message}${hint})`,
      retryable: true,
      retryAfterS: init.retryAfterS,
      requestId: init.last.requestId,
      status: init.last.status,
      hosts: init.last.hosts,
      cause: init.last,
    });
    this.name = "CapacityUnavailable";
    this.elapsedS = init.elapsedS;
    this.attempts = init.attempts;
    this.lastCode = init.last.code;
    this.last = init.last;
    this.transportError = init.transportError;
  }
}

/** "1.234s", "90s", "1e+20s": seconds for a person. */
function formatSeconds(s: number): string {
  if (!Number.isFinite(s)) return "forever";
  return `${Math.round(s * 1000) / 1000}s`;
}
