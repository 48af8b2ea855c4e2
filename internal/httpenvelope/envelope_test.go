package httpenvelope

import (
	"bytes"
	"net/http"
	"reflect"
	"testing"
)

func TestResponseBinary(t *testing.T) {
	tests := []struct {
		name string
		resp Response
	}{
		{"status only", Response{Status: 204}},
		{"headers and body", Response{
			Status: 201,
			Header: http.Header{"Content-Type": {"application/json"}, "Location": {"/charges/1"}, "Etag": {`"1"`}},
			Body:   []byte(`{"id":1}`),
		}},
		{"repeated header", Response{Status: 200, Header: http.Header{"Link": {"<a>", "<b>"}}, Body: []byte{0, 1, 2}}},
		{"binary body", Response{Status: 402, Body: bytes.Repeat([]byte{0xff, 0}, 1000)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			data, err := tt.resp.MarshalBinary()
			if err != nil {
				t.Fatal(err)
			}
			var got Response
			if err := got.UnmarshalBinary(data); err != nil {
				t.Fatal(err)
			}
			if got.Status != tt.resp.Status || !bytes.Equal(got.Body, tt.resp.Body) ||
				(len(tt.resp.Header) > 0 && !reflect.DeepEqual(got.Header, tt.resp.Header)) || (len(tt.resp.Header) == 0 && len(got.Header) != 0) {
				t.Fatalf("round trip: got %+v, want %+v", got, tt.resp)
			}
			// Every proper prefix up to the body is an error, never a panic.
			for i := 0; i < len(data)-len(tt.resp.Body); i++ {
				var r Response
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
	seed, _ := Response{Status: 201, Header: http.Header{"Location": {"/x"}}, Body: []byte("ok")}.MarshalBinary()
	f.Add(seed)
	f.Add([]byte{1, 200, 1, 0})
	f.Add([]byte{1, 0xc8, 0x01, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Response
		if r.UnmarshalBinary(data) != nil {
			return
		}
		again, err := r.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var r2 Response
		if err := r2.UnmarshalBinary(again); err != nil {
			t.Fatalf("re-encoded response does not decode: %v", err)
		}
		if r2.Status != r.Status || !bytes.Equal(r2.Body, r.Body) || len(r2.Header) != len(r.Header) {
			t.Fatalf("round trip changed %+v into %+v", r, r2)
		}
	})
}
