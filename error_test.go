package berth

import "testing"

// TestServiceExitedMessage: service_exited says the exit code and the output tail, or that
// the service printed nothing — never a dangling "output tail:" (found by a new user, whose
// app's reason ended in "output tail: ⏎").
func TestServiceExitedMessage(t *testing.T) {
	for _, tc := range []struct {
		code int
		tail string
		want string
	}{
		{3, "", "the service exited with code 3 and printed nothing"},
		{3, " \n\t\n", "the service exited with code 3 and printed nothing"},
		{1, "boom\n", "the service exited with code 1; output tail:\nboom\n"},
	} {
		if got := ServiceExitedMessage(tc.code, tc.tail); got != tc.want {
			t.Errorf("ServiceExitedMessage(%d, %q) = %q, want %q", tc.code, tc.tail, got, tc.want)
		}
	}
}

// TestParseErrorBody: only JSON with a non-empty error code is Berth's error body; a proxy's
// page, an empty object and a body without a code are not.
func TestParseErrorBody(t *testing.T) {
	for body, want := range map[string]bool{
		`{"error":{"code":"no_capacity","message":"full","retry_after_s":3}}`: true,
		`{"error":{"code":"","message":"x"}}`:                                 false,
		`{}`:                                                                  false,
		`<html>502 Bad Gateway</html>`:                                        false,
		``:                                                                    false,
	} {
		eb, ok := ParseErrorBody([]byte(body))
		if ok != want || (ok && (eb.Error.Code != ENoCapacity || eb.Error.RetryAfterS != 3)) {
			t.Errorf("ParseErrorBody(%q) = %+v, %v; want ok %v", body, eb, ok, want)
		}
	}
}

// TestParseExecResult: an exec result is a JSON object whose exit_code is a number with an
// integer value of magnitude at most 2^53−1 (1.0 and 1e2 are integers, as they are for the
// Python and TypeScript SDKs); anything else that once read as exit code 0 is not one.
func TestParseExecResult(t *testing.T) {
	for body, want := range map[string]*ExecResult{
		`{"exit_code":0,"stdout":"hi\n","stderr":""}`:      {Stdout: "hi\n"},
		` {"exit_code":-1,"stdout":null,"stderr":"late"} `: {ExitCode: -1, Stderr: "late"},
		`{"exit_code":2.0}`:                                {ExitCode: 2},
		`{"exit_code":1e2,"extra":[1]}`:                    {ExitCode: 100},
		`{"exit_code":9007199254740991}`:                   {ExitCode: MaxExecExitCode},
		`{"exit_code":-9007199254740991}`:                  {ExitCode: -MaxExecExitCode},
		``:                                                 nil,
		`null`:                                             nil,
		` null `:                                           nil,
		`{}`:                                               nil,
		`[]`:                                               nil,
		`[{"exit_code":0}]`:                                nil,
		`"0"`:                                              nil,
		`0`:                                                nil,
		`{"stdout":"hi"}`:                                  nil,
		`{"exit_code":"0"}`:                                nil,
		`{"exit_code":null}`:                               nil,
		`{"exit_code":true}`:                               nil,
		`{"exit_code":[0]}`:                                nil,
		`{"exit_code":1.5}`:                                nil,
		`{"exit_code":9007199254740992}`:                   nil,
		`{"exit_code":1e400}`:                              nil,
		`{"EXIT_CODE":0}`:                                  nil,
		`{"exit_code":0,"stdout":5}`:                       nil,
		`{"exit_code":0`:                                   nil,
		`{"exit_code":0} {}`:                               nil,
	} {
		got, err := ParseExecResult([]byte(body))
		if (err == nil) != (want != nil) || (want != nil && got != *want) {
			t.Errorf("ParseExecResult(%q) = %+v, %v; want %+v", body, got, err, want)
		}
	}
}
