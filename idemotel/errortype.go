package idemotel

import (
	"context"
	"errors"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/idemhq/idem/idem"
)

// sentinels are idem's errors by the name error.type gives them, in the
// order they are tried: ErrOutcomeUnknown wraps the connection's error, so
// it comes first.
var sentinels = []struct {
	err  error
	name string
}{
	{idem.ErrOutcomeUnknown, "idem.ErrOutcomeUnknown"},
	{idem.ErrInProgress, "idem.ErrInProgress"},
	{idem.ErrMismatch, "idem.ErrMismatch"},
	{idem.ErrInvalidKey, "idem.ErrInvalidKey"},
	{idem.ErrInvalidScope, "idem.ErrInvalidScope"},
	{idem.ErrInvalidRequestHash, "idem.ErrInvalidRequestHash"},
	{idem.ErrInvalidTable, "idem.ErrInvalidTable"},
	{idem.ErrInvalidOption, "idem.ErrInvalidOption"},
	{idem.ErrTxOwned, "idem.ErrTxOwned"},
	{idem.ErrCorruptRecord, "idem.ErrCorruptRecord"},
	{idem.ErrKeyLost, "idem.ErrKeyLost"},
	{idem.ErrResultTooLarge, "idem.ErrResultTooLarge"},
	{idem.ErrLeaseLost, "idem.ErrLeaseLost"},
	{idem.ErrDeadline, "idem.ErrDeadline"},
	{context.DeadlineExceeded, "context.DeadlineExceeded"},
	{context.Canceled, "context.Canceled"},
}

// errorType names the class of a failed call's error without its text,
// which may quote client data: an idem sentinel it wraps
// ("idem.ErrInProgress"), a context error ("context.DeadlineExceeded"), a
// PostgreSQL error's SQLSTATE ("40001", as OpenTelemetry's database
// conventions do), the value of an ErrorType method in its chain (the
// semconv convention), the HTTP status for a bare error under idemhttp, and
// otherwise its Go type ("*pay.CardError").
func errorType(c *idem.CallEnd) string { return errorTypeOf(c.Err, c.HTTPStatus) }

// errorTypeOf is errorType for an error and the HTTP status answered with
// it (0 outside idemhttp, and for steps).
func errorTypeOf(err error, httpStatus int) string {
	if err == nil {
		if httpStatus >= 400 {
			return strconv.Itoa(httpStatus)
		}
		return semconv.ErrorTypeOther.Value.AsString()
	}
	for _, s := range sentinels {
		if errors.Is(err, s.err) {
			return s.name
		}
	}
	if pgErr, ok := errors.AsType[*pgconn.PgError](err); ok && pgErr.Code != "" {
		return pgErr.Code
	}
	t := semconv.ErrorType(err).Value.AsString()
	if t == "*errors.errorString" && httpStatus >= 400 {
		// A bare errors.New says nothing a dashboard can use; the status
		// the middleware answered does (OpenTelemetry's HTTP conventions).
		return strconv.Itoa(httpStatus)
	}
	return t
}
