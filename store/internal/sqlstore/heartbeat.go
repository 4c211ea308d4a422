package sqlstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"database/sql"

	"github.com/berth-dev/berth"
)

// ApplyHeartbeat is RecordHeartbeat returning only the number of reservations netted.
func (s *Store) ApplyHeartbeat(ctx context.Context, hb berth.Heartbeat, now time.Time) (int, error) {
	res, err := s.RecordHeartbeat(ctx, hb, "", now)
	return res.Netted, err
}

// RecordHeartbeat records hb as received at now, in one transaction (AGT-1, LED-4, LIF-3):
//
//   - it applies nothing, and answers an error wrapping berth.ErrRevoked, when an admin
//     revoked hb.AgentID or when credHash is not "" and is not a live credential of
//     hb.AgentID (TRUST-1: a rejoin revoked it, or it is another id's). The check runs under
//     the id's credential lock inside the transaction, so a server may authenticate a
//     heartbeat from a cache of credentials and still never apply one a revoke preceded;
//   - it applies nothing but hb.Ended when hb is overtaken: a heartbeat of the same boot with
//     a Seq at or above hb.Seq was applied already (C32: the order is the agent's sequence
//     number, never its clock; hb.HeartbeatAt is stored for operators and decides nothing);
//   - likewise when hb is a delta (issue 16, goal 2) whose base is not the held list the store
//     keeps: another boot, or a BaseSeq other than the heartbeat whose list agent_held holds
//     (held_boot, held_seq). The result says Resync: the agent must send its whole list;
//   - it upserts the agent with every heartbeat field and last_seen = now. The stored status
//     is draining while an operator drain is in force, else hb.Status ("" means active);
//   - it brings agent_held, one row per held sandbox, to what hb lists: a whole list replaces
//     it (rows are written only where they differ), a delta writes its listed rows and deletes
//     its Removed ones, so a heartbeat writes what changed, never the whole list again;
//   - it writes an event for every sandbox whose OOM kill count grew (C09);
//   - it writes the agent events: "" → status on first sight (reason "registered"), old →
//     new on a status change ("heartbeat"; into draining, "heartbeat: " and hb.StatusReason
//     when the agent says why) and old → new boot id ("agent restarted"); on a new boot,
//     every live sandbox of the agent that hb does not list becomes lost (AGT-6),
//     and its create-failure count and quarantine are cleared (PLC-9: the failures were the
//     old process's), with the event "quarantined → active" if it was quarantined;
//   - it applies hb.Ended: each listed sandbox that exists, belongs to hb.AgentID and is not
//     terminal moves to its (terminal) state, actor "agent/<id>". Unknown ids, other agents'
//     sandboxes and non-terminal states are ignored, so a retried list is harmless;
//   - it moves to running every starting or resuming sandbox of the agent that agent_held
//     lists not Starting (LIF-1, PAUSE-1);
//   - it nets (LED-4) the agent's reservations for sandboxes agent_held lists, and every
//     reservation, of any agent, whose sandbox is terminal, each with the event held → netted;
//   - on first sight or a status change it notifies WatchAgents listeners on commit (PLC-5).
//
// The agent row is created (if new) and locked before it is read, so concurrent heartbeats of
// one agent, and Reserves against it, run one after the other. A paused sandbox has no agent
// (agent_id ""), so no heartbeat and no restart touches it (PAUSE-1). The result's Agent is the
// row as written, without its held list.
func (s *Store) RecordHeartbeat(ctx context.Context, hb berth.Heartbeat, credHash string, now time.Time) (berth.HeartbeatResult, error) {
	if hb.AgentID == "" {
		return berth.HeartbeatResult{}, s.errorf("heartbeat: empty agent id")
	}
	reported := hb.Status
	if reported == "" {
		reported = berth.AgentActive
	}
	ended, err := listJSON(hb.Ended)
	if err != nil {
		return berth.HeartbeatResult{}, err
	}
	actor := "agent/" + hb.AgentID
	if s.d.Pipelines && hb.Delta && hb.Seq > 0 && hb.BaseSeq > 0 {
		res, err := s.recordDelta(ctx, hb, credHash, reported, ended, actor, now)
		if !errors.Is(err, errNotUsual) {
			return res, err
		}
	}
	var res berth.HeartbeatResult
	err = s.inTx(ctx, func(tx *Tx) error {
		res = berth.HeartbeatResult{}
		// A heartbeat of an agent an admin revoked, or sent under a credential a rejoin
		// revoked, is not applied, not even one that was on its way while the revoke ran
		// (TRUST-1: it is treated as silent).
		if err := s.checkCredential(ctx, tx, hb.AgentID, credHash); err != nil {
			return err
		}
		// Create a placeholder row if the agent is new: the insert (or, for a known agent,
		// the FOR UPDATE below) locks the row, so "first sight" is decided exactly once.
		var inserted bool
		err := tx.queryRow(ctx, `INSERT INTO agents (id, status, last_seen) VALUES (?, '', ?)
			ON CONFLICT (id) DO NOTHING RETURNING TRUE`, hb.AgentID, ms(now)).Scan(&inserted)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return s.errorf("heartbeat of %q: %w", hb.AgentID, err)
		}
		known := !inserted
		if !known && hb.Delta {
			// A delta from an agent the store does not know has no base; the placeholder
			// row must not stay behind either.
			return errResync
		}
		var oldStatus, oldBoot, drain, heldBoot string
		var oldSeq, heldSeq int64
		if err := tx.queryRow(ctx, `SELECT status, boot_id, drain_reason, heartbeat_seq, held_boot, held_seq FROM agents WHERE id = ?`+s.d.ForUpdate,
			hb.AgentID).Scan(&oldStatus, &oldBoot, &drain, &oldSeq, &heldBoot, &heldSeq); err != nil {
			return s.errorf("heartbeat of %q: %w", hb.AgentID, err)
		}
		if known && hb.Overtaken(oldBoot, oldSeq) {
			// Overtaken: a newer heartbeat of the same boot is already applied (this one's
			// POST was slow). Its figures are out of date; only its ended list is news.
			res.Resync = true // the agent's base is not what the store holds
			return s.applyEnded(ctx, tx, hb, actor, now)
		}
		if hb.Delta && (heldBoot != hb.BootID || hb.BaseSeq <= 0 || heldSeq != hb.BaseSeq) {
			// A delta onto a base the store does not hold (a lost answer, a restart of the
			// agent, or a replica of the previous release wrote in between): whole list next.
			res.Resync = true
			return s.applyEnded(ctx, tx, hb, actor, now)
		}
		if err := s.writeHeld(ctx, tx, hb, known && oldBoot == hb.BootID, actor, now); err != nil {
			return err
		}
		status := reported
		if drain != "" {
			status = berth.AgentDraining
		}
		_, err = tx.exec(ctx, updateAgentSQL+` WHERE id = ?`, append(updateAgentArgs(hb, reported, ended, now), hb.AgentID)...)
		if err != nil {
			return s.errorf("heartbeat of %q: %w", hb.AgentID, err)
		}
		ev := berth.Event{At: now, Entity: actor, Actor: actor}
		switch {
		case !known:
			ev.From, ev.To, ev.Reason = "", string(status), "registered"
		case oldStatus != string(status):
			ev.From, ev.To, ev.Reason = oldStatus, string(status), "heartbeat"
			if hb.StatusReason != "" && status == berth.AgentDraining {
				ev.Reason += ": " + hb.StatusReason // why the agent drains itself
			}
		}
		if ev.Reason != "" {
			if err := s.insertEvent(ctx, tx, ev); err != nil {
				return err
			}
			if err := s.d.NotifyAgent(ctx, tx, hb.AgentID); err != nil {
				return err
			}
		}
		if known && oldBoot != hb.BootID {
			ev.From, ev.To, ev.Reason = oldBoot, hb.BootID, "agent restarted"
			if err := s.insertEvent(ctx, tx, ev); err != nil {
				return err
			}
			if err := s.loseUnheld(ctx, tx, hb, actor, now); err != nil {
				return err
			}
			if err := s.clearQuarantine(ctx, tx, hb.AgentID, actor, now); err != nil {
				return err
			}
		}
		if err := s.applyEnded(ctx, tx, hb, actor, now); err != nil {
			return err
		}
		if err := s.promoteRunning(ctx, tx, hb, actor, now); err != nil {
			return err
		}
		if res.Netted, err = s.netReservations(ctx, tx, hb, actor, now); err != nil {
			return err
		}
		res.Applied = true
		res.Agent, err = s.scanAgent(tx.queryRow(ctx, `SELECT `+agentColumns+` FROM agents WHERE id = ?`, hb.AgentID))
		return err
	})
	if errors.Is(err, errResync) {
		return berth.HeartbeatResult{Resync: true}, nil
	}
	if err != nil {
		return berth.HeartbeatResult{}, err
	}
	return res, nil
}

