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
