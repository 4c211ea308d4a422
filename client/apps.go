package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/berth-dev/berth"
)

// CreateApp records an app (POST /v1/apps, 201, APP-1): its first version's spec and whether
// it should run now (default), be hibernated until a request comes, or stay stopped. The
// server starts it in the background; watch App(ctx, name).State or the app's events. A taken
// name is conflict; a missing template template_not_found. It sends one random
// Idempotency-Key on every attempt, so a retry after a lost answer gets the first answer
// instead of meeting its own app as a conflict (API-4, C26).
func (c *Client) CreateApp(ctx context.Context, req berth.AppRequest) (berth.App, error) {
	r, err := jsonRequest(http.MethodPost, "/v1/apps", req, true)
	if err != nil {
		return berth.App{}, err
	}
	r.idempotencyKey = newIdempotencyKey()
	var a berth.App
	return a, c.call(ctx, r, &a)
}

// App returns one app (GET /v1/apps/{name}); app_not_found if none is visible to the key.
func (c *Client) App(ctx context.Context, name string) (berth.App, error) {
	var a berth.App
	return a, c.call(ctx, request{method: http.MethodGet, path: appPath(name), idempotent: true}, &a)
}

// Apps lists the apps visible to the key (GET /v1/apps), ordered by name.
func (c *Client) Apps(ctx context.Context) ([]berth.App, error) {
	var out struct {
		Apps []berth.App `json:"apps"`
	}
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/apps", idempotent: true}, &out)
	return out.Apps, err
}

// DeployApp makes spec the app's next version (POST /v1/apps/{name}/deploy, 202): a running
// app starts it beside the old one and switches once it answers; a deploy that cannot be
// placed leaves the old version serving (APP-2). Each call is one new version: its attempts
// share one Idempotency-Key, so a retry after a lost answer is not a second (API-4, C26).
func (c *Client) DeployApp(ctx context.Context, name string, spec berth.AppSpec) (berth.App, error) {
	r, err := jsonRequest(http.MethodPost, appPath(name)+"/deploy", spec, true)
	if err != nil {
		return berth.App{}, err
	}
	r.idempotencyKey = newIdempotencyKey()
	var a berth.App
	return a, c.call(ctx, r, &a)
}

// SetApp records what the owner wants of an app (POST /v1/apps/{name}/{action}, 202):
// action is "hibernate", "wake", "stop" or "start". Retried like a GET: asking twice is
// asking once.
func (c *Client) SetApp(ctx context.Context, name, action string) (berth.App, error) {
	var a berth.App
	return a, c.call(ctx, request{method: http.MethodPost, path: appPath(name) + "/" + url.PathEscape(action), idempotent: true}, &a)
}

// DeleteApp stops an app's sandboxes and removes it (DELETE /v1/apps/{name}, 204).
func (c *Client) DeleteApp(ctx context.Context, name string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: appPath(name), idempotent: true}, nil)
}

func appPath(name string) string { return "/v1/apps/" + url.PathEscape(name) }

// SetAppIdle sets the seconds without a request after which the app hibernates, 0 for never
// (POST /v1/apps/{name}/idle, 202). It deploys nothing.
func (c *Client) SetAppIdle(ctx context.Context, name string, seconds int64) (berth.App, error) {
	r, err := jsonRequest(http.MethodPost, appPath(name)+"/idle", map[string]int64{"idle_seconds": seconds}, true)
	if err != nil {
		return berth.App{}, err
	}
	var a berth.App
	return a, c.call(ctx, r, &a)
}
