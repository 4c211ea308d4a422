package httpjson

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
	"github.com/google/go-cmp/cmp"
)

// TestStatusForPinsEveryCode pins the one code → status mapping (API-2, STYLE habit 4):
// capacity refusals are 503, never 429 or 500.
func TestStatusForPinsEveryCode(t *testing.T) {
	want := map[string]int{
		berth.ENoCapacity:          503,
		berth.ENoHealthyAgents:     503,
		berth.EHostStartsSaturated: 503,
		berth.EUnavailable:         503,
		berth.ETenantOverQuota:     403,
		berth.EForbidden:           403,
		berth.ETemplateNotFound:    404,
		berth.ESandboxNotFound:     404,
		berth.ENotFound:            404,
		berth.EInvalidRequest:      400,
		berth.EUnauthorized:        401,
		berth.EConflict:            409,
		berth.ETooLarge:            413,
		berth.ERateLimited:         429,
		berth.EMethodNotAllowed:    405,
		berth.EOutcomeUnknown:      504,
		berth.EInternal:            500,
		"some_future_code":         500,
	}
	got := map[string]int{}
	for code := range want {
		got[code] = StatusFor(code)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("StatusFor (-want +got):\n%s", diff)
	}
}

// TestWriteErrorBody: a retryable refusal carries Retry-After in whole seconds (at least 1)
// in the header and the body; a plain Go error never leaks its text.
func TestWriteErrorBody(t *testing.T) {
	w := httptest.NewRecorder()
	WriteError(w, "req-1", fmt.Errorf("place: %w", &berth.Error{Code: berth.ENoCapacity, Message: "1 hosts",
		RetryAfter: 1500e6, Hosts: map[string]int{"total": 1, "insufficient_memory": 1}}))
	if w.Code != 503 || w.Header().Get("Retry-After") != "2" {
		t.Fatalf("status %d Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	want := `{"error":{"code":"no_capacity","message":"1 hosts","retryable":true,"retry_after_s":2,"request_id":"req-1","hosts":{"insufficient_memory":1,"total":1}}}`
	if got := strings.TrimSpace(w.Body.String()); got != want {
		t.Fatalf("body\n got %s\nwant %s", got, want)
	}
	w = httptest.NewRecorder()
	WriteError(w, "req-2", errors.New("pq: secret connection string"))
	if w.Code != 500 || strings.Contains(w.Body.String(), "secret") || w.Header().Get("Retry-After") != "" {
		t.Fatalf("internal error leaked or mis-mapped: %d %s", w.Code, w.Body.String())
	}
}

// TestDecode: strict decoding turns every malformed body into invalid_request or
// request_too_large.
func TestDecode(t *testing.T) {
	type body struct {
		A int `json:"a"`
	}
	for _, tc := range []struct{ in, code string }{
		{`{"a":1}`, ""},
		{``, berth.EInvalidRequest},
		{`{"a":`, berth.EInvalidRequest},
		{`{"a":"x"}`, berth.EInvalidRequest},
		{`[]`, berth.EInvalidRequest},
		{`{"b":1}`, berth.EInvalidRequest},
		{`{"a":1} {"a":2}`, berth.EInvalidRequest},
		{`{"a":1e400}`, berth.EInvalidRequest},
		{`{"a":` + strings.Repeat("1", 100) + `}`, berth.ETooLarge},
		{`{"a":1}` + strings.Repeat(" ", 100), berth.ETooLarge}, // padded past the limit
		{`{"a":1}` + strings.Repeat(" ", 40), ""},               // padded within it
		{`{"a":1}` + strings.Repeat(" ", 40) + "x", berth.EInvalidRequest},
	} {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(tc.in))
		var v body
		err := Decode(httptest.NewRecorder(), r, 64, &v)
		if got := berth.ErrorCode(err); got != tc.code {
			t.Errorf("Decode(%q) = %v (code %q), want code %q", tc.in, err, got, tc.code)
		}
	}
}

// TestDecodeMessagesSpeakJSON: messages name JSON kinds, never Go types.
func TestDecodeMessagesSpeakJSON(t *testing.T) {
	type body struct {
		A int `json:"a"`
	}
	for in, want := range map[string]string{
		`[]`:        "body must be a JSON object, not array",
		`{"a":"x"}`: `field "a" must be an integer`,
	} {
		var v body
		err := Decode(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", strings.NewReader(in)), 1024, &v)
		if got := berth.ErrorMessage(err); got != want {
			t.Errorf("Decode(%s) message %q, want %q", in, got, want)
		}
	}
}

// TestWriteErrorHidesCauses (issue 15): an *Error's Cause never reaches the body, and an
// internal error says only "internal error", whatever its message.
func TestWriteErrorHidesCauses(t *testing.T) {
	for _, err := range []error{
		berth.Wrap(berth.EUnavailable, errors.New("dial tcp 10.0.0.7:5432: connection refused"), "list sandboxes"),
		berth.Wrap(berth.EInternal, errors.New("sql: database is closed"), "list sandboxes"),
		berth.Errorf(berth.EInternal, "sqlite: api key: sql: database is closed"),
	} {
		w := httptest.NewRecorder()
		WriteError(w, "req-1", err)
		for _, leak := range []string{"10.0.0.7", "refused", "closed", "sqlite"} {
			if strings.Contains(w.Body.String(), leak) {
				t.Errorf("WriteError(%v) body holds %q: %s", err, leak, w.Body.String())
			}
		}
		if berth.ErrorCode(err) == berth.EInternal && !strings.Contains(w.Body.String(), `"message":"internal error"`) {
			t.Errorf("internal error body %s: want message \"internal error\"", w.Body.String())
		}
	}
}

// TestEchoRequestID (issue 15): an error answered behind EchoRequestID carries the request
// id the caller sent (a server proxying an agent's answer); without one, a fresh id; a
// malformed one is replaced.
func TestEchoRequestID(t *testing.T) {
	h := EchoRequestID(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		WriteError(w, "", berth.Errorf(berth.EUpstream, "nothing answers"))
	}))
	for _, tc := range []struct{ sent, want string }{
		{"req-abc123", "req-abc123"},
		{"", ""},
		{"bad id\r\nx", ""},
	} {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		if tc.sent != "" {
			r.Header[berth.HeaderRequestID] = []string{tc.sent}
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var body berth.ErrorBody
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
		got := body.Error.RequestID
		if got == "" || got != w.Header().Get(berth.HeaderRequestID) || (tc.want != "" && got != tc.want) ||
			(tc.want == "" && got == tc.sent) {
			t.Errorf("sent %q: body request_id %q header %q, want %q (or a fresh one)", tc.sent, got, w.Header().Get(berth.HeaderRequestID), tc.want)
		}
	}
}

// TestWriteJSONUnencodable: a value JSON cannot encode (a time in year 10000) is answered 500
// internal with an error body, never the status asked for with an empty body.
func TestWriteJSONUnencodable(t *testing.T) {
	w := httptest.NewRecorder()
	WriteJSON(w, http.StatusOK, map[string]any{"at": time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)})
	if w.Code != http.StatusInternalServerError || !strings.Contains(w.Body.String(), `"internal"`) {
		t.Fatalf("WriteJSON of an unencodable value: %d %q; want 500 with an internal error body", w.Code, w.Body.String())
	}
	w = httptest.NewRecorder()
	WriteJSON(w, http.StatusCreated, map[string]int{"n": 1})
	if w.Code != http.StatusCreated || w.Body.String() != "{\"n\":1}\n" || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("WriteJSON: %d %q %q", w.Code, w.Body.String(), w.Header().Get("Content-Type"))
	}
}

