package idem

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"sync"
)

// encode serializes a result for storage. A type that implements
// encoding.BinaryMarshaler and encoding.BinaryUnmarshaler itself (not
// through an embedded field) is stored in its own form, without reflection;
// any other type as JSON.
func encode[T any](v T) ([]byte, error) {
	if codecOf[T]().binary {
		return any(&v).(encoding.BinaryMarshaler).MarshalBinary()
	}
	return json.Marshal(v)
}

func decode[T any](data []byte) (T, error) {
	var v T
	if codecOf[T]().binary {
		err := any(&v).(encoding.BinaryUnmarshaler).UnmarshalBinary(data)
		return v, err
	}
	if len(data) == 0 {
		return v, errors.New("empty stored result")
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return v, err
	}
	if foreign[T](data, &v) {
		return v, fmt.Errorf("the stored result shares no field with %v: it was stored by another caller under the same scope and key (a result of another type), not by this one", reflect.TypeFor[T]())
	}
	return v, nil
}

// foreign reports a result that another caller stored: a JSON object with
// members, none of which is a field of T, so that it decodes into T's zero
// value. Two callers that use one key in one scope (the empty scope is
// shared by every caller of the table) would otherwise be answered each
// other's results as zero values. A type that gained or lost fields since
// it stored a result still shares the others, and replays. Only the zero
// value is looked into, so a replay pays nothing for the check.
func foreign[T any](data []byte, v *T) bool {
	t := reflect.TypeFor[T]()
	if t.Kind() != reflect.Struct || reflect.PointerTo(t).Implements(jsonUnmarshaler) || !reflect.ValueOf(v).Elem().IsZero() {
		return false
	}
	var members map[string]json.RawMessage
	if json.Unmarshal(data, &members) != nil || len(members) == 0 {
		return false
	}
	for name := range members {
		// encoding/json's own matching of a member to a field (tags,
		// case folding, embedded structs): a member it knows decodes
		// without an unknown-field error.
		probe, err := json.Marshal(map[string]any{name: nil})
		if err != nil {
			return false
		}
		dec := json.NewDecoder(bytes.NewReader(probe))
		dec.DisallowUnknownFields()
		if dec.Decode(reflect.New(t).Interface()) == nil {
			return false
		}
	}
	return true
}

// storedForm returns v as a replay will see it: decoded from data. The first
// call returns this form too, so that it and every replay are equal (a
// time.Time loses its monotonic reading and location in JSON, an empty slice
// under omitempty comes back nil). A type with its own MarshalBinary is
// decoded with its UnmarshalBinary, so a lossy pair shows on the first call.
func storedForm[T any](v T, data []byte) (T, error) {
	back, err := decode[T](data)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("idem: the result does not decode from what it encoded to (%T): %w", v, err)
	}
	return back, nil
}

// codec is how a result type is stored, decided once per type.
type codec struct {
	binary bool  // with its own MarshalBinary/UnmarshalBinary, else JSON
	err    error // why the type cannot be replayed exactly, or nil
}

var codecs sync.Map // reflect.Type -> codec

func codecOf[T any]() codec {
	t := reflect.TypeFor[T]()
	if c, ok := codecs.Load(t); ok {
		return c.(codec)
	}
	var c codec
	pt := reflect.PointerTo(t)
	// A struct's promoted MarshalBinary (a struct embedding time.Time)
	// encodes the embedded field alone: only a declared one is trusted.
	c.binary = pt.Implements(binaryMarshaler) && pt.Implements(binaryUnmarshaler) &&
		(t.Kind() != reflect.Struct || declares(t, "MarshalBinary"))
	if !c.binary {
		if problem := checkType(t, t.String(), forStorage, map[reflect.Type]bool{}); problem != "" {
			c.err = inputError(ErrInvalidOption, "result type %v cannot be replayed exactly: %s; give the type MarshalBinary/UnmarshalBinary or MarshalJSON/UnmarshalJSON methods, or store plain exported fields", t, problem)
		}
	}
	codecs.Store(t, c)
	return c
}

// checkStorable reports whether a T can be stored and replayed exactly: an
// error wrapping ErrInvalidOption that names the first part JSON cannot
// carry, or nil.
func checkStorable[T any]() error { return codecOf[T]().err }

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

// oneWay reports a JSON or text encoding that t has in one direction only:
// encoding/json then writes one form and reads another.
func oneWay(t reflect.Type) string {
	pt := reflect.PointerTo(t)
	m, u := pt.Implements(jsonMarshaler), pt.Implements(jsonUnmarshaler)
	if m != u {
		return "has MarshalJSON or UnmarshalJSON without the other"
	}
	if m {
		return ""
	}
	if pt.Implements(textMarshaler) != pt.Implements(textUnmarshaler) {
		return "has MarshalText or UnmarshalText without the other"
	}
	return ""
}

// purpose is what a type is checked for: storing and replaying a result,
// which needs JSON both ways and exactly, or fingerprinting a request,
// which needs only that JSON writes everything the value holds.
type purpose bool

const (
	forStorage     purpose = false
	forFingerprint purpose = true
)

