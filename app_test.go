package berth

import (
	"strings"
	"testing"
)

// TestAppSpecValidateRefusesWhatCannotStart: a spec the agent, the kernel or a runtime would
// refuse at every start is invalid_request when it is given, so an app is never accepted only
// to fail (or be retried) for ever: a memory below MinSandboxMiB (it quarantined the fleet), a
// NUL in a command argument or an env value (no C string holds one), a command or an env over
// the kernel's execve limits, and a file path whose element or whole is too long for a file
// system. The largest values that do start are accepted.
func TestAppSpecValidateRefusesWhatCannotStart(t *testing.T) {
	ok := AppSpec{Template: "shell", Command: []string{"sleep", "1000"}, Port: 8080}
	with := func(f func(s *AppSpec)) AppSpec {
		s := ok
		s.Command = append([]string(nil), ok.Command...)
		f(&s)
		return s
	}
	big := strings.Repeat("a", MaxAppArgBytes)
	for _, tt := range []struct {
		name string
		spec AppSpec
		want string // "" for valid, else a part of the error's message
	}{
		{"valid", ok, ""},
		{"memory at the floor", with(func(s *AppSpec) { s.MemoryMiB = MinSandboxMiB }), ""},
		{"memory of the template", with(func(s *AppSpec) { s.MemoryMiB = 0 }), ""},
		{"memory 1", with(func(s *AppSpec) { s.MemoryMiB = 1 }), "below the minimum of 64 MiB"},
		{"memory under the floor", with(func(s *AppSpec) { s.MemoryMiB = MinSandboxMiB - 1 }), "below the minimum"},
		{"NUL in the command", with(func(s *AppSpec) { s.Command = []string{"sleep\x00", "1000"} }), "command[0] must not contain a NUL"},
		{"NUL in an argument", with(func(s *AppSpec) { s.Command = []string{"sleep", "10\x0000"} }), "command[1] must not contain a NUL"},
		{"NUL in an env value", with(func(s *AppSpec) { s.Env = map[string]string{"A": "b\x00c"} }), `env "A" must not contain a NUL`},
		{"NUL in an env name", with(func(s *AppSpec) { s.Env = map[string]string{"A\x00": "b"} }), "env name"},
		{"argument at the kernel's limit", with(func(s *AppSpec) { s.Command = []string{"echo", big} }), ""},
		{"argument over it", with(func(s *AppSpec) { s.Command = []string{"echo", big + "a"} }), "command[1] is 131072 bytes"},
		{"env at the limit", with(func(s *AppSpec) { s.Env = map[string]string{"A": big[:MaxAppArgBytes-2]} }), ""},
		{"env over it", with(func(s *AppSpec) { s.Env = map[string]string{"A": big[:MaxAppArgBytes-1]} }), "as NAME=value"},
		{"command and env over the total", with(func(s *AppSpec) {
			for range 8 {
				s.Command = append(s.Command, big)
			}
		}), "together"},
		{"file path element at NAME_MAX", with(func(s *AppSpec) { s.Files = map[string]string{strings.Repeat("f", 255): "x"} }), ""},
		{"file path element over it", with(func(s *AppSpec) { s.Files = map[string]string{"d/" + strings.Repeat("f", 256): "x"} }), "each element at most 255"},
		{"file path over the whole", with(func(s *AppSpec) {
			s.Files = map[string]string{strings.Repeat("d/", MaxAppPathBytes/2) + "f": "x"}
		}), "the whole at most 1024"},
	} {
		err := tt.spec.Validate()
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v; want valid", tt.name, err)
		case tt.want != "" && (ErrorCode(err) != EInvalidRequest || !strings.Contains(ErrorMessage(err), tt.want)):
			t.Errorf("%s: %v; want invalid_request saying %q", tt.name, err, tt.want)
		}
	}
}

// TestSandboxMiBFloor: a sandbox's size is what it asks, else its template's, and never below
// MinSandboxMiB — a template or app spec stored below the floor before it existed still starts.
func TestSandboxMiBFloor(t *testing.T) {
	for _, tt := range []struct{ asked, template, want int64 }{
		{0, 512, 512},
		{256, 512, 256},
		{0, 16, MinSandboxMiB},
		{1, 512, MinSandboxMiB},
		{MinSandboxMiB, 16, MinSandboxMiB},
	} {
		if got := SandboxMiB(tt.asked, tt.template); got != tt.want {
			t.Errorf("SandboxMiB(%d, %d) = %d; want %d", tt.asked, tt.template, got, tt.want)
		}
	}
}
