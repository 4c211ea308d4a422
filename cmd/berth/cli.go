package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/spf13/cobra"
)

// exitError carries a sandboxed command's exit code out of `berth sandbox exec`.
type exitError struct{ code int }

func (e *exitError) Error() string { return fmt.Sprintf("command exited with code %d", e.code) }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func newSandboxCmd(cf *clientFlags) *cobra.Command {
	var createOut, listOut, getOut printer // -o, registered below with each command
	cmd := &cobra.Command{Use: "sandbox", Aliases: []string{"sandboxes", "sb"}, Short: "Create, inspect, exec in, pause, resume and kill sandboxes"}
	var req berth.CreateRequest
	var quiet bool
	create := &cobra.Command{
		Use:   "create TEMPLATE",
		Short: "Create a sandbox from a template (see `berth templates`); prints it as JSON",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			req.Template = args[0]
			sb, err := c.CreateSandbox(cmd.Context(), req)
			if err != nil {
				return err
			}
			if quiet {
				_, err := fmt.Fprintln(cmd.OutOrStdout(), sb.ID)
				return err
			}
			return createOut.print(cmd, sb, sandboxTable(sb))
		},
	}
	createOut = withOutput(create, outJSON)
	create.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only the sandbox id")
	create.Flags().Int64Var(&req.MemoryMiB, "memory-mb", 0, "memory, MiB, at least 64 (default: the template's)")
	create.Flags().Int64Var(&req.TTLSeconds, "ttl", 0, "time to live, seconds (default 3600)")
	create.Flags().BoolVar(&req.Stateful, "stateful", false, "stateful: charged in full, never evicted")

	var state string
	list := &cobra.Command{
		Use:   "list",
		Short: "List sandboxes",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if state != "" && !berth.SandboxState(state).Valid() { // say which, before asking anyone
				return badInput("--state %q: want one of %s", state, berth.SandboxStateList())
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			sbs, err := c.Sandboxes(cmd.Context(), berth.SandboxState(state))
			if err != nil {
				return err
			}
			return listOut.print(cmd, sbs, sandboxTable(sbs...))
		},
	}
	listOut = withOutput(list, outTable)
	list.Flags().StringVar(&state, "state", "", "only sandboxes in this state: "+berth.SandboxStateList())

	get := &cobra.Command{
		Use: "get ID", Short: "Show one sandbox", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			sb, err := c.Sandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return getOut.print(cmd, sb, sandboxTable(sb))
		},
	}
	getOut = withOutput(get, outJSON)

	var timeout int
	var withStdin bool
	exec := &cobra.Command{
		Use:   "exec ID [-i] -- CMD [ARG...]",
		Short: "Run a command in a sandbox; prints its output and exits with its exit code (1–255)",
		Long: "Run CMD in the sandbox, print its stdout and stderr as they are, and exit with its exit code.\n" +
			"With -i, berth reads its own standard input to the end first and gives it to CMD as its\n" +
			"stdin (text, up to the API's 1 MiB request); without -i, CMD's stdin is empty and berth\n" +
			"reads nothing. A failure of berth itself (no such sandbox, server unreachable, …) prints\n" +
			"one stderr line starting with \"berth: \" and exits 1, 2 or 3 (see berth --help).",
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			req := berth.ExecRequest{Cmd: args[1:], TimeoutS: timeout}
			if withStdin {
				if req.Stdin, err = execStdin(cmd.InOrStdin(), req); err != nil {
					return err
				}
			}
			res, err := c.Exec(cmd.Context(), args[0], req)
			if err != nil {
				return err
			}
			fmt.Fprint(cmd.OutOrStdout(), res.Stdout)
			fmt.Fprint(cmd.ErrOrStderr(), res.Stderr)
			if res.ExitCode != 0 {
				return &exitError{code: res.ExitCode}
			}
			return nil
		},
	}
	exec.Flags().IntVar(&timeout, "timeout", 0, "seconds before the command is killed (default 60)")
	exec.Flags().BoolVarP(&withStdin, "stdin", "i", false, "send standard input, read to its end, as the command's stdin (UTF-8 text; the request is at most 1 MiB)")

	write := &cobra.Command{
		Use: "write ID PATH", Short: "Write stdin to a file in the sandbox", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			data, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<20+1))
			if err != nil {
				return err
			}
			return c.WriteFile(cmd.Context(), args[0], args[1], data)
		},
	}
	read := &cobra.Command{
		Use: "read ID PATH", Short: "Print a file of the sandbox", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			data, err := c.ReadFile(cmd.Context(), args[0], args[1])
			if err != nil {
				return err
			}
			_, err = cmd.OutOrStdout().Write(data)
			return err
		},
	}
	pause := &cobra.Command{
		Use:   "pause ID",
		Short: "Checkpoint a running sandbox (processes, memory, /tmp) and free its host; prints it as JSON (PAUSE-1)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			sb, err := c.PauseSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), sb)
		},
	}
	resume := &cobra.Command{
		Use:   "resume ID",
		Short: "Place a paused sandbox again and restore it as it was; waits like create when the fleet is full (PAUSE-1)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			sb, err := c.ResumeSandbox(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), sb)
		},
	}
	kill := &cobra.Command{
		Use: "kill ID", Aliases: []string{"delete", "rm"}, Args: cobra.ExactArgs(1),
		Short: "Stop a sandbox (its record stays, state stopped; one that already ended is left as it is)",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			if err := c.DeleteSandbox(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), killReport(cmd.Context(), c, args[0]))
			return nil
		},
	}
	completeWith(completeFromServer(cf, sandboxIDs), get)
	completeWith(completeFromServer(cf, liveSandboxIDs), exec, write, read, pause, resume, kill)
	cmd.AddCommand(create, list, get, exec, write, read, pause, resume, kill)
	return cmd
}

