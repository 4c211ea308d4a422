package server

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"

	"github.com/berth-dev/berth"
	"github.com/berth-dev/berth/internal/httpjson"
)

// The web dashboard (issue 17, point 4): static HTML, CSS and JavaScript modules embedded in
// the binary, served at /ui/ with no build step. The page holds the API key the operator
// types in sessionStorage and sends it as "Authorization: Bearer" on every API call it makes
// to this same origin; the key never appears in a URL. What a key may see is enforced by
// the API, not the page: a tenant key's calls to admin routes answer 403 and the page hides
// those views.
//
//go:embed ui
var uiFiles embed.FS

// uiCSP is the dashboard's Content-Security-Policy: only its own scripts, styles and API
// (no inline script or style, no other origin, no plugins), never framed.
const uiCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// uiAsset is one embedded file, its type and its ETag (a hash of its bytes).
type uiAsset struct {
	body  []byte
	ctype string
	etag  string
}

// loadUIAssets reads every embedded file under ui/ once, keyed by its path below ui/.
func loadUIAssets() map[string]uiAsset {
	out := map[string]uiAsset{}
	err := fs.WalkDir(uiFiles, "ui", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := uiFiles.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		ctype := mime.TypeByExtension(path.Ext(p))
		if path.Ext(p) == ".js" {
			ctype = "text/javascript; charset=utf-8" // module scripts need a JavaScript type
		}
		out[strings.TrimPrefix(p, "ui/")] = uiAsset{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		return nil
	})
	if err != nil {
		panic("embedded dashboard unreadable: " + err.Error()) // a broken build, not input
	}
	return out
}

// uiHeaders sets the headers of every answer under /ui, the page's and its errors' and
// redirects' alike: uiCSP, no framing, no sniffing, no referrer.
func uiHeaders(h http.Header) {
	h.Set("Content-Security-Policy", uiCSP)
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
}

// handleFuncer is what uiRoutes registers on: *http.ServeMux, or a wrapper that records
// the patterns it is given.
type handleFuncer interface {
	HandleFunc(pattern string, handler func(http.ResponseWriter, *http.Request))
}

// uiRoutes adds the dashboard and the one API route only it needs:
//
//   - GET /ui redirects (308) to /ui/;
//   - GET /ui/ is the page (index.html), GET /ui/{file...} its files (404 not_found for any
//     other); every answer, errors and redirects too, with uiHeaders; files with an ETag
//     (Cache-Control no-cache: revalidated on every load, so an upgrade is seen at once);
//   - GET /v1/refusals (admin): this replica's refusals by code per minute (refusals.go).
//
// No key is needed for the files: they hold nothing but code, and the data they show comes
// from the API with the operator's key.
func (s *Server) uiRoutes(mux handleFuncer, admin func(apiFunc) http.HandlerFunc) {
	assets := loadUIAssets()
	mux.HandleFunc("GET /ui", func(w http.ResponseWriter, r *http.Request) {
		uiHeaders(w.Header())
		http.Redirect(w, r, "/ui/", http.StatusPermanentRedirect)
	})
	// The bare address, as a person types it from the banner, finds the dashboard (a new user
	// got a JSON 404). Found, not permanent: the root may serve something else one day.
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		uiHeaders(w.Header())
		http.Redirect(w, r, "/ui/", http.StatusFound)
	})
	mux.HandleFunc("GET /ui/{file...}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("file")
		if name == "" {
			name = "index.html"
		}
		h := w.Header()
		uiHeaders(h)
		a, ok := assets[name]
		if !ok {
			httpjson.WriteError(w, requestID(r.Context()), berth.Errorf(berth.ENotFound, "no dashboard file %q", name))
			return
		}
		h.Set("Cache-Control", "no-cache")
		h.Set("ETag", a.etag)
		if r.Header.Get("If-None-Match") == a.etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		h.Set("Content-Type", a.ctype)
		_, _ = w.Write(a.body)
	})
	mux.HandleFunc("GET /v1/refusals", admin(s.refusals(newRefusalWindow(s.metrics.refusals, s.cfg.Clock, refusalSample))))
}
