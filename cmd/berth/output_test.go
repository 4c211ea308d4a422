package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/spf13/cobra"
	"sigs.k8s.io/yaml"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/client"
)

// TestCLI_OutputFormats: every list and get prints -o table, json or yaml from one printer;
// JSON and YAML carry the API's field names and values (the same sandbox the API returns), a
// list is an array ([] when empty), and an unknown -o is refused (exit 2) before a create
// runs. Issue 17, point 5.
func TestCLI_OutputFormats(t *testing.T) {
	st := bootDev(t, nil)
	cli := func(args ...string) cliRun {
		t.Helper()
		return runCLI(t, "", append([]string{"--url", st.URL, "--key", st.AdminKey}, args...)...)
	}
	api := client.New(st.URL, st.AdminKey)
	ctx := context.Background()

	if r := cli("sandbox", "create", "shell", "-o", "xml"); r.code != exitInvalid {
		t.Errorf("create -o xml: exit %d, want %d; stderr %q", r.code, exitInvalid, r.stderr)
	} else {
		checkStderr(t, r.stderr, `-o "xml": want table, json or yaml`)
	}
	if sbs, err := api.Sandboxes(ctx, ""); err != nil || len(sbs) != 0 {
		t.Fatalf("after a refused -o, sandboxes = %v, %v; want none (the create must not run)", sbs, err)
	}
	if r := cli("apps", "list", "-o", "json"); r.code != 0 || strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("apps list -o json with no apps: exit %d, %q; want []", r.code, r.stdout)
	}

	r := cli("sandbox", "create", "shell", "-o", "yaml")
	if r.code != 0 {
		t.Fatalf("create -o yaml: exit %d, %s", r.code, r.stderr)
	}
	var created berth.Sandbox
	if err := yaml.Unmarshal([]byte(r.stdout), &created); err != nil || created.ID == "" {
		t.Fatalf("create -o yaml printed %q: %v", r.stdout, err)
	}
	want, err := api.Sandbox(ctx, created.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, format := range []string{"json", "yaml"} {
		r := cli("sandbox", "get", created.ID, "-o", format)
		var got berth.Sandbox
		if err := yaml.Unmarshal([]byte(r.stdout), &got); r.code != 0 || err != nil { // YAML reads JSON too
			t.Fatalf("get -o %s: exit %d, %v: %q", format, r.code, err, r.stdout)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("get -o %s differs from the API's sandbox (-api +cli):\n%s", format, diff)
		}
		r = cli("sandbox", "list", "-o", format)
		var list []berth.Sandbox
		if err := yaml.Unmarshal([]byte(r.stdout), &list); r.code != 0 || err != nil {
			t.Fatalf("list -o %s: exit %d, %v: %q", format, r.code, err, r.stdout)
		}
		if len(list) != 1 || list[0].ID != created.ID {
			t.Errorf("list -o %s = %+v, want the one sandbox %s", format, list, created.ID)
		}
	}
	if format := "json"; !json.Valid([]byte(cli("sandbox", "get", created.ID, "-o", format).stdout)) {
		t.Errorf("get -o json is not JSON")
	}

	for _, tt := range []struct {
		args   []string
		header string
		cell   string
	}{
		{[]string{"sandbox", "list"}, "ID  ", created.ID},
		{[]string{"sandbox", "get", created.ID, "-o", "table"}, "ID  ", created.ID},
		{[]string{"agents", "list"}, "ID  ", "dev-agent-1"},
		{[]string{"events", "sandbox/" + created.ID, "-o", "table"}, "AT  ", "sandbox/" + created.ID},
		{[]string{"templates"}, "NAME  ", "python"},
	} {
		r := cli(tt.args...)
		lines := strings.Split(strings.TrimRight(r.stdout, "\n"), "\n")
		if r.code != 0 || !strings.HasPrefix(lines[0], tt.header) || !strings.Contains(r.stdout, tt.cell) {
			t.Errorf("%v: exit %d, %q; want a table with header %q and %q in it", tt.args, r.code, r.stdout, tt.header, tt.cell)
		}
		// Every row has as many fields as the header: an empty cell shows as "-".
		for _, l := range lines[1:] {
			if len(strings.Fields(l)) < len(strings.Fields(lines[0])) && !slices.Contains(tt.args, "events") {
				t.Errorf("%v: row %q has fewer fields than the header %q", tt.args, l, lines[0])
			}
		}
	}

	// The tenant commands print JSON by default (scripts read the key from it) and take -o too.
	var tenant berth.Tenant
	if r := cli("tenants", "create", "acme", "-o", "yaml"); yaml.Unmarshal([]byte(r.stdout), &tenant) != nil || tenant.Name != "acme" {
		t.Errorf("tenants create -o yaml: exit %d, %q; want the tenant acme", r.code, r.stdout)
	}
	var key client.APIKeySecret
	if r := cli("tenants", "key", "acme"); json.Unmarshal([]byte(r.stdout), &key) != nil || key.Tenant != "acme" || key.Key == "" {
		t.Errorf("tenants key: exit %d, %q; want JSON with the secret", r.code, r.stdout)
	}
	if r := cli("tenants", "key", "acme", "-o", "table"); r.code != 0 || !strings.HasPrefix(r.stdout, "ID  ") || !strings.Contains(r.stdout, "bk_") {
		t.Errorf("tenants key -o table: exit %d, %q; want a table with the secret", r.code, r.stdout)
	}
	if r := cli("tenants", "create", "other", "-o", "xml"); r.code != exitInvalid {
		t.Errorf("tenants create -o xml: exit %d, want %d", r.code, exitInvalid)
	} else if _, err := api.Quota(ctx, "other"); err == nil {
		t.Errorf("tenants create -o xml created the tenant; the -o check must come first")
	}

	var agents []berth.Agent
	if r := cli("agents", "list", "-o", "json"); json.Unmarshal([]byte(r.stdout), &agents) != nil || len(agents) != 1 {
		t.Errorf("agents list -o json: exit %d, %q; want the one agent", r.code, r.stdout)
	}
	var evs []berth.Event
	if r := cli("events", "sandbox/"+created.ID, "-o", "yaml"); yaml.Unmarshal([]byte(r.stdout), &evs) != nil || len(evs) == 0 {
		t.Errorf("events -o yaml: exit %d, %q; want the sandbox's events", r.code, r.stdout)
	}
}

