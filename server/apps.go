package server

import (
	"cmp"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
)

// maxIdleSeconds bounds idle_seconds (30 days).
const maxIdleSeconds = 30 * 24 * 3600

// createApp is POST /v1/apps (APP-1): validate the name and the first version's spec, record
// the app (deploying when desired running), and let the reconciler start it. The template
// must exist now: a typo is a 404 at once, not an app in error later.
func (s *Server) createApp(w http.ResponseWriter, r *http.Request, p principal) error {
	var req berth.AppRequest
	if err := httpjson.Decode(w, r, berth.MaxAppSpecBytes, &req); err != nil {
		return err
	}
	if !berth.ValidAppName(req.Name) {
		return berth.Errorf(berth.EInvalidRequest, "name %q must be a DNS label: 1–63 of a-z, 0-9 and '-', not starting or ending in '-'", req.Name)
	}
	if err := s.validateAppSpec(r, req.AppSpec); err != nil {
		return err
	}
	req.Desired = cmp.Or(req.Desired, berth.DesireRunning)
	if !req.Desired.Valid() {
		return berth.Errorf(berth.EInvalidRequest, "desired must be running, hibernated or stopped")
	}
	if req.IdleSeconds < 0 || req.IdleSeconds > maxIdleSeconds {
		return berth.Errorf(berth.EInvalidRequest, "idle_seconds must be 0 (never hibernate) to %d", maxIdleSeconds)
	}
	// API-4, C26: a retried create with the same key answers as the first did, whatever
	// happened to the app since; with another request it is idempotency_key_mismatch.
	return s.keyed(w, r, p, "POST /v1/apps", req, func(w http.ResponseWriter) error {
		return s.recordApp(w, r, p, req)
	})
}

// recordApp writes a new app from a validated request and answers 201 with it. Errors:
// conflict when the name is taken, unavailable when the store fails.
func (s *Server) recordApp(w http.ResponseWriter, r *http.Request, p principal, req berth.AppRequest) error {
	a := berth.App{
		Name: req.Name, Tenant: p.Tenant, Spec: req.AppSpec, Version: 1, Desired: req.Desired,
		IdleSeconds: req.IdleSeconds,
	}
	switch req.Desired {
	case berth.DesireRunning:
		a.State = berth.AppDeploying
	case berth.DesireHibernated:
		a.State = berth.AppHibernated
	default:
		a.State = berth.AppStopped
	}
	created, err := s.store.CreateApp(r.Context(), a, p.actor(), s.cfg.Clock())
	if errors.Is(err, berth.ErrAppExists) {
		return berth.Errorf(berth.EConflict, "an app named %q exists (app names are unique across the fleet)", req.Name)
	}
	if err != nil {
		return berth.Fault(err, "record app")
	}
	s.kickApps()
	httpjson.WriteJSON(w, http.StatusCreated, created)
	return nil
}

// validateAppSpec checks a spec's shape and that its sandbox could be created: the template
// exists and the memory is in range (the same checks as a sandbox create).
func (s *Server) validateAppSpec(r *http.Request, spec berth.AppSpec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	t, err := s.validateCreate(r.Context(), berth.CreateRequest{Template: spec.Template, MemoryMiB: spec.MemoryMiB})
	if err != nil {
		return err
	}
	mem := berth.SandboxMiB(spec.MemoryMiB, t.MemoryMiB)
	if err := s.sched.refreshIfStale(r.Context()); err != nil {
		return berth.Fault(err, "store")
	}
	if largest, never := s.sched.neverFits(berth.Sandbox{MemoryMiB: mem}); never {
		// Refused now, like a sandbox create, rather than accepted and then in error.
		return berth.Errorf(berth.EInvalidRequest, "memory_mb %d can never be placed: it is more than the largest host's %d MiB", mem, largest)
	}
	return nil
}

// appFor returns the app if the principal may see it; other tenants' apps are app_not_found,
// exactly like missing ones.
func (s *Server) appFor(r *http.Request, p principal, name string) (berth.App, error) {
	a, err := s.store.App(r.Context(), name)
	if errors.Is(err, berth.ErrNotFound) || (err == nil && !p.admin() && a.Tenant != p.Tenant) {
		return a, berth.Errorf(berth.EAppNotFound, "no app %q", name)
	}
	if err != nil {
		return a, berth.Fault(err, "read app")
	}
	return a, nil
}

func (s *Server) getApp(w http.ResponseWriter, r *http.Request, p principal) error {
	a, err := s.appFor(r, p, r.PathValue("name"))
	if err != nil {
		return err
	}
	httpjson.WriteJSON(w, http.StatusOK, a)
	return nil
}

// listApps is GET /v1/apps: the tenant's apps (an admin key sees every app).
func (s *Server) listApps(w http.ResponseWriter, r *http.Request, p principal) error {
	tenant := p.Tenant
	if p.admin() {
		tenant = ""
	}
	apps, err := s.store.Apps(r.Context(), tenant)
	if err != nil {
		return berth.Fault(err, "list apps")
	}
	if apps == nil {
		apps = []berth.App{}
	}
	httpjson.WriteJSON(w, http.StatusOK, map[string]any{"apps": apps})
	return nil
}

