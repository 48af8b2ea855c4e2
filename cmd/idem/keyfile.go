package main

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/idemhq/idem/idem"
)

// loadSealer reads an AES key from path and returns the Sealer a service
// makes with it: idem.NewAEADSealer over AES-GCM (crypto/aes,
// cipher.NewGCM, the standard 12-byte nonce). The file holds the key of
// 16, 24 or 32 bytes as hex, as base64 (standard or URL alphabet, padded
// or not), or raw; surrounding white space is ignored for the text forms.
func loadSealer(path string) (idem.Sealer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	key, err := parseKey(data)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return idem.NewAEADSealer(gcm), nil
}

func parseKey(data []byte) ([]byte, error) {
	aesSize := func(b []byte) bool { return len(b) == 16 || len(b) == 24 || len(b) == 32 }
	text := bytes.TrimSpace(data)
	if k, err := hex.DecodeString(string(text)); err == nil && aesSize(k) {
		return k, nil
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if k, err := enc.DecodeString(string(text)); err == nil && aesSize(k) {
			return k, nil
		}
	}
	if aesSize(data) {
		return data, nil
	}
	return nil, fmt.Errorf("want an AES key of 16, 24 or 32 bytes, as hex, base64 or raw bytes (the file holds %d bytes)", len(data))
}