func newAgentsCmd(cf *clientFlags) *cobra.Command {
	var listOut, statusOut, credsOut printer // -o, registered below with each command
	cmd := &cobra.Command{Use: "agents", Aliases: []string{"agent-list"}, Short: "Inspect the fleet's agents"}
	var heldCount bool
	list := &cobra.Command{
		Use: "list", Short: "List agents with their admission figures", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			// The table shows how many a host holds, so it asks for counts; -o json/yaml carry
			// the held lists, as GET /v1/agents does by default, unless --held-count.
			read := c.Agents
			if *listOut.format == outTable || heldCount {
				read = c.AgentCounts
			}
			as, err := read(cmd.Context())
			if err != nil {
				return err
			}
			return listOut.print(cmd, as, agentTable(as...))
		},
	}
	listOut = withOutput(list, outTable)
	list.Flags().BoolVar(&heldCount, "held-count", false, "in -o json/yaml, leave out the held lists and send only held_count (GET /v1/agents?held=count)")
	var reason string
	drain := &cobra.Command{
		Use: "drain ID", Short: "Cordon an agent: no new placements there (AGT-5)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			if err := c.DrainAgent(cmd.Context(), args[0], reason); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "draining", args[0])
			return nil
		},
	}
	drain.Flags().StringVar(&reason, "reason", "", "why (recorded in the event)")
	undrain := &cobra.Command{
		Use: "undrain ID", Short: "Lift a drain: the agent takes placements again", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			if err := c.UndrainAgent(cmd.Context(), args[0]); err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), "active", args[0])
			return nil
		},
	}
	status := &cobra.Command{
		Use: "drain-status ID", Short: "Is the agent's drain complete, and what blocks it past its deadline (C11, C12)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			st, err := c.DrainStatus(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return statusOut.print(cmd, st, drainStatusTable(st))
		},
	}
	statusOut = withOutput(status, outJSON)
	revoke := &cobra.Command{
		Use: "revoke ID", Short: "Revoke an agent's credential: its calls get 401, it goes silent and cannot rejoin under this id (TRUST-1)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			n, err := c.RevokeAgent(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked %s (%d live credential(s))\n", args[0], n)
			return nil
		},
	}
	creds := &cobra.Command{
		Use: "credentials", Short: "List agent credentials: agent, created, revoked (never the secret; TRUST-1)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			cs, err := c.AgentCredentials(cmd.Context())
			if err != nil {
				return err
			}
			return credsOut.print(cmd, cs, credentialTable(cs...))
		},
	}
	credsOut = withOutput(creds, outTable)
	completeWith(completeFromServer(cf, agentIDs), drain, undrain, status, revoke)
	cmd.AddCommand(list, drain, undrain, status, revoke, creds)
	return cmd
}

func newEventsCmd(cf *clientFlags) *cobra.Command {
	var out printer
	cmd := &cobra.Command{
		Use:   "events [ENTITY]",
		Short: "Show state transitions (LIF-3), e.g. `berth events sandbox/sb-1` or `berth events agent/`",
		Args:  cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			entity := ""
			if len(args) == 1 {
				entity = args[0]
			}
			evs, err := c.Events(cmd.Context(), entity)
			if err != nil {
				return err
			}
			return out.print(cmd, evs, eventTable(evs...))
		},
	}
	out = withOutput(cmd, outTable)
	cmd.ValidArgsFunction = func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		return completeFromServer(cf, eventEntities(toComplete))(c, args, toComplete)
	}
	return cmd
}

func newTemplatesCmd(cf *clientFlags) *cobra.Command {
	var out printer
	cmd := &cobra.Command{Use: "templates", Short: "List templates", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			ts, err := c.Templates(cmd.Context())
			if err != nil {
				return err
			}
			return out.print(cmd, ts, templateTable(ts...))
		},
	}
	out = withOutput(cmd, outTable)
	return cmd
}

