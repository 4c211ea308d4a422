// Command berth is Berth's one binary: the server, the agent, the all-in-one dev stack and
// the operator CLI (SPEC §0). Configuration is read here and only here (STYLE habit 9).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

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
	code := run(ctx, &clientFlags{}, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Main runs the berth command line with args and returns its error, nil on success; it is
// what tests call (STYLE habit 7). exitCode gives the error's exit code and errorMessage the
// line run prints for it.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	return execute(ctx, &clientFlags{}, args, stdin, stdout, stderr)
}

// run runs the command line as the berth binary does: on failure it prints the one line
// "berth: MESSAGE" on stderr (nothing for `sandbox exec`, whose command's own stderr was
// passed through verbatim) and returns the exit code of exitCode's rule.
func run(ctx context.Context, cf *clientFlags, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	err := execute(ctx, cf, args, stdin, stdout, stderr)
	if err == nil {
		return 0
	}
	if msg := errorMessage(err); msg != "" {
		fmt.Fprintln(stderr, "berth: "+msg)
	}
	return exitCode(err)
}

// execute builds the command tree around cf and runs args through it. An error that cobra
// raised before any command ran — an unknown command or flag, a flag value that does not
// parse, the wrong number of arguments, a required flag missing — comes back as a
// *usageError (exit 2).
func execute(ctx context.Context, cf *clientFlags, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	root := newRootCmd(cf)
	guardFlagValues(root)
	ran := guardUsage(root)
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err != nil && !*ran {
		return &usageError{cmd: cmd.CommandPath(), err: err}
	}
	return cf.explain(err)
}

func newRootCmd(cf *clientFlags) *cobra.Command {
	root := &cobra.Command{
		Use:           "berth",
		Short:         "Berth: admission, placement and lifecycle for fleets of sandbox hosts",
		Long:          "Berth: admission, placement and lifecycle for fleets of sandbox hosts.\n\n" + exitCodeHelp,
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentPreRun = func(cmd *cobra.Command, _ []string) { cf.stderr, cf.changed = cmd.ErrOrStderr(), cmd.Flags().Changed }
	root.PersistentFlags().StringVar(&cf.url, "url", envOr("BERTH_URL", "http://127.0.0.1:7070"), "Berth server URL, http:// or https:// (env BERTH_URL)")
	// The key's default is read when it is used, never shown: --help must not print a secret.
	root.PersistentFlags().StringVar(&cf.key, "key", "", "API key (default: env BERTH_KEY, else the file --key-file)")
	root.PersistentFlags().StringVar(&cf.keyFile, "key-file", defaultDataDir()+"/admin.key", "file holding the API key when neither --key nor BERTH_KEY is set")
	root.PersistentFlags().StringVar(&cf.ca, "ca", os.Getenv("BERTH_CA"), "PEM file of the CA that signed an https:// server's certificate, trusted instead of the system's roots (env BERTH_CA); berth agent trusts it for --server")
	root.PersistentFlags().DurationVar(&cf.wait, "wait", 90*time.Second, "how long to keep retrying refusals (503) and an unreachable server (SDK-1); 0: try once")
	root.AddCommand(newDevCmd(), newServerCmd(), newAgentCmd(cf), newSandboxCmd(cf), newAgentsCmd(cf), newTemplatesCmd(cf), newEventsCmd(cf), newTenantsCmd(cf), newAppsCmd(cf), newPlanCmd(), newSimCmd(), newBenchCmd(cf), newVersionCmd())
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
