package process

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFindMemoryMount(t *testing.T) {
	const (
		v1      = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
		v1Other = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
		v2      = "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n"
		v2Root  = "29 23 0:26 / /sys/fs/cgroup rw,nosuid shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
		noise   = "27 1 254:0 / / rw,relatime - ext4 /dev/vda rw\nbroken line\n"
	)
	controllers := map[string]string{
		"/sys/fs/cgroup/unified": "hugetlb\n",
		"/sys/fs/cgroup":         "cpuset cpu io memory hugetlb pids\n",
	}
	cases := []struct {
		name      string
		mountinfo string
		want      memoryMount
		ok        bool
	}{
		{"v1 beside an empty v2", noise + v1Other + v1 + v2, memoryMount{path: "/sys/fs/cgroup/memory"}, true},
		{"v2 with memory wins", v1 + v2Root, memoryMount{path: "/sys/fs/cgroup", v2: true}, true},
		{"v2 without memory only", noise + v2, memoryMount{}, false},
		{"nothing", noise, memoryMount{}, false},
	}
	for _, tc := range cases {
		got, ok := findMemoryMount(tc.mountinfo, func(mp string) string { return controllers[mp] })
		if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(memoryMount{})); diff != "" || ok != tc.ok {
			t.Errorf("%s: ok=%t (want %t), (-want +got):\n%s", tc.name, ok, tc.ok, diff)
		}
	}
}

func TestWorkingSetMiB(t *testing.T) {
	cases := []struct {
		usage, inactive, want int64
	}{
		{300 << 20, 200 << 20, 100},
		{100<<20 + 1<<19, 0, 101},     // half a MiB rounds up
		{100<<20 + 1<<19 - 1, 0, 100}, // just under rounds down
		{10 << 20, 20 << 20, 0},       // inactive above usage (v1 usage is approximate): floor at 0
		{0, 0, 0},
	}
	for _, tc := range cases {
		if got := workingSetMiB(tc.usage, tc.inactive); got != tc.want {
			t.Errorf("workingSetMiB(%d, %d) = %d, want %d", tc.usage, tc.inactive, got, tc.want)
		}
	}
}

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

func TestValidID(t *testing.T) {
	for id, ok := range map[string]bool{
		"sb-1": true, "sbx_01HZ.v2": true, "": false, ".": false, "..": false,
		"a/b": false, "a b": false, "ü": false, string(make([]byte, 129)): false,
	} {
		if err := validID(id); (err == nil) != ok {
			t.Errorf("validID(%q) = %v, want ok %t", id, err, ok)
		}
	}
}

// The cgroup file handling of both versions, against a plain directory standing in for the
// hierarchy (this machine's memory controller is v1, so v2 cannot run for real here).
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
		cs, err := newCgroupSet(memoryMount{path: mount, v2: tc.v2}, "berth/nested", "rt-x")
		if err != nil {
			t.Fatalf("v2=%t: newCgroupSet: %v", tc.v2, err)
		}
		if want := filepath.Join(mount, "berth/nested/rt-x"); cs.base != want {
			t.Errorf("v2=%t: base = %s, want %s", tc.v2, cs.base, want)
		}
		for _, dir := range []string{"", "berth", "berth/nested", "berth/nested/rt-x"} {
			b, err := os.ReadFile(filepath.Join(mount, dir, "cgroup.subtree_control"))
			if got := string(b); tc.v2 && got != "+memory" || !tc.v2 && err == nil {
				t.Errorf("v2=%t: %s/cgroup.subtree_control = %q, %v", tc.v2, dir, got, err)
			}
		}
		dir, err := cs.create("sb", 256)
		if err != nil {
			t.Fatalf("v2=%t: create: %v", tc.v2, err)
		}
		if b, _ := os.ReadFile(filepath.Join(dir, tc.limitFile)); string(b) != "268435456" {
			t.Errorf("v2=%t: %s = %q, want 268435456", tc.v2, tc.limitFile, b)
		}
		os.WriteFile(filepath.Join(dir, tc.usageFile), []byte("314572800\n"), 0o644)
		os.WriteFile(filepath.Join(dir, "memory.stat"), []byte(tc.stat), 0o644)
		usage, inactive, err := cgroupUsage(dir, tc.v2)
		if err != nil || usage != tc.wantUsage || inactive != tc.wantInactive {
			t.Errorf("v2=%t: cgroupUsage = %d, %d, %v; want %d, %d", tc.v2, usage, inactive, err, tc.wantUsage, tc.wantInactive)
		}
	}
}
