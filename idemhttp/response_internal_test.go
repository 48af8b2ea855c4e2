package idemhttp

import (
	"bytes"
	"net/http"
	"reflect"
	"testing"
)

func TestResponseBinary(t *testing.T) {
	tests := []struct {
		name string
		resp response
	}{
		{"status only", response{status: 204}},
		{"headers and body", response{
			status: 201,
			header: http.Header{"Content-Type": {"application/json"}, "Location": {"/charges/1"}, "Etag": {`"1"`}},
			body:   []byte(`{"id":1}`),
		}},
		{"repeated header", response{status: 200, header: http.Header{"Link": {"<a>", "<b>"}}, body: []byte{0, 1, 2}}},
		{"binary body", response{status: 402, body: bytes.Repeat([]byte{0xff, 0}, 1000)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := tt.resp.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			var got response
			if err := got.UnmarshalBinary(data); err != nil {
				t.Fatal(err)
			}
			if got.status != tt.resp.status || !bytes.Equal(got.body, tt.resp.body) ||
				(len(tt.resp.header) > 0 && !reflect.DeepEqual(got.header, tt.resp.header)) || (len(tt.resp.header) == 0 && len(got.header) != 0) {
				t.Fatalf("round trip: got %+v, want %+v", got, tt.resp)
			}
			// Every proper prefix up to the body is an error, never a panic.
			for i := 0; i < len(data)-len(tt.resp.body); i++ {
				var r response
				if err := r.UnmarshalBinary(data[:i]); err == nil {
					t.Fatalf("prefix of %d bytes decoded without error", i)
				}
			}
		})
	}
}

// FuzzResponseBinary checks that UnmarshalBinary never panics on stored
// bytes, and that whatever it accepts encodes back to a form that decodes to
// the same response.
func FuzzResponseBinary(f *testing.F) {
	seed, _ := response{status: 201, header: http.Header{"Location": {"/x"}}, body: []byte("ok")}.MarshalBinary()
	f.Add(seed)
	f.Add([]byte{1, 200, 1, 0})
	f.Add([]byte{1, 0xc8, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r response
		if r.UnmarshalBinary(data) != nil {
			return
		}
		again, err := r.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var r2 response
		if err := r2.UnmarshalBinary(again); err != nil {
			t.Fatalf("re-encoded response does not decode: %v", err)
		}
		if r2.status != r.status || !bytes.Equal(r2.body, r.body) || len(r2.header) != len(r.header) {
			t.Fatalf("round trip changed %+v into %+v", r, r2)
		}
	})
}