// checkType walks t as encoding/json would and returns what it would lose
// (path: the Go expression reaching the part), or "".
func checkType(t reflect.Type, path string, why purpose, seen map[reflect.Type]bool) string {
	if seen[t] {
		return ""
	}
	if why == forStorage {
		if problem := oneWay(t); problem != "" {
			return path + " (" + t.String() + ") " + problem
		}
	} else if reflect.PointerTo(t).Implements(jsonMarshaler) || reflect.PointerTo(t).Implements(textMarshaler) {
		if problem := promotedCodec(t, path); problem != "" {
			return problem
		}
		return "" // its own encoding writes what it holds
	}
	if problem := promotedCodec(t, path); problem != "" {
		return problem
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
		if why == forFingerprint {
			return "" // the dynamic value is encoded; its Go type does not matter to a fingerprint
		}
		return path + " is an interface (" + t.String() + "): JSON does not record the dynamic type, so int64(7) would replay as float64(7)"
	case reflect.Pointer:
		return checkType(t.Elem(), "(*"+path+")", why, seen)
	case reflect.Slice, reflect.Array:
		return checkType(t.Elem(), path+"[i]", why, seen)
	case reflect.Map:
		k := t.Key()
		switch {
		case k.Kind() == reflect.String, marshalsItself(k) && (k.Implements(textMarshaler) || reflect.PointerTo(k).Implements(textUnmarshaler)):
		case k.Kind() >= reflect.Int && k.Kind() <= reflect.Uintptr:
		default:
			return path + " is a map with " + k.String() + " keys, which JSON cannot encode"
		}
		return checkType(t.Elem(), path+"[k]", why, seen)
	case reflect.Struct:
		if problem := droppedNames(t, path); problem != "" {
			return problem
		}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			if f.Name == "_" {
				continue // a blank field holds nothing
			}
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
			if problem := checkType(f.Type, fpath, why, seen); problem != "" {
				return problem
			}
		}
		return ""
	default: // complex, chan, func, unsafe pointer
		return path + " is a " + t.Kind().String() + ", which JSON cannot encode"
	}
}

var (
	binaryMarshaler   = reflect.TypeFor[encoding.BinaryMarshaler]()
	binaryUnmarshaler = reflect.TypeFor[encoding.BinaryUnmarshaler]()
)

// declares reports whether t (or *t) declares the method name itself, as
// opposed to having it promoted from an embedded field: the compiler's
// wrapper for a promoted method has no source file of its own.
func declares(t reflect.Type, name string) bool {
	for _, tt := range [...]reflect.Type{t, reflect.PointerTo(t)} {
		m, ok := tt.MethodByName(name)
		if !ok {
			continue
		}
		pc := m.Func.Pointer()
		if file, _ := runtime.FuncForPC(pc).FileLine(pc); file != "<autogenerated>" {
			return true
		}
	}
	return false
}

// promotedCodec reports a struct whose JSON encoding is a method promoted
// from an embedded field (a struct embedding time.Time): encoding/json then
// encodes that field alone, and the struct's other fields are lost. Only the
// method encoding/json uses counts: MarshalJSON, else MarshalText.
func promotedCodec(t reflect.Type, path string) string {
	if t.Kind() != reflect.Struct {
		return ""
	}
	pt := reflect.PointerTo(t)
	var iface reflect.Type
	switch {
	case pt.Implements(jsonMarshaler):
		iface = jsonMarshaler
	case pt.Implements(textMarshaler):
		iface = textMarshaler
	default:
		return ""
	}
	name := iface.Method(0).Name
	if declares(t, name) {
		return ""
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.Anonymous || (!f.Type.Implements(iface) && !reflect.PointerTo(f.Type).Implements(iface)) {
			continue
		}
		for j := 0; j < t.NumField(); j++ {
			if j != i && t.Field(j).Name != "_" {
				return path + " embeds " + f.Type.String() + ", whose " + name + " encodes it alone: " + path + "." + t.Field(j).Name + " would be lost"
			}
		}
	}
	return ""
}

// droppedNames reports a field that encoding/json leaves out without an
// error: one hidden by a shallower field of the same JSON name, or two at
// the same depth that conflict.
func droppedNames(t reflect.Type, path string) string {
	type field struct {
		name   string
		depth  int
		tagged bool
	}
	var fields []field
	var walk func(t reflect.Type, depth int, seen map[reflect.Type]bool)
	walk = func(t reflect.Type, depth int, seen map[reflect.Type]bool) {
		if seen[t] {
			return
		}
		seen[t] = true
		defer delete(seen, t)
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			ft := f.Type
			if ft.Name() == "" && ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if f.Name == "_" || (!f.IsExported() && (!f.Anonymous || ft.Kind() != reflect.Struct)) {
				continue
			}
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, _, _ := strings.Cut(tag, ",")
			if name == "" && f.Anonymous && ft.Kind() == reflect.Struct {
				walk(ft, depth+1, seen)
				continue
			}
			tagged := name != ""
			if !tagged {
				name = f.Name
			}
			fields = append(fields, field{name, depth, tagged})
		}
	}
	walk(t, 0, map[reflect.Type]bool{})
	for i, a := range fields {
		for j, b := range fields {
			if i == j || a.name != b.name {
				continue
			}
			if b.depth < a.depth || (b.depth == a.depth && b.tagged == a.tagged) {
				return path + " has two fields encoded as " + strconv.Quote(a.name) + "; encoding/json drops at least one of them"
			}
		}
	}
	return ""
}
