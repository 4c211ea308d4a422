package process

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/berth-dev/berth"
)

// freePort returns a TCP port nothing on the host listens on right now, so a non-isolated
// sandbox (which shares the host's network) can use it too.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func serve(t *testing.T, r *Runtime, id string, req berth.ServiceRequest) {
	t.Helper()
	if err := r.Serve(context.Background(), id, req); err != nil {
		t.Fatalf("Serve(%q): %v", req.Cmd, err)
	}
}

// dialWhenUp dials port in the sandbox until the app listens (bounded: 30 s). A service that
// exited ends the wait at once.
func dialWhenUp(t *testing.T, r *Runtime, id string, port int) net.Conn {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := r.Dial(context.Background(), id, port)
		if err == nil {
			return c
		}
		if berth.ErrorCode(err) != berth.EUpstream || time.Now().After(deadline) {
			t.Fatalf("Dial(%s, %d): %v", id, port, err)
		}
		time.Sleep(50 * time.Millisecond) // real: an app process starting to listen
	}
}

// statusWhen polls the service's status until ok holds (bounded: 30 s).
func statusWhen(t *testing.T, r *Runtime, id string, ok func(berth.ServiceStatus) bool) berth.ServiceStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, err := r.ServiceStatus(context.Background(), id)
		if err != nil {
			t.Fatalf("ServiceStatus(%s): %v", id, err)
		}
		if ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("ServiceStatus(%s) = %+v: the awaited state never came", id, st)
		}
		time.Sleep(50 * time.Millisecond) // real: an app process's state
	}
}

func exited(st berth.ServiceStatus) bool { return st.Exited }

// TestAPP1_ServeAndDial: a real HTTP server started with Serve answers through Dial from the
// sandbox's working directory (a file exec wrote there), also when the request ends with a
// half-close.
func TestAPP1_ServeAndDial(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-app", 256)
			run(t, r, "sb-app", berth.ExecRequest{Cmd: []string{"sh", "-c", "echo hello-from-cwd > hello.txt"}})
			port := freePort(t)
			serve(t, r, "sb-app", berth.ServiceRequest{
				Cmd: []string{"python3", "-m", "http.server", strconv.Itoa(port), "--bind", "127.0.0.1"}})

			c := dialWhenUp(t, r, "sb-app", port)
			defer c.Close()
			if _, err := io.WriteString(c, "GET /hello.txt HTTP/1.0\r\nHost: app\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				t.Fatalf("CloseWrite: %v", err)
			}
			got, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("read answer: %v", err)
			}
			if !strings.HasPrefix(string(got), "HTTP/1.0 200") || !strings.HasSuffix(string(got), "\r\n\r\nhello-from-cwd\n") {
				t.Fatalf("answer = %q, want 200 with the file exec wrote", got)
			}
			st, err := r.ServiceStatus(context.Background(), "sb-app")
			if err != nil || !st.Started || st.Exited {
				t.Fatalf("ServiceStatus = %+v, %v; want started and running", st, err)
			}
			if isolated := mode == IsolateOn && r.cloneflags&syscall.CLONE_NEWNET != 0; isolated {
				// The reason Dial exists: the app's port is not the host's.
				if hc, err := net.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port))); err == nil {
					hc.Close()
					t.Fatalf("the host reached the sandbox's port %d directly", port)
				}
			}
		})
	}
}

// TestAPP1_ServiceExitReported: a command that exits at once is reported with its exit code
// and the tail of its output; a dial then answers service_exited with both; a new Serve
// may start it again.
func TestAPP1_ServiceExitReported(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-exit", 256)
			serve(t, r, "sb-exit", berth.ServiceRequest{Cmd: []string{"sh", "-c", "echo boom >&2; exit 3"}})
			st := statusWhen(t, r, "sb-exit", exited)
			want := berth.ServiceStatus{Started: true, Exited: true, ExitCode: 3, Output: "boom\n"}
			if diff := cmp.Diff(want, st); diff != "" {
				t.Errorf("ServiceStatus (-want +got):\n%s", diff)
			}
			_, err := r.Dial(context.Background(), "sb-exit", freePort(t))
			var be *berth.Error
			if !errors.As(err, &be) || be.Code != berth.EServiceExited ||
				!strings.Contains(be.Message, "code 3") || !strings.Contains(be.Message, "boom") {
				t.Fatalf("Dial after exit: %v, want service_exited with code 3 and boom", err)
			}

			serve(t, r, "sb-exit", berth.ServiceRequest{Cmd: []string{"sh", "-c", "echo again; exit 4"}})
			st = statusWhen(t, r, "sb-exit", func(st berth.ServiceStatus) bool { return st.Exited && st.ExitCode == 4 })
			if st.Output != "again\n" {
				t.Errorf("second run's output = %q, want only its own", st.Output)
			}

			serve(t, r, "sb-exit", berth.ServiceRequest{Cmd: []string{"no-such-command-berth"}})
			st = statusWhen(t, r, "sb-exit", func(st berth.ServiceStatus) bool { return st.Exited && st.ExitCode == 127 })
			if !strings.Contains(st.Output, "command not found") {
				t.Errorf("output of a missing command = %q, want a note", st.Output)
			}
		})
	}
}

