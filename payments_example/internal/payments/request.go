package payments

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/idemhq/idem/idemhttp"
)

// MaxBodyBytes is the largest request body the service accepts: 1 MiB.
// idemhttp enforces it on POST /payments; decode enforces it everywhere.
const MaxBodyBytes = 1 << 20

// MaxOwnerBytes is the longest account owner, in bytes of UTF-8.
const MaxOwnerBytes = 200

// decode reads r's body as exactly one JSON object into v, a pointer to
// one of package api's request structs. It refuses what a lenient decoder
// would let through: a field the struct does not have (a misspelt
// "amount" must not become a charge of zero), a field in another case
// ("AMOUNT"), a field given twice, null, and a missing field whose name is
// in required. It returns the reply to send when the body is unacceptable.
//
// The replies are fixed sentences: they never repeat the client's bytes,
// which may be megabytes long or crafted to mislead whoever reads them.
// A field is named only by the struct's own JSON tag, never by the key the
// client sent.
func decode(r *http.Request, v any, required ...string) (reply, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(nil, r.Body, MaxBodyBytes))
	if err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return fail(http.StatusRequestEntityTooLarge, idemhttp.ProblemBodyTooLarge,
				fmt.Sprintf("the body is larger than %d bytes", MaxBodyBytes)), false
		}
		return invalid("the body could not be read"), false
	}
	return decodeBody(body, v, required...)
}

// decodeBody is decode of a body already read.
func decodeBody(body []byte, v any, required ...string) (reply, bool) {
	if !utf8.Valid(body) {
		return invalid("the body is not valid UTF-8"), false
	}
	fields := jsonFields(reflect.TypeOf(v).Elem())
	if rep, ok := checkObject(body, fields, required); !ok {
		return rep, false
	}
	if err := json.Unmarshal(body, v); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			if typ, known := fields[typeErr.Field]; known {
				return invalid(typeErr.Field + " must be " + typeName(typ)), false
			}
		}
		return invalid("the body does not match the expected fields"), false
	}
	return reply{}, true
}

// checkObject checks the shape of body against fields (JSON name -> Go
// type) without decoding other values: one object, known keys spelt
// exactly, each at most once and not null, ids that are UUIDs, every
// required one present, nothing after it.
func checkObject(body []byte, fields map[string]reflect.Type, required []string) (reply, bool) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	switch {
	case errors.Is(err, io.EOF):
		return invalid("the body is empty; send one JSON object"), false
	case err != nil:
		return invalid("the body is not valid JSON"), false
	case tok != json.Delim('{'):
		return invalid("the body must be one JSON object"), false
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return invalid("the body is not valid JSON"), false
		}
		key, _ := tok.(string) // an object's keys are strings
		var value json.RawMessage
		if err := dec.Decode(&value); err != nil {
			return invalid("the body is not valid JSON"), false
		}
		if _, known := fields[key]; !known {
			return invalid("unknown field"), false
		}
		if seen[key] {
			return invalid(key + " appears more than once"), false
		}
		seen[key] = true
		if string(value) == "null" {
			return invalid(key + " must not be null"), false
		}
		if fields[key] == uuidType {
			// uuid.UUID's own decoding error names no field.
			var id string
			if json.Unmarshal(value, &id) != nil || uuid.Validate(id) != nil {
				return invalid(key + " must be a UUID"), false
			}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return invalid("the body is not valid JSON"), false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return invalid("the body holds more than one JSON value"), false
	}
	for _, name := range required {
		if !seen[name] {
			return invalid(name + " is required"), false
		}
	}
	return reply{}, true
}

// uuidType is the type of the ids in package api's structs.
var uuidType = reflect.TypeFor[uuid.UUID]()

// jsonFields maps the JSON names of struct type t's fields to their types.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := map[string]reflect.Type{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name != "" && name != "-" {
			fields[name] = f.Type
		}
	}
	return fields
}

// typeName says what a JSON value must be to fill a field of type t.
func typeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	default:
		return "of another type"
	}
}

// invalid is a 400 with the service's invalid-request type. It is not
// stored under the key: the client fixes the body and retries with it.
func invalid(detail string) reply {
	return fail(http.StatusBadRequest, ProblemInvalidRequest, detail)
}

// validOwner reports why owner is not an acceptable account owner: 1 to
// MaxOwnerBytes bytes of UTF-8 (decode has checked the encoding), not only
// white space, without control characters (NUL included: PostgreSQL's
// text cannot hold it).
func validOwner(owner string) (string, bool) {
	switch {
	case strings.TrimSpace(owner) == "":
		return "owner is required", false
	case len(owner) > MaxOwnerBytes:
		return fmt.Sprintf("owner must be at most %d bytes", MaxOwnerBytes), false
	case strings.ContainsFunc(owner, unicode.IsControl):
		return "owner must not contain control characters", false
	}
	return "", true
}
