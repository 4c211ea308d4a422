package httpjson

import (
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/berth-dev/berth"
)

// refuseNUL returns invalid_request when a string v holds anywhere — a field, a map key or
// value, a list element, at any depth — contains a NUL character (JSON "\u0000"), naming the
// field by its JSON path. PostgreSQL refuses NUL in text and in JSON alike, so a body that
// carried one was a 500 on PostgreSQL and stored on SQLite (found by an attack); the answer
// must not depend on the store. Exec's stdin, which is never stored, is decoded with
// DecodeBinary instead.
func refuseNUL(v reflect.Value) error {
	steps, found := findNUL(v)
	if !found {
		return nil
	}
	slices.Reverse(steps) // built from the NUL up
	path := strings.Join(slices.DeleteFunc(steps, func(s string) bool { return s == "" }), ".")
	path = strings.ReplaceAll(path, ".[", "[")
	if path == "" {
		return berth.Errorf(berth.EInvalidRequest, "the body must not contain a NUL character (\\u0000)")
	}
	return berth.Errorf(berth.EInvalidRequest, "field %q must not contain a NUL character (\\u0000)", path)
}

// findNUL reports whether a string in v holds a NUL, and the JSON path to it from v, last
// step first. The path is built only on the way back from a NUL: a walk that finds none
// allocates nothing.
func findNUL(v reflect.Value) ([]string, bool) {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return findNUL(v.Elem())
		}
	case reflect.String:
		return nil, strings.IndexByte(v.String(), 0) >= 0
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return nil, false // bytes ([]byte, json.RawMessage) are not text
		}
		for i := range v.Len() {
			if steps, found := findNUL(v.Index(i)); found {
				return append(steps, "["+strconv.Itoa(i)+"]"), true
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			k := it.Key()
			if k.Kind() == reflect.String && strings.IndexByte(k.String(), 0) >= 0 {
				return nil, true // the key itself: the path ends at the map
			}
			if steps, found := findNUL(it.Value()); found {
				return append(steps, keyText(k)), true
			}
		}
	case reflect.Struct:
		for _, f := range textFields(v.Type()) {
			if steps, found := findNUL(v.Field(f.index)); found {
				return append(steps, f.name), true
			}
		}
	}
	return nil, false
}

// textField is a struct field JSON reads that may hold text: its index and its JSON name
// ("" for an embedded struct, whose fields are its parent's).
type textField struct {
	index int
	name  string
}

// textFieldsOf caches textFields per struct type: a heartbeat's thousand held sandboxes are
// one type, looked at once.
var textFieldsOf sync.Map // reflect.Type → []textField

// textFields returns the fields of struct type t that JSON reads and that may hold a string.
func textFields(t reflect.Type) []textField {
	if fs, ok := textFieldsOf.Load(t); ok {
		return fs.([]textField)
	}
	var fs []textField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() && !f.Anonymous {
			continue // JSON neither reads nor writes it; an embedded struct's fields it does
		}
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		switch {
		case tag == "-" || !mayHoldText(f.Type, map[reflect.Type]bool{}):
			continue // only a tag of exactly "-" hides a field: "-," names it "-"
		case f.Anonymous && name == "" && embedsStruct(f.Type):
			// an embedded struct: its fields are the parent's, no step of its own
		case name == "":
			name = f.Name // an embedded non-struct is a field named after its type
		}
		fs = append(fs, textField{i, name})
	}
	textFieldsOf.Store(t, fs)
	return fs
}

// mayHoldText reports whether a value of type t can hold a string NUL could be in; seen
// breaks cycles of recursive types.
func mayHoldText(t reflect.Type, seen map[reflect.Type]bool) bool {
	if seen[t] {
		return false
	}
	seen[t] = true
	switch t.Kind() {
	case reflect.String, reflect.Interface:
		return true
	case reflect.Pointer:
		return mayHoldText(t.Elem(), seen)
	case reflect.Slice, reflect.Array:
		return t.Elem().Kind() != reflect.Uint8 && mayHoldText(t.Elem(), seen)
	case reflect.Map:
		return t.Key().Kind() == reflect.String || mayHoldText(t.Elem(), seen)
	case reflect.Struct:
		for i := range t.NumField() {
			if f := t.Field(i); (f.IsExported() || f.Anonymous) && mayHoldText(f.Type, seen) {
				return true
			}
		}
	}
	return false
}

// embedsStruct reports whether an embedded field of type t promotes its fields, as
// encoding/json reads it: a struct, or a pointer to one.
func embedsStruct(t reflect.Type) bool {
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.Kind() == reflect.Struct
}

// keyText is a map key as JSON writes it, for a field path.
func keyText(k reflect.Value) string {
	switch k.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(k.Int(), 10)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return strconv.FormatUint(k.Uint(), 10)
	}
	return k.String()
}
