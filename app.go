package berth

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strings"
	"time"
)

// AppState is the actual state of an app (APP-1).
type AppState string

// App states (APP-1, APP-2). hibernated, stopped and error hold no sandbox; running serves
// from one; waking and deploying are starting one; waiting_capacity was refused by the
// scheduler (a 503) and retries with backoff — it is never a failure.
const (
	AppHibernated      AppState = "hibernated"
	AppWaking          AppState = "waking"
	AppDeploying       AppState = "deploying"
	AppRunning         AppState = "running"
	AppWaitingCapacity AppState = "waiting_capacity"
	AppStopped         AppState = "stopped"
	AppError           AppState = "error"
)

// AppDesired is what the owner (or the idle timer, or a request) wants of an app.
type AppDesired string

// Desired states: running (serve; a hibernated app is woken), hibernated (no sandbox; the
// next request wakes it) and stopped (no sandbox; requests get app_stopped).
const (
	DesireRunning    AppDesired = "running"
	DesireHibernated AppDesired = "hibernated"
	DesireStopped    AppDesired = "stopped"
)

// Valid reports whether d is a known desired state.
func (d AppDesired) Valid() bool {
	return d == DesireRunning || d == DesireHibernated || d == DesireStopped
}

// AppSpec is one template version of an app (APP-1): the sandbox it runs in, the command of
// its long-lived server, the files written before the command starts (path relative to the
// sandbox's working directory → content), and the TCP port it listens on inside the sandbox.
type AppSpec struct {
	Template  string            `json:"template"`
	MemoryMiB int64             `json:"memory_mb,omitempty"`
	Command   []string          `json:"command"`
	Files     map[string]string `json:"files,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Port      int               `json:"port"`
}

// Limits of an app spec. The command and environment limits are the kernel's: it refuses to
// start a program (E2BIG, so the app would only ever exit 126) when one argument or one
// NAME=value is over 128 KiB with its terminating NUL (Linux's MAX_ARG_STRLEN, measured on
// the process runtime: 131,071 bytes start, 131,072 do not), or when the arguments and the
// environment together are over a quarter of the stack limit (2 MiB with the usual 8 MiB);
// MaxAppExecBytes keeps half of that for the sandbox's own environment. A file path's every
// element is at most 255 bytes (NAME_MAX) and the whole path MaxAppPathBytes, well inside
// PATH_MAX once the sandbox's working directory is in front of it.
const (
	MaxAppFiles     = 64
	MaxAppFileBytes = 1 << 20
	MaxAppSpecBytes = 4 << 20
	MaxAppArgBytes  = 128<<10 - 1
	MaxAppExecBytes = 1 << 20
	MaxAppPathBytes = 1024
	maxNameBytes    = 255
)

var appNameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidAppName reports whether name can name an app: a DNS label (1–63 of a-z, 0-9 and '-',
// not starting or ending in '-'), so it also works as a Host-header subdomain.
func ValidAppName(name string) bool { return appNameRE.MatchString(name) }

// Validate checks a spec's shape; the errors are invalid_request *Errors naming the field.
// Everything a sandbox's agent or kernel would refuse when the app starts is refused here,
// so an app is never accepted only to fail at every start: a memory_mb below MinSandboxMiB,
// a NUL in the command or the environment (no C string holds one), a command or environment
// over the kernel's limits (MaxAppArgBytes, MaxAppExecBytes), an env name that is empty or
// holds '=', and a file path that is not clean and relative or is too long (MaxAppPathBytes).
func (s AppSpec) Validate() error {
	switch {
	case s.Template == "":
		return Errorf(EInvalidRequest, "template is required")
	case len(s.Command) == 0 || s.Command[0] == "":
		return Errorf(EInvalidRequest, "command is required: the app's server, e.g. [\"python3\",\"-m\",\"http.server\",\"8080\"]")
	case s.Port < 1 || s.Port > 65535:
		return Errorf(EInvalidRequest, "port %d is not in 1..65535", s.Port)
	case s.MemoryMiB < 0:
		return Errorf(EInvalidRequest, "memory_mb %d is negative", s.MemoryMiB)
	case s.MemoryMiB > 0 && s.MemoryMiB < MinSandboxMiB:
		return Errorf(EInvalidRequest, "memory_mb %d is below the minimum of %d MiB (the least every runtime can start)", s.MemoryMiB, MinSandboxMiB)
	case len(s.Files) > MaxAppFiles:
		return Errorf(EInvalidRequest, "%d files; at most %d", len(s.Files), MaxAppFiles)
	}
	if err := s.validExec(); err != nil {
		return err
	}
	for p, data := range s.Files {
		if !validAppPath(p) {
			return Errorf(EInvalidRequest, "file path %q must be clean, relative and inside the sandbox's working directory "+
				"(e.g. \"static/index.html\"), without NUL, each element at most %d bytes and the whole at most %d",
				cut(p), maxNameBytes, MaxAppPathBytes)
		}
		if len(data) > MaxAppFileBytes {
			return Errorf(EInvalidRequest, "file %q is %d bytes; at most %d", p, len(data), MaxAppFileBytes)
		}
	}
	return nil
}

// validExec checks what the kernel gets when the app's command starts: its arguments and its
// environment (see the limits above).
func (s AppSpec) validExec() error {
	total := 0
	for i, arg := range s.Command {
		switch {
		case strings.IndexByte(arg, 0) >= 0:
			return Errorf(EInvalidRequest, "command[%d] must not contain a NUL character", i)
		case len(arg) > MaxAppArgBytes:
			return Errorf(EInvalidRequest, "command[%d] is %d bytes; at most %d", i, len(arg), MaxAppArgBytes)
		}
		total += len(arg) + 1
	}
	for k, v := range s.Env {
		switch {
		case k == "" || strings.ContainsAny(k, "=\x00"):
			return Errorf(EInvalidRequest, "env name %q is not valid: it must be non-empty, without '=' or NUL", cut(k))
		case strings.IndexByte(v, 0) >= 0:
			return Errorf(EInvalidRequest, "env %q must not contain a NUL character", cut(k))
		case len(k)+1+len(v) > MaxAppArgBytes:
			return Errorf(EInvalidRequest, "env %q is %d bytes as NAME=value; at most %d", cut(k), len(k)+1+len(v), MaxAppArgBytes)
		}
		total += len(k) + len(v) + 2
	}
	if total > MaxAppExecBytes {
		return Errorf(EInvalidRequest, "command and env are %d bytes together; at most %d", total, MaxAppExecBytes)
	}
	return nil
}

// validAppPath reports whether p can name an app's file: clean, relative, inside the working
// directory, without NUL, each element at most NAME_MAX bytes and the whole MaxAppPathBytes.
func validAppPath(p string) bool {
	clean := path.Clean(p)
	if p == "" || path.IsAbs(p) || clean != p || clean == "." || clean == ".." || strings.HasPrefix(clean, "../") ||
		strings.IndexByte(p, 0) >= 0 || len(p) > MaxAppPathBytes {
		return false
	}
	for elem := range strings.SplitSeq(p, "/") {
		if len(elem) > maxNameBytes {
			return false
		}
	}
	return true
}

// cut shortens s for an error message: its first 64 bytes and "…" when longer.
func cut(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64] + "…"
}

// App is the record of one app (APP-1) as the store and the API see it. Names are unique
// across the fleet (they route requests: /apps/{name}/ and {name}.<apps domain>); each app
// belongs to one tenant.
type App struct {
	Name    string     `json:"name"`
	Tenant  string     `json:"tenant"`
	Spec    AppSpec    `json:"spec"`
	Version int        `json:"version"` // of Spec; a deploy increments it
	Desired AppDesired `json:"desired"`
	State   AppState   `json:"state"`
	// Reason explains the latest transition (a refusal's code and message, a lost sandbox,
	// the output of a command that exits at once).
	Reason string `json:"reason,omitempty"`
	// SandboxID serves the app's requests (on AgentID), running ServingVersion of the spec;
	// empty while hibernated, stopped or before the first start.
	SandboxID      string `json:"sandbox_id,omitempty"`
	AgentID        string `json:"agent_id,omitempty"`
	ServingVersion int    `json:"serving_version,omitempty"`
	// PausedSandbox is the sandbox a hibernated app was paused in (PAUSE-2: its runtime could
	// checkpoint, so its memory is kept), running PausedVersion of the spec; a wake resumes it
	// instead of starting a new one. Empty when the app hibernated by stopping its sandbox.
	PausedSandbox string `json:"paused_sandbox,omitempty"`
	PausedVersion int    `json:"paused_version,omitempty"`
	// Retire lists sandboxes the app no longer uses that are still to be stopped (an old
	// version after a deploy, the sandbox of a hibernated app).
	Retire []string `json:"retire,omitempty"`
	// RetireAt is when the retire list may be stopped: a switch to a new sandbox leaves the
	// old one a grace for the requests already on their way to it (zero: at once).
	RetireAt time.Time `json:"retire_at,omitzero"`
	// Incarnation numbers the app's sandbox starts; with Version it makes the Idempotency-Key
	// of the next start, so replicas reconciling the same app create one sandbox, not two.
	Incarnation int `json:"incarnation"`
	// WaitingSince is the first capacity refusal of the start in progress (zero when none):
	// the start of the MET-4 time to success. RetryAt is when the reconciler tries again,
	// RetryCode the refusal's code, Attempts the refusals so far (APP-2).
	WaitingSince time.Time `json:"waiting_since,omitzero"`
	RetryAt      time.Time `json:"retry_at,omitzero"`
	RetryCode    string    `json:"retry_code,omitempty"`
	Attempts     int       `json:"attempts,omitempty"`
	// StartFailures counts consecutive starts whose command exited before it served.
	StartFailures int `json:"start_failures,omitempty"`
	// IdleSeconds hibernates a running app after that long without a request; 0 never.
	IdleSeconds int64     `json:"idle_seconds"`
	LastActive  time.Time `json:"last_active,omitzero"`
	// Revision increases with every write; UpdateApp writes only over the revision it read.
	Revision  int64     `json:"revision"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
}

