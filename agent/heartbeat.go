package agent

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/berth-dev/berth"
)

// Heartbeat builds the agent's current heartbeat (AGT-1). Memory figures are MiB.
func (a *Agent) Heartbeat(now time.Time) berth.Heartbeat {
	a.mu.Lock()
	defer a.mu.Unlock()
	// Seq orders this boot's heartbeats for the store (a slow POST must not roll newer
	// figures back); HeartbeatAt is the wall clock as it is, for operators only (C32).
	a.heartbeatSeq++
	hb := berth.Heartbeat{
		AgentID:             a.cfg.ID,
		Address:             a.addr,
		Region:              a.cfg.Region,
		Pool:                a.cfg.Pool,
		Preemptible:         a.cfg.Preemptible,
		HeartbeatAt:         now.UTC(),
		Seq:                 a.heartbeatSeq,
		Status:              berth.AgentActive,
		CPUTotal:            cpuTotal(),
		CPUUsed:             a.cpuUsed,
		MemoryMiBTotal:      a.cfg.MemoryMiB,
		MemoryAdmission:     a.cfg.Admission,
		MemoryMiBAdmittable: a.admittableLocked(),
		IntakeOpen:          a.intakeOpenLocked(),
		MemoryPressure:      a.pressure,
		StartsInFlight:      len(a.starts),
		Version:             a.cfg.Version,
		BootID:              a.bootID,
		MeasurementErrors:   a.measureErrs,
		Runtime:             a.info.Name,
		Checkpoint:          a.ckpt != nil,
		Sandboxes:           make([]berth.HeldSandbox, 0, len(a.guests)),
		Ended:               append([]berth.EndedSandbox(nil), a.ended...),
	}
	if a.drainingLocked() {
		hb.Status, hb.StatusReason = berth.AgentDraining, a.drainReasonLocked()
	}
	for id, g := range a.guests {
		hb.MemoryMiBCommitted += g.spec.MemoryMiB
		hb.MemoryMiBUsed += g.resident
		// Every guest admittable charges is listed, so its ledger entry is netted by the
		// same heartbeat that starts counting it (LED-4: never counted twice for longer).
		// A guest still starting says so: the store must not call it running yet.
		hb.Sandboxes = append(hb.Sandboxes, berth.HeldSandbox{ID: id, ResidentMiB: g.resident,
			Measured: g.measured, Starting: !g.started, OOMKills: g.oomKills, Incarnation: g.incarnation})
	}
	return hb
}

func (a *Agent) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.HeartbeatInterval)
	defer t.Stop()
	a.sendHeartbeat(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-a.kick:
		}
		a.sendHeartbeat(ctx)
	}
}

func (a *Agent) sendHeartbeat(ctx context.Context) {
	if a.cfg.ServerURL == "" {
		return
	}
	// A delta the server cannot place on its base is answered resync: send the whole list
	// at once rather than an interval later (one more POST at most).
	for range 2 {
		if !a.sendHeartbeatOnce(ctx) {
			return
		}
	}
}

// sendHeartbeatOnce posts one heartbeat, a delta when the server acknowledged a base (issue 16,
// goal 2), and reports whether the server asked for the whole list.
func (a *Agent) sendHeartbeatOnce(ctx context.Context) (resync bool) {
	full := a.Heartbeat(time.Now())
	hb := a.hbBase.next(full)
	cctx, cancel := context.WithTimeout(ctx, max(a.cfg.HeartbeatInterval, time.Second))
	defer cancel()
	c, err := a.serverClient(cctx)
	var ack berth.HeartbeatAck
	if err == nil {
		if ack, err = c.HeartbeatAck(cctx, hb); err != nil {
			a.credentialRefused(err)
		}
	}
	a.hbBase.acked(full, hb, ack, err)
	if err != nil {
		if ctx.Err() == nil {
			a.log.Warn("heartbeat failed", "err", err)
		}
		return false
	}
	// The server recorded these transitions; forget exactly the ones it saw.
	if len(hb.Ended) > 0 {
		a.mu.Lock()
		a.ended = a.ended[min(len(hb.Ended), len(a.ended)):]
		a.mu.Unlock()
	}
	return ack.Resync
}

// residentSlackMiB is the smallest change of a sandbox's measured working set a delta
// heartbeat reports (issue 16, goal 2): a change is sent once it reaches
// max(residentSlackMiB, 1/16 of the value the server holds). The host's totals (used,
// committed, admittable) are exact on every heartbeat; only the per-sandbox figure, which
// operators read and no decision uses, may lag by less than this.
const residentSlackMiB = 16

// heartbeatBase is the held list the server acknowledged holding, as of heartbeat seq of this
// boot (issue 16, goal 2). While it is valid, heartbeats are deltas against it; an error, an
// answer without an acknowledgment (a server of the previous release answers 204) or a
// resync makes it invalid, and the next heartbeat lists everything.
type heartbeatBase struct {
	mu   sync.Mutex
	seq  int64                        // 0: no base, send the whole list
	held map[string]berth.HeldSandbox // what the server holds as of seq
}

