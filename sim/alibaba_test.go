package sim

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestSIM1_BuiltinAlibaba: the trace built into the binary holds the whole workload (8,151
// pods, 208 series, 214,890 samples) and, where the original CSVs are beside this checkout,
// the very pods they give and their utilisation to within the rounding (sim/traces/README.md).
func TestSIM1_BuiltinAlibaba(t *testing.T) {
	pods, util, err := Alibaba()
	if err != nil {
		t.Fatal(err)
	}
	samples := 0
	for _, s := range util {
		samples += len(s)
	}
	if len(pods) != 8151 || len(util) != 208 || samples != 214890 {
		t.Fatalf("built-in trace: %d pods, %d series, %d samples; want 8151, 208, 214890", len(pods), len(util), samples)
	}
	origPods, _, err := LoadPods("../../shared/data/alibaba-2023-openb-pod-list.csv")
	if err != nil {
		t.Skipf("the original Alibaba traces are not beside this checkout (../shared/data): %v", err)
	}
	origUtil, err := LoadUtil("../../shared/data/alibaba-2026-genai-pod-memory-util.csv.gz")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(origPods, pods); diff != "" {
		t.Errorf("built-in pods differ from the originals (-orig +built-in):\n%s", diff)
	}
	if len(origUtil) != len(util) {
		t.Fatalf("%d series built in, %d in the original", len(util), len(origUtil))
	}
	for i := range util {
		if len(util[i]) != len(origUtil[i]) {
			t.Fatalf("series %d: %d samples built in, %d in the original", i, len(util[i]), len(origUtil[i]))
		}
		for j, v := range util[i] {
			if math.Abs(v-origUtil[i][j]) > 0.5/SeriesScale+1e-12 {
				t.Fatalf("series %d sample %d: %v built in, %v in the original", i, j, v, origUtil[i][j])
			}
		}
	}
}

// TestReadSeries: WriteSeries and ReadSeries round-trip to 1/SeriesScale, and a malformed
// series is an error naming its line, never a silently shorter series.
func TestReadSeries(t *testing.T) {
	var b bytes.Buffer
	if err := WriteSeries(&b, "two series", [][]float64{{0.5, 0.12344, -0.0003}, {1}}); err != nil {
		t.Fatal(err)
	}
	got, err := ReadSeries(&b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([][]float64{{0.5, 0.1234, -0.0003}, {1}}, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	for _, bad := range []string{"1,2\n3,x\n", "1,,2\n", "0.5\n", "99999999999\n"} {
		if _, err := ReadSeries(strings.NewReader(bad)); err == nil || !strings.Contains(err.Error(), "line") {
			t.Errorf("ReadSeries(%q) = %v, want an error naming the line", bad, err)
		}
	}
}