// AppKeyPrefix starts every Idempotency-Key the app reconciler uses for an app's sandboxes;
// the API refuses tenant keys with it, so a tenant's create can never claim (or be taken
// for) an app's start.
const AppKeyPrefix = "app/"

// IdempotencyKey is the key of the app's next sandbox start (API-4): one per version and
// incarnation, so a retried or concurrent start finds the first one. It starts with
// AppKeyPrefix.
func (a App) IdempotencyKey() string {
	return fmt.Sprintf("%s%s/v%d/i%d", AppKeyPrefix, a.Name, a.Version, a.Incarnation)
}

// AppRequest is the body of POST /v1/apps: the name, the first version's spec, the desired
// state (default running) and the idle time before hibernation in seconds (0: never).
type AppRequest struct {
	Name string `json:"name"`
	AppSpec
	Desired     AppDesired `json:"desired,omitempty"`
	IdleSeconds int64      `json:"idle_seconds,omitempty"`
}

// ErrAppExists is returned (wrapped) by AppStore.CreateApp when the name is taken.
var ErrAppExists = errors.New("app name already taken")

// ErrStaleRevision is returned (wrapped) by AppStore.UpdateApp when the app changed since it
// was read: re-read and decide again.
var ErrStaleRevision = errors.New("app changed since it was read")

