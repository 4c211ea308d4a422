package cgroups

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestFind: the hierarchy of a controller is read off mountinfo: v2 when it offers the
// controller, else the v1 mount that names it (AGT-3).
func TestFind(t *testing.T) {
	const (
		v1      = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
		v1Pids  = "36 31 0:33 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
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
		name       string
		mountinfo  string
		controller string
		want       Mount
		ok         bool
	}{
		{"v1 beside an empty v2", noise + v1Other + v1 + v1Pids + v2, "memory", Mount{Path: "/sys/fs/cgroup/memory"}, true},
		{"v1 pids", noise + v1Other + v1 + v1Pids + v2, "pids", Mount{Path: "/sys/fs/cgroup/pids"}, true},
		{"v2 with memory wins", v1 + v2Root, "memory", Mount{Path: "/sys/fs/cgroup", V2: true}, true},
		{"v2 with pids wins", v1Pids + v2Root, "pids", Mount{Path: "/sys/fs/cgroup", V2: true}, true},
		{"v2 without memory only", noise + v2, "memory", Mount{}, false},
		{"no pids", noise + v1 + v2, "pids", Mount{}, false},
		{"nothing", noise, "memory", Mount{}, false},
	}
	for _, tc := range cases {
		got, ok := Find(tc.mountinfo, tc.controller, func(mp string) string { return controllers[mp] })
		if diff := cmp.Diff(tc.want, got); diff != "" || ok != tc.ok {
			t.Errorf("%s: ok=%t (want %t), (-want +got):\n%s", tc.name, ok, tc.ok, diff)
		}
	}
}

// TestWorkingSetMiB pins C24's working set: usage minus inactive file pages, rounded to
// the nearest MiB, never negative.
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
		if got := WorkingSetMiB(tc.usage, tc.inactive); got != tc.want {
			t.Errorf("WorkingSetMiB(%d, %d) = %d, want %d", tc.usage, tc.inactive, got, tc.want)
		}
	}
}
