// Package escape is Berth's escape suite (issue 12, point 6): it attacks a real `berth dev`
// the way a tenant would, with nothing but a tenant API key, and claims that every attempt
// fails — that a sandbox reaches only itself (ISO-1), cannot raise its limits (ISO-2: memory,
// pids, scratch disk bounded and never on the store's file system) and that the files API
// resolves paths inside the sandbox's root only (ISO-3).
//
// The package holds no code but its tests. TestMain builds the real berth binary once
// (./cmd/berth) into a temporary directory. TestEscape then starts, for each runtime `berth
// dev` can run without --insecure on this machine — gvisor when runsc is installed, process
// when the tests run as root — one `berth dev` subprocess (own data directory, a free
// 127.0.0.1 port, --agents 2, --pids-limit 128), creates two tenants and a tenant key for
// each, and runs every attempt as a subtest named <runtime>/<attempt>
// (TestEscape/gvisor/02_files_read_host_file, …). Each `berth dev` runs the way an operator
// runs it: in a terminal of its own (a pseudo-terminal the test holds the other end of, so
// anything a sandbox writes to or injects into the operator's terminal is seen), in a
// session keyring holding a secret key, and with a marker variable in its environment.
//
// The attempts, each of which must fail (see escape_test.go for what each tries and why):
//
//	00 normal use works (so the suite cannot pass by everything being broken)
//	01 the files API writes a host path (direct, symlinks, /proc magic links)      ISO-3
//	02 the files API reads a host file or admin.key                                 ISO-3
//	03 exec reads the same files (cat, find, python)                               ISO-1
//	04 exec finds berth dev's environment or process                               ISO-1
//	05 exec unmounts, mounts, enters or creates namespaces, chroots                ISO-1
//	06 exec reaches the server's port, an agent's, or a host listener              ISO-1
//	07 exec raises its memory limit or allocates past it                           ISO-2
//	08 exec forks past its pids limit                                              ISO-2
//	09 exec fills /tmp and /dev/shm past their bound, onto the host's disk          ISO-2
//	10 a sandbox reads another's files, sockets or volume; another tenant's key
//	   reaches a sandbox                                                           ISO-1
//	11a writes to /proc/sys, /proc/sysrq-trigger, its oom_score_adj                ISO-1
//	11b host devices, by name and made with mknod                                  ISO-1
//	11c ptrace of every process in view                                            ISO-1
//	11d /.berth (the init binary) and every unix socket in view                    ISO-1
//	11e setuid binaries, capabilities                                              ISO-1
//	11f the host kernel's log                                                      ISO-1
//	11g the operator's session keyring (berth dev's)                               ISO-1
//	11h the operator's terminal (berth dev's controlling tty): write, TIOCSTI       ISO-1
//	11i writes through the init's inherited descriptors onto the host's disk       ISO-2
//	11j the guest stands in for its init and answers an exec that ran with Berth's
//	    rate_limited (which the SDKs resend), with a 200 KB message, or not at all:
//	    the exec must run once and its answer not be retryable (no answer: 504
//	    outcome_unknown)                                                            API-2
//
// When an attempt succeeds the test fails and says which attempt, on which runtime, with
// which command, and what it got. Each `berth dev` is stopped in cleanup (SIGTERM to its
// pid, SIGKILL after a bounded wait) even when tests fail, and the suite then checks that
// no sandbox survived it (`runsc --root <data>/agents/*/state list` is empty for gvisor; no
// init of its data directory is left for process).
//
// Run it as root: `go test -count=1 -v ./escape/`. Without runsc the gvisor runtime is
// skipped, and without root the process runtime is; both fail instead when the CI
// environment variable is set. It talks only to 127.0.0.1, and every loop it or its
// sandboxes run is bounded in count and time.
package escape