// AppStore keeps apps (APP-1). Every change of an app's actual state writes its event
// ("app/<name>", from → to, reason) in the same transaction (LIF-3).
type AppStore interface {
	// CreateApp inserts a with Revision 1 and the event "" → a.State; a taken name →
	// ErrAppExists.
	CreateApp(ctx context.Context, a App, actor string, now time.Time) (App, error)
	// App returns one app or an error wrapping ErrNotFound.
	App(ctx context.Context, name string) (App, error)
	// Apps lists the tenant's apps (every app when tenant is "") ordered by name.
	Apps(ctx context.Context, tenant string) ([]App, error)
	// UpdateApp writes a over the stored app only if its revision is still a.Revision
	// (else ErrStaleRevision; unknown app ErrNotFound), sets UpdatedAt to now, increments
	// the revision, and writes the event old state → a.State with reason when the state
	// changed. It returns the app as stored.
	UpdateApp(ctx context.Context, a App, reason, actor string, now time.Time) (App, error)
	// DeleteApp removes the app if its revision is still revision, with the event
	// state → "deleted".
	DeleteApp(ctx context.Context, name string, revision int64, actor string, now time.Time) error
}

// InStore returns a as stores keep it: every time in UTC, to the millisecond (the precision
// both stores hold), so an app reads back exactly as written.
func (a App) InStore() App {
	for _, t := range []*time.Time{&a.WaitingSince, &a.RetryAt, &a.RetireAt, &a.LastActive, &a.CreatedAt, &a.UpdatedAt} {
		if !t.IsZero() {
			*t = t.UTC().Truncate(time.Millisecond)
		}
	}
	return a
}
