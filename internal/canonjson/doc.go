// Package canonjson holds the machinery behind idem's request fingerprints:
// Canonicalize, the canonical-JSON parser behind idem.CanonicalJSON,
// HashJSON and HashJSONBytes, and CheckUTF8, which HashJSON uses to refuse
// the strings json.Marshal would silently repair. The contract (what is
// refused, how each value is spelled) is stated once, on idem.CanonicalJSON.
//
// The parser is hand-written, not built on encoding/json's Decoder, because
// the Decoder turns invalid UTF-8 and lone surrogate escapes into U+FFFD and
// reads numbers only as text or float64: a fingerprint must see the bytes as
// they are and the numbers as exact decimals.
package canonjson
