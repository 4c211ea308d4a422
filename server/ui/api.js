// The API as the dashboard calls it: same origin, the key from sessionStorage in the
// Authorization header (never in a URL), every call bounded by a timeout.

const KEY = "berth.key";
const TIMEOUT_MS = 10000;

export function getKey() {
  return sessionStorage.getItem(KEY) || "";
}

export function setKey(key) {
  if (key) sessionStorage.setItem(KEY, key);
  else sessionStorage.removeItem(KEY);
}

// ApiError carries the server's error envelope: {"error":{"code","message","retryable",
// "retry_after_s","request_id","hosts"?}} and the HTTP status.
export class ApiError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || (status === 0 ? "network" : "http_" + status);
    this.requestId = e.request_id || "";
    this.retryable = !!e.retryable;
  }
}

// call sends one request and returns the decoded JSON answer (null for 204), or throws an
// ApiError: the server's error, or status 0 for a network failure or a timeout.
export async function call(method, path, body) {
  const ctl = new AbortController();
  const timer = setTimeout(() => ctl.abort(), TIMEOUT_MS);
  const headers = { Authorization: "Bearer " + getKey() };
  const init = { method, headers, signal: ctl.signal, cache: "no-store", credentials: "omit" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let resp;
  try {
    resp = await fetch(path, init);
  } catch (err) {
    const e = new ApiError(0, { error: { message: ctl.signal.aborted ? "the server did not answer in time" : "the server cannot be reached" } });
    throw e;
  } finally {
    clearTimeout(timer);
  }
  if (resp.status === 204) return null;
  let data = null;
  try {
    data = await resp.json();
  } catch {
    data = null;
  }
  if (!resp.ok) throw new ApiError(resp.status, data);
  return data;
}

export const get = (path) => call("GET", path);
export const post = (path, body) => call("POST", path, body);
