package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/berth-dev/berth"
)

// updateAgentSQL writes a heartbeat's fields into its agent's row (RecordHeartbeat); its
// arguments are updateAgentArgs', and the caller appends the WHERE clause. The stored status
// is draining while an operator drain is in force, else the reported one.
const updateAgentSQL = `
	UPDATE agents SET address = ?, region = ?, pool = ?, preemptible = ?, heartbeat_at = ?,
		status = CASE WHEN drain_reason <> '' THEN ? ELSE ? END, reported_status = ?,
		cpu_total = ?, cpu_used = ?, memory_mb_total = ?,
		memory_mb_used = ?, memory_mb_committed = ?, memory_admission = ?,
		memory_mb_admittable = ?, intake_open = ?, memory_pressure = ?, starts_in_flight = ?,
		ended = ?, version = ?,
		boot_id = ?, measurement_errors = ?, last_seen = ?, runtime = ?, checkpoint = ?,
		heartbeat_seq = ?, held_boot = ?, held_seq = ?`

func updateAgentArgs(hb berth.Heartbeat, reported berth.AgentStatus, ended any, now time.Time) []any {
	return []any{hb.Address, hb.Region, hb.Pool, hb.Preemptible, nullMS(hb.HeartbeatAt),
		string(berth.AgentDraining), string(reported), string(reported),
		hb.CPUTotal, hb.CPUUsed, hb.MemoryMiBTotal, hb.MemoryMiBUsed,
		hb.MemoryMiBCommitted, hb.MemoryAdmission, hb.MemoryMiBAdmittable, hb.IntakeOpen,
		hb.MemoryPressure, hb.StartsInFlight, ended,
		hb.Version, hb.BootID, hb.MeasurementErrors, ms(now), hb.Runtime, hb.Checkpoint, hb.Seq,
		hb.BootID, hb.Seq}
}

// usualWhere limits updateAgentSQL to the usual delta heartbeat (recordDelta): a known agent
// of the same boot, not overtaken (its Seq above the applied one), whose agent_held holds the
// delta's base, and whose stored status the heartbeat leaves as it is.
const usualWhere = ` WHERE id = ? AND boot_id = ? AND heartbeat_seq < ? AND held_boot = ? AND held_seq = ?
	AND status = CASE WHEN drain_reason <> '' THEN ? ELSE ? END RETURNING ` + agentColumns

// promotableSQL reads, and locks, the agent's starting or resuming sandboxes that agent_held
// lists as no longer starting: those promoteRunning moves to running. It is driven by the
// sandboxes' (agent_id, state) index, usually empty, and probes agent_held by its key only for
// what that finds (a join let SQLite scan all of an agent's held rows: 1.7x slower at 1,000).
var promotableSQL = `SELECT s.id FROM sandboxes s WHERE s.agent_id = ? AND s.state IN ` + inPromoted + `
	AND EXISTS (SELECT 1 FROM agent_held h WHERE h.agent_id = s.agent_id AND h.sandbox_id = s.id AND NOT h.starting)
	ORDER BY s.id`

// errNotUsual rolls recordDelta's transaction back: the heartbeat is not the usual kind, and
// RecordHeartbeat's general path takes it.
var errNotUsual = errors.New("not the usual delta heartbeat")

