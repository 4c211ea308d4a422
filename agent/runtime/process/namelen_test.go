package process

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/berth-dev/berth"
)

// TestFilesNameTooLongIsInvalidRequest: a path whose element is over NAME_MAX, or which is
// over PATH_MAX as a whole, is the caller's invalid_request — the same answer on every try —
// not the conflict of a sandbox whose file system is in a bad state (an app whose files held
// such a path was retried as a transient failure for ever).
func TestFilesNameTooLongIsInvalidRequest(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-long", 256)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			for _, p := range []string{"/tmp/" + strings.Repeat("n", 256), "/tmp/" + strings.Repeat("d/", 2100) + "f"} {
				if err := r.WriteFile(ctx, "sb-long", p, bytes.NewReader([]byte("x"))); berth.ErrorCode(err) != berth.EInvalidRequest {
					t.Errorf("WriteFile(%d-byte path) = %.120v; want invalid_request", len(p), err)
				}
				if _, err := readAll(r.ReadFile(ctx, "sb-long", p)); berth.ErrorCode(err) != berth.EInvalidRequest {
					t.Errorf("ReadFile(%d-byte path) = %.120v; want invalid_request", len(p), err)
				}
			}
		})
	}
}