// TestCLI_CompletionFromServer: `berth completion bash|zsh|fish` prints a script, and ids
// complete from the server (through cobra's hidden __complete command, which the scripts
// call): sandbox ids (only live ones for the commands that act on a sandbox; ended ones too
// for get), agent ids, event entities. An unreachable server completes nothing and prints
// nothing, without retrying.
func TestCLI_CompletionFromServer(t *testing.T) {
	st := bootDev(t, nil)
	api := client.New(st.URL, st.AdminKey)
	sb, err := api.CreateSandbox(context.Background(), berth.CreateRequest{Template: "shell"})
	if err != nil {
		t.Fatal(err)
	}
	ended, err := api.CreateSandbox(context.Background(), berth.CreateRequest{Template: "shell"})
	if err == nil {
		err = api.DeleteSandbox(context.Background(), ended.ID)
	}
	if err != nil {
		t.Fatal(err)
	}
	if got, err := api.Sandbox(context.Background(), ended.ID); err != nil || !got.State.Terminal() {
		t.Fatalf("the killed sandbox = %+v, %v; want it ended", got, err)
	}
	complete := func(url string, args ...string) (ids []string, stderr string) {
		t.Helper()
		r := runCLI(t, "", append([]string{"__complete", "--url", url, "--key", st.AdminKey}, args...)...)
		if r.code != 0 {
			t.Fatalf("__complete %v: exit %d, %s", args, r.code, r.stderr)
		}
		for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
			if !strings.HasPrefix(l, ":") { // the last line is cobra's directive, ":4"
				ids = append(ids, l)
			}
		}
		return ids, r.stderr
	}
	for _, tt := range []struct {
		args []string
		want []string
	}{
		{[]string{"sandbox", "exec", ""}, []string{sb.ID}},
		{[]string{"sandbox", "kill", ""}, []string{sb.ID}},
		{[]string{"sandbox", "get", ""}, []string{sb.ID, ended.ID}},
		{[]string{"sandbox", "kill", sb.ID[:4]}, []string{sb.ID}},
		{[]string{"sandbox", "kill", "zz"}, nil},
		{[]string{"agents", "drain", "dev-agent-1"}, []string{"dev-agent-1"}},
		{[]string{"events", "sa"}, []string{"sandbox/"}},
		{[]string{"events", "sandbox/"}, []string{"sandbox/" + sb.ID, "sandbox/" + ended.ID}},
		{[]string{"sandbox", "list", "-o", ""}, []string{"table", "json", "yaml"}},
	} {
		if got, _ := complete(st.URL, tt.args...); !cmp.Equal(got, tt.want, cmpopts.SortSlices(strings.Compare)) {
			t.Errorf("complete %v = %q, want %q", tt.args, got, tt.want)
		}
	}
	if got, stderr := complete("http://127.0.0.1:1", "sandbox", "get", ""); len(got) != 0 || strings.Contains(stderr, "retrying") {
		t.Errorf("complete against no server = %q, stderr %q; want nothing, no retry", got, stderr)
	}
	for _, shell := range []string{"bash", "zsh", "fish"} {
		if r := runCLI(t, "", "completion", shell); r.code != 0 || !strings.Contains(r.stdout, "__complete") {
			t.Errorf("completion %s: exit %d, %d bytes; want a script that calls __complete", shell, r.code, len(r.stdout))
		}
	}
}

