package httpjson

import (
	"fmt"
	"reflect"
	"testing"

	"github.com/berth-dev/berth"
)

// BenchmarkRefuseNUL is Decode's NUL walk over a whole heartbeat of 1,000 held sandboxes (the
// largest body an agent sends often; a delta lists a handful).
//
//	go test ./internal/httpjson -run '^$' -bench BenchmarkRefuseNUL
func BenchmarkRefuseNUL(b *testing.B) {
	hb := berth.Heartbeat{AgentID: "a1", Address: "http://127.0.0.1:1", BootID: "b"}
	for i := range 1000 {
		hb.Sandboxes = append(hb.Sandboxes, berth.HeldSandbox{ID: fmt.Sprintf("sb-%016x", i), ResidentMiB: 100, Measured: true})
	}
	for b.Loop() {
		if err := refuseNUL(reflect.ValueOf(&hb)); err != nil {
			b.Fatal(err)
		}
	}
}
