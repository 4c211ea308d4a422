package docs

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// requirementsFile is the file that must explain every cited ID, relative to the module root.
const requirementsFile = "docs/REQUIREMENTS.md"

// prefixes are the requirement-ID prefixes SPEC.md defines.
const prefixes = `ADM|PLC|LED|AGT|API|LIF|POOL|SPOT|SDK|APP|MET|PLAN|SIM|ISO|PAUSE|TRUST`

var (
	// dashID is a requirement ID as prose cites it: "ADM-3", a range "PLC-1…4" or
	// "ADM-2…ADM-7", or a pair "POOL-2/3".
	dashID = regexp.MustCompile(`(` + prefixes + `)-(\d+)(?:(?:…|\.\.\.?)(?:(?:` + prefixes + `)-)?(\d+)|/(\d+))?`)
	// testName is a test or benchmark whose name cites IDs: TestPLC1_PLC10_Filters,
	// TestCase_C11_C12_DrainCompletion, TestCase_C31_….
	testName = regexp.MustCompile(`\b(?:Test|Benchmark|Fuzz|Example)([A-Za-z0-9_]+)`)
	nameID   = regexp.MustCompile(`^(` + prefixes + `)(\d+)$`)
	// caseID is a field case: C07, C25. Underscores count as separators (TestCase_C20_…).
	caseID = regexp.MustCompile(`C(\d{2})`)
	// styleID is a STYLE.md habit: "STYLE 5", "STYLE habit 4".
	styleID = regexp.MustCompile(`STYLE(?:\.md)?(?: habits?)? (\d+)`)
	// sectionID is a SPEC section: "SPEC §13", "(§0)". An RFC's section is not one.
	sectionID = regexp.MustCompile(`(RFC ?\d+ )?§ ?(\d+)`)
	// entry is an entry of docs/REQUIREMENTS.md: a list item that starts with the ID in bold.
	entry = regexp.MustCompile(`(?m)^- \*\*([^*]+)\*\*`)
)

// alnum reports whether b is an ASCII letter or digit (an underscore is a separator here).
func alnum(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9'
}

// citedIDs returns the IDs text cites, in the spelling docs/REQUIREMENTS.md uses for its
// entries ("ADM-3", "C07", "STYLE 5", "§13"), each once, in the order first cited.
func citedIDs(text string) []string {
	var ids []string
	add := func(id string) {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	for _, m := range dashID.FindAllStringSubmatchIndex(text, -1) {
		if m[0] > 0 && alnum(text[m[0]-1]) {
			continue // part of a longer word
		}
		prefix, from := text[m[2]:m[3]], atoi(text[m[4]:m[5]])
		add(fmt.Sprintf("%s-%d", prefix, from))
		if m[6] >= 0 { // a range: every ID in it is cited
			if to := atoi(text[m[6]:m[7]]); to > from && to-from <= 20 {
				for n := from + 1; n <= to; n++ {
					add(fmt.Sprintf("%s-%d", prefix, n))
				}
			}
		}
		if m[8] >= 0 {
			add(fmt.Sprintf("%s-%d", prefix, atoi(text[m[8]:m[9]])))
		}
	}
	for _, m := range testName.FindAllStringSubmatch(text, -1) {
		for _, part := range strings.Split(m[1], "_") {
			if p := nameID.FindStringSubmatch(part); p != nil {
				add(fmt.Sprintf("%s-%d", p[1], atoi(p[2])))
			} else if caseID.MatchString(part) && len(part) == 3 {
				add(part)
			}
		}
	}
	for _, m := range caseID.FindAllStringIndex(text, -1) {
		if m[0] > 0 && alnum(text[m[0]-1]) || m[1] < len(text) && alnum(text[m[1]]) {
			continue
		}
		add(text[m[0]:m[1]])
	}
	for _, m := range styleID.FindAllStringSubmatch(text, -1) {
		add("STYLE " + strconv.Itoa(atoi(m[1])))
	}
	for _, m := range sectionID.FindAllStringSubmatch(text, -1) {
		if m[1] == "" {
			add("§" + strconv.Itoa(atoi(m[2])))
		}
	}
	return ids
}

func atoi(s string) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return -1 // more digits than an int holds: no ID has them, so no entry will match
	}
	return n
}