// TestAPP1_OneServicePerSandbox: a second Serve while the service runs is service_running.
func TestAPP1_OneServicePerSandbox(t *testing.T) {
	r := newRuntime(t, IsolateOff)
	startSandbox(t, r, "sb-one", 256)
	serve(t, r, "sb-one", berth.ServiceRequest{Cmd: []string{"sleep", "1000"}})
	err := r.Serve(context.Background(), "sb-one", berth.ServiceRequest{Cmd: []string{"sleep", "1"}})
	if code := berth.ErrorCode(err); code != berth.EServiceRunning {
		t.Fatalf("second Serve: %v, want %s", err, berth.EServiceRunning)
	}
}

// TestAPP1_ServiceProcess: the service gets req.Env on top of the usual environment, its own
// process group, stdin /dev/null and exec's working directory; its output shows while it
// runs; an exec timeout (which kills its own command's group) leaves it running.
func TestAPP1_ServiceProcess(t *testing.T) {
	for _, mode := range modes {
		t.Run(mode, func(t *testing.T) {
			r := newRuntime(t, mode)
			startSandbox(t, r, "sb-proc", 256)
			cwd := strings.TrimSpace(run(t, r, "sb-proc", berth.ExecRequest{Cmd: []string{"pwd"}}).Stdout)
			script := `import os, sys, time
print(os.environ["GREETING"], os.environ["PATH"] != "", os.getpid() == os.getpgrp(), repr(sys.stdin.read()), os.getcwd(), flush=True)
time.sleep(1000)`
			serve(t, r, "sb-proc", berth.ServiceRequest{Cmd: []string{"python3", "-c", script}, Env: map[string]string{"GREETING": "hi"}})
			st := statusWhen(t, r, "sb-proc", func(st berth.ServiceStatus) bool { return st.Output != "" || st.Exited })
			if want := "hi True True '' " + cwd + "\n"; st.Output != want || st.Exited {
				t.Fatalf("status = %+v, want running with output %q", st, want)
			}
			res := run(t, r, "sb-proc", berth.ExecRequest{Cmd: []string{"sleep", "100"}, TimeoutS: 1})
			if res.ExitCode != -1 {
				t.Fatalf("exec = %+v, want a timeout", res)
			}
			if st, err := r.ServiceStatus(context.Background(), "sb-proc"); err != nil || st.Exited {
				t.Fatalf("after an exec timeout: %+v, %v; want the service still running", st, err)
			}
		})
	}
}

// TestAPP1_OutputTail: only the last ServiceOutputTail bytes of a chatty service are kept.
func TestAPP1_OutputTail(t *testing.T) {
	r := newRuntime(t, IsolateOff)
	startSandbox(t, r, "sb-tail", 256)
	serve(t, r, "sb-tail", berth.ServiceRequest{Cmd: []string{"seq", "1", "20000"}})
	st := statusWhen(t, r, "sb-tail", exited)
	if len(st.Output) != berth.ServiceOutputTail || !strings.HasSuffix(st.Output, "\n19999\n20000\n") {
		t.Fatalf("output is %d bytes ending %q, want the last %d bytes", len(st.Output), st.Output[max(0, len(st.Output)-20):], berth.ServiceOutputTail)
	}
}

// TestAPP1_DialGreeting: bytes an app sends first are not lost behind the dial's answer.
func TestAPP1_DialGreeting(t *testing.T) {
	r := newRuntime(t, IsolateOff)
	startSandbox(t, r, "sb-greet", 256)
	port := freePort(t)
	script := `import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
while True:
    c, _ = s.accept(); c.sendall(b"hello\n"); c.close()`
	serve(t, r, "sb-greet", berth.ServiceRequest{Cmd: []string{"python3", "-c", script, strconv.Itoa(port)}})
	c := dialWhenUp(t, r, "sb-greet", port)
	defer c.Close()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hello\n" {
		t.Fatalf("read %q, %v; want the greeting", got, err)
	}
}

// TestAPP1_RuntimeRefusals: each refusal carries its code.
func TestAPP1_RuntimeRefusals(t *testing.T) {
	r := newRuntime(t, IsolateOff)
	startSandbox(t, r, "sb-ref", 256)
	ctx := context.Background()
	dial := func(id string, port int) error { _, err := r.Dial(ctx, id, port); return err }
	_, statusErr := r.ServiceStatus(ctx, "nope")
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"nothing listens", dial("sb-ref", freePort(t)), berth.EUpstream},
		{"port 0", dial("sb-ref", 0), berth.EInvalidRequest},
		{"port 65536", dial("sb-ref", 65536), berth.EInvalidRequest},
		{"empty cmd", r.Serve(ctx, "sb-ref", berth.ServiceRequest{}), berth.EInvalidRequest},
		{"bad env", r.Serve(ctx, "sb-ref", berth.ServiceRequest{Cmd: []string{"true"}, Env: map[string]string{"A=B": "c"}}), berth.EInvalidRequest},
		{"serve unknown", r.Serve(ctx, "nope", berth.ServiceRequest{Cmd: []string{"true"}}), berth.ESandboxNotFound},
		{"status unknown", statusErr, berth.ESandboxNotFound},
		{"dial unknown", dial("nope", 80), berth.ESandboxNotFound},
	}
	for _, tc := range cases {
		if got := berth.ErrorCode(tc.err); got != tc.want {
			t.Errorf("%s: %v, want %s", tc.name, tc.err, tc.want)
		}
	}
	st, err := r.ServiceStatus(ctx, "sb-ref")
	if err != nil || st != (berth.ServiceStatus{}) {
		t.Errorf("status before any serve = %+v, %v; want zero", st, err)
	}
}
