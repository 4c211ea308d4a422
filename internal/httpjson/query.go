package httpjson

import (
	"net/url"
	"strings"

	"github.com/berth-dev/berth"
)

// Query parses r's raw query the way every API call and the agent's /internal/drain read it,
// and refuses (invalid_request) what would otherwise be read as less than was sent:
//   - a query Go cannot parse (a ';', a bad escape), whose unreadable pairs r.URL.Query()
//     drops silently — a filter would vanish and the call answer more than was asked;
//   - a parameter given more than once. No route takes a list by repetition, and Get reads
//     the first: `?held=count&held=bogus` answered 200 while the reverse was 400, and
//     `?reason=ok&reason=<600 bytes>` drained with "ok" (found by an attack).
func Query(rawQuery string) (url.Values, error) {
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return nil, berth.Errorf(berth.EInvalidRequest, "the query does not parse: %s", strings.ToValidUTF8(err.Error(), "?"))
	}
	for k, vs := range q {
		if len(vs) > 1 {
			return nil, berth.Errorf(berth.EInvalidRequest, "query parameter %q is given %d times; give it once", strings.ToValidUTF8(k, "?"), len(vs))
		}
	}
	return q, nil
}