// A list that decoded to nil prints as an empty array, in JSON and YAML: a script's
// `jq '.[]'` must not meet null.
func TestPrinter_NilListIsEmptyArray(t *testing.T) {
	for format, want := range map[string]string{"json": "[]\n", "yaml": "[]\n"} {
		cmd := &cobra.Command{}
		p := withOutput(cmd, format)
		var out strings.Builder
		cmd.SetOut(&out)
		if err := p.print(cmd, []berth.Sandbox(nil), sandboxTable()); err != nil || out.String() != want {
			t.Errorf("-o %s of a nil list = %q, %v; want %q", format, out.String(), err, want)
		}
	}
}

// A table never passes a control character to the terminal: tenants' text (an app's output
// tail in its reason) could otherwise rewrite the operator's screen or clipboard (review
// finding F2), nor a bidi control that reorders what follows (U+202E). Line breaks and tabs
// become spaces, the rest is shown escaped.
func TestPrinter_TableShowsControlCharactersEscaped(t *testing.T) {
	cmd := &cobra.Command{}
	p := withOutput(cmd, outTable)
	var out strings.Builder
	cmd.SetOut(&out)
	app := berth.App{Name: "hider", Reason: "tail:\n\x1b[2K\x1b[1A\x1b]52;c;ZWNobw==\x07\tend\u009b\u202edegats\u2066"}
	if err := p.print(cmd, []berth.App{app}, appTable(app)); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if strings.ContainsFunc(strings.TrimSuffix(strings.ReplaceAll(got, "\n", ""), ""), unicode.IsControl) {
		t.Errorf("table output holds a control character: %q", got)
	}
	if strings.ContainsFunc(got, func(r rune) bool { return unicode.Is(unicode.Bidi_Control, r) }) {
		t.Errorf("table output holds a bidi control (it would reorder what follows): %q", got)
	}
	if want := `tail: \x1b[2K\x1b[1A\x1b]52;c;ZWNobw==\x07 end\x9b\u202edegats\u2066`; !strings.Contains(got, want) {
		t.Errorf("table output %q; want the reason shown as %q", got, want)
	}
}
