package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// buildVersion describes the running binary from runtime/debug.ReadBuildInfo: the main
// module's version ("(devel)" for a build from a working tree, which `go build` and `go run`
// produce; a tagged version for `go install …@vX`), its path, the VCS commit and time and
// whether the tree had uncommitted changes (when the build stamped them: `go build` in a
// git checkout does, `go run` and `-buildvcs=false` do not), and the Go version.
type buildVersion struct {
	Module, Version string
	Commit, Time    string // "" when the build did not stamp VCS information
	Modified        bool
	Go              string
}

func readBuildVersion() buildVersion {
	v := buildVersion{Module: "github.com/berth-dev/berth", Version: "(unknown)", Go: runtime.Version()}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if info.Main.Path != "" {
		v.Module = info.Main.Path
	}
	if info.Main.Version != "" {
		v.Version = info.Main.Version
	}
	if info.GoVersion != "" {
		v.Go = info.GoVersion
	}
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Commit = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

// String is the one line `berth version` prints, e.g.
//
//	berth (devel) github.com/berth-dev/berth commit 1a57537… 2026-11-30T10:00:00Z (modified) go1.26.0
//	berth v1.2.0 github.com/berth-dev/berth commit unknown go1.26.0
func (v buildVersion) String() string {
	commit := "unknown"
	if v.Commit != "" {
		commit = v.Commit
		if v.Time != "" {
			commit += " " + v.Time
		}
		if v.Modified {
			commit += " (modified)"
		}
	}
	return fmt.Sprintf("berth %s %s commit %s %s", v.Version, v.Module, commit, v.Go)
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the module version, the VCS commit and the Go version this binary was built from",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			_, err := fmt.Fprintln(cmd.OutOrStdout(), readBuildVersion())
			return err
		},
	}
}
