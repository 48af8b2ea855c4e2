package idem

import "time"

// claim is what the claim statement answered.
type claim struct {
	locked  *bool // nil: a live row made locking needless
	claimed bool
	rec     *storedRow
}

// lostRace turns a claim that its second look undid (assert_deferred.sql or
// assert_claimed_partitioned.sql found a live row committed just before the
// lock) into what it is: a key held and released by another call, whose
// row the lookup after this attempt will find.
func (cl *claim) lostRace() {
	cl.claimed, cl.rec = false, nil
}

// storedRow is a live row read back for a replay (Record is what Lookup
// shows of one).
type storedRow struct {
	requestHash string
	status      string
	response    []byte
	refusal     []byte
}

// claimTargets are the destinations the claim's row is scanned into.
type claimTargets struct {
	locked            *bool
	claimed           bool
	hash, status      *string
	response, refusal []byte
	createdAt         *time.Time
}

// claim is what the scanned targets say, once a protocol has scanned its
// claim's row into them and decided claimed.
func (t *claimTargets) claim() claim {
	cl := claim{locked: t.locked, claimed: t.claimed}
	if t.hash != nil {
		cl.rec = &storedRow{requestHash: *t.hash, status: *t.status, response: t.response, refusal: t.refusal}
	}
	return cl
}