func TestCitedIDs(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       []string
	}{
		{"plain", "// Charge implements ADM-4 and LED-2.", []string{"ADM-4", "LED-2"}},
		{"range", "(PLC-1…4, ADM-2…ADM-3)", []string{"PLC-1", "PLC-2", "PLC-3", "PLC-4", "ADM-2", "ADM-3"}},
		{"pair", "POOL-2/3", []string{"POOL-2", "POOL-3"}},
		{"test names", "func TestPLC1_PLC10_Filters(t", []string{"PLC-1", "PLC-10"}},
		{"case test name", "TestCase_C11_C12_DrainCompletion and TestCase_C31_X", []string{"C11", "C12", "C31"}},
		{"cases in prose", "(C09; ADM-9 keeps it at 0), C24.", []string{"ADM-9", "C09", "C24"}},
		{"not cases", "0xC0FE C123 ABC12 SHA-256 UTF-8", nil},
		{"style", "(STYLE habit 4) and STYLE 5", []string{"STYLE 4", "STYLE 5"}},
		{"sections", "SPEC §13; RFC 9110 §10.2.3; (§0)", []string{"§13", "§0"}},
		{"not an ID", "XADM-3 MADM-1", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, citedIDs(tc.text)); diff != "" {
				t.Errorf("citedIDs(%q) (-want +got):\n%s", tc.text, diff)
			}
		})
	}
}

// TestRequirementsExplainEveryCitedID: every requirement ID, field case, STYLE habit and SPEC
// section cited anywhere in the repository (code, comments, tests, docs, README, deploy files)
// has an entry in docs/REQUIREMENTS.md, because SPEC.md, CASES.md and STYLE.md live outside it.
func TestRequirementsExplainEveryCitedID(t *testing.T) {
	root := moduleRoot(t)
	doc, err := os.ReadFile(filepath.Join(root, requirementsFile))
	if err != nil {
		t.Fatalf("%s: %v", requirementsFile, err)
	}
	entries := map[string]bool{}
	for _, m := range entry.FindAllStringSubmatch(string(doc), -1) {
		entries[m[1]] = true
	}

	citedBy := map[string][]string{} // ID → files citing it
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			switch rel {
			case ".git", "bin", "berth-data": // VCS state, build output, `berth dev` data (.gitignore)
				return filepath.SkipDir
			}
			if d.Name() == "node_modules" {
				return filepath.SkipDir // npm's packages (sdk/typescript's dev dependencies): not ours
			}
			return nil
		}
		if !d.Type().IsRegular() || rel == requirementsFile {
			return nil
		}
		if info, err := d.Info(); err != nil || info.Size() > 8<<20 {
			return err // no text file here is that large: a binary
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.IndexByte(b, 0) >= 0 {
			return nil // binary (the built berth, compressed traces)
		}
		for _, id := range citedIDs(string(b)) {
			citedBy[id] = append(citedBy[id], rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A walk that saw nothing would pass vacuously: the tree cites these on every version.
	for _, id := range []string{"ADM-4", "C07", "STYLE 4", "§13"} {
		if len(citedBy[id]) == 0 {
			t.Fatalf("found no citation of %s in %s: the scan is broken", id, root)
		}
	}

	var missing []string
	for id := range citedBy {
		if !entries[id] {
			missing = append(missing, id)
		}
	}
	slices.Sort(missing)
	for _, id := range missing {
		files := citedBy[id]
		more := ""
		switch len(files) {
		case 1:
		case 2:
			more = " and 1 more file"
		default:
			more = fmt.Sprintf(" and %d more files", len(files)-1)
		}
		t.Errorf("%s has no entry for %s (cited in %s%s); add a line \"- **%s** …\" saying what it requires and where it lives",
			requirementsFile, id, files[0], more, id)
	}
	t.Logf("%d cited IDs, %d entries", len(citedBy), len(entries))
}

// moduleRoot is the directory holding go.mod, above this package's directory.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}
