// Command berth is Berth's one binary: the server, the agent, the all-in-one dev stack and
// the operator CLI (SPEC §0). Configuration is read here and only here (STYLE habit 9).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/agent/runtime/gvisor"
	"github.com/berth-dev/berth/agent/runtime/process"
	"github.com/spf13/cobra"
)

func main() {
	// A re-executed copy of this binary may be a sandbox's init or a relay into one (AGT-3);
	// then these never return.
	process.MaybeRunInit()
	gvisor.MaybeRunInit()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		var ee *exitError
		if !errors.As(err, &ee) { // exec already printed the command's own output
			fmt.Fprintln(os.Stderr, "berth:", strings.TrimPrefix(err.Error(), "berth: "))
		}
		os.Exit(exitCode(err))
	}
}

// Main runs the berth command line with args; it is what tests call (STYLE habit 7).
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	root := newRootCmd()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	return root.ExecuteContext(ctx)
}

// exitCode maps errors to exit codes: a sandboxed command's own code for exec, 2 invalid
// request, 3 capacity or server unavailable (retry later), 1 anything else.
func exitCode(err error) int {
	var e *berth.Error
	var ee *exitError
	switch {
	case errors.As(err, &ee):
		return min(max(ee.code, 1), 255)
	case errors.As(err, &e) && e.Retryable():
		return 3
	case errors.As(err, &e) && e.Code == berth.EInvalidRequest:
		return 2
	}
	return 1
}

func newRootCmd() *cobra.Command {
	root := &cobra.Command{
		Use:           "berth",
		Short:         "Berth: admission, placement and lifecycle for fleets of sandbox hosts",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	cf := &clientFlags{}
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) { cf.stderr = cmd.ErrOrStderr() }
	root.PersistentFlags().StringVar(&cf.url, "url", envOr("BERTH_URL", "http://127.0.0.1:7070"), "Berth server URL (env BERTH_URL)")
	// The key's default is read when it is used, never shown: --help must not print a secret.
	root.PersistentFlags().StringVar(&cf.key, "key", "", "API key (default: env BERTH_KEY, else the file --key-file)")
	root.PersistentFlags().StringVar(&cf.keyFile, "key-file", defaultDataDir()+"/admin.key", "file holding the API key when --key is not set")
	root.PersistentFlags().DurationVar(&cf.wait, "wait", 90*time.Second, "how long to keep retrying refusals (503) and an unreachable server (SDK-1)")
	root.AddCommand(newDevCmd(), newServerCmd(), newAgentCmd(), newSandboxCmd(cf), newAgentsCmd(cf), newTemplatesCmd(cf), newEventsCmd(cf), newTenantsCmd(cf), newAppsCmd(cf), newPlanCmd(), newSimCmd(), newBenchCmd(cf))
	return root
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// defaultDataDir is where `berth dev` keeps its state: $XDG_STATE_HOME/berth, else
// ~/.local/state/berth, else ./berth-data.
func defaultDataDir() string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return d + "/berth"
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" {
		return h + "/.local/state/berth"
	}
	return "berth-data"
}
