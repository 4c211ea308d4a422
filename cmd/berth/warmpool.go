package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/berth-dev/berth/agent"
	"github.com/spf13/pflag"
)

// warmPoolFlag is --warm-pool (issue 16, goal 5): TEMPLATE=COUNT[:MEMORY_MB], comma
// separated, e.g. "shell=2,python=1" or "ml=1:4096". The memory size is the one creates
// must ask for to be served warm; it defaults to the built-in template's (shell 256 MiB,
// python 512 MiB) and is required for any other template. "" or "none": no pool.
type warmPoolFlag struct{ entries *[]agent.WarmPoolEntry }

func (f warmPoolFlag) Type() string { return "TEMPLATE=COUNT[:MB],..." }

func (f warmPoolFlag) String() string {
	if f.entries == nil || len(*f.entries) == 0 {
		return ""
	}
	parts := make([]string, 0, len(*f.entries))
	for _, e := range *f.entries {
		parts = append(parts, fmt.Sprintf("%s=%d:%d", e.Template, e.Size, e.MemoryMiB))
	}
	return strings.Join(parts, ",")
}

func (f warmPoolFlag) Set(s string) error {
	entries, err := parseWarmPool(s)
	if err != nil {
		return err
	}
	*f.entries = entries
	return nil
}

// parseWarmPool parses --warm-pool's value; the agent validates the rest (sizes 0..64, a
// template named once). An error says what form is wanted, for usageText to show after
// "want" (`--warm-pool "nope=abc": want TEMPLATE=COUNT[:MEMORY_MB] with COUNT a whole number
// ≥ 0, e.g. shell=2`), never the value again; in a list of several entries it names the one
// at fault.
func parseWarmPool(s string) ([]agent.WarmPoolEntry, error) {
	s = strings.TrimSpace(s)
	if s == "" || s == "none" {
		return nil, nil
	}
	parts := strings.Split(s, ",")
	var out []agent.WarmPoolEntry
	for _, part := range parts {
		part = strings.TrimSpace(part)
		bad := func(format string, args ...any) error {
			msg := fmt.Sprintf(format, args...)
			switch {
			case len(parts) == 1:
			case part == "":
				msg += " (an entry is empty)"
			default:
				msg += fmt.Sprintf(" (entry %q)", part)
			}
			return errors.New(msg)
		}
		name, spec, ok := strings.Cut(part, "=")
		if !ok || name == "" {
			return nil, bad("TEMPLATE=COUNT[:MEMORY_MB], comma-separated, e.g. shell=2,python=1")
		}
		countText, memText, hasMem := strings.Cut(spec, ":")
		count, err := strconv.Atoi(countText)
		if err != nil || count < 0 {
			return nil, bad("TEMPLATE=COUNT[:MEMORY_MB] with COUNT a whole number ≥ 0, e.g. shell=2")
		}
		e := agent.WarmPoolEntry{Template: name, Size: count}
		switch {
		case hasMem:
			if e.MemoryMiB, err = strconv.ParseInt(memText, 10, 64); err != nil || e.MemoryMiB <= 0 {
				return nil, bad("TEMPLATE=COUNT:MEMORY_MB with MEMORY_MB a positive number of MiB, e.g. %s=%d:1024", name, count)
			}
		default:
			var builtIn []string
			for _, t := range devTemplates {
				builtIn = append(builtIn, t.Name)
				if t.Name == name {
					e.MemoryMiB = t.MemoryMiB
				}
			}
			if e.MemoryMiB == 0 {
				return nil, bad("%s=%d:MEMORY_MB: %s is not a built-in template (%s), so give its memory size in MiB, e.g. %s=%d:1024",
					name, count, name, strings.Join(builtIn, ", "), name, count)
			}
		}
		out = append(out, e)
	}
	return out, nil
}

// registerWarmPool adds --warm-pool to f, for `berth agent` and `berth dev`.
func registerWarmPool(f *pflag.FlagSet, entries *[]agent.WarmPoolEntry) {
	f.Var(warmPoolFlag{entries}, "warm-pool", "sandboxes to keep started ahead of demand per template on each agent, "+
		"TEMPLATE=COUNT[:MEMORY_MB],… e.g. shell=2,python=1 (memory defaults to the built-in template's; "+
		"a create of that template and size is served at once; the pool yields its memory to any create that needs it). Default: none")
}
