package httpenvelope

import (
	"bytes"
	"net/http"
	"reflect"
	"testing"
)

// FuzzResponseRoundTrip: every response the middleware can store
// (a final status up to 599, any replayable header values, any body)
// decodes to itself.
func FuzzResponseRoundTrip(f *testing.F) {
	f.Add(201, "Location", "/x", "Etag", `"1"`, []byte("ok"))
	f.Add(402, "Content-Type", "", "Content-Type", "text/plain", []byte{})
	f.Fuzz(func(t *testing.T, status int, n1, v1, n2, v2 string, body []byte) {
		if status < 200 || status > 599 {
			return
		}
		h := http.Header{}
		h[n1] = append(h[n1], v1)
		h[n2] = append(h[n2], v2)
		in := Response{Status: status, Header: h, Body: body}
		data, err := in.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var out Response
		if err := out.UnmarshalBinary(data); err != nil {
			t.Fatalf("stored response does not decode: %v", err)
		}
		if out.Status != in.Status || !bytes.Equal(out.Body, in.Body) || !reflect.DeepEqual(out.Header, in.Header) {
			t.Fatalf("round trip: %+v, want %+v", out, in)
		}
	})
}