func newTenantsCmd(cf *clientFlags) *cobra.Command {
	var createOut, keyOut, quotaOut printer // -o, registered below with each command
	cmd := &cobra.Command{Use: "tenants", Short: "Tenants, their API keys and quotas (admin key)"}
	create := &cobra.Command{
		Use: "create NAME", Short: "Create a tenant", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			t, err := c.CreateTenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return createOut.print(cmd, t, tenantTable(t))
		},
	}
	var role string
	key := &cobra.Command{
		Use: "key NAME", Short: "Create an API key for a tenant; the key is shown once", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			k, err := c.CreateAPIKey(cmd.Context(), args[0], role)
			if err != nil {
				return err
			}
			return keyOut.print(cmd, k, apiKeyTable(k))
		},
	}
	createOut, keyOut = withOutput(create, outJSON), withOutput(key, outJSON)
	key.Flags().StringVar(&role, "role", berth.RoleTenant, "tenant or admin")
	var q berth.Quota
	quota := &cobra.Command{
		Use:   "quota NAME [--sandboxes N] [--memory-mb M]",
		Short: "Show a tenant's quota and usage; with --sandboxes or --memory-mb, set it (ADM-11)",
		Long: "Without flags, print the tenant's quota and what its live sandboxes use now; nothing changes.\n" +
			"With --sandboxes and/or --memory-mb, set those limits (0: no limit) and keep the one not given,\n" +
			"then print the quota now in force.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			setSandboxes, setMemory := cmd.Flags().Changed("sandboxes"), cmd.Flags().Changed("memory-mb")
			if q.MaxSandboxes < 0 || q.MaxMemoryMiB < 0 {
				return badInput("--sandboxes and --memory-mb: want 0 (no limit) or more")
			}
			cur, err := c.Quota(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !setSandboxes && !setMemory {
				return quotaOut.print(cmd, cur, quotaTable(cur))
			}
			next := cur.Quota
			next.Tenant = args[0]
			if setSandboxes {
				next.MaxSandboxes = q.MaxSandboxes
			}
			if setMemory {
				next.MaxMemoryMiB = q.MaxMemoryMiB
			}
			if err := c.SetQuota(cmd.Context(), next); err != nil {
				return err
			}
			return quotaOut.print(cmd, next, quotaTable(client.QuotaUsage{Quota: next, Sandboxes: cur.Sandboxes, MemoryMiB: cur.MemoryMiB}))
		},
	}
	quotaOut = withOutput(quota, outJSON)
	quota.Flags().IntVar(&q.MaxSandboxes, "sandboxes", 0, "set the most live sandboxes (0: no limit); not given: unchanged")
	quota.Flags().Int64Var(&q.MaxMemoryMiB, "memory-mb", 0, "set the most configured memory of live sandboxes, MiB (0: no limit); not given: unchanged")
	cmd.AddCommand(create, key, quota)
	return cmd
}

// killReport says what `sandbox kill id` did, from the sandbox's state after the delete: a
// DELETE on a sandbox that had already ended (lost, failed, evicted…) answers 204 and changes
// nothing, and "stopped" would then be untrue (found by a new user on a lost sandbox). When the
// state cannot be read, the delete's own success is all there is to say.
func killReport(ctx context.Context, c *client.Client, id string) string {
	sb, err := c.Sandbox(ctx, id)
	if err != nil || sb.State == berth.SandboxStopped {
		return "stopped " + id
	}
	return fmt.Sprintf("%s had already ended (%s): nothing to stop", id, sb.State)
}

// execStdin reads r to its end for `sandbox exec -i` and returns it as the Stdin of req. It
// refuses, with a usage error (exit 2) before anything is sent, input the API cannot carry as
// it is: bytes that are not UTF-8 (a JSON string would carry U+FFFD in their place), and input
// that makes the request's body, as this client sends it (stdin JSON-escaped), larger than the
// API takes (berth.MaxJSONBodyBytes). It reads at most berth.MaxJSONBodyBytes+1 bytes, so
// endless input is refused, not read forever.
// A read error is returned as it is (exit 1).
func execStdin(r io.Reader, req berth.ExecRequest) (string, error) {
	const instead = "; copy it into the sandbox with `berth sandbox write ID PATH` and redirect from there, e.g. -- sh -c 'CMD < PATH'"
	b, err := io.ReadAll(io.LimitReader(r, berth.MaxJSONBodyBytes+1))
	if err != nil {
		return "", fmt.Errorf("-i: read standard input: %w", err)
	}
	if len(b) > berth.MaxJSONBodyBytes {
		return "", badInput("-i: standard input is over %d bytes, more than an exec request carries (%d bytes of JSON, stdin included)%s",
			berth.MaxJSONBodyBytes, berth.MaxJSONBodyBytes, instead)
	}
	if !utf8.Valid(b) {
		return "", badInput("-i: standard input is not UTF-8 text, and the API carries it as a JSON string, which would change it%s", instead)
	}
	req.Stdin = string(b)
	body, err := json.Marshal(req) // as the client encodes it
	if err != nil {
		return "", err
	}
	if len(body) > berth.MaxJSONBodyBytes {
		return "", badInput("-i: standard input of %d bytes makes an exec request of %d bytes as JSON (stdin escaped), over the %d it may have%s",
			len(b), len(body), berth.MaxJSONBodyBytes, instead)
	}
	return req.Stdin, nil
}
