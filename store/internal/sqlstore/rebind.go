package sqlstore

import (
	"strconv"
	"strings"
	"sync"
)

// dollarCache maps a '?' query to its '$n' form; the store's queries are a fixed set of texts
// (plus "IN (?, …)" lists of bounded lengths), so it stays small.
var dollarCache sync.Map // string → string

// DollarRebind rewrites the '?' placeholders of query as $1, $2, … (PostgreSQL), leaving
// question marks inside '…' string literals, "…" identifiers and -- comments alone. Results are
// cached per query text.
func DollarRebind(query string) string {
	if v, ok := dollarCache.Load(query); ok {
		return v.(string)
	}
	var b strings.Builder
	b.Grow(len(query) + 16)
	n := 0
	var quote byte // the quote we are inside, or 0
	comment := false
	for i := 0; i < len(query); i++ {
		c := query[i]
		switch {
		case comment:
			if c == '\n' {
				comment = false
			}
		case quote != 0:
			if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '-' && i+1 < len(query) && query[i+1] == '-':
			comment = true
		case c == '?':
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(c)
	}
	out := b.String()
	dollarCache.Store(query, out)
	return out
}
