package lincheck

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// opRegister is an operation key's state in the sequential specification:
// not begun; begun with one request and unfinished; or finished, written
// once with the answer of the call that stored it. It is comparable, so
// porcupine's default equality serves.
type opRegister struct {
	begun    bool
	hash     string
	written  bool
	finisher int64
	refused  bool
}

func (r opRegister) String() string {
	switch {
	case !r.begun:
		return "not begun"
	case !r.written:
		return fmt.Sprintf("unfinished (hash %s)", r.hash)
	}
	return fmt.Sprintf("answer of op %d (refused %v, hash %s)", r.finisher, r.refused, r.hash)
}

// opObservation is the input of the last operation of a key's history: the
// stored row read after the run was settled.
type opObservation struct{ reg opRegister }

// opBegin is the beginning a Run that ended Executed or Unknown may have
// made, apart from its answer: such a call begins the operation (if no
// call did before it) in its first transaction, and stores the answer in
// its last, and calls in between may see the operation begun and
// unfinished.
type opBegin struct{ call *OpCall }

// opStep is the specification of an operation key: the states a call can
// leave it in, none if the call could not have returned what it did from
// state s.
func opStep(s opRegister, in any) []any {
	switch in := in.(type) {
	case opObservation:
		if in.reg == s {
			return []any{s}
		}
		return nil
	case opBegin:
		if !s.begun {
			return []any{s, opRegister{begun: true, hash: in.call.Hash}}
		}
		return []any{s}
	case *OpCall:
		resume := in.Hash == ""
		hash := in.Hash
		if resume {
			hash = s.hash // Resume runs the stored request
		}
		// runs: the call could own the operation, which is free to begin
		// with its request (never by Resume) or begun with that request.
		runs := s.begun && s.hash == hash || !s.begun && !resume
		begin := opRegister{begun: true, hash: hash}
		write := opRegister{begun: true, hash: hash, written: true, finisher: in.Op, refused: in.Refused}
		switch in.Kind {
		case Executed:
			if !s.written && runs && in.Value == in.Op {
				return []any{write}
			}
		case Replayed:
			// A Resume observes neither the answer nor whether it is a
			// refusal.
			if s.written && s.hash == hash && (resume || s.finisher == in.Value && s.refused == in.Refused) {
				return []any{s}
			}
		case Mismatch:
			if s.begun && !resume && s.hash != in.Hash {
				return []any{s}
			}
		case InProgress:
			if !s.written && runs {
				return []any{s}
			}
		case NotFound:
			if resume && !s.begun {
				return []any{s}
			}
		case Failed:
			if !s.begun && !resume {
				return []any{s, begin}
			}
			return []any{s}
		case Unknown:
			switch {
			case s.written || !runs:
				return []any{s}
			case !s.begun:
				return []any{s, begin, write}
			default:
				return []any{s, write}
			}
		}
	}
	return nil
}

// opModel is the specification of an operation key, for one key's history.
var opModel = (&porcupine.NondeterministicModel{
	Init: func() []any { return []any{opRegister{}} },
	Step: func(state, input, _ any) []any { return opStep(state.(opRegister), input) },
	DescribeOperation: func(input, _ any) string {
		switch in := input.(type) {
		case opObservation:
			return "stored: " + in.reg.String()
		case opBegin:
			return fmt.Sprintf("client %d op %d may begin with request %s", in.call.Client, in.call.Op, in.call.Hash)
		case *OpCall:
			req := in.Hash
			if req == "" {
				req = "(resume)"
			}
			return fmt.Sprintf("client %d op %d %s value %d refused %v request %s", in.Client, in.Op, in.Kind, in.Value, in.Refused, req)
		}
		return fmt.Sprint(input)
	},
	DescribeState: func(state any) string { return state.(opRegister).String() },
}).ToModel()