// errResync rolls back RecordHeartbeat's transaction for a delta from an unknown agent.
var errResync = errors.New("delta without a base")

// heldBatch is how many agent_held rows one INSERT writes.
const heldBatch = 100

// writeHeld brings agent_held to what hb lists (issue 16, goal 2) and writes the OOM kill
// events (C09) against the rows it replaces when sameBoot (a new boot has no baseline). A
// whole list is compared with the stored rows and only the differences are written; a delta
// writes its listed rows (reading first the stored OOM count of those that report kills) and
// deletes its Removed ones.
func (s *Store) writeHeld(ctx context.Context, tx *Tx, hb berth.Heartbeat, sameBoot bool, actor string, now time.Time) error {
	var before []berth.HeldSandbox
	var gone []string
	put := hb.Sandboxes
	if !hb.Delta {
		old, err := s.heldRows(ctx, tx, hb.AgentID, nil)
		if err != nil {
			return err
		}
		listed := make(map[string]berth.HeldSandbox, len(hb.Sandboxes))
		for _, h := range hb.Sandboxes {
			listed[h.ID] = h
		}
		stored := make(map[string]bool, len(old))
		for _, o := range old {
			stored[o.ID] = true
			if h, ok := listed[o.ID]; !ok {
				gone = append(gone, o.ID)
			} else if h == o {
				delete(listed, o.ID) // unchanged: nothing to write
			}
		}
		put = make([]berth.HeldSandbox, 0, len(listed))
		for _, h := range hb.Sandboxes {
			if _, ok := listed[h.ID]; ok {
				put = append(put, h)
				delete(listed, h.ID) // a duplicated id is written once
			}
		}
		before = old
	} else {
		gone = hb.Removed
		var killed []string
		for _, h := range hb.Sandboxes {
			if h.OOMKills > 0 {
				killed = append(killed, h.ID)
			}
		}
		if sameBoot && len(killed) > 0 {
			old, err := s.heldRows(ctx, tx, hb.AgentID, killed)
			if err != nil {
				return err
			}
			before = old
		}
	}
	if sameBoot {
		if err := s.oomEvents(ctx, tx, before, put, actor, now); err != nil {
			return err
		}
	}
	b := &batch{}
	s.queueHeld(b, hb.AgentID, gone, put)
	if len(b.queries) == 0 {
		return nil
	}
	res := tx.send(ctx, b)
	for range b.queries {
		if _, err := res.Exec(); err != nil {
			res.Close()
			return s.errorf("held sandboxes of %q: %w", hb.AgentID, err)
		}
	}
	if err := res.Close(); err != nil {
		return s.errorf("held sandboxes of %q: %w", hb.AgentID, err)
	}
	return nil
}

