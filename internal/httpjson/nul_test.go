package httpjson

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/berth-dev/berth"
)

// Tags is an embedded named non-struct type: encoding/json reads it as a field "Tags".
type Tags []string

// TestDecodeRefusesNUL: a NUL anywhere in a decoded string — a field of an embedded struct,
// a list element, a map key or value — is invalid_request naming the field by its JSON path;
// DecodeBinary lets it through, and bytes (json.RawMessage) are not text.
func TestDecodeRefusesNUL(t *testing.T) {
	type inner struct {
		Env map[string]string `json:"env"`
	}
	type body struct {
		inner
		Tags
		Dash string          `json:"-,"` // read under the key "-" (found by an attack)
		IM   map[int]string  `json:"im"`
		Name string          `json:"name"`
		Cmd  []string        `json:"cmd"`
		Raw  json.RawMessage `json:"raw"`
		Ptr  *inner          `json:"ptr"`
	}
	decode := func(s string, binary bool) error {
		r := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(s))
		var b body
		if binary {
			return DecodeBinary(httptest.NewRecorder(), r, 1<<20, &b)
		}
		return Decode(httptest.NewRecorder(), r, 1<<20, &b)
	}
	for s, field := range map[string]string{
		`{"name":"a\u0000"}`:              `"name"`,
		`{"cmd":["x","\u0000"]}`:          `"cmd[1]"`,
		`{"env":{"K":"v\u0000"}}`:         `"env.K"`,
		`{"env":{"\u0000":"v"}}`:          `"env"`,
		`{"ptr":{"env":{"K":"\u0000v"}}}`: `"ptr.env.K"`,
		`{"-":"\u0000"}`:                  `"-"`,
		`{"im":{"7":"\u0000"}}`:           `"im.7"`,
		`{"Tags":["x","\u0000"]}`:         `"Tags[1]"`,
	} {
		err := decode(s, false)
		if berth.ErrorCode(err) != berth.EInvalidRequest || !strings.Contains(err.Error(), field) {
			t.Errorf("Decode(%s) = %v; want invalid_request naming %s", s, err, field)
		}
		if err := decode(s, true); err != nil {
			t.Errorf("DecodeBinary(%s) = %v; want it decoded", s, err)
		}
	}
	for _, s := range []string{`{"raw":"\u0000"}`, `{"name":"a\\u0000"}`, `{"name":"é"}`} {
		if err := decode(s, false); err != nil {
			t.Errorf("Decode(%s) = %v; want it decoded (no NUL in any text)", s, err)
		}
	}
}
