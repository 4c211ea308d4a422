// @berth/sdk: the TypeScript SDK of the Berth v1 HTTP API (docs/API.md). No runtime
// dependencies: Node.js ≥ 18's fetch. The retry contract is the Go SDK's (SDK-1…3).

export {
  Apps, Berth, DEFAULT_ATTEMPT_TIMEOUT_S, DEFAULT_URL, DEFAULT_USER_AGENT, Events, Sandboxes, Tenants,
} from "./client.js";
export type { BerthOptions, CallOptions, Clock, IdempotentCallOptions, RetryInfo } from "./client.js";
export { BerthError, CapacityUnavailable, TransportError } from "./errors.js";
export type { BerthErrorInit, CapacityUnavailableInit } from "./errors.js";
export {
  backoff, DEFAULT_BACKOFF_BASE_S, DEFAULT_BACKOFF_CAP_S, DEFAULT_DEADLINE_S, jitter, parseHttpDate, parseRetryAfter,
  retryAfterFromHeaders,
} from "./retry.js";
export type {
  APIKeySecret, App, AppAction, AppDesired, AppSpec, AppState, CreateAppRequest, CreateSandboxRequest, ErrorBody, Event,
  EventFilter, ExecRequest, ExecResult, Sandbox, SandboxState, Tenant,
} from "./types.js";
