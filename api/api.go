// Package api holds Berth's OpenAPI 3.1 document, openapi.yaml: the reference of the v1 HTTP
// API (docs/API.md is its prose guide). The server serves it at GET /v1/openapi.yaml, and
// server/openapi_test.go fails when a route the server registers, or a field of an answer,
// is not described in it.
package api

import _ "embed"

// OpenAPI is the document's YAML text, as built into the binary.
//
//go:embed openapi.yaml
var OpenAPI []byte

// ContentType is the media type GET /v1/openapi.yaml answers with.
const ContentType = "application/yaml"
