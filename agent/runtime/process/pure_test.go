package process

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/berth-dev/berth/agent/runtime/cgroups"
	"github.com/google/go-cmp/cmp"
)

func TestParseStat(t *testing.T) {
	cases := []struct {
		in      string
		want    procStat
		wantErr bool
	}{
		{"42 (sleep) S 7 42 7 0 -1", procStat{pid: 42, ppid: 7, state: 'S'}, false},
		{"43 (a) b (c) Z 1 43", procStat{pid: 43, ppid: 1, state: 'Z'}, false},
		{"44 (with space) R 2 3", procStat{pid: 44, ppid: 2, state: 'R'}, false},
		{"garbage", procStat{}, true},
		{"45 (x) S", procStat{}, true},
	}
	for _, tc := range cases {
		got, err := parseStat(tc.in)
		if (err != nil) != tc.wantErr {
			t.Errorf("parseStat(%q) error = %v, want error %t", tc.in, err, tc.wantErr)
		}
		if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(procStat{})); diff != "" {
			t.Errorf("parseStat(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

// The cgroup file handling of both versions, against a plain directory standing in for the
// hierarchy (this machine's memory controller is v1, so v2 cannot run for real here): on v2
// one set holds memory and pids, on v1 each controller has its own.
func TestCgroupFiles(t *testing.T) {
	cases := []struct {
		v2                      bool
		limitFile, usageFile    string
		stat                    string
		wantUsage, wantInactive int64
	}{
		{false, "memory.limit_in_bytes", "memory.usage_in_bytes",
			"cache 1\ninactive_file 5\ntotal_cache 9\ntotal_inactive_file 104857600\n", 314572800, 104857600},
		{true, "memory.max", "memory.current",
			"anon 1\nfile 2\ninactive_file 104857600\nactive_file 7\n", 314572800, 104857600},
	}
	for _, tc := range cases {
		mount := t.TempDir()
		ctrls := []string{ctrlMemory}
		if tc.v2 {
			ctrls = append(ctrls, ctrlPids)
		}
		cs, err := newCgroupSet(cgroups.Mount{Path: mount, V2: tc.v2}, ctrls, "berth/nested", "rt-x")
		if err != nil {
			t.Fatalf("v2=%t: newCgroupSet: %v", tc.v2, err)
		}
		if want := filepath.Join(mount, "berth/nested/rt-x"); cs.base != want {
			t.Errorf("v2=%t: base = %s, want %s", tc.v2, cs.base, want)
		}
		for _, dir := range []string{"", "berth", "berth/nested", "berth/nested/rt-x"} {
			b, err := os.ReadFile(filepath.Join(mount, dir, "cgroup.subtree_control"))
			if got := string(b); tc.v2 && got != "+memory +pids" || !tc.v2 && err == nil {
				t.Errorf("v2=%t: %s/cgroup.subtree_control = %q, %v", tc.v2, dir, got, err)
			}
		}
		dir, err := cs.create("sb", cgroupLimits{memoryMiB: 256, pids: 77})
		if err != nil {
			t.Fatalf("v2=%t: create: %v", tc.v2, err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, tc.limitFile)); string(b) != "268435456" {
			t.Errorf("v2=%t: %s = %q, want 268435456", tc.v2, tc.limitFile, b)
		}
		b, err := os.ReadFile(filepath.Join(dir, "pids.max"))
		if got := string(b); tc.v2 && got != "77" || !tc.v2 && err == nil {
			t.Errorf("v2=%t: pids.max = %q, %v; want 77 on v2, none in a v1 memory set", tc.v2, got, err)
		}
		os.WriteFile(filepath.Join(dir, tc.usageFile), []byte("314572800\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "memory.stat"), []byte(tc.stat), 0o644)
		usage, inactive, err := cgroups.Usage(dir, tc.v2)
		if err != nil || usage != tc.wantUsage || inactive != tc.wantInactive {
			t.Errorf("v2=%t: cgroupUsage = %d, %d, %v; want %d, %d", tc.v2, usage, inactive, err, tc.wantUsage, tc.wantInactive)
		}
	}
}