// deployApp is POST /v1/apps/{name}/deploy with a new spec: the version goes up and, if the
// app is to run, the reconciler starts the new version beside the old one and switches
// routing once it answers (APP-1). A hibernated or stopped app keeps its state; its next
// start runs the new version. A deploy also clears an error: it is the owner's fix.
func (s *Server) deployApp(w http.ResponseWriter, r *http.Request, p principal) error {
	var spec berth.AppSpec
	if err := httpjson.Decode(w, r, berth.MaxAppSpecBytes, &spec); err != nil {
		return err
	}
	if err := s.validateAppSpec(r, spec); err != nil {
		return err
	}
	// API-4, C26: a retried deploy with the same key is not a second version.
	route := "POST /v1/apps/" + r.PathValue("name") + "/deploy"
	return s.keyed(w, r, p, route, spec, func(w http.ResponseWriter) error {
		return s.changeApp(w, r, p, func(a *berth.App) {
			a.Spec = spec
			a.Version++
			resetStart(a)
			a.Reason = fmt.Sprintf("deploy of version %d", a.Version)
			switch a.Desired {
			case berth.DesireRunning:
				a.State = berth.AppDeploying
			case berth.DesireHibernated:
				a.State = berth.AppHibernated
			case berth.DesireStopped:
				a.State = berth.AppStopped
			}
		})
	})
}

// setAppDesired serves POST /v1/apps/{name}/{hibernate|wake|stop|start}: it records what the
// owner wants; the reconciler does the work (and writes the state change's event).
func (s *Server) setAppDesired(desired berth.AppDesired, verb string) apiFunc {
	return func(w http.ResponseWriter, r *http.Request, p principal) error {
		return s.changeApp(w, r, p, func(a *berth.App) {
			a.Desired = desired
			a.Reason = verb + " requested by tenant/" + p.Tenant
			switch {
			case desired != berth.DesireRunning:
			case a.State == berth.AppWaitingCapacity:
				a.RetryAt = time.Time{} // try now; the wait since the first refusal goes on (MET-4)
			case a.SandboxID == "" || a.State == berth.AppError:
				resetStart(a)
				a.State = berth.AppWaking
			}
		})
	}
}

// setAppIdle is POST /v1/apps/{name}/idle {"idle_seconds"}: the idle time before the app
// hibernates, 0 for never. It is not part of a version: changing it deploys nothing.
func (s *Server) setAppIdle(w http.ResponseWriter, r *http.Request, p principal) error {
	var req struct {
		IdleSeconds *int64 `json:"idle_seconds"`
	}
	if err := httpjson.Decode(w, r, maxJSONBytes, &req); err != nil {
		return err
	}
	if req.IdleSeconds == nil || *req.IdleSeconds < 0 || *req.IdleSeconds > maxIdleSeconds {
		return berth.Errorf(berth.EInvalidRequest, "idle_seconds is required: 0 (never hibernate) to %d", maxIdleSeconds)
	}
	return s.changeApp(w, r, p, func(a *berth.App) { a.IdleSeconds = *req.IdleSeconds })
}

// changeApp applies fn to the tenant's app (re-reading on a concurrent write), answers 202
// with the result and wakes the reconciler.
func (s *Server) changeApp(w http.ResponseWriter, r *http.Request, p principal, fn func(a *berth.App)) error {
	name := r.PathValue("name")
	if _, err := s.appFor(r, p, name); err != nil {
		return err
	}
	a, err := s.mutateApp(r.Context(), name, p.actor(), func(a *berth.App) error { fn(a); return nil })
	if errors.Is(err, berth.ErrNotFound) {
		return berth.Errorf(berth.EAppNotFound, "no app %q", name)
	}
	if err != nil {
		return berth.Fault(err, "record app")
	}
	s.kickApps()
	httpjson.WriteJSON(w, http.StatusAccepted, a)
	return nil
}

// deleteApp is DELETE /v1/apps/{name}: the record goes (with an event) and its sandboxes
// are stopped. A start in flight on some replica finds the app gone and stops what it made.
func (s *Server) deleteApp(w http.ResponseWriter, r *http.Request, p principal) error {
	name := r.PathValue("name")
	for range 10 {
		a, err := s.appFor(r, p, name)
		if err != nil {
			return err
		}
		err = s.store.DeleteApp(r.Context(), name, a.Revision, p.actor(), s.cfg.Clock())
		if errors.Is(err, berth.ErrStaleRevision) {
			continue
		}
		if errors.Is(err, berth.ErrNotFound) {
			return berth.Errorf(berth.EAppNotFound, "no app %q", name)
		}
		if err != nil {
			return berth.Fault(err, "delete app")
		}
		s.appChanged(name) // requests held for it answer app_not_found now
		for _, id := range append(a.Retire, a.SandboxID, a.PausedSandbox) {
			if id != "" {
				s.retireSandbox(r.Context(), id, "app "+name+" deleted")
			}
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	return berth.Errorf(berth.EUnavailable, "app %q keeps changing; try again", name)
}

// resetStart forgets the progress of a start (refusals, failures): a new version or an
// owner's wake starts counting anew.
func resetStart(a *berth.App) {
	a.WaitingSince, a.RetryAt, a.RetryCode, a.Attempts, a.StartFailures = time.Time{}, time.Time{}, "", 0, 0
}
