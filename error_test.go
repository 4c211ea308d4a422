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
