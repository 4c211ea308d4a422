// The JSON of the Berth v1 API (docs/API.md), field for field as the server sends it: the
// names are the wire's snake_case names, times are RFC 3339 strings, sizes are MiB.

/**
 * The lifecycle state of a sandbox (LIF-1, PAUSE-1, SPOT-3). Terminal: stopped, failed, lost,
 * evicted, reconstructed, migrated. The API may add states; an unknown one is still a string.
 */
export type SandboxState =
  | "pending" | "starting" | "running" | "stopping" | "stopped"
  | "failed" | "lost" | "evicted"
  | "evacuating" | "reconstructed" | "migrated"
  | "pausing" | "paused" | "resuming" | "snapshotting"
  | (string & {});

/** A sandbox as the API answers it (GET /v1/sandboxes/{id}). */
export interface Sandbox {
  id: string;
  template: string;
  tenant: string;
  /** The host running it; "" while it has none (paused, pending). */
  agent_id: string;
  state: SandboxState;
  /** Configured memory, MiB. */
  memory_mb: number;
  vcpus: number;
  stateful: boolean;
  /** RFC 3339. */
  created_at: string;
  /** RFC 3339: when its TTL stops it. */
  expires_at: string;
  metadata?: Record<string, string>;
  /** Why it is in its state ("agent started it", "deleted", a failure's cause). */
  reason?: string;
  /** The volume it mounts at /tmp/volume, if any. */
  volume?: string;
  /** RFC 3339, while paused (its TTL clock is stopped). */
  paused_at?: string;
}

/** Body of POST /v1/sandboxes. Only `template` is required; see docs/API.md for bounds. */
export interface CreateSandboxRequest {
  template: string;
  /** MiB, 1 … 1,048,576 (default: the template's). */
  memory_mb?: number;
  vcpus?: number;
  /** 1 … 604,800 (default 3600). */
  ttl_seconds?: number;
  stateful?: boolean;
  /** A volume name: pins the sandbox to the host it first lands on; makes it stateful. */
  volume?: string;
  region?: string;
  pool?: string;
  /** At most 32 keys. */
  metadata?: Record<string, string>;
}

/** Body of POST /v1/sandboxes/{id}/exec. */
export interface ExecRequest {
  cmd: string[];
  stdin?: string;
  /** 1 … 3600 (default 60). A command that runs out reports exit code −1. */
  timeout_s?: number;
}

/** Answer of an exec: a non-zero exit code is a result, not an error. Each stream ≤ 1 MiB. */
export interface ExecResult {
  exit_code: number;
  stdout: string;
  stderr: string;
}

/** What the owner wants of an app (APP-1). */
export type AppDesired = "running" | "hibernated" | "stopped" | (string & {});

/** The actual state of an app (APP-1, APP-2). */
export type AppState =
  | "deploying" | "waking" | "running" | "waiting_capacity" | "hibernated" | "stopped" | "error"
  | (string & {});

/** One version of an app: the sandbox it runs in and its long-lived HTTP server. */
export interface AppSpec {
  template: string;
  memory_mb?: number;
  command: string[];
  /** Path relative to the sandbox's working directory (/tmp) → content. */
  files?: Record<string, string>;
  env?: Record<string, string>;
  /** The TCP port it listens on inside the sandbox. */
  port: number;
}

/** Body of POST /v1/apps. */
export interface CreateAppRequest extends AppSpec {
  /** A DNS label: 1–63 of a-z0-9-, unique across the fleet. */
  name: string;
  desired?: AppDesired;
  /** Seconds without a request before it hibernates; 0 = never. */
  idle_seconds?: number;
}

/** An app as the API answers it (GET /v1/apps/{name}). */
export interface App {
  name: string;
  tenant: string;
  spec: AppSpec;
  version: number;
  desired: AppDesired;
  state: AppState;
  reason?: string;
  sandbox_id?: string;
  agent_id?: string;
  serving_version?: number;
  paused_sandbox?: string;
  paused_version?: number;
  retire?: string[];
  retire_at?: string;
  incarnation: number;
  waiting_since?: string;
  retry_at?: string;
  retry_code?: string;
  attempts?: number;
  start_failures?: number;
  idle_seconds: number;
  last_active?: string;
  revision: number;
  created_at: string;
  updated_at: string;
}

/** The desired-state actions of POST /v1/apps/{name}/{action}. */
export type AppAction = "hibernate" | "wake" | "stop" | "start";

/** One recorded state transition (LIF-3), GET /v1/events. */
export interface Event {
  id?: number;
  /** RFC 3339. */
  at: string;
  /** "sandbox/sb-…", "app/name", "agent/id", "reservation/…". */
  entity: string;
  from: string;
  to: string;
  reason: string;
  /** Who caused it: "tenant/acme", "admin/default" (an admin key), "agent/dev-agent-1", … */
  actor: string;
}

/** Filters of GET /v1/events; all optional. */
export interface EventFilter {
  /** One entity ("sandbox/sb-1") or, ending in "/", a kind ("sandbox/"). */
  entity?: string;
  type?: "sandbox" | "agent" | "reservation" | "app" | (string & {});
  since?: Date | string;
  until?: Date | string;
  /** Only transitions into this state. */
  to?: string;
  limit?: number;
}

/** A tenant (POST /v1/tenants, admin key). */
export interface Tenant {
  name: string;
  created_at: string;
}

/** A new API key (POST /v1/tenants/{name}/keys): `key` is shown once and never again. */
export interface APIKeySecret {
  id: string;
  tenant: string;
  role: "tenant" | "admin" | (string & {});
  created_at: string;
  key: string;
}

/** The error envelope of every non-2xx answer (API-2). */
export interface ErrorBody {
  error: {
    code: string;
    message: string;
    retryable: boolean;
    retry_after_s: number;
    request_id: string;
    hosts?: Record<string, number>;
  };
}
