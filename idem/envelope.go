package idem

import (
	"encoding/binary"
	"errors"
)

// envelope is what a Sealer seals: not the result alone but everything a
// replay trusts (the status, the request hash, the refusal and the key it
// belongs to), so that editing any column of a sealed row, or moving a
// sealed result to another key, is detected on open as ErrCorruptRecord,
// even by a Sealer that binds no additional data of its own.
//
//	version byte (1)
//	uvarint len, scope; uvarint len, key
//	uvarint len, status; uvarint len, request hash
//	uvarint len, refusal JSON (0: none)
//	the encoded result: the remaining bytes
type envelope struct {
	status      string
	requestHash string
	refusal     []byte
	value       []byte
}

const envelopeVersion = 1

func (e envelope) marshal(scope, key string) []byte {
	size := 1 + 5*binary.MaxVarintLen64 + len(scope) + len(key) + len(e.status) + len(e.requestHash) + len(e.refusal) + len(e.value)
	b := make([]byte, 0, size)
	b = append(b, envelopeVersion)
	for _, part := range [...][]byte{[]byte(scope), []byte(key), []byte(e.status), []byte(e.requestHash), e.refusal} {
		b = binary.AppendUvarint(b, uint64(len(part)))
		b = append(b, part...)
	}
	return append(b, e.value...)
}

var errEnvelope = errors.New("sealed record: malformed envelope")

func unmarshalEnvelope(b []byte, scope, key string) (envelope, error) {
	if len(b) == 0 || b[0] != envelopeVersion {
		return envelope{}, errEnvelope
	}
	b = b[1:]
	var parts [5][]byte
	for i := range parts {
		n, size := binary.Uvarint(b)
		if size <= 0 || n > uint64(len(b)-size) {
			return envelope{}, errEnvelope
		}
		parts[i], b = b[size:size+int(n)], b[size+int(n):]
	}
	if string(parts[0]) != scope || string(parts[1]) != key {
		return envelope{}, errors.New("sealed record: sealed for another key")
	}
	e := envelope{status: string(parts[2]), requestHash: string(parts[3]), value: b}
	if len(parts[4]) > 0 {
		e.refusal = parts[4]
	}
	return e, nil
}
