package idem

import (
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
)

// encode serializes a result for storage. A type that implements
// encoding.BinaryMarshaler (with *T implementing encoding.BinaryUnmarshaler)
// is stored in its own form, without reflection; any other type as JSON.
func encode[T any](v T) ([]byte, error) {
	if isBinary[T]() {
		return any(v).(encoding.BinaryMarshaler).MarshalBinary()
	}
	return json.Marshal(v)
}

func decode[T any](data []byte) (T, error) {
	var v T
	if isBinary[T]() {
		err := any(&v).(encoding.BinaryUnmarshaler).UnmarshalBinary(data)
		return v, err
	}
	if len(data) == 0 {
		return v, errors.New("empty stored result")
	}
	err := json.Unmarshal(data, &v)
	return v, err
}

// isBinary reports whether T stores itself with MarshalBinary.
func isBinary[T any]() bool {
	var v T
	if _, ok := any(v).(encoding.BinaryMarshaler); !ok {
		return false
	}
	_, ok := any(&v).(encoding.BinaryUnmarshaler)
	return ok
}

// storedForm returns v as a replay will see it: decoded from data. The first
// call returns this form too, so that it and every replay are equal (a
// time.Time loses its monotonic reading and location in JSON, an empty slice
// under omitempty comes back nil). A type with its own MarshalBinary is
// trusted to round-trip and returned as it is.
func storedForm[T any](v T, data []byte) (T, error) {
	if isBinary[T]() {
		return v, nil
	}
	back, err := decode[T](data)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("idem: the result does not decode from its own JSON (%T): %w", v, err)
	}
	return back, nil
}

// storable caches checkType's verdict per result type.
var storable sync.Map // reflect.Type -> verdict

type verdict struct{ err error }

// checkStorable reports whether a T can be stored and replayed exactly: an
// error wrapping ErrInvalidOption that names the first part JSON cannot
// carry, or nil.
func checkStorable[T any]() error {
	t := reflect.TypeFor[T]()
	if v, ok := storable.Load(t); ok {
		return v.(verdict).err
	}
	var err error
	if !isBinary[T]() {
		if problem := checkType(t, t.String(), map[reflect.Type]bool{}); problem != "" {
			err = inputError(ErrInvalidOption, "result type %v cannot be replayed exactly: %s; give the type MarshalBinary/UnmarshalBinary or MarshalJSON/UnmarshalJSON methods, or store plain exported fields", t, problem)
		}
	}
	storable.Store(t, verdict{err})
	return err
}

var (
	jsonMarshaler   = reflect.TypeFor[json.Marshaler]()
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textMarshaler   = reflect.TypeFor[encoding.TextMarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// marshalsItself reports whether t has a JSON or text encoding of its own in
// both directions, which encoding/json uses instead of reflection.
func marshalsItself(t reflect.Type) bool {
	pt := reflect.PointerTo(t)
	return (t.Implements(jsonMarshaler) || pt.Implements(jsonMarshaler)) && pt.Implements(jsonUnmarshaler) ||
		(t.Implements(textMarshaler) || pt.Implements(textMarshaler)) && pt.Implements(textUnmarshaler)
}

// checkType walks t as encoding/json would and returns what it would lose
// (path: the Go expression reaching the part), or "".
func checkType(t reflect.Type, path string, seen map[reflect.Type]bool) string {
	if seen[t] {
		return ""
	}
	if marshalsItself(t) {
		return ""
	}
	seen[t] = true
	defer delete(seen, t)
	switch t.Kind() {
	case reflect.Bool, reflect.String,
		reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Float32, reflect.Float64:
		return ""
	case reflect.Interface:
		return path + " is an interface (" + t.String() + "): JSON does not record the dynamic type, so int64(7) would replay as float64(7)"
	case reflect.Pointer:
		return checkType(t.Elem(), "(*"+path+")", seen)
	case reflect.Slice, reflect.Array:
		return checkType(t.Elem(), path+"[i]", seen)
	case reflect.Map:
		k := t.Key()
		switch {
		case k.Kind() == reflect.String, marshalsItself(k) && (k.Implements(textMarshaler) || reflect.PointerTo(k).Implements(textUnmarshaler)):
		case k.Kind() >= reflect.Int && k.Kind() <= reflect.Uintptr:
		default:
			return path + " is a map with " + k.String() + " keys, which JSON cannot encode"
		}
		return checkType(t.Elem(), path+"[k]", seen)
	case reflect.Struct:
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			fpath := path + "." + f.Name
			switch {
			case tag == "-" && f.Tag.Get("json") == "-":
				return fpath + " is tagged `json:\"-\"`, so it is not stored"
			case !f.IsExported() && !f.Anonymous:
				return fpath + " is unexported, so it is not stored"
			case f.Anonymous && !f.IsExported():
				ft := f.Type
				if ft.Kind() == reflect.Pointer {
					return fpath + " embeds a pointer to an unexported type, which encoding/json cannot decode into"
				}
				if ft.Kind() != reflect.Struct {
					return fpath + " embeds an unexported non-struct type, so it is not stored"
				}
			}
			if problem := checkType(f.Type, fpath, seen); problem != "" {
				return problem
			}
		}
		return ""
	default: // complex, chan, func, unsafe pointer
		return path + " is a " + t.Kind().String() + ", which JSON cannot encode"
	}
}
