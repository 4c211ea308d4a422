package main

import (
	"encoding/json"
	"fmt"
	"io"
	"reflect"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// Output formats of every list and get: `-o table|json|yaml` (issue 17, point 5). JSON and
// YAML carry the API's own field names (the JSON tags), so a script reads the same keys as
// the HTTP API documents; a list prints as an array ([] when empty, never null).
const (
	outTable = "table"
	outJSON  = "json"
	outYAML  = "yaml"
)

// table writes a value as a table: its header line, then one line per row, columns separated
// by tabs (aligned by a tabwriter).
type table func(w io.Writer)

// printer is the one printer behind every list and get: the -o flag it registered on its
// command and the format that command prints when -o is not given.
type printer struct{ format *string }

// withOutput registers -o/--output on cmd (default def: table for lists, json for a get whose
// callers already parse JSON) and refuses an unknown format before the command does anything
// (a create must not run and then fail to print). The flag completes to the three formats.
func withOutput(cmd *cobra.Command, def string) printer {
	p := printer{format: new(string)}
	cmd.Flags().StringVarP(p.format, "output", "o", def, "output format: table, json or yaml")
	_ = cmd.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{outTable, outJSON, outYAML}, cobra.ShellCompDirectiveNoFileComp))
	cmd.PreRunE = func(*cobra.Command, []string) error {
		switch *p.format {
		case outTable, outJSON, outYAML:
			return nil
		}
		return badInput("-o %q: want table, json or yaml", *p.format)
	}
	return p
}

// print writes v to cmd's stdout in the chosen format; t draws it as a table. A nil slice
// prints as an empty array.
func (p printer) print(cmd *cobra.Command, v any, t table) error {
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Slice && rv.IsNil() {
		v = reflect.MakeSlice(rv.Type(), 0, 0).Interface()
	}
	w := cmd.OutOrStdout()
	switch *p.format {
	case outJSON:
		return printJSON(w, v)
	case outYAML:
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		y, err := yaml.JSONToYAML(b)
		if err != nil {
			return err
		}
		_, err = w.Write(y)
		return err
	default:
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		t(tw)
		return tw.Flush()
	}
}

// row writes one table line: cells joined by tabs; an empty cell shows as "-" so columns
// stay aligned and awk sees as many fields on every line.
func row(w io.Writer, cells ...any) {
	parts := make([]string, len(cells))
	for i, c := range cells {
		s := fmt.Sprint(c)
		switch v := c.(type) {
		case time.Time:
			s = "-"
			if !v.IsZero() {
				s = v.Format(time.RFC3339)
			}
		case *time.Time:
			s = "-"
			if v != nil && !v.IsZero() {
				s = v.Format(time.RFC3339)
			}
		}
		if s == "" {
			s = "-"
		}
		parts[i] = printable(s)
	}
	fmt.Fprintln(w, strings.Join(parts, "\t"))
}

// printable makes s safe for one table cell on a terminal: a line break or tab becomes a
// space, and every other control character (ESC, BEL, C1 codes…) is shown escaped, as \x1b,
// as is every bidirectional control (U+202E RIGHT-TO-LEFT OVERRIDE…, as \u202e). Cells carry
// tenants' text (an app's output tail in its reason, metadata), and raw escapes would let one
// tenant rewrite or hide lines, set titles or write the clipboard in an operator's terminal;
// a bidi override would show the rest of the cell, and the cells after it, reordered. JSON
// and YAML escape the control characters already.
func printable(s string) string {
	if !strings.ContainsFunc(s, unsafeInCell) {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n' || r == '\r' || r == '\t':
			b.WriteByte(' ')
		case unicode.IsControl(r):
			fmt.Fprintf(&b, "\\x%02x", r)
		case unicode.Is(unicode.Bidi_Control, r):
			fmt.Fprintf(&b, "\\u%04x", r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// unsafeInCell reports a rune printable shows escaped: a control or bidi control character.
func unsafeInCell(r rune) bool { return unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) }

func sandboxTable(sbs ...berth.Sandbox) table {
	return func(w io.Writer) {
		row(w, "ID", "TEMPLATE", "STATE", "AGENT", "MEMORY_MB", "EXPIRES")
		for _, s := range sbs {
			row(w, s.ID, s.Template, s.State, s.AgentID, s.MemoryMiB, s.ExpiresAt)
		}
	}
}

func agentTable(as ...berth.Agent) table {
	return func(w io.Writer) {
		row(w, "ID", "STATUS", "ADMISSION", "TOTAL_MB", "USED_MB", "COMMITTED_MB", "ADMITTABLE_MB", "SANDBOXES", "LAST_SEEN_S")
		for _, a := range as {
			row(w, a.AgentID, a.Status, a.MemoryAdmission, a.MemoryMiBTotal, a.MemoryMiBUsed, a.MemoryMiBCommitted,
				a.MemoryMiBAdmittable, a.HeldCount, fmt.Sprintf("%.1f", a.LastSeenS))
		}
	}
}

func credentialTable(cs ...berth.AgentCredential) table {
	return func(w io.Writer) {
		row(w, "AGENT", "CREATED", "REVOKED", "BY")
		for _, k := range cs {
			revoked := time.Time{}
			if !k.Live() {
				revoked = k.RevokedAt
			}
			row(w, k.AgentID, k.CreatedAt, revoked, k.RevokedBy)
		}
	}
}

func eventTable(evs ...berth.Event) table {
	return func(w io.Writer) {
		row(w, "AT", "ENTITY", "FROM", "TO", "REASON", "ACTOR")
		for _, e := range evs {
			row(w, e.At.Format(time.RFC3339Nano), e.Entity, e.From, e.To, e.Reason, e.Actor)
		}
	}
}

func templateTable(ts ...berth.Template) table {
	return func(w io.Writer) {
		row(w, "NAME", "MEMORY_MB", "VCPUS")
		for _, t := range ts {
			row(w, t.Name, t.MemoryMiB, t.VCPUs)
		}
	}
}

func appTable(apps ...berth.App) table {
	return func(w io.Writer) {
		row(w, "NAME", "STATE", "DESIRED", "VERSION", "SERVING", "SANDBOX", "AGENT", "REASON")
		for _, a := range apps {
			row(w, a.Name, a.State, a.Desired, a.Version, a.ServingVersion, a.SandboxID, a.AgentID, a.Reason)
		}
	}
}

func quotaTable(q client.QuotaUsage) table {
	return func(w io.Writer) {
		row(w, "TENANT", "MAX_SANDBOXES", "MAX_MEMORY_MB", "SANDBOXES", "MEMORY_MB")
		row(w, q.Quota.Tenant, q.Quota.MaxSandboxes, q.Quota.MaxMemoryMiB, q.Sandboxes, q.MemoryMiB)
	}
}

func tenantTable(t berth.Tenant) table {
	return func(w io.Writer) {
		row(w, "TENANT", "CREATED")
		row(w, t.Name, t.CreatedAt)
	}
}

// apiKeyTable shows the secret too: `tenants key` is the one time it is shown.
func apiKeyTable(k client.APIKeySecret) table {
	return func(w io.Writer) {
		row(w, "ID", "TENANT", "ROLE", "KEY")
		row(w, k.ID, k.Tenant, k.Role, k.Key)
	}
}

func drainStatusTable(st berth.DrainStatus) table {
	return func(w io.Writer) {
		row(w, "AGENT", "DRAINING", "COMPLETE", "BLOCKED", "REMAINING", "DEADLINE")
		row(w, st.AgentID, st.Draining, st.Complete, st.Blocked, len(st.Remaining), st.Deadline)
	}
}
