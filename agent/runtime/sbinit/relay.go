package sbinit

import (
	"fmt"
	"io"
	"net"
	"os"
	"sync"
)

// Relay connects to the init's socket at sock and carries bytes between it and this
// process's stdin and stdout until both directions end: stdin's EOF half-closes the socket
// (the init sees the end of an upload or of a request), the socket's EOF closes stdout. It
// is how a runtime that cannot reach a socket inside its sandbox (gVisor: the sandbox's
// files live in the sentry) opens one stream to the init: `runsc exec <id> <berth> <relay
// arg> <sock>` with a socket pair as stdin and stdout. It returns the process exit code.
func Relay(sock string) int {
	conn, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Fprintf(os.Stderr, "berth relay: %v\n", err)
		return 1
	}
	uc := conn.(*net.UnixConn)
	var wg sync.WaitGroup
	wg.Go(func() {
		io.Copy(uc, os.Stdin)
		uc.CloseWrite()
	})
	wg.Go(func() {
		io.Copy(os.Stdout, uc)
		os.Stdout.Close()
	})
	wg.Wait()
	return 0
}
