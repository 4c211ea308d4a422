package main

import (
	"maps"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth"
)

// specFlags are the flags of one app version (APP-1), shared by create and deploy.
type specFlags struct {
	template string
	memory   int64
	port     int
	files    []string // PATH=LOCALFILE
	env      []string // NAME=VALUE
}

// register adds the flags; on create, --template and --port are required, on deploy every
// flag left out keeps the current version's value.
func (f *specFlags) register(cmd *cobra.Command, create bool) {
	memory := "memory, MiB, at least 64 (default: the template's)"
	if !create {
		memory = "memory, MiB, at least 64 (default: the current version's)"
	}
	cmd.Flags().StringVar(&f.template, "template", "", "sandbox template, as listed by: berth templates")
	cmd.Flags().Int64Var(&f.memory, "memory-mb", 0, memory)
	cmd.Flags().IntVar(&f.port, "port", 0, "TCP port the app listens on inside its sandbox (127.0.0.1 is enough)")
	cmd.Flags().StringArrayVar(&f.files, "file", nil, "PATH=LOCALFILE: write LOCALFILE to PATH (relative to the app's working directory) before the command starts; repeatable (deploy: replaces that file, keeps the others)")
	cmd.Flags().StringArrayVar(&f.env, "env", nil, "NAME=VALUE in the command's environment; repeatable (deploy: replaces that variable, keeps the others)")
}

// apply overrides spec with the flags that were set (and the command, when given).
func (f *specFlags) apply(cmd *cobra.Command, spec *berth.AppSpec, command []string) error {
	if cmd.Flags().Changed("template") {
		spec.Template = f.template
	}
	if cmd.Flags().Changed("memory-mb") {
		spec.MemoryMiB = f.memory
	}
	if cmd.Flags().Changed("port") {
		spec.Port = f.port
	}
	if len(command) > 0 {
		spec.Command = command
	}
	if len(f.files) > 0 {
		spec.Files = maps.Clone(spec.Files) // deploy: the current version's files, these replaced
		if spec.Files == nil {
			spec.Files = map[string]string{}
		}
		for _, kv := range f.files {
			p, local, ok := strings.Cut(kv, "=")
			if !ok || p == "" || local == "" {
				return badInput("--file %q: want PATH=LOCALFILE", kv)
			}
			b, err := os.ReadFile(local)
			if err != nil {
				return badInput("--file %s: cannot read %s: %s", kv, local, pathProblem(err))
			}
			spec.Files[p] = string(b)
		}
	}
	if len(f.env) > 0 {
		spec.Env = maps.Clone(spec.Env)
		if spec.Env == nil {
			spec.Env = map[string]string{}
		}
		for _, kv := range f.env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return badInput("--env %q: want NAME=VALUE", kv)
			}
			spec.Env[k] = v
		}
	}
	return nil
}

func newAppsCmd(cf *clientFlags) *cobra.Command {
	var createOut, listOut, getOut printer // -o, registered below with each command
	cmd := &cobra.Command{Use: "apps", Aliases: []string{"app"}, Short: "Long-lived apps: create, deploy, hibernate, wake (APP-1, APP-2)",
		Long: "An app is a long-lived HTTP server in a sandbox, reached at <server>/apps/<name>/. It hibernates\n" +
			"after --idle seconds without a request and wakes on the next one. A full fleet never fails an app:\n" +
			"it waits in waiting_capacity and retries by itself."}

	var sf specFlags
	var idle int64
	var desired string
	create := &cobra.Command{
		Use:   "create NAME --template T --port P [--file PATH=LOCAL]... -- CMD [ARG...]",
		Short: "Create an app and start it (or leave it hibernated or stopped with --desired); prints it as JSON",
		Args:  cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			req := berth.AppRequest{Name: args[0], IdleSeconds: idle, Desired: berth.AppDesired(desired)}
			if err := sf.apply(cmd, &req.AppSpec, args[1:]); err != nil {
				return err
			}
			a, err := c.CreateApp(cmd.Context(), req)
			if err != nil {
				return err
			}
			return createOut.print(cmd, a, appTable(a))
		},
	}
	createOut = withOutput(create, outJSON)
	sf.register(create, true)
	_ = create.MarkFlagRequired("template")
	_ = create.MarkFlagRequired("port")
	create.Flags().Int64Var(&idle, "idle", 0, "hibernate after this many seconds without a request (0: never)")
	create.Flags().StringVar(&desired, "desired", "running", "running, hibernated or stopped")

	var df specFlags
	deploy := &cobra.Command{
		Use:   "deploy NAME [flags] [-- CMD [ARG...]]",
		Short: "Deploy a new version: the current spec with the flags given (and the command, if given) changed",
		Args:  cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := df.apply(cmd, &berth.AppSpec{}, nil); err != nil {
				return err // bad --file or --env: say so before asking the server anything
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			cur, err := c.App(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			spec := cur.Spec
			if err := df.apply(cmd, &spec, args[1:]); err != nil {
				return err
			}
			a, err := c.DeployApp(cmd.Context(), args[0], spec)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), a)
		},
	}
	df.register(deploy, false)

	idleCmd := &cobra.Command{
		Use: "idle NAME SECONDS", Short: "Hibernate the app after SECONDS without a request (0: never); deploys nothing", Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.ParseInt(args[1], 10, 64)
			if err != nil {
				return berth.Errorf(berth.EInvalidRequest, "SECONDS %q is not a whole number", args[1])
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			a, err := c.SetAppIdle(cmd.Context(), args[0], n)
			if err != nil {
				return err
			}
			return printJSON(cmd.OutOrStdout(), a)
		},
	}

	list := &cobra.Command{
		Use: "list", Short: "List apps", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			apps, err := c.Apps(cmd.Context())
			if err != nil {
				return err
			}
			return listOut.print(cmd, apps, appTable(apps...))
		},
	}
	listOut = withOutput(list, outTable)
	get := &cobra.Command{
		Use: "get NAME", Short: "Show one app", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			a, err := c.App(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return getOut.print(cmd, a, appTable(a))
		},
	}
	getOut = withOutput(get, outJSON)
	del := &cobra.Command{
		Use: "delete NAME", Aliases: []string{"rm"}, Short: "Stop an app's sandboxes and delete it", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			return c.DeleteApp(cmd.Context(), args[0])
		},
	}
	byName := completeFromServer(cf, appNames)
	completeWith(byName, deploy, idleCmd, get, del)
	cmd.AddCommand(create, deploy, idleCmd, list, get, del)
	for _, v := range []struct{ verb, short string }{
		{"hibernate", "Pause the app's sandbox (gVisor: memory kept; else it stops); the next request wakes it"},
		{"wake", "Start a hibernated app now (a stopped one too; a waiting one tries again now)"},
		{"stop", "Stop the app; requests get app_stopped until `start`"},
		{"start", "Start a stopped app (or one in error, after fixing it)"},
	} {
		cmd.AddCommand(&cobra.Command{
			Use: v.verb + " NAME", Short: v.short, Args: cobra.ExactArgs(1), ValidArgsFunction: byName,
			RunE: func(cmd *cobra.Command, args []string) error {
				c, err := cf.client()
				if err != nil {
					return err
				}
				a, err := c.SetApp(cmd.Context(), args[0], v.verb)
				if err != nil {
					return err
				}
				return printJSON(cmd.OutOrStdout(), a)
			},
		})
	}
	return cmd
}
