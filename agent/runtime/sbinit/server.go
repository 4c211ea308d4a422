// Package sbinit is the small init that runs inside every sandbox and the host side that
// talks to it (AGT-3): exec with stdin, timeout and exit code; files resolved inside the
// sandbox and streamed (ISO-3); one long-running app service and TCP dials to the sandbox's
// own loopback (APP-1). Both runtime drivers use it: the process runtime starts it as PID 1
// of fresh namespaces and reaches it over a unix socket; the gVisor runtime starts it as the
// container's process and reaches it through a relay process started with `runsc exec`
// (Relay). The protocol is in wire.go.
package sbinit

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"

	"github.com/berth-dev/berth"
)

// Config configures the init's server inside a sandbox.
type Config struct {
	// Cwd is where commands and services run, and their HOME.
	Cwd string
	// Path is the PATH of commands.
	Path string
	// Env is more environment for commands and services ("K=V").
	Env []string
	// Files says where the files API resolves paths (ISO-3).
	Files FileRoot
	Log   *slog.Logger
}

// FileRoot is where the files API resolves the sandbox's paths: a path must be Prefix or
// lie under it; the rest of it is resolved inside Dir as if Dir were "/" (openat2
// RESOLVE_IN_ROOT: no "..", absolute symlink or /proc magic link leaves it). A confined
// sandbox (its own root file system: gVisor, the isolated process runtime) uses Dir "/" and
// no Prefix; an unisolated one maps /tmp onto its private directory.
type FileRoot struct {
	Dir    string
	Prefix string
	// Confined is true when the init's "/" is the sandbox's own root, so resolving a path
	// there without openat2 (gVisor has none) cannot reach the host.
	Confined bool
}

// server is the init's request loop.
type server struct {
	cfg    Config
	log    *slog.Logger
	reaper *reaper
	svc    service // the sandbox's app service (APP-1)
}

// Serve runs the init's request loop on l until l fails; it also reaps every child (the init
// is the sandbox's PID 1 or its child subreaper). It returns l's error.
func Serve(l net.Listener, cfg Config) error {
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Path == "" {
		cfg.Path = DefaultPath
	}
	if cfg.Files.Dir == "" {
		cfg.Files.Dir = "/"
	}
	s := &server{cfg: cfg, log: cfg.Log, reaper: newReaper()}
	go s.reaper.run()
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go s.handle(c)
	}
}

func (s *server) handle(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	line, err := readLine(br, maxHeaderBytes)
	if err != nil {
		return
	}
	var req wireRequest
	if err := json.Unmarshal(line, &req); err != nil {
		writeResponse(c, wireResponse{Code: berth.EInvalidRequest, Message: "bad request header"})
		return
	}
	var resp wireResponse
	switch req.Op {
	case opPing:
	case opExec:
		ctx, cancel := context.WithCancel(context.Background())
		// The runtime sends nothing after the header; EOF means it gave up.
		go func() { br.ReadByte(); cancel() }()
		resp = s.exec(ctx, req)
		cancel()
	case opWrite:
		resp = s.writeFile(c, br, req)
	case opRead:
		s.readFile(c, req) // answers itself, then streams the content
		return
	case opServe:
		resp = s.startService(req)
	case opStatus:
		resp = s.serviceStatus()
	case opDial:
		s.dialApp(c, br, req) // answers itself, then carries the app's bytes
		return
	default:
		resp = wireResponse{Code: berth.EInvalidRequest, Message: "unknown op " + req.Op}
	}
	writeResponse(c, resp)
}