// recordDelta is RecordHeartbeat for the usual heartbeat of a fleet (issue 16, goal 2): a
// delta of a known agent, same boot, in order, onto the base the store holds, that changes no
// status and reports no OOM kill. Everything it writes and reads goes in one batch — the agent
// row's update (which locks it, and answers the row as written), the agent_held rows it
// changes, the sandboxes it promotes to running and the reservations it may net — so a
// heartbeat is BEGIN, one round trip and COMMIT on PostgreSQL, plus a statement per sandbox
// that ended, started or was netted. What it writes is what the general path writes for the
// same heartbeat, to the event. Anything else answers errNotUsual with nothing written.
func (s *Store) recordDelta(ctx context.Context, hb berth.Heartbeat, credHash string, reported berth.AgentStatus, ended any, actor string, now time.Time) (berth.HeartbeatResult, error) {
	for _, h := range hb.Sandboxes {
		if h.OOMKills > 0 {
			return berth.HeartbeatResult{}, errNotUsual // the kill events need the stored counts
		}
	}
	var res berth.HeartbeatResult
	err := s.inTx(ctx, func(tx *Tx) error {
		res = berth.HeartbeatResult{}
		// One batch: the agent row, agent_held, then what to promote and to net. The general
		// path ends the Ended sandboxes before it reads those; here they end after the read,
		// which changes nothing: a promotion is guarded by the state it leaves (an ended
		// sandbox is not promoted) and an end releases its sandbox's reservation itself (so
		// netting finds it gone). testUsualDeltaKeepsOrder pins it.
		b := &batch{}
		// First the agent id's credential lock, its admin revokes and the credential's
		// liveness (checkCredential).
		locks := s.queueLockName(b, agentCredLock+hb.AgentID, exclusive)
		b.queue(credentialCheckSQL, credentialCheckArgs(hb.AgentID, credHash)...)
		checks := len(b.queries)
		b.queue(updateAgentSQL+usualWhere, append(updateAgentArgs(hb, reported, ended, now),
			hb.AgentID, hb.BootID, hb.Seq, hb.BootID, hb.BaseSeq, string(berth.AgentDraining), string(reported))...)
		s.queueHeld(b, hb.AgentID, hb.Removed, hb.Sandboxes)
		writes := len(b.queries) - checks - 1 // the agent_held statements after the UPDATE
		b.queue(promotableSQL+s.d.ForUpdate, append([]any{hb.AgentID}, promotedStates...)...)
		b.queue(nettableSQL, nettableArgs(hb)...)
		out := tx.send(ctx, b)
		var err error
		for range locks {
			_, err = out.Exec()
		}
		var admin, live int
		if err == nil {
			err = out.QueryRow().Scan(&admin, &live)
		}
		if err == nil {
			if err := credentialVerdict(hb.AgentID, admin, live); err != nil {
				_ = out.Close()
				return err
			}
		}
		var a berth.Agent
		if err == nil {
			a, err = s.scanAgent(out.QueryRow())
		}
		if err == nil {
			for range writes {
				if _, err = out.Exec(); err != nil {
					break
				}
			}
		}
		var promote []string
		var done map[string]string
		if err == nil {
			promote, done, err = s.promotableAndNettable(out, hb, actor)
		}
		if cerr := out.Close(); err == nil && cerr != nil {
			err = cerr
		}
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return errNotUsual
		case err != nil:
			return s.errorf("heartbeat of %q: %w", hb.AgentID, err)
		}
		if err := s.applyEnded(ctx, tx, hb, actor, now); err != nil {
			return err
		}
		for _, id := range promote {
			if _, err := s.transitionTx(ctx, tx, id, promotedFrom, berth.SandboxRunning, nil,
				"agent reports it running", actor, now); err != nil {
				return err
			}
		}
		if res.Netted, err = s.net(ctx, tx, done, actor, now); err != nil {
			return err
		}
		res.Applied, res.Agent = true, a
		return nil
	})
	return res, err
}

// promotableAndNettable reads the two answers of recordDelta's reads: the sandboxes to
// promote to running and the reservations to net.
func (s *Store) promotableAndNettable(out BatchResults, hb berth.Heartbeat, actor string) ([]string, map[string]string, error) {
	rows, err := out.Query()
	if err != nil {
		return nil, nil, err
	}
	promote, err := collectIDs(rows)
	if err != nil {
		return nil, nil, err
	}
	if rows, err = out.Query(); err != nil {
		return nil, nil, err
	}
	done, err := s.nettable(rows, hb, actor)
	return promote, done, err
}

// collectIDs reads rows of one string each, and closes rows.
func collectIDs(rows Rows) ([]string, error) {
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			return nil, err
		}
		ids = append(ids, id)
	}
	return ids, rows.Err()
}
