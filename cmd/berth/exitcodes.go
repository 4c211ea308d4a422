package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
	"github.com/berth-dev/berth/internal/httpjson"
)

// The exit codes of every berth command (README "First sandbox"; rule in exitCode).
const (
	exitFailure = 1 // anything else
	exitInvalid = 2 // an invalid request: fix the command line
	exitRetry   = 3 // a refusal or an unreachable server: try again later
)

// exitCodeHelp is the rule as `berth --help` states it.
const exitCodeHelp = `Exit codes: 0 success; ` + "`sandbox exec`" + ` exits with the command's own code (1-255);
2 invalid request (a wrong command, flag or argument, a bad --url, no API key, a server
certificate --ca does not vouch for, or the server's 400/404/413: invalid_request,
*_not_found, request_too_large); 3 refused or
unreachable (a 503 the server asks to retry, capacity still unavailable after --wait, or no
answer from the server: connection refused, DNS, timeout); 1 anything else (401, 403, 409,
500, an app's 502, an exec whose command may have run but whose answer was lost:
outcome_unknown, local I/O errors). The CLI's own messages are the stderr lines that
start with "berth: "; a sandboxed command's stderr is passed through as it is.`

// exitCode maps an error of any berth command to its exit code. One rule for every command
// (the README's: "`sandbox exec` exits with the command's own exit code; other failures exit
// 1, invalid requests 2, and refusals or an unreachable server 3"), checked in this order:
//
//   - `sandbox exec` whose command ran: the command's own code, 1–255 (a code outside that
//     range, such as the −1 of a command killed by its timeout, exits 1).
//   - 2, invalid request — the same command will fail the same way until it is changed:
//     a *usageError (an unknown command or flag, a flag value that does not parse, the wrong
//     number of arguments, a required flag missing, a --url that is not http(s)://HOST, no
//     API key or an empty or unreadable key file, a --file or --env that is not NAME=VALUE or
//     cannot be read, a negative --wait), and a *berth.Error whose code the API answers with
//     400, 404 or 413 (API-2): invalid_request, template_not_found, sandbox_not_found,
//     app_not_found, not_found, request_too_large — also when the CLI itself raises one
//     (`plan`, `sim`, `apps idle`).
//   - 3, refused or unreachable — the same command may succeed later: a retryable
//     *berth.Error (503 no_capacity, no_healthy_agents, host_starts_saturated, unavailable,
//     app_wake_timeout, or a proxy's 502/503/504), a *client.CapacityUnavailable (SDK-2: the
//     SDK gave up at --wait, or at once on a Retry-After past it, C30), and a server that
//     cannot be reached (client.IsUnreachable: connection refused or reset, DNS, a dial
//     error, a timeout, a hang-up before the answer) — also for calls the SDK never retries
//     (drain), but not for an exec that may have reached the server (the client's
//     outcome_unknown: exit 1, as its command may have run).
//   - 1, anything else: 401 unauthorized, 403 forbidden and tenant_over_quota, 409 conflict
//     and app_stopped, 500 internal, 501, a non-retryable 502 (app_error…), 504 outcome_unknown
//     (an exec that may have run: running it again is the user's call), TLS failures, an
//     answer that is not Berth's JSON, local I/O errors, an interrupt (Ctrl-C).
func exitCode(err error) int {
	var ee *exitError
	var ue *usageError
	var be *berth.Error
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		if ee.code < 1 || ee.code > 255 {
			return exitFailure
		}
		return ee.code
	case errors.As(err, &ue):
		return exitInvalid
	case client.IsCapacityUnavailable(err), client.IsUnreachable(err):
		return exitRetry
	case errors.As(err, &be) && be.Retryable():
		return exitRetry
	case errors.As(err, &be):
		switch httpjson.StatusFor(be.Code) {
		case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge:
			return exitInvalid
		}
	}
	return exitFailure
}

// errorMessage is the text run prints after "berth: " for err: never a Go-internal prefix
// ("client:", `Get "URL":`, "strconv.ParseInt:"), and nothing for `sandbox exec`, whose
// command's own stderr was passed through verbatim — so a line starting with "berth: " is
// always the CLI's own. A nil error (success) has no message: "".
func errorMessage(err error) string {
	var ee *exitError
	var ex *explained
	switch {
	case err == nil:
		return ""
	case errors.As(err, &ee):
		return ""
	case errors.As(err, &ex):
		return ex.msg
	case errors.Is(err, context.Canceled):
		return "interrupted"
	}
	return strings.TrimPrefix(err.Error(), "berth: ")
}

// explained is an error reworded for a person, still wrapping the error for exitCode.
type explained struct {
	msg string
	err error
}

func (e *explained) Error() string { return e.msg }
func (e *explained) Unwrap() error { return e.err }

// usageError is a command line that cannot work as written (exit 2): cobra's own complaints,
// and the CLI's checks of its flags and arguments.
type usageError struct {
	cmd string // "berth sandbox create"; empty for a check made by a command itself
	err error
}

func (e *usageError) Error() string {
	if e.cmd == "" {
		return e.err.Error()
	}
	name := strings.TrimPrefix(strings.TrimPrefix(e.cmd, "berth"), " ")
	if name == "" {
		return fmt.Sprintf("%s (see berth --help)", usageText(e.err))
	}
	return fmt.Sprintf("%s: %s (see %s --help)", name, usageText(e.err), e.cmd)
}

func (e *usageError) Unwrap() error { return e.err }

// badInput returns a *usageError for a check a command makes of its own input.
func badInput(format string, args ...any) error {
	return &usageError{err: fmt.Errorf(format, args...)}
}

// invalidFlagValue matches pflag's `invalid argument "VALUE" for "--FLAG" flag: CAUSE`.
var invalidFlagValue = regexp.MustCompile(`^invalid argument ("(?:[^"\\]|\\.)*") for "([^"]+)" flag: `)

// usageText rewords cobra's and pflag's errors where they show Go internals: a flag value
// that does not parse says what was expected instead of "strconv.ParseInt: parsing …".
func usageText(err error) string {
	msg := err.Error()
	m := invalidFlagValue.FindStringSubmatch(msg)
	if m == nil {
		return msg
	}
	want := "a valid value"
	var ne *strconv.NumError
	switch {
	case errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange):
		want = "a number in range"
	case errors.As(err, &ne) && ne.Func == "ParseFloat":
		want = "a number"
	case errors.As(err, &ne) && ne.Func == "ParseBool":
		want = "true or false"
	case errors.As(err, &ne):
		want = "a whole number"
	case strings.HasPrefix(msg[len(m[0]):], "time: "):
		want = "a duration such as 90s or 2m"
	default:
		want = msg[len(m[0]):]
	}
	return fmt.Sprintf("%s %s: want %s", m[2], m[1], want)
}

// guardUsage prepares the command tree for exitCode's rule and returns a flag that is set
// once a command's RunE starts: an error cobra returns before that is a usage error. A
// command group (sandbox, apps, …) given an unknown subcommand is one too; by itself it
// prints its help.
func guardUsage(root *cobra.Command) *bool {
	ran := new(bool)
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		switch {
		case c.RunE != nil:
			runE := c.RunE
			c.RunE = func(cmd *cobra.Command, args []string) error {
				*ran = true
				return runE(cmd, args)
			}
		case c.Run == nil && c.HasSubCommands() && c.HasParent():
			c.Args = cobra.NoArgs
			c.RunE = func(cmd *cobra.Command, _ []string) error {
				*ran = true
				return cmd.Help()
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	return ran
}

// pathProblem says why a local file could not be read, without os.PathError's "open PATH:".
func pathProblem(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}
