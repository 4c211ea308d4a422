package httpjson

import (
	"encoding/json"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"github.com/berth-dev/berth"
)

// typeError words a JSON value of the wrong type for its field as invalid_request, naming the
// field by the JSON path a client sent (never a Go type: encoding/json puts the name of an
// embedded struct, e.g. "AppSpec", in the path) and what the field takes. A number too big or
// too small for its field is said to be out of range, with the range, not to be of the wrong
// kind.
func typeError(te *json.UnmarshalTypeError, v any) error {
	field, fieldType := jsonPath(te.Field, v)
	if lo, hi, ok := outOfRange(te); ok {
		return berth.Errorf(berth.EInvalidRequest, "field %q: %s is out of range (%s to %s)",
			field, clip(strings.TrimPrefix(te.Value, "number ")), lo, hi)
	}
	want := jsonKind(te.Type.Kind())
	if fieldType != nil && fieldType != te.Type {
		switch fieldType.Kind() {
		case reflect.Slice, reflect.Array:
			return berth.Errorf(berth.EInvalidRequest, "field %q must be an array; each item must be %s", field, want)
		case reflect.Map:
			return berth.Errorf(berth.EInvalidRequest, "field %q must be an object; each value must be %s", field, want)
		}
	}
	return berth.Errorf(berth.EInvalidRequest, "field %q must be %s", field, want)
}

// jsonPath rewrites encoding/json's dotted field path (each step a JSON name, except that a
// field promoted from an embedded struct is preceded by the embedded type's Go name) into the
// JSON path: the Go names are dropped. It also returns the Go type of the field the path ends
// at, nil when it cannot be followed (v nil or not a struct).
func jsonPath(path string, v any) (string, reflect.Type) {
	t := reflect.TypeOf(v)
	var out []string
	for _, step := range strings.Split(path, ".") {
		t = container(t)
		if t == nil || t.Kind() != reflect.Struct {
			out, t = append(out, step), nil
			continue
		}
		if f, ok := t.FieldByName(step); ok && f.Anonymous && tagName(f) == "" && len(f.Index) == 1 && structElem(f.Type) != nil {
			t = f.Type // an embedding hop: not a name the client sent
			continue
		}
		out, t = append(out, step), fieldType(t, step)
	}
	return strings.Join(out, "."), t
}

// container strips pointers, and the element types of arrays, slices and maps whose elements
// are structs, to reach the struct the next path step names a field of.
func container(t reflect.Type) reflect.Type {
	for t != nil {
		switch t.Kind() {
		case reflect.Pointer:
			t = t.Elem()
		case reflect.Slice, reflect.Array, reflect.Map:
			if e := structElem(t.Elem()); e != nil {
				t = e
				continue
			}
			return t
		default:
			return t
		}
	}
	return nil
}

func structElem(t reflect.Type) reflect.Type {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	return t
}

// fieldType is the type of t's direct field whose JSON name is name, nil when none is.
func fieldType(t reflect.Type, name string) reflect.Type {
	for i := range t.NumField() {
		f := t.Field(i)
		if n := tagName(f); n == name || n == "" && f.Name == name && !f.Anonymous {
			return f.Type
		}
	}
	return nil
}

func tagName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	return name
}

var integerRE = regexp.MustCompile(`^-?[0-9]+$`)

// outOfRange reports whether te is a JSON number that has the form its field takes (an
// integer for an integer field, any number for a float field) but does not fit in it, and the
// field's range.
func outOfRange(te *json.UnmarshalTypeError) (lo, hi string, ok bool) {
	num, isNum := strings.CutPrefix(te.Value, "number ")
	if !isNum {
		return "", "", false
	}
	t := te.Type
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		bits := t.Bits()
		return strconv.FormatInt(-1<<(bits-1), 10), strconv.FormatInt(1<<(bits-1)-1, 10), integerRE.MatchString(num)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "0", strconv.FormatUint(math.MaxUint64>>(64-t.Bits()), 10), integerRE.MatchString(num)
	case reflect.Float32:
		return fmt.Sprint(-math.MaxFloat32), fmt.Sprint(math.MaxFloat32), true
	case reflect.Float64:
		return fmt.Sprint(-math.MaxFloat64), fmt.Sprint(math.MaxFloat64), true
	}
	return "", "", false
}

// clip shortens a number a client sent to at most 32 characters for an error message.
func clip(num string) string {
	if len(num) <= 32 {
		return num
	}
	return fmt.Sprintf("%s… (%d digits)", num[:24], len(num))
}

// jsonKind names a Go kind the way a JSON client thinks of it.
func jsonKind(k reflect.Kind) string {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "of another type"
}