// queueHeld queues on b the statements that bring agent's agent_held rows to a heartbeat's
// news: delete those of gone, upsert those of put (one row per id, heldBatch rows a
// statement). Each statement answers as an Exec.
func (s *Store) queueHeld(b *batch, agent string, gone []string, put []berth.HeldSandbox) {
	for start := 0; start < len(gone); start += inChunk {
		cond, args := s.in("sandbox_id", gone[start:min(start+inChunk, len(gone))])
		b.queue(`DELETE FROM agent_held WHERE agent_id = ? AND `+cond, append([]any{agent}, args...)...)
	}
	seen := make(map[string]bool, len(put))
	rows := make([]berth.HeldSandbox, 0, len(put))
	for _, h := range put {
		if h.ID != "" && !seen[h.ID] { // one row per id: a repeated id in one statement is an error
			seen[h.ID] = true
			rows = append(rows, h)
		}
	}
	for start := 0; start < len(rows); start += heldBatch {
		chunk := rows[start:min(start+heldBatch, len(rows))]
		args := make([]any, 0, 7*len(chunk))
		for _, h := range chunk {
			args = append(args, agent, h.ID, h.ResidentMiB, h.Measured, h.Starting, h.OOMKills, h.Incarnation)
		}
		b.queue(`INSERT INTO agent_held (agent_id, sandbox_id, resident_mb, measured, starting, oom_kills, incarnation) VALUES `+
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?, ?, ?, ?), ", len(chunk)), ", ")+
			` ON CONFLICT (agent_id, sandbox_id) DO UPDATE SET resident_mb = excluded.resident_mb,
				measured = excluded.measured, starting = excluded.starting, oom_kills = excluded.oom_kills,
				incarnation = excluded.incarnation`, args...)
	}
}

