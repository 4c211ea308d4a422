package cpustat

import (
	"os"
	"os/exec"
	"testing"
	"time"
)

// TestTreeCountsChildrenAlsoAfterTheyEnd: a child that burns CPU and is reaped is still in
// its parent's tree (reaped time), and Self and Tree of this process agree that work happened.
func TestTreeCountsChildrenAlsoAfterTheyEnd(t *testing.T) {
	me := os.Getpid()
	before, err := Tree(me)
	if err != nil {
		t.Fatal(err)
	}
	stat0, _ := readStat(me)
	self0 := Self()
	// A shell loop of about a tenth of a second of CPU, reaped by Run.
	if out, err := exec.Command("sh", "-c", `i=0; while [ $i -lt 100000 ]; do i=$((i+1)); done`).CombinedOutput(); err != nil {
		t.Fatalf("child: %v %s", err, out)
	}
	after, err := Tree(me)
	if err != nil {
		t.Fatal(err)
	}
	stat1, _ := readStat(me)
	if stat1.reaped <= stat0.reaped { // the child's work, counted though it ended
		t.Errorf("reaped ticks %d -> %d after a child burned CPU and ended", stat0.reaped, stat1.reaped)
	}
	if after < before+time.Duration(stat1.reaped-stat0.reaped)*time.Second/userHZ {
		t.Errorf("tree CPU %v -> %v does not hold the ended child's %d ticks", before, after, stat1.reaped-stat0.reaped)
	}
	if Self() < self0 {
		t.Error("Self went backwards")
	}
	if _, err := Tree(1 << 30); err == nil {
		t.Error("Tree of a pid that does not exist answered")
	}
}

// TestParentAndChildren: a child started here names this process as parent, and is listed
// among its children by name.
func TestParentAndChildren(t *testing.T) {
	cmd := exec.Command("sleep", "5")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	ppid, _, err := Parent(cmd.Process.Pid)
	if err != nil || ppid != os.Getpid() {
		t.Fatalf("Parent(%d) = %d, %v; want %d", cmd.Process.Pid, ppid, err, os.Getpid())
	}
	kids, err := Children(os.Getpid(), "sleep")
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, k := range kids {
		found = found || k == cmd.Process.Pid
	}
	if !found {
		t.Errorf("Children(me, sleep) = %v, want it to hold %d", kids, cmd.Process.Pid)
	}
}
