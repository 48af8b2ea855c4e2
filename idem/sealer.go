package idem

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"encoding/binary"
	"errors"
)

// A Sealer transforms what is stored under a key: Seal before it is written,
// Open after it is read back for a replay or a Lookup. Use it to encrypt
// results at rest.
//
// What is sealed is not only the result: it is an envelope that also holds
// the status, the request hash, the refusal and the scope and key, and a
// replay checks the envelope against the row's columns. With an
// authenticating Sealer (an AEAD, such as NewAEADSealer's), a row whose
// status, request hash, refusal or result was edited, or that was copied to
// another key, fails to replay with ErrCorruptRecord instead of replaying a
// forged answer. scope and key are given so a Sealer can bind them as
// additional authenticated data too.
//
// An error from Seal rolls the call back (nothing is stored); an error from
// Open is returned wrapped in ErrCorruptRecord. Rows stored before a Sealer
// was configured cannot be opened by it and replay as ErrCorruptRecord until
// they expire. Removing a Sealer is not safe while sealed rows live: the
// sealed bytes would be read as a plain result, which may fail to decode or,
// for a type that decodes anything, replay garbage; Forget them, or keep the
// Sealer until they expire.
type Sealer interface {
	Seal(ctx context.Context, scope, key string, plain []byte) ([]byte, error)
	Open(ctx context.Context, scope, key string, sealed []byte) ([]byte, error)
}

// NewAEADSealer returns a Sealer that encrypts and authenticates with aead
// (for example AES-256-GCM from crypto/aes and crypto/cipher), with a random
// nonce per row and the scope and key as additional authenticated data.
// Stored form: nonce, then ciphertext and tag.
func NewAEADSealer(aead cipher.AEAD) Sealer { return aeadSealer{aead} }

type aeadSealer struct{ aead cipher.AEAD }

func (s aeadSealer) Seal(_ context.Context, scope, key string, plain []byte) ([]byte, error) {
	nonce := make([]byte, s.aead.NonceSize(), s.aead.NonceSize()+len(plain)+s.aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return s.aead.Seal(nonce, nonce, plain, aeadData(scope, key)), nil
}

func (s aeadSealer) Open(_ context.Context, scope, key string, sealed []byte) ([]byte, error) {
	n := s.aead.NonceSize()
	if len(sealed) < n {
		return nil, errors.New("idem: sealed record too short")
	}
	return s.aead.Open(nil, sealed[:n], sealed[n:], aeadData(scope, key))
}

func aeadData(scope, key string) []byte {
	b := make([]byte, 0, 8+2*binary.MaxVarintLen64+len(scope)+len(key))
	b = append(b, "idem/v1"...)
	b = binary.AppendUvarint(b, uint64(len(scope)))
	b = append(b, scope...)
	b = binary.AppendUvarint(b, uint64(len(key)))
	return append(b, key...)
}