// heldRows reads agent's agent_held rows: all of them when ids is nil, else those of ids.
func (s *Store) heldRows(ctx context.Context, q interface {
	query(ctx context.Context, query string, args ...any) (Rows, error)
}, agent string, ids []string) ([]berth.HeldSandbox, error) {
	query := `SELECT sandbox_id, resident_mb, measured, starting, oom_kills, incarnation FROM agent_held WHERE agent_id = ?`
	args := []any{agent}
	if ids != nil {
		cond, more := s.in("sandbox_id", ids)
		query += ` AND ` + cond
		args = append(args, more...)
	}
	rows, err := q.query(ctx, query+` ORDER BY sandbox_id`, args...)
	if err != nil {
		return nil, s.errorf("held sandboxes of %q: %w", agent, err)
	}
	return s.scanHeld(rows, agent)
}

// scanHeld reads agent_held rows (sandbox_id, resident_mb, measured, starting, oom_kills,
// incarnation) of agent, and closes rows.
func (s *Store) scanHeld(rows Rows, agent string) ([]berth.HeldSandbox, error) {
	defer rows.Close()
	out := []berth.HeldSandbox{}
	for rows.Next() {
		var h berth.HeldSandbox
		if err := rows.Scan(&h.ID, &h.ResidentMiB, &h.Measured, &h.Starting, &h.OOMKills, &h.Incarnation); err != nil {
			return nil, s.errorf("held sandboxes of %q: %w", agent, err)
		}
		out = append(out, h)
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("held sandboxes of %q: %w", agent, err)
	}
	return out, nil
}

// applyEnded moves the sandboxes hb.Ended lists to their terminal states. Each row is locked
// before its owner is judged, so a sandbox a concurrent MoveSandbox hands to another agent is
// not ended by its former one (PAUSE-1, SPOT-3).
func (s *Store) applyEnded(ctx context.Context, tx *Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	for _, e := range hb.Ended {
		if !e.State.Terminal() {
			continue
		}
		var owner string
		err := tx.queryRow(ctx, `SELECT agent_id FROM sandboxes WHERE id = ?`+s.d.ForUpdate, e.ID).Scan(&owner)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return s.errorf("ended sandbox %q: %w", e.ID, err)
		}
		if owner != hb.AgentID {
			continue
		}
		if _, err := s.transitionTx(ctx, tx, e.ID, nil, e.State, nil, e.Reason, actor, now); err != nil {
			return err
		}
	}
	return nil
}

