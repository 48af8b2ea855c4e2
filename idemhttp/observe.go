package idemhttp

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/idemhq/idem/idem"
)

// observation reports one request to the Observer with the HTTP status the
// middleware answered, which is known only once the call has returned: it
// stands in for the Observer during the call and holds the call's end until
// the answer is written.
type observation struct {
	m     *Middleware
	inner idem.Observer
	ctx   context.Context
	end   idem.CallEnd
	ended bool
	begun time.Time
}

func newObservation(m *Middleware, inner idem.Observer) *observation {
	if inner == nil {
		return nil
	}
	return &observation{m: m, inner: inner}
}

// CallStart passes the call's start on.
func (o *observation) CallStart(ctx context.Context, c idem.CallStart) context.Context {
	o.ctx = o.inner.CallStart(ctx, c)
	return o.ctx
}

// CallEnd holds the call's end until done.
func (o *observation) CallEnd(ctx context.Context, c idem.CallEnd) {
	o.ctx, o.end, o.ended = ctx, c, true
}

// done passes the held end on, with the status answered, once: a later
// call does nothing. Status 0 means no answer was written (the handler
// panicked).
func (o *observation) done(status int) {
	if o == nil || !o.ended {
		return
	}
	o.ended = false
	o.end.HTTPStatus = status
	o.inner.CallEnd(o.ctx, o.end)
}

// start and invalid report a request refused before any call.
func (o *observation) start(r *http.Request) {
	o.begun = time.Now()
	o.ctx = o.inner.CallStart(r.Context(), idem.CallStart{Table: o.table()})
}

func (o *observation) invalid(status int, typ string) {
	o.inner.CallEnd(o.ctx, idem.CallEnd{
		Table:      o.table(),
		Outcome:    idem.OutcomeInvalid,
		Duration:   time.Since(o.begun),
		Err:        refusedError(typ),
		HTTPStatus: status,
	})
}

func (o *observation) table() string {
	if c, ok := o.m.db.(*idem.Client); ok {
		return c.Table()
	}
	return idem.DefaultTable
}

// refusedError is the error of a request refused before any call.
type refusedError string

func (e refusedError) Error() string { return "idemhttp: refused before any call: " + string(e) }

// ErrorType names the refusal for telemetry (OpenTelemetry's error.type
// convention): "idemhttp." and the problem's name, such as
// "idemhttp.invalid-key".
func (e refusedError) ErrorType() string {
	return "idemhttp." + strings.TrimPrefix(string(e), DefaultProblemBase)
}
