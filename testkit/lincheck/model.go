package lincheck

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// register is one key's state in the sequential specification: empty, or
// written once by one execution with one request hash. It is comparable, so
// porcupine's default equality serves.
type register struct {
	written bool
	op      int64
	refused bool
	hash    string
}

func (r register) String() string {
	if !r.written {
		return "empty"
	}
	return fmt.Sprintf("op %d (refused %v, hash %s)", r.op, r.refused, r.hash)
}

// observation is the input of the last operation of a key's history: the
// stored row read after every call returned.
type observation struct{ reg register }

// step is the register's specification: the states a call can leave it in,
// none if the call could not have returned what it did from state s.
func step(s register, in any) []any {
	switch in := in.(type) {
	case observation:
		if in.reg == s {
			return []any{s}
		}
		return nil
	case *Call:
		switch in.Kind {
		case Executed:
			if s.written || in.Value != in.Op {
				return nil
			}
			return []any{register{written: true, op: in.Op, refused: in.Refused, hash: in.Hash}}
		case Replayed:
			if s.written && s.op == in.Value && s.refused == in.Refused && s.hash == in.Hash {
				return []any{s}
			}
		case Mismatch:
			if s.written && s.hash != in.Hash {
				return []any{s}
			}
		case InProgress:
			if !s.written {
				return []any{s}
			}
		case Unknown:
			// Committed or not: the register is write-once, so a write is
			// possible only while it is empty.
			if !s.written {
				return []any{s, register{written: true, op: in.Op, refused: in.Refused, hash: in.Hash}}
			}
			return []any{s}
		}
	}
	return nil
}

// model is the write-once register, for one key's history.
var model = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{register{}} },
	Step: func(state, input, _ any) []any { return step(state.(register), input) },
	DescribeOperation: func(input, _ any) string {
		switch in := input.(type) {
		case observation:
			return "stored: " + in.reg.String()
		case *Call:
			return fmt.Sprintf("client %d op %d %s value %d refused %v hash %s", in.Client, in.Op, in.Kind, in.Value, in.Refused, in.Hash)
		}
		return fmt.Sprint(input)
	},
	DescribeState: func(state any) string { return state.(register).String() },
}).ToModel()