// promoteRunning moves to running every starting or resuming sandbox of this agent that
// agent_held (just brought up to date) lists and not as Starting: the agent runs it, whatever
// became of the replica that was starting or resuming it (LIF-1, PAUSE-1). It reads only the
// agent's starting and resuming rows (usually none), not every held sandbox, and locks them,
// so a row a concurrent MoveSandbox hands to another agent is re-read and skipped.
func (s *Store) promoteRunning(ctx context.Context, tx *Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	ids, err := s.queryIDs(ctx, tx, `SELECT id FROM sandboxes WHERE agent_id = ? AND state IN `+inPromoted+` ORDER BY id`+s.d.ForUpdate,
		append([]any{hb.AgentID}, promotedStates...)...)
	if err != nil {
		return s.errorf("promote for %q: %w", hb.AgentID, err)
	}
	if len(ids) == 0 {
		return nil
	}
	held, err := s.heldRows(ctx, tx, hb.AgentID, ids)
	if err != nil {
		return err
	}
	for _, h := range held {
		if h.Starting { // a guest still starting (or restoring) does not run yet
			continue
		}
		if _, err := s.transitionTx(ctx, tx, h.ID, promotedFrom, berth.SandboxRunning, nil,
			"agent reports it running", actor, now); err != nil {
			return err
		}
	}
	return nil
}

// promotedFrom lists the states a listed sandbox leaves for running (promoteRunning), and
// promotedStates the same for SQL IN clauses (inPromoted).
var (
	promotedFrom   = []berth.SandboxState{berth.SandboxStarting, berth.SandboxResuming}
	promotedStates = []any{string(berth.SandboxStarting), string(berth.SandboxResuming)}
	inPromoted     = "(" + placeholders(len(promotedStates)) + ")"
)

// loseUnheld marks lost every live sandbox the store assigns to a restarted agent that its
// first heartbeat after the restart does not list (AGT-6): a new boot holds nothing the
// old one did not hand over, so "running" would be a lie. The rows are locked as they are
// read, so one a concurrent MoveSandbox hands to another agent (or pauses) is skipped.
func (s *Store) loseUnheld(ctx context.Context, tx *Tx, hb berth.Heartbeat, actor string, now time.Time) error {
	listed := make(map[string]bool, len(hb.Sandboxes))
	for _, h := range hb.Sandboxes {
		listed[h.ID] = true
	}
	ids, err := s.queryIDs(ctx, tx, `SELECT id FROM sandboxes WHERE agent_id = ? AND state NOT IN `+inTerminal+` ORDER BY id`+s.d.ForUpdate,
		append([]any{hb.AgentID}, terminalStates...)...)
	if err != nil {
		return s.errorf("reconcile %q: %w", hb.AgentID, err)
	}
	for _, id := range ids {
		if listed[id] {
			continue
		}
		if _, err := s.transitionTx(ctx, tx, id, nil, berth.SandboxLost, nil, "agent restarted without it", actor, now); err != nil {
			return err
		}
	}
	return nil
}

// netReservations implements LED-4 for one heartbeat and returns how many reservations it
// released: the agent's reservations for sandboxes agent_held lists, or whose sandbox is
// terminal.
func (s *Store) netReservations(ctx context.Context, tx *Tx, hb berth.Heartbeat, actor string, now time.Time) (int, error) {
	rows, err := tx.query(ctx, nettableSQL, nettableArgs(hb)...)
	if err != nil {
		return 0, s.errorf("netting for %q: %w", hb.AgentID, err)
	}
	done, err := s.nettable(rows, hb, actor)
	if err != nil {
		return 0, err
	}
	return s.net(ctx, tx, done, actor, now)
}

// nettableSQL reads the reservations a heartbeat of agent ? may net (netReservations): the
// agent's own, with their sandbox's state and whether agent_held lists it. Only the agent's
// own, through the reservations' agent_id index: a heartbeat costs what its agent has, not
// what the fleet has (issue 16, goal 2). It used to read every reservation of a terminal
// sandbox too, fleet-wide, which made PostgreSQL scan the whole ledger on every heartbeat;
// such a reservation is rare — a terminal transition releases its sandbox's reservations in
// the same transaction, so only one inserted concurrently with it is left — and its own
// agent's next heartbeat nets it, or the TTL sweep (LED-2) when that agent is gone.
var nettableSQL = `
	SELECT r.id, r.agent_id, r.sandbox_id, COALESCE(s.state, ''), h.sandbox_id IS NOT NULL
	FROM reservations r LEFT JOIN sandboxes s ON s.id = r.sandbox_id
		LEFT JOIN agent_held h ON h.agent_id = r.agent_id AND h.sandbox_id = r.sandbox_id
	WHERE r.agent_id = ?
	ORDER BY r.id`

