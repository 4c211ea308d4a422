package main

import (
	"context"
	"strings"
	"time"
	"unicode"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// completionBudget bounds one completion's call to the server: a shell waits for it at every
// Tab, so it tries once, for at most this long, and prints nothing when it fails.
const completionBudget = 3 * time.Second

// maxCompletions caps how many ids one Tab offers (the newest first, as the API lists them).
const maxCompletions = 500

// completeFromServer completes a command's first argument with the ids list reads from the
// server that --url/--key name (cobra's `berth completion bash|zsh|fish` scripts call it
// through the hidden __complete command). Any failure — no key, an unreachable server, a
// refusal — completes nothing, silently.
func completeFromServer(cf *clientFlags, list func(context.Context, *client.Client) ([]string, error)) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		quiet := *cf
		quiet.stderr, quiet.wait = nil, 0
		c, err := quiet.client()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionBudget)
		defer cancel()
		ids, err := list(ctx, c)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []cobra.Completion
		for _, id := range ids {
			// An id with a control character cannot be typed and would reach the shell's
			// list of choices raw: it is left out.
			if strings.HasPrefix(id, toComplete) && !strings.ContainsFunc(id, unicode.IsControl) && len(out) < maxCompletions {
				out = append(out, id)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}

// sandboxIDs completes any sandbox the key sees (`get` and `events` read ended ones too).
func sandboxIDs(ctx context.Context, c *client.Client) ([]string, error) {
	return sandboxIDsWhere(ctx, c, func(berth.SandboxState) bool { return true })
}

// liveSandboxIDs completes the sandboxes a command can still act on: not in a terminal state
// (exec, files, pause, resume, kill).
func liveSandboxIDs(ctx context.Context, c *client.Client) ([]string, error) {
	return sandboxIDsWhere(ctx, c, func(st berth.SandboxState) bool { return !st.Terminal() })
}

func sandboxIDsWhere(ctx context.Context, c *client.Client, keep func(berth.SandboxState) bool) ([]string, error) {
	sbs, err := c.Sandboxes(ctx, "")
	ids := make([]string, 0, len(sbs))
	for _, s := range sbs {
		if keep(s.State) {
			ids = append(ids, s.ID)
		}
	}
	return ids, err
}

func agentIDs(ctx context.Context, c *client.Client) ([]string, error) {
	as, err := c.AgentCounts(ctx)
	ids := make([]string, 0, len(as))
	for _, a := range as {
		ids = append(ids, a.AgentID)
	}
	return ids, err
}

func appNames(ctx context.Context, c *client.Client) ([]string, error) {
	apps, err := c.Apps(ctx)
	names := make([]string, 0, len(apps))
	for _, a := range apps {
		names = append(names, a.Name)
	}
	return names, err
}

// eventEntities completes `berth events ENTITY`: the kinds ("sandbox/", "agent/", "app/")
// until one is typed, then that kind's ids.
func eventEntities(toComplete string) func(context.Context, *client.Client) ([]string, error) {
	return func(ctx context.Context, c *client.Client) ([]string, error) {
		kind, _, found := strings.Cut(toComplete, "/")
		if !found {
			return []string{"sandbox/", "agent/", "app/"}, nil
		}
		var list func(context.Context, *client.Client) ([]string, error)
		switch kind {
		case "sandbox":
			list = sandboxIDs
		case "agent":
			list = agentIDs
		case "app":
			list = appNames
		default:
			return nil, berth.Errorf(berth.EInvalidRequest, "no entity kind %q", kind)
		}
		ids, err := list(ctx, c)
		for i := range ids {
			ids[i] = kind + "/" + ids[i]
		}
		return ids, err
	}
}

// completeWith sets fn as the first-argument completion of every command in cmds.
func completeWith(fn cobra.CompletionFunc, cmds ...*cobra.Command) {
	for _, c := range cmds {
		c.ValidArgsFunction = fn
	}
}
