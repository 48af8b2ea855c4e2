// Package lincheck checks a history of idempotent calls, recorded under
// faults, against the contract of idem.Do: every key is a write-once
// register, and the database left at the end agrees with what every call
// reported.
//
// A test records one Call per call it made (its key, request hash, its own
// operation id, which its fn writes to a ledger, what it returned and when)
// and reads back, at the end, each key's stored row and ledger rows. Check
// then runs two independent checks:
//
//   - linearizability, with github.com/anishathalye/porcupine: a call that
//     returned fn's own value wrote the register; one that returned another
//     execution's value, ErrMismatch or ErrInProgress observed it; one that
//     returned ErrOutcomeUnknown may have written it, at any moment after it
//     began; one that returned any other error did nothing. The stored row,
//     read after every call returned, is a last observation.
//   - reconciliation: per key at most one ledger row, a stored value that
//     names the execution whose ledger row committed, no committed execution
//     of a call that reported a plain failure, no committed row of an
//     operation that no call made, and no row left 'in_progress'.
//
// CheckOperations does the same for idem.Operation (operation.go): each key
// is begun by one request and then written once with the answer of the call
// that stored it, and the database and the external provider left at the
// end agree with the answer: each database step's rows exactly once, one
// effect at the provider under the derived key, nothing left unfinished.
//
// CheckDeliveries does the same for the deliveries of a message consumer
// (idemconsume, consumer.go): each message key is the write-once register
// above, each delivery a call of it that ends in a settlement, and the
// broker is told no more than the outcome proves: an Ack only once the
// message's effect committed. The database left once every delivery was
// settled holds each stored message's effect exactly once.
package lincheck

import "fmt"

// Kind is how a call ended, as far as the register is concerned.
type Kind uint8

const (
	// Failed is any error but the ones below: the call must have written
	// nothing.
	Failed Kind = iota
	// Executed is a call that returned its own fn's value (with a refusal or
	// without): it wrote the register.
	Executed
	// Replayed is a call that returned another execution's value: it
	// observed the register written.
	Replayed
	// Unknown is ErrOutcomeUnknown: the call may have written the register.
	Unknown
	// Mismatch is ErrMismatch: the call observed the register written with
	// another request hash.
	Mismatch
	// InProgress is ErrInProgress: the call observed the register empty
	// while another call held the key.
	InProgress
	// NotFound is ErrNotFound, from Operation.Resume: the call observed the
	// key holding nothing, not even an operation begun.
	NotFound
)

var kindNames = [...]string{
	Failed:     "failed",
	Executed:   "executed",
	Replayed:   "replayed",
	Unknown:    "outcome_unknown",
	Mismatch:   "mismatch",
	InProgress: "in_progress",
	NotFound:   "not_found",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("Kind(%d)", uint8(k))
}

// Kinds lists every Kind, in the order reports print them.
var Kinds = []Kind{Executed, Replayed, Unknown, Mismatch, InProgress, NotFound, Failed}

// A Call is one recorded call.
type Call struct {
	Client int    // which client made it
	Key    string // the idempotency key
	Hash   string // the request hash it was called with
	// Op is the call's own operation id, unique in the history: the value
	// its fn writes to the ledger and returns.
	Op   int64
	Kind Kind
	// Value is the operation id that the returned value names (Executed
	// and Replayed only); Refused says it came with a refusal.
	Value   int64
	Refused bool
	// Contradiction, when set, is a breach the recorder saw in the return
	// itself (Run's Outcome disagreeing with the value, an error that the
	// workload cannot cause): it is reported as a violation as it stands.
	Contradiction string
	// Err is the returned error's text, for the report.
	Err string
	// Start and End are when the call began and returned, in nanoseconds
	// from the start of the run, read from one monotonic clock.
	Start, End int64
}

// Stored is a key's row in the key table, read after the run.
type Stored struct {
	Status  string // 'completed', 'refused' or 'in_progress'
	Hash    string // request_hash
	Op      int64  // the operation id the stored value names
	Refused bool
}

// Final is the database as the run left it.
type Final struct {
	// Keys holds every key's stored row; a key without one is absent.
	Keys map[string]Stored
	// Rows counts each key's rows in the key table, when a layout's primary
	// key does not make a key unique (the partitioned one): more than one
	// is a second execution. Nil: one row per key at most.
	Rows map[string]int
	// Ledger holds, per key, the operation id of every committed ledger row.
	Ledger map[string][]int64
}

// A Violation is one breach of the contract.
type Violation struct {
	Key  string
	Op   int64 // the operation concerned, or 0 for the key as a whole
	What string
}

func (v Violation) String() string {
	if v.Op == 0 {
		return fmt.Sprintf("key %s: %s", v.Key, v.What)
	}
	return fmt.Sprintf("key %s, op %d: %s", v.Key, v.Op, v.What)
}
