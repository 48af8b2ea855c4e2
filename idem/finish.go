package idem

import (
	"context"
	"errors"
	"fmt"
)

// finish is the outcome to store, prepared before the last round trip.
type finish struct {
	status   string
	response []byte
	// refusal is the jsonb parameter: a string, or nil for NULL. A []byte
	// would travel as bytea in the exec and simple-protocol modes (the
	// modes for PgBouncer), and the server would reject it as JSON.
	refusal any
	refused bool
}

// finishing decides what fn's return means. A nil error means store fin;
// stored is the value as every replay will see it. An error means roll back
// and return that error.
func finishing[T any](ctx context.Context, c *call, v T, fnErr error) (fin finish, stored T, err error) {
	var refusalJSON []byte
	if fnErr != nil {
		var refusal *Refusal
		if !errors.As(fnErr, &refusal) || refusal == nil {
			return fin, stored, fnErr
		}
		if refusal.Code == "" {
			return fin, stored, fmt.Errorf("idem: a Refusal needs a Code: %w", fnErr)
		}
		if refusalJSON, err = refusal.marshal(); err != nil {
			return fin, stored, fmt.Errorf("idem: encode refusal: %w", err)
		}
		fin.refused, fin.status = true, statusRefused
	} else {
		fin.status = statusCompleted
	}
	data, err := encode(v)
	if err != nil {
		return fin, stored, fmt.Errorf("idem: encode result: %w", err)
	}
	if len(data) > c.s.maxResult {
		return fin, stored, fmt.Errorf("%w: %d bytes encoded, more than %d (Config.MaxResultBytes)", ErrResultTooLarge, len(data), c.s.maxResult)
	}
	if stored, err = storedForm(v, data); err != nil {
		return fin, stored, err
	}
	if c.s.sealer != nil {
		env := envelope{status: fin.status, requestHash: c.reqHash, refusal: refusalJSON, value: data}
		sealed, err := c.s.sealer.Seal(ctx, c.scope, c.key, env.marshal(c.scope, c.key))
		if err != nil {
			return fin, stored, fmt.Errorf("idem: seal result: %w", err)
		}
		fin.response = sealed
		// A reader without the Sealer can tell the row is sealed
		// (Record.Sealed); the refusal itself is in the envelope.
		fin.refusal = sealedRefusal
		return fin, stored, nil
	}
	if refusalJSON != nil {
		fin.refusal = string(refusalJSON)
	}
	if data == nil {
		data = []byte{} // NULL is reserved for rows that hold no result yet
	}
	fin.response = data
	return fin, stored, nil
}

// The status column's values.
const (
	statusInProgress = "in_progress"
	statusCompleted  = "completed"
	statusRefused    = "refused"
	// statusUnfinished is an operation's key between its first and its
	// last step (operation.go).
	statusUnfinished = "unfinished"
)

// The status values as arguments, boxed once.
var (
	statusCompletedArg any = statusCompleted
	statusRefusedArg   any = statusRefused
)

func statusArg(status string) any {
	if status == statusRefused {
		return statusRefusedArg
	}
	return statusCompletedArg
}
