package sbinit

import (
	"strings"
	"testing"

	"github.com/berth-dev/berth"
)

func TestTailKeepsLastBytes(t *testing.T) {
	var tl tail
	big := strings.Repeat("a", berth.ServiceOutputTail-2)
	tl.Write([]byte(big))
	tl.Write([]byte("bcd"))
	if got := tl.String(); len(got) != berth.ServiceOutputTail || !strings.HasSuffix(got, "abcd") || got[0] != 'a' {
		t.Fatalf("tail is %d bytes ending %q", len(got), got[len(got)-4:])
	}
	tl.Write([]byte(strings.Repeat("z", 2*berth.ServiceOutputTail) + "!"))
	if got := tl.String(); got != strings.Repeat("z", berth.ServiceOutputTail-1)+"!" {
		t.Fatalf("after a big write the tail is %q…", got[:10])
	}
}
