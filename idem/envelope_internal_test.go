package idem

import (
	"bytes"
	"testing"
)

// FuzzEnvelope: unmarshalEnvelope never panics on what a Sealer
// opened, and what marshal writes comes back whole for its own key and is
// refused for any other.
func FuzzEnvelope(f *testing.F) {
	f.Add([]byte{1, 0, 1, 'k', 9, 'c', 'o', 'm', 'p', 'l', 'e', 't', 'e', 'd', 1, 'h', 0, '{', '}'}, "", "k", "completed", "h", []byte(nil), []byte("{}"))
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, "\x1fop\x1fs", "key", "refused", "h", []byte(`{"code":"x"}`), []byte{})
	f.Fuzz(func(t *testing.T, raw []byte, scope, key, status, hash string, refusal, value []byte) {
		_, _ = unmarshalEnvelope(raw, scope, key)

		e := envelope{status: status, requestHash: hash, refusal: refusal, value: value}
		b := e.marshal(scope, key)
		got, err := unmarshalEnvelope(b, scope, key)
		if err != nil {
			t.Fatalf("own envelope: %v", err)
		}
		if got.status != status || got.requestHash != hash || !bytes.Equal(got.refusal, refusal) || !bytes.Equal(got.value, value) {
			t.Fatalf("round trip: %+v, want %+v", got, e)
		}
		if len(refusal) == 0 && got.refusal != nil {
			t.Fatalf("an empty refusal came back as %q", got.refusal)
		}
		if _, err := unmarshalEnvelope(b, scope, key+"x"); err == nil {
			t.Fatal("an envelope opened for another key")
		}
		if _, err := unmarshalEnvelope(b, scope+"x", key); err == nil {
			t.Fatal("an envelope opened for another scope")
		}
	})
}
