package kit

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// ChangeJSON returns a JSON document that differs from doc in one value,
// always the same one: the first number, string or boolean met depth first,
// with object members in key order. A number gains 1, a string gets
// "-changed" appended, a boolean flips and null becomes 0. A document with
// no such value gets a member (or element) "idemtest-changed" added.
// Numbers keep their spelling elsewhere; the result is compact JSON.
func ChangeJSON(doc []byte) ([]byte, error) {
	d := json.NewDecoder(bytes.NewReader(doc))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("the body is not JSON: %w", err)
	}
	if d.More() {
		return nil, errors.New("the body holds more than one JSON value")
	}
	v, changed := change(v)
	if !changed {
		switch x := v.(type) {
		case map[string]any:
			x["idemtest-changed"] = true
		case []any:
			v = append(x, "idemtest-changed")
		}
	}
	return json.Marshal(v)
}

// change changes the first scalar in v and reports whether it found one.
func change(v any) (any, bool) {
	switch x := v.(type) {
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			if nv, ok := change(x[k]); ok {
				x[k] = nv
				return x, true
			}
		}
		return x, false
	case []any:
		for i := range x {
			if nv, ok := change(x[i]); ok {
				x[i] = nv
				return x, true
			}
		}
		return x, false
	case json.Number:
		if n, err := strconv.ParseInt(string(x), 10, 64); err == nil {
			if n == 1<<63-1 {
				return json.Number(strconv.FormatInt(n-1, 10)), true
			}
			return json.Number(strconv.FormatInt(n+1, 10)), true
		}
		f, err := strconv.ParseFloat(string(x), 64)
		if err != nil { // beyond float64's range: any finite number differs
			return json.Number("0"), true
		}
		if f+1 == f {
			return json.Number(strconv.FormatFloat(-f, 'g', -1, 64)), true
		}
		return json.Number(strconv.FormatFloat(f+1, 'g', -1, 64)), true
	case string:
		return x + "-changed", true
	case bool:
		return !x, true
	case nil:
		return json.Number("0"), true
	}
	return v, false
}