// next returns full as a delta against the base when there is one, else full itself.
func (b *heartbeatBase) next(full berth.Heartbeat) berth.Heartbeat {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.seq == 0 || full.Seq <= b.seq {
		return full
	}
	hb := full
	hb.Delta, hb.BaseSeq, hb.Sandboxes, hb.Removed = true, b.seq, []berth.HeldSandbox{}, nil
	now := make(map[string]bool, len(full.Sandboxes))
	for _, h := range full.Sandboxes {
		now[h.ID] = true
		if old, ok := b.held[h.ID]; !ok || changed(old, h) {
			hb.Sandboxes = append(hb.Sandboxes, h)
		}
	}
	for id := range b.held {
		if !now[id] {
			hb.Removed = append(hb.Removed, id)
		}
	}
	return hb
}

// changed reports whether h differs from what the server holds, old, enough to send: any flag
// or OOM count, or the working set by residentSlackMiB or 1/16 of old's.
func changed(old, h berth.HeldSandbox) bool {
	if old.Measured != h.Measured || old.Starting != h.Starting || old.OOMKills != h.OOMKills || old.Incarnation != h.Incarnation {
		return true
	}
	d := h.ResidentMiB - old.ResidentMiB
	if d < 0 {
		d = -d
	}
	return d > 0 && d >= max(residentSlackMiB, old.ResidentMiB/16)
}

// acked records the server's answer to hb (built from full): an acknowledgment of hb.Seq
// moves the base to what the server now holds; anything else drops it.
func (b *heartbeatBase) acked(full, hb berth.Heartbeat, ack berth.HeartbeatAck, err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err != nil || ack.Resync || ack.Seq == 0 || ack.Seq != hb.Seq {
		b.seq, b.held = 0, nil
		return
	}
	if !hb.Delta {
		b.held = make(map[string]berth.HeldSandbox, len(full.Sandboxes))
	} else if b.seq != hb.BaseSeq {
		b.seq, b.held = 0, nil // another send moved the base meanwhile: start over
		return
	}
	for _, h := range hb.Sandboxes {
		b.held[h.ID] = h
	}
	for _, id := range hb.Removed {
		delete(b.held, id)
	}
	b.seq = hb.Seq
}

// samplePressure records the host's memory pressure (PSI "some avg10", percent; AGT-1) and
// feeds the pressure gate (ADM-8): while it is closed the agent publishes admittable 0,
// intake closed, and its local gate refuses. Kernels without PSI leave the gate open.
func (a *Agent) samplePressure(now time.Time) {
	p, ok := a.cfg.PressureSource()
	if !ok {
		return
	}
	a.mu.Lock()
	a.pressure = p
	was := a.gate.Closed()
	open := a.gate.Observe(p, now)
	a.mu.Unlock()
	switch {
	case was && open:
		a.log.Info("memory pressure calm again: intake reopened", "pressure", p)
		a.Kick()
	case !was && !open:
		a.log.Warn("memory pressure over the close line: intake closed (ADM-8)", "pressure", p)
		a.Kick()
	}
}

// ProcPressure reads PSI "some avg10" from /proc/pressure/memory; ok is false where the
// kernel has no PSI. It is the default Config.PressureSource.
func ProcPressure() (float64, bool) {
	b, err := os.ReadFile("/proc/pressure/memory")
	if err != nil {
		return 0, false
	}
	return parsePSISome(string(b))
}

// parsePSISome returns avg10 of the "some" line of a PSI file.
func parsePSISome(s string) (float64, bool) {
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "some" {
			continue
		}
		for _, kv := range f[1:] {
			if v, ok := strings.CutPrefix(kv, "avg10="); ok {
				x, err := strconv.ParseFloat(v, 64)
				if err != nil || x < 0 || x > 100 {
					return 0, false // a bad reading is no reading (C07)
				}
				return x, true
			}
		}
	}
	return 0, false
}

// sampleCPU updates cpuUsed (cores busy on the host) from /proc/stat deltas.
func (a *Agent) sampleCPU() {
	busy, total, ok := readProcStat()
	if !ok {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lastCPUTotal > 0 && total > a.lastCPUTotal {
		frac := float64(busy-a.lastCPUBusy) / float64(total-a.lastCPUTotal)
		a.cpuUsed = min(max(frac, 0), 1) * cpuTotal()
	}
	a.lastCPUBusy, a.lastCPUTotal = busy, total
}

func readProcStat() (busy, total uint64, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, false
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, false
	}
	for i, s := range f[1:] {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return 0, 0, false
		}
		total += v
		if i != 3 && i != 4 { // idle, iowait
			busy += v
		}
	}
	return busy, total, true
}
