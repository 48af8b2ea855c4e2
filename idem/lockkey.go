package idem

import (
	"crypto/sha256"
	"encoding/binary"
)

// lockKey is the 64 bits of the key's advisory lock: the first eight bytes
// of SHA-256 over scope, a unit separator and key. The claim XORs the key
// table's oid into the high half, so that every spelling of one table takes
// the same lock and two tables never share one.
//
// A cryptographic hash, so that no tenant can make a key of its own collide
// with another tenant's: with a 64-bit preimage of SHA-256, a chosen
// victim's lock costs about 2^64 hashes to hit, where the 32-bit,
// invertible hashtext it replaces cost milliseconds (docs/SECURITY.md). A
// collision found anyway would only answer one of the two keys "in
// progress" while the other runs; it never lets both commit.
func lockKey(scope, key string) int64 {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0x1f})
	h.Write([]byte(key))
	var sum [sha256.Size]byte
	return int64(binary.BigEndian.Uint64(h.Sum(sum[:0])))
}
