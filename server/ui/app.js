// The dashboard's shell: sign-in, navigation, and the refresh loop. One refresh at a time,
// every 3 s (or five times as long as the last one took, up to 30 s), for the visible view
// only; paused while the tab is hidden; slower after failures (doubling, up to 16 times).

import { get, getKey, setKey, ApiError } from "./api.js";
import { FleetView, SandboxesView, AppsView, RefusalsView, EventsView } from "./views.js";
import { el } from "./table.js";

const POLL_MS = 3000;
const MESSAGE = "berth.message"; // the sign-in form's message across signOut's reload
const $ = (id) => document.getElementById(id);

let role = ""; // "admin" | "tenant"
let current = null;
let timer = 0;
let inflight = false;
let again = false;
let failures = 0;
let took = 0; // ms the latest successful refresh took

const ctx = {
  isAdmin: () => role === "admin",
  refreshNow,
  toast,
  fail: showError,
};

const views = [new FleetView(ctx), new SandboxesView(ctx), new AppsView(ctx), new RefusalsView(ctx), new EventsView(ctx)];

function init() {
  const main = $("views");
  const nav = $("nav");
  for (const v of views) {
    main.appendChild(v.root);
    const a = el("a", "nav-link");
    a.href = "#" + v.id;
    a.id = "nav-" + v.id;
    a.textContent = v.title;
    nav.appendChild(a);
  }
  $("login-form").addEventListener("submit", (e) => {
    e.preventDefault();
    signIn($("key").value.trim());
  });
  $("logout").addEventListener("click", () => signOut(""));
  $("refresh").addEventListener("click", () => refreshNow());
  window.addEventListener("hashchange", route);
  document.addEventListener("visibilitychange", () => { if (!document.hidden) refreshNow(); });
  const message = sessionStorage.getItem(MESSAGE) || "";
  sessionStorage.removeItem(MESSAGE);
  if (getKey()) signIn(getKey());
  else showLogin(message);
}

function showLogin(message) {
  $("app").hidden = true;
  $("login").hidden = false;
  const err = $("login-error");
  err.textContent = message;
  err.hidden = !message;
  $("key").focus();
}

// signIn checks the key: GET /v1/templates answers any valid key (401 otherwise), and
// GET /v1/refusals, admin only, tells an admin key (200) from a tenant key (403).
async function signIn(key) {
  if (!key) return showLogin("Enter an API key.");
  setKey(key);
  $("login-submit").disabled = true;
  try {
    await get("/v1/templates");
    try {
      await get("/v1/refusals?window=60");
      role = "admin";
    } catch (e) {
      if (!(e instanceof ApiError) || e.status !== 403) throw e;
      role = "tenant";
    }
  } catch (e) {
    setKey("");
    $("key").value = "";
    $("login-submit").disabled = false;
    return showLogin(describe(e));
  }
  $("login-submit").disabled = false;
  $("key").value = "";
  $("login").hidden = true;
  $("app").hidden = false;
  $("role").textContent = role === "admin" ? "admin key" : "tenant key";
  $("role").className = "role role-" + role;
  document.body.dataset.role = role;
  for (const v of views) $("nav-" + v.id).hidden = v.admin && role !== "admin";
  route();
}

// signOut forgets the key and reloads the page, so nothing the last key fetched stays in
// memory or in the DOM for the next one; message is shown on the sign-in form.
function signOut(message) {
  setKey("");
  role = "";
  current = null;
  clearTimeout(timer);
  sessionStorage.setItem(MESSAGE, message);
  location.replace(location.pathname);
}

function parseHash() {
  const h = location.hash.replace(/^#/, "");
  const [name, query] = h.split("?");
  return { name, params: new URLSearchParams(query || "") };
}

function route() {
  if (!role) return;
  const { name, params } = parseHash();
  let v = views.find((x) => x.id === name && !(x.admin && role !== "admin"));
  if (!v) {
    v = views.find((x) => x.id === (role === "admin" ? "fleet" : "sandboxes"));
    history.replaceState(null, "", "#" + v.id);
  }
  for (const x of views) {
    x.root.hidden = x !== v;
    $("nav-" + x.id).classList.toggle("active", x === v);
  }
  current = v;
  document.title = `${v.title} · Berth`;
  v.show(params);
  refreshNow();
}

function refreshNow() {
  clearTimeout(timer);
  if (inflight) {
    again = true;
    return;
  }
  tick();
}

async function tick() {
  if (!current || !role) return;
  if (!document.hidden) {
    inflight = true;
    const v = current;
    const began = performance.now();
    try {
      await v.refresh();
      took = performance.now() - began;
      failures = 0;
      hideError();
      $("updated").textContent = "Updated " + new Date().toLocaleTimeString("en-GB");
    } catch (e) {
      failures++;
      if (e instanceof ApiError && e.status === 401) return signOut("The server refused the key: " + describe(e));
      if (e instanceof ApiError && e.status === 403 && v.admin) {
        // An admin view this key may not see: hide it and go to one it may.
        $("nav-" + v.id).hidden = true;
        role = "tenant";
        document.body.dataset.role = role;
        location.hash = "#sandboxes";
      } else {
        showError(e);
      }
    } finally {
      inflight = false;
    }
    if (again) {
      again = false;
      return tick();
    }
  }
  clearTimeout(timer);
  // A fleet whose answer takes long to fetch and draw (10,000 hosts) is polled less often:
  // at most a fifth of the time goes to refreshing.
  const every = Math.min(30000, Math.max(POLL_MS, 5 * took));
  timer = setTimeout(tick, every * Math.pow(2, Math.min(failures, 4)));
}

function describe(e) {
  if (e instanceof ApiError) return `${e.message} (${e.code}${e.status ? ", HTTP " + e.status : ""}${e.requestId ? ", request " + e.requestId : ""})`;
  return String(e && e.message ? e.message : e);
}

function showError(e) {
  const b = $("error");
  b.textContent = "Could not refresh: " + describe(e) + ". Retrying; the figures shown may be stale.";
  b.hidden = false;
}

function hideError() {
  $("error").hidden = true;
}

let toastTimer = 0;
function toast(text) {
  const t = $("toast");
  t.textContent = text;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, 4000);
}

init();
