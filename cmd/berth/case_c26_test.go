package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/berth-dev/berth"
)

// keyedCall sends one call with an Idempotency-Key and returns its status and body.
func keyedCall(t *testing.T, method, url, apiKey, idem, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	req.Header.Set("Content-Type", "application/json")
	if idem != "" {
		req.Header.Set(berth.HeaderIdempotencyKey, idem)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// wantCode fails unless b is an API-2 error body with code.
func wantCode(t *testing.T, what string, status int, b []byte, wantStatus int, code string) {
	t.Helper()
	var eb berth.ErrorBody
	_ = json.Unmarshal(b, &eb)
	if status != wantStatus || eb.Error.Code != code {
		t.Fatalf("%s: %d %s; want %d %s", what, status, b, wantStatus, code)
	}
}

// TestCase_C26_IdempotencyKeyBindsToItsRequest: the same Idempotency-Key with a different body
// is 422 idempotency_key_mismatch, never the first call's answer passed off as the second's;
// a true replay (the same request however it is spelt) returns the first answer byte for byte,
// even after the sandbox changed state. The kind: sandbox creates, app creates and deploys.
func TestCase_C26_IdempotencyKeyBindsToItsRequest(t *testing.T) {
	st := bootDev(t, nil)
	create := func(idem, body string) (int, []byte) {
		return keyedCall(t, http.MethodPost, st.URL+"/v1/sandboxes", st.AdminKey, idem, body)
	}
	status, first := create("k", `{"template":"shell"}`)
	if status != http.StatusCreated {
		t.Fatalf("first create: %d %s", status, first)
	}
	status, b := create("k", `{"template":"python","memory_mb":1024}`)
	wantCode(t, "same key, different body", status, b, http.StatusUnprocessableEntity, berth.EIdempotencyMismatch)

	// The same request spelt differently (spacing, an explicit default) is a replay.
	status, b = create("k", `{ "template" : "shell", "metadata": {} }`)
	if status != http.StatusCreated || !bytes.Equal(b, first) {
		t.Fatalf("replay: %d\n%s\nwant the first answer byte for byte:\n%s", status, b, first)
	}
	var sb berth.Sandbox
	if err := json.Unmarshal(first, &sb); err != nil {
		t.Fatal(err)
	}
	// The answer is the sandbox as every later read shows it (created_at in the store's
	// precision), and a replay after the sandbox ended is still the first answer.
	got, err := adminClient(st).Sandbox(t.Context(), sb.ID)
	if err != nil || !got.CreatedAt.Equal(sb.CreatedAt) || !got.ExpiresAt.Equal(sb.ExpiresAt) {
		t.Fatalf("GET %s: %+v, %v; want created_at %v and expires_at %v as the create answered", sb.ID, got, err, sb.CreatedAt, sb.ExpiresAt)
	}
	if err := adminClient(st).DeleteSandbox(t.Context(), sb.ID); err != nil {
		t.Fatal(err)
	}
	if status, b = create("k", `{"template":"shell"}`); status != http.StatusCreated || !bytes.Equal(b, first) {
		t.Fatalf("replay after delete: %d %s; want the first answer", status, b)
	}
	// Concurrent retries with one key and two bodies: one sandbox, the other body refused.
	var wg sync.WaitGroup
	results := make([]int, 8)
	for i := range results {
		body := `{"template":"shell"}`
		if i%2 == 1 {
			body = `{"template":"shell","memory_mb":300}`
		}
		wg.Go(func() { results[i], _ = create("burst", body) })
	}
	wg.Wait()
	created, refused := 0, 0
	for _, s := range results {
		switch s {
		case http.StatusCreated:
			created++
		case http.StatusUnprocessableEntity:
			refused++
		}
	}
	if created != 4 || refused != 4 {
		t.Fatalf("concurrent creates with one key, two bodies: statuses %v; want 4 × 201 (one body) and 4 × 422", results)
	}

	// Apps: create and deploy are keyed calls too.
	app := func(idem, body string) (int, []byte) {
		return keyedCall(t, http.MethodPost, st.URL+"/v1/apps", st.AdminKey, idem, body)
	}
	spec := `{"name":"web","template":"shell","command":["sleep","600"],"port":8080,"desired":"stopped"}`
	status, appFirst := app("a", spec)
	if status != http.StatusCreated {
		t.Fatalf("app create: %d %s", status, appFirst)
	}
	if status, b = app("a", spec); status != http.StatusCreated || !bytes.Equal(b, appFirst) {
		t.Fatalf("app create replay: %d %s; want the first answer %s", status, b, appFirst)
	}
	status, b = app("a", strings.Replace(spec, `"web"`, `"web2"`, 1))
	wantCode(t, "app create, same key, other name", status, b, http.StatusUnprocessableEntity, berth.EIdempotencyMismatch)
	status, b = app("", spec)
	wantCode(t, "app create without a key, name taken", status, b, http.StatusConflict, berth.EConflict)

	deploy := func(idem, body string) (int, []byte) {
		return keyedCall(t, http.MethodPost, st.URL+"/v1/apps/web/deploy", st.AdminKey, idem, body)
	}
	v2 := `{"template":"shell","command":["sleep","700"],"port":8080}`
	status, d1 := deploy("d", v2)
	if status != http.StatusAccepted {
		t.Fatalf("deploy: %d %s", status, d1)
	}
	if status, b = deploy("d", v2); status != http.StatusAccepted || !bytes.Equal(b, d1) {
		t.Fatalf("deploy replay: %d %s; want the first answer", status, b)
	}
	status, b = deploy("d", strings.Replace(v2, "700", "800", 1))
	wantCode(t, "deploy, same key, other spec", status, b, http.StatusUnprocessableEntity, berth.EIdempotencyMismatch)
	a, err := adminClient(st).App(t.Context(), "web")
	if err != nil || a.Version != 2 {
		t.Fatalf("app after a deploy and its replay: version %d, %v; want 2 (one deploy)", a.Version, err)
	}
	// A failed call does not bind its key: a deploy to a missing app, then to a real one.
	status, b = keyedCall(t, http.MethodPost, st.URL+"/v1/apps/nosuch/deploy", st.AdminKey, "d2", v2)
	wantCode(t, "deploy to a missing app", status, b, http.StatusNotFound, berth.EAppNotFound)
	if status, b = keyedCall(t, http.MethodPost, st.URL+"/v1/apps/nosuch/deploy", st.AdminKey, "d2", v2); status != http.StatusNotFound {
		t.Fatalf("retry of a failed deploy: %d %s; want it run again (404)", status, b)
	}
}

// TestCase_C26_KeysTheStoreCannotHold: a key that is not printable ASCII (PostgreSQL refused
// non-UTF-8 with a 503) or that starts with the app reconciler's prefix (a tenant's create
// would have claimed an app's start) is a 400 before anything is written, for sandbox and app
// calls alike.
func TestCase_C26_KeysTheStoreCannotHold(t *testing.T) {
	st := bootDev(t, nil)
	for _, key := range []string{"k\xff", "caf\xc3\xa9", "a\tb", berth.AppKeyPrefix + "web/v1/i1"} {
		status, b := keyedCall(t, http.MethodPost, st.URL+"/v1/sandboxes", st.AdminKey, key, `{"template":"shell"}`)
		wantCode(t, "sandbox create with key "+strconv.Quote(key), status, b, http.StatusBadRequest, berth.EInvalidRequest)
		status, b = keyedCall(t, http.MethodPost, st.URL+"/v1/apps", st.AdminKey, key,
			`{"name":"web","template":"shell","command":["sleep","600"],"port":8080,"desired":"stopped"}`)
		wantCode(t, "app create with key "+strconv.Quote(key), status, b, http.StatusBadRequest, berth.EInvalidRequest)
	}
	list, err := adminClient(st).Sandboxes(t.Context(), "")
	if err != nil || len(list) != 0 {
		t.Fatalf("sandboxes after refused keys: %d, %v; want none written", len(list), err)
	}
}
