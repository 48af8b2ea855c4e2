package lincheck

// An OpCall is one recorded call of an operation made of steps
// (idem.Operation): a Run, or a Resume.
//
// The register of an operation key is its answer. A call that reports
// Executed (OutcomeExecuted or OutcomeRefused) stored it, and names itself
// in it: the operation's function puts the op id of the call running it
// into the answer it returns, so Value is Op. A Replayed call read the
// answer another call stored (Value names that call). A Failed or
// InProgress call stored nothing, though a Failed Run may have begun the
// operation, which fixes the key's request (Hash) from then on. An Unknown
// call may have begun it, stored the answer, both or neither, at any moment
// after it began.
type OpCall struct {
	// Call is the call as Do's history holds it. Hash is the request the
	// call runs with, or "" for a Resume, which runs the stored one. Value
	// is the op id the returned answer names as the call that stored it
	// (Executed and Replayed); 0 for a Replayed Resume, which returns no
	// answer. Refused says the answer is a refusal: for Executed and a
	// Replayed Run, what the call returned (a Replayed Resume does not
	// say); for Unknown, what its answer would be, had it stored one.
	Call
	// Answer is the answer the call returned, as text comparable with
	// OpStored.Answer; "" when it returned none (every Resume, and any
	// call that did not end Executed or Replayed).
	Answer string
}

// OpStored is an operation key's row in the key table, read after the run
// was settled, with what its answer names.
type OpStored struct {
	Status string // 'completed', 'refused' or 'unfinished'
	Hash   string // the request the operation was begun with
	// Finisher is the op id of the call that stored the answer, as the
	// answer names it (completed and refused only).
	Finisher int64
	Refused  bool
	// Answer is the stored answer, as text comparable with OpCall.Answer.
	Answer string
	// Steps holds, for each database step the answer says ran, the op id
	// of the call whose owner ran it: the one row of the step that must
	// have committed.
	Steps map[string]int64
	// Outputs holds, for every step whose recorded output the answer
	// carries (database and external), the op id of the call whose owner
	// ran it and had its output recorded.
	Outputs map[string]int64
	// Effect is the id of the provider's effect that the answer names, ""
	// if none: the one effect the provider must hold for the operation.
	Effect string
}

// An Effect is one effect the external provider made: the first call with
// a new idempotency key acts, every later one with that key answers with
// the same effect and makes none.
type Effect struct {
	// Key is the operation key the provider was told the call was for (in
	// the call's body, not its idempotency key).
	Key string
	// DerivedKey is the idempotency key the provider was called with.
	DerivedKey string
	ID         string
	Op         int64 // the op id of the call whose step made it
}

// OpFinal is the database and the provider as the settled run left them.
type OpFinal struct {
	// Keys holds every operation key's stored row; a key without one is
	// absent.
	Keys map[string]OpStored
	// Ledger holds, per key and per database step, the op id of every
	// committed row of the step, counted without a unique constraint.
	Ledger map[string]map[string][]int64
	// Effects is every effect the provider made.
	Effects []Effect
	// Derived returns the idempotency key an external step of the
	// operation under key must send (idem.CallKey.Derive).
	Derived func(key string) string
	// Fenced holds, per step, the calls whose owner returned from the
	// step's function after it had lost its lease (the function's context
	// ended with idem.ErrLeaseLost): fencing must keep their outputs from
	// being recorded.
	Fenced map[string]map[int64]bool
	// Unfinished is Client.Stats' count of unfinished operations, and
	// StepRecords the rows left in the table of step records.
	Unfinished  int
	StepRecords int
}