func nettableArgs(hb berth.Heartbeat) []any { return []any{hb.AgentID} }

// nettable reads nettableSQL's rows (and closes them) into the reservations hb nets, each
// with the reason of its event: listed by hb's agent, or of a terminal sandbox.
func (s *Store) nettable(rows Rows, hb berth.Heartbeat, actor string) (map[string]string, error) {
	defer rows.Close()
	reasons := map[string]string{}
	for rows.Next() {
		var id, agent, sid, state string
		var held bool
		if err := rows.Scan(&id, &agent, &sid, &state, &held); err != nil {
			return nil, s.errorf("netting for %q: %w", hb.AgentID, err)
		}
		switch {
		case agent == hb.AgentID && sid != "" && held:
			reasons[id] = fmt.Sprintf("sandbox/%s listed by %s", sid, actor)
		case berth.SandboxState(state).Terminal():
			reasons[id] = fmt.Sprintf("sandbox/%s %s", sid, state)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, s.errorf("netting for %q: %w", hb.AgentID, err)
	}
	return reasons, nil
}

// net deletes the reservations of done (id → reason) that are still there, each with its
// event held → netted, and returns how many it deleted.
func (s *Store) net(ctx context.Context, tx *Tx, done map[string]string, actor string, now time.Time) (int, error) {
	if len(done) == 0 {
		return 0, nil
	}
	ids := make([]string, 0, len(done))
	for id := range done {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	cond, args := s.in("id", ids)
	return s.dropReservations(ctx, tx, `DELETE FROM reservations WHERE `+cond+` RETURNING id`, args,
		func(id string) berth.Event {
			return berth.Event{At: now, Entity: "reservation/" + id, From: resHeld, To: resNetted, Reason: done[id], Actor: actor}
		})
}

// oomEvents writes an event for every sandbox in which the kernel OOM killer struck since the
// agent's previous heartbeat (C09): the sandbox may live on, but it must not go unseen. before
// holds the stored rows (at least those of now that report kills).
func (s *Store) oomEvents(ctx context.Context, tx *Tx, before, now []berth.HeldSandbox, actor string, at time.Time) error {
	for id, n := range berth.NewOOMKills(before, now) {
		if err := s.insertEvent(ctx, tx, berth.Event{At: at, Entity: "sandbox/" + id, From: string(berth.SandboxRunning),
			To: berth.EventOOMKill, Reason: fmt.Sprintf("the kernel OOM killer killed %d process(es) in it", n), Actor: actor}); err != nil {
			return err
		}
	}
	return nil
}

// clearQuarantine resets an agent's create-failure count and quarantine when it restarts
// (issue 15, point 5): the failures belonged to the process that is gone. If a quarantine
// was still in force at now it writes "quarantined → active" ("agent restarted") and
// notifies WatchAgents listeners.
func (s *Store) clearQuarantine(ctx context.Context, tx *Tx, id, actor string, now time.Time) error {
	var failures int
	var until sql.NullInt64
	if err := tx.queryRow(ctx, `SELECT create_failures, quarantined_until FROM agents WHERE id = ?`, id).
		Scan(&failures, &until); err != nil {
		return s.errorf("restart of %q: %w", id, err)
	}
	if failures == 0 && !until.Valid {
		return nil
	}
	if _, err := tx.exec(ctx, `UPDATE agents SET create_failures = 0, quarantined_until = NULL WHERE id = ?`, id); err != nil {
		return s.errorf("restart of %q: %w", id, err)
	}
	if !fromNullMS(until).After(now) {
		return nil
	}
	if err := s.insertEvent(ctx, tx, berth.Event{At: now, Entity: "agent/" + id, From: string(berth.AgentQuarantined), To: string(berth.AgentActive),
		Reason: "agent restarted: its create failures were the old process's", Actor: actor}); err != nil {
		return err
	}
	return s.d.NotifyAgent(ctx, tx, id)
}
