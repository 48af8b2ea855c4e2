package idem

import (
	"encoding"
	"encoding/json"
	"fmt"
)

// encode serializes a result for storage. A type that implements
// encoding.BinaryMarshaler (with *T implementing encoding.BinaryUnmarshaler)
// is stored in its own compact form, without reflection; any other type is
// stored as JSON, so its exported fields are what a replay gets back.
func encode[T any](v T) ([]byte, error) {
	if m, ok := any(v).(encoding.BinaryMarshaler); ok {
		if _, ok := any(new(T)).(encoding.BinaryUnmarshaler); ok {
			return m.MarshalBinary()
		}
	}
	return json.Marshal(v)
}

func decode[T any](data []byte) (T, error) {
	var v T
	if u, ok := any(&v).(encoding.BinaryUnmarshaler); ok {
		if _, ok := any(v).(encoding.BinaryMarshaler); ok {
			err := u.UnmarshalBinary(data)
			return v, err
		}
	}
	if len(data) == 0 {
		return v, fmt.Errorf("empty stored result")
	}
	err := json.Unmarshal(data, &v)
	return v, err
}
