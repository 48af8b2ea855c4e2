package canonjson

import (
	"encoding"
	"encoding/json"
	"errors"
	"reflect"
	"unicode/utf8"
)

// errInvalidUTF8 is CheckUTF8's error.
var errInvalidUTF8 = errors.New("a string is not valid UTF-8 (json.Marshal would replace it with U+FFFD)")

var (
	jsonMarshaler = reflect.TypeFor[json.Marshaler]()
	textMarshaler = reflect.TypeFor[encoding.TextMarshaler]()
)

// CheckUTF8 fails on the first string json.Marshal would encode from v with
// U+FFFD in place of invalid UTF-8: a field, a map key, an element, a
// TextMarshaler's text. A json.Marshaler's output is left to Canonicalize,
// which refuses invalid UTF-8 itself. v must be a value json.Marshal has
// accepted: the walk does not look for cycles, which json.Marshal refuses.
func CheckUTF8(v any) error {
	return validUTF8(reflect.ValueOf(v), 0)
}

// validUTF8 is CheckUTF8 on the value v, reached through depth pointers,
// interfaces and containers; depth stops a walk as deep as Canonicalize
// would refuse anyway.
func validUTF8(v reflect.Value, depth int) error {
	if !v.IsValid() || depth > maxDepth {
		return nil
	}
	t := v.Type()
	if t.Implements(jsonMarshaler) || v.CanAddr() && reflect.PointerTo(t).Implements(jsonMarshaler) {
		return nil
	}
	if tm, ok := asTextMarshaler(v); ok {
		if k := v.Kind(); (k == reflect.Pointer || k == reflect.Interface) && v.IsNil() {
			return nil
		}
		text, err := tm.MarshalText()
		if err == nil && !utf8.Valid(text) {
			return errInvalidUTF8
		}
		return nil
	}
	switch v.Kind() {
	case reflect.String:
		if !utf8.ValidString(v.String()) {
			return errInvalidUTF8
		}
	case reflect.Pointer, reflect.Interface:
		return validUTF8(v.Elem(), depth+1)
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 && v.Kind() == reflect.Slice {
			return nil // base64
		}
		for i := range v.Len() {
			if err := validUTF8(v.Index(i), depth+1); err != nil {
				return err
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if err := validUTF8(it.Key(), depth+1); err != nil {
				return err
			}
			if err := validUTF8(it.Value(), depth+1); err != nil {
				return err
			}
		}
	case reflect.Struct:
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() && !f.Anonymous || f.Tag.Get("json") == "-" {
				continue
			}
			if err := validUTF8(v.Field(i), depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// asTextMarshaler returns v as an encoding.TextMarshaler, as json.Marshal
// would use it, if it is one.
func asTextMarshaler(v reflect.Value) (encoding.TextMarshaler, bool) {
	if v.Type().Implements(textMarshaler) && v.CanInterface() {
		tm, ok := v.Interface().(encoding.TextMarshaler)
		return tm, ok
	}
	if v.CanAddr() && reflect.PointerTo(v.Type()).Implements(textMarshaler) && v.Addr().CanInterface() {
		tm, ok := v.Addr().Interface().(encoding.TextMarshaler)
		return tm, ok
	}
	return nil, false
}