// TestDecodeTypeErrorsNameJSONFields (a new user found both): a field is named by the JSON
// path a client sends, never through a Go type (a spec embedded in a request said
// "AppSpec.port"), and a number too big or too small for its field is out of range, with the
// range, not "must be an integer". A number of the wrong form still says what the field takes.
func TestDecodeTypeErrorsNameJSONFields(t *testing.T) {
	type Spec struct {
		Command []string          `json:"command"`
		Port    int               `json:"port"`
		Files   map[string]string `json:"files"`
	}
	type Named struct{ X int }
	type body struct {
		Name string `json:"name"`
		Spec
		*Named
		Inner    Spec    `json:"spec"`
		List     []*Spec `json:"list"`
		MemoryMB int64   `json:"memory_mb"`
		Idle     *int64  `json:"idle_seconds"`
		Small    uint8   `json:"small"`
		Ratio    float64 `json:"ratio"`
		Ratio32  float32 `json:"ratio32"`
	}
	for in, want := range map[string]string{
		`{"port":"x"}`:                                  `field "port" must be an integer`,
		`{"command":"x"}`:                               `field "command" must be an array`,
		`{"command":[1]}`:                               `field "command" must be an array; each item must be a string`,
		`{"files":{"a":1}}`:                             `field "files" must be an object; each value must be a string`,
		`{"X":"x"}`:                                     `field "X" must be an integer`,
		`{"spec":{"port":"x"}}`:                         `field "spec.port" must be an integer`,
		`{"list":[{"port":true}]}`:                      `field "list.port" must be an integer`,
		`{"list":[1]}`:                                  `field "list" must be an array; each item must be an object`,
		`{"memory_mb":99999999999999999999999}`:         `field "memory_mb": 99999999999999999999999 is out of range (-9223372036854775808 to 9223372036854775807)`,
		`{"memory_mb":9223372036854775808}`:             `field "memory_mb": 9223372036854775808 is out of range (-9223372036854775808 to 9223372036854775807)`,
		`{"memory_mb":-9223372036854775809}`:            `field "memory_mb": -9223372036854775809 is out of range (-9223372036854775808 to 9223372036854775807)`,
		`{"memory_mb":` + strings.Repeat("9", 40) + `}`: `field "memory_mb": 999999999999999999999999… (40 digits) is out of range (-9223372036854775808 to 9223372036854775807)`,
		`{"idle_seconds":1e99}`:                         `field "idle_seconds" must be an integer`,
		`{"idle_seconds":18446744073709551616}`:         `field "idle_seconds": 18446744073709551616 is out of range (-9223372036854775808 to 9223372036854775807)`,
		`{"spec":{"port":9223372036854775808}}`:         `field "spec.port": 9223372036854775808 is out of range (-9223372036854775808 to 9223372036854775807)`,
		`{"small":256}`:                                 `field "small": 256 is out of range (0 to 255)`,
		`{"small":-1}`:                                  `field "small": -1 is out of range (0 to 255)`,
		`{"small":1.5}`:                                 `field "small" must be an integer`,
		`{"memory_mb":1.5}`:                             `field "memory_mb" must be an integer`,
		`{"ratio":1e400}`:                               `field "ratio": 1e400 is out of range (-1.7976931348623157e+308 to 1.7976931348623157e+308)`,
		`{"ratio32":1e39}`:                              `field "ratio32": 1e39 is out of range (-3.4028234663852886e+38 to 3.4028234663852886e+38)`,
		`{"name":1}`:                                    `field "name" must be a string`,
	} {
		var v body
		err := Decode(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", strings.NewReader(in)), 1024, &v)
		if got := berth.ErrorMessage(err); berth.ErrorCode(err) != berth.EInvalidRequest || got != want {
			t.Errorf("Decode(%s) = %v\n got message %q\nwant message %q", in, err, got, want)
		}
	}
}
