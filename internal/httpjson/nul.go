package httpjson

import (
	"reflect"
	"strconv"
	"strings"

	"github.com/berth-dev/berth"
)

// refuseNUL returns invalid_request when a string v holds anywhere — a field, a map key or
// value, a list element, at any depth — contains a NUL character (JSON "\u0000"), naming the
// field by its JSON path. PostgreSQL refuses NUL in text and in JSON alike, so a body that
// carried one was a 500 on PostgreSQL and stored on SQLite (found by an attack); the answer
// must not depend on the store. Exec's stdin, which is never stored, is decoded with
// DecodeBinary instead.
func refuseNUL(v reflect.Value, path string) error {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return refuseNUL(v.Elem(), path)
		}
	case reflect.String:
		if strings.IndexByte(v.String(), 0) >= 0 {
			return nulError(path)
		}
	case reflect.Slice, reflect.Array:
		if v.Type().Elem().Kind() == reflect.Uint8 {
			return nil // bytes ([]byte, json.RawMessage) are not text
		}
		for i := range v.Len() {
			if err := refuseNUL(v.Index(i), path+"["+strconv.Itoa(i)+"]"); err != nil {
				return err
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			k := it.Key()
			if k.Kind() == reflect.String && strings.IndexByte(k.String(), 0) >= 0 {
				return nulError(path)
			}
			if err := refuseNUL(it.Value(), join(path, k.String())); err != nil {
				return err
			}
		}
	case reflect.Struct:
		t := v.Type()
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() && !f.Anonymous {
				continue // JSON neither reads nor writes it; an embedded struct's fields it does
			}
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-":
				continue
			case f.Anonymous && name == "":
				name = "" // embedded: its fields are the parent's
			case name == "":
				name = f.Name
			}
			if err := refuseNUL(v.Field(i), join(path, name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func join(path, name string) string {
	switch {
	case name == "":
		return path
	case path == "":
		return name
	}
	return path + "." + name
}

func nulError(path string) error {
	if path == "" {
		return berth.Errorf(berth.EInvalidRequest, "the body must not contain a NUL character (\\u0000)")
	}
	return berth.Errorf(berth.EInvalidRequest, "field %q must not contain a NUL character (\\u0000)", path)
}
