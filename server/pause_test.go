package server

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gocloud.dev/blob"

	"github.com/berth-dev/berth"
)

// TestPAUSE1_LostCheckpointAnswer: an agent that drops the connection in the middle of a
// pause, or whose answer is not the agent's (a 200 whose body is not a checkpoint result, a
// proxy's 502 page), leaves the outcome unknown. The server never guesses "it runs on" (which
// would also delete the image): with the image whole in the snapshot store the sandbox is
// paused; without it, it stays pausing for the sweeper to settle from what the agent and the
// store hold. (The two answers that are not the agent's were found by an attack.)
func TestPAUSE1_LostCheckpointAnswer(t *testing.T) {
	answers := map[string]func(w http.ResponseWriter){
		"hang-up": func(w http.ResponseWriter) {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close() // the answer is lost
		},
		"200 not a result": func(w http.ResponseWriter) { _, _ = w.Write([]byte(`{"image":"x","resident_mb":`)) },
		"a proxy's 502": func(w http.ResponseWriter) {
			w.WriteHeader(http.StatusBadGateway)
			_, _ = w.Write([]byte("<html>502 Bad Gateway</html>"))
		},
	}
	for how, answer := range answers {
		for _, stored := range []bool{true, false} {
			name := how + ", image stored"
			if !stored {
				name = how + ", nothing stored"
			}
			t.Run(name, func(t *testing.T) {
				bucket, err := blob.OpenBucket(context.Background(), "file://"+t.TempDir())
				must(t, err)
				t.Cleanup(func() { bucket.Close() })
				h := newHarnessWith(t, func(c *Config) { c.Snapshots = bucket })
				ctx := context.Background()
				var image atomic.Value // the checkpoint's image name, written by the stand-in agent
				image.Store("")
				agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					switch {
					case r.Method == http.MethodPost && r.URL.Path == "/internal/sandboxes":
						w.WriteHeader(http.StatusCreated)
					case strings.HasSuffix(r.URL.Path, "/checkpoint"):
						var req struct{ Image string }
						_ = json.NewDecoder(r.Body).Decode(&req)
						image.Store(req.Image)
						if stored {
							_ = bucket.WriteAll(r.Context(), req.Image+"/files.json", []byte(`{"files":[]}`), nil)
						}
						answer(w)
					default:
						w.WriteHeader(http.StatusNoContent)
					}
				}))
				t.Cleanup(agent.Close)
				code, sb := pauseOn(t, h, agent.URL)
				got, err := h.st.Sandbox(ctx, sb.ID)
				must(t, err)
				want, status := berth.SandboxPausing, http.StatusServiceUnavailable
				if stored {
					want, status = berth.SandboxPaused, http.StatusOK
				}
				if got.State != want || code != status {
					t.Fatalf("after a lost answer: %d, sandbox %s (%s); want %d and %s", code, got.State, got.Reason, status, want)
				}
				if kept, _ := bucket.Exists(ctx, image.Load().(string)+"/files.json"); stored && !kept {
					t.Fatalf("the stored image of a checkpoint whose answer was lost was deleted")
				}
			})
		}
	}
}

// TestPAUSE1_CheckpointCallCarriesTheWait: the server tells the agent how long it waits for a
// checkpoint (berth.HeaderTimeout, at most PauseTimeout), so the agent can stop one that
// would outlast the wait instead of finishing it after the server gave up.
func TestPAUSE1_CheckpointCallCarriesTheWait(t *testing.T) {
	bucket, err := blob.OpenBucket(context.Background(), "file://"+t.TempDir())
	must(t, err)
	t.Cleanup(func() { bucket.Close() })
	h := newHarnessWith(t, func(c *Config) { c.Snapshots, c.PauseTimeout = bucket, 7*time.Second })
	waits := make(chan string, 1)
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/internal/sandboxes":
			w.WriteHeader(http.StatusCreated)
		case strings.HasSuffix(r.URL.Path, "/checkpoint"):
			waits <- r.Header.Get(berth.HeaderTimeout)
			var req struct{ Image string }
			_ = json.NewDecoder(r.Body).Decode(&req)
			_ = json.NewEncoder(w).Encode(berth.CheckpointResult{Image: req.Image})
		default:
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	t.Cleanup(agent.Close)
	if code, _ := pauseOn(t, h, agent.URL); code != http.StatusOK {
		t.Fatalf("pause: %d", code)
	}
	got := <-waits
	ms, err := strconv.ParseInt(got, 10, 64)
	if err != nil || ms <= 0 || ms > 7000 {
		t.Fatalf("checkpoint call's %s = %q; want the server's wait in ms, at most PauseTimeout (7000)", berth.HeaderTimeout, got)
	}
}

// pauseOn announces agent a1 at agentURL (gVisor, checkpoints), creates a sandbox there and
// asks to pause it; it returns the pause's status and the sandbox as created.
func pauseOn(t *testing.T, h *harness, agentURL string) (int, berth.Sandbox) {
	t.Helper()
	_, err := h.st.ApplyHeartbeat(context.Background(), berth.Heartbeat{AgentID: "a1", Address: agentURL, Status: berth.AgentActive,
		IntakeOpen: true, MemoryAdmission: berth.AdmissionCommitted, MemoryMiBTotal: 4096, MemoryMiBAdmittable: 4096,
		CPUTotal: 2, HeartbeatAt: time.Now(), Runtime: "gvisor", Checkpoint: true}, time.Now())
	must(t, err)
	code, sb, e := h.create(t)
	if code != http.StatusCreated {
		t.Fatalf("create: %d %+v", code, e)
	}
	req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/sandboxes/"+sb.ID+"/pause", nil)
	req.Header.Set("Authorization", "Bearer "+h.key)
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	return resp.StatusCode, sb
}
