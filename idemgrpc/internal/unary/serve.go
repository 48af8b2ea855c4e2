package unary

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// A Handler runs the service's handler with ctx and reports its answer.
type Handler func(ctx context.Context) Result

// Result is a handler's answer as the interceptors store it.
type Result struct {
	Msg    proto.Message // the response, when the handler succeeded
	Status *spb.Status   // the handler's error, nil when it succeeded
}

// Answer is what an interceptor returns for a covered call.
type Answer struct {
	// Handler means: return what the handler returned, as it returned it.
	Handler bool
	// Replayed means the answer is the key's stored reply: Msg, or Status.
	Replayed bool
	// Msg is the replayed response.
	Msg proto.Message
	// Status is the replayed refusal, or the interceptor's own answer.
	Status *spb.Status
}

var (
	// errNotStored makes idem.Run roll back an answer that is not stored.
	errNotStored = errors.New("the handler's answer is not stored")
	// errResponseTooLarge: the reply exceeds MaxResponseBytes.
	errResponseTooLarge = errors.New("the handler's answer exceeds MaxResponseBytes")
	// errNoResponse: the handler returned neither a response nor an error.
	errNoResponse = errors.New("the handler returned no response and no error")
)

// Serve runs a covered call: keys are the call's values of the
// idempotency-key metadata, req the request, h the handler.
func (s *Server) Serve(ctx context.Context, m *Method, keys []string, req any, h Handler) Answer {
	msg, ok := req.(proto.Message)
	if !ok || msg == nil {
		return s.fail(ctx, m, CodeInternal, ReasonInternal, "the request is not a protobuf message",
			fmt.Errorf("%s: request of type %T", s.cfg.Package, req))
	}
	key, problem := m.key(keys, msg)
	if problem != nil {
		var extra []proto.Message
		if problem.field != "" {
			extra = append(extra, &errdetails.BadRequest{FieldViolations: []*errdetails.BadRequest_FieldViolation{
				{Field: problem.field, Description: problem.message, Reason: problem.reason}}})
		}
		return s.refuse(ctx, m, CodeInvalidArgument, problem.reason, problem.message, extra...)
	}
	if key == "" {
		if m.Required {
			where := "idempotency-key metadata"
			if m.keyField != "" {
				where = string(m.keyField) + " field or an " + where
			}
			return s.refuse(ctx, m, CodeInvalidArgument, ReasonMissingKey, "this method needs an idempotency key: send the "+where)
		}
		return s.serveUnkeyed(ctx, m, h)
	}

	if s.cfg.Scope != nil {
		scope, err := s.cfg.Scope(ctx)
		if err != nil || scope == "" {
			// Fail closed: without a principal, the key would be shared
			// with every caller that has none.
			return s.refuse(ctx, m, CodeUnauthenticated, ReasonUnauthenticated, "the call has no principal to scope its idempotency key by")
		}
		ctx = idem.ContextWithScope(ctx, scope)
	}
	// With SharedKeys, the context's scope if any, else the empty one.
	if scope, ok := idem.ScopeFromContext(ctx); ok {
		if err := idem.ValidateScope(scope); err != nil {
			return s.refuse(ctx, m, CodeInvalidArgument, ReasonInvalidRequest, "the call's principal cannot scope an idempotency key")
		}
	}
	fingerprint, err := s.cfg.Fingerprint(m.Name, msg)
	if err != nil {
		return s.refuse(ctx, m, CodeInvalidArgument, ReasonInvalidRequest, "the request could not be fingerprinted")
	}

	// The call runs on a context that the client's departure cancels only
	// until the handler starts: from then on, the handler's answer decides,
	// and it commits even if nobody is left to receive it (a retry will).
	callCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	stop := context.AfterFunc(ctx, cancel)
	defer stop()

	stored, outcome, err := idem.Run(callCtx, s.db, key, fingerprint, func(workCtx context.Context, tx pgx.Tx) (reply, error) {
		if !stop() {
			return reply{}, fmt.Errorf("%s: the client left: %w", s.cfg.Package, context.Cause(ctx))
		}
		// The handler sees the call's own context (its values, deadline and
		// cancellation) with the key and the observer's span added.
		return s.decide(h(withTx(mergeValues(ctx, workCtx), tx)))
	}, s.idemOpts...)
	return s.answer(ctx, m, stored, outcome, err)
}

// decide turns the handler's answer into what idem.Run stores: a response
// commits with the key; a stored error code rolls the handler's writes back
// and keeps the key with the status (a refusal); any other error rolls
// everything back and frees the key.
func (s *Server) decide(res Result) (reply, error) {
	if res.Status == nil {
		if res.Msg == nil {
			return reply{}, errNoResponse
		}
		r, err := messageReply(res.Msg)
		if err != nil {
			return reply{}, fmt.Errorf("%s: encode the response: %w", s.cfg.Package, err)
		}
		if len(r.data) > s.cfg.MaxResponseBytes {
			return reply{}, errResponseTooLarge
		}
		return r, nil
	}
	st := res.Status
	if st.GetCode() == 0 {
		return reply{}, errNotStored // an error that claims success: never stored
	}
	if !s.cfg.Store(st.GetCode()) {
		return reply{}, errNotStored
	}
	r, err := statusReply(st)
	if err != nil {
		return reply{}, fmt.Errorf("%s: encode the status: %w", s.cfg.Package, err)
	}
	if len(r.data) > s.cfg.MaxResponseBytes {
		return reply{}, errResponseTooLarge
	}
	// The status, message included, is stored once, in the reply: the
	// refusal names only its code. Its message would be a second copy,
	// uncounted by MaxResponseBytes, and jsonb cannot hold every string a
	// status message may (U+0000).
	return r, idem.Refuse(refusalCode(st.GetCode()), "")
}

// answer is the Answer for how idem.Run ended.
func (s *Server) answer(ctx context.Context, m *Method, stored reply, outcome idem.Outcome, err error) Answer {
	switch {
	case outcome == idem.OutcomeReplayed:
		if stored.msg != nil && stored.msg.ProtoReflect().Descriptor().FullName() != m.output {
			return s.fail(ctx, m, CodeInternal, ReasonInternal, "the stored response cannot be replayed",
				fmt.Errorf("%s: stored response of type %s, the method answers %s", s.cfg.Package,
					stored.msg.ProtoReflect().Descriptor().FullName(), m.output))
		}
		return Answer{Replayed: true, Msg: stored.msg, Status: stored.status}
	case err == nil || outcome == idem.OutcomeRefused || errors.Is(err, errNotStored):
		return Answer{Handler: true}
	case errors.Is(err, errResponseTooLarge), errors.Is(err, idem.ErrResultTooLarge):
		return s.fail(ctx, m, CodeInternal, ReasonResponseTooLarge,
			"the answer is too large to store; nothing was committed", err)
	case errors.Is(err, idem.ErrMismatch):
		return s.refused(m, CodeFailedPrecondition, ReasonKeyMismatch,
			"this idempotency key was used with a different request; use a new key for a new request")
	case errors.Is(err, idem.ErrInProgress):
		return Answer{Status: own(CodeAborted, ReasonInProgress, s.domain(m),
			"a call with this idempotency key is in progress; retry later with the same key", s.cfg.RetryDelay)}
	case errors.Is(err, idem.ErrOutcomeUnknown):
		return s.failRetry(ctx, m, ReasonOutcomeUnknown,
			"the outcome of this call is unknown; retry with the same key to learn it", err)
	case errors.Is(err, idem.ErrInvalidScope):
		return s.refused(m, CodeInvalidArgument, ReasonInvalidRequest, "the call's principal cannot scope an idempotency key")
	case ctx.Err() != nil:
		c := CodeCanceled
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			c = CodeDeadlineExceeded
		}
		st := own(c, ReasonCallEnded, s.domain(m), "the call ended before its work did; nothing was stored, retry with the same key", 0)
		s.report(ctx, m, slog.LevelWarn, st, err)
		return Answer{Status: st}
	case idem.Retryable(err):
		return s.failRetry(ctx, m, ReasonUnavailable,
			"the call could not be processed and left no trace; retry with the same key", err)
	default:
		return s.fail(ctx, m, CodeInternal, ReasonInternal, "the call could not be processed", err)
	}
}

// serveUnkeyed runs a covered call without a key in a plain transaction
// that commits when the handler succeeds and rolls back when it fails.
func (s *Server) serveUnkeyed(ctx context.Context, m *Method, h Handler) Answer {
	tx, err := s.begin(ctx)
	if err != nil {
		return s.failRetry(ctx, m, ReasonUnavailable, "the database is unavailable; retry later", err)
	}
	ended := false
	rollback := func() {
		if !ended {
			ended = true
			cctx, cancel := cleanupContext(ctx)
			_ = tx.Rollback(cctx)
			cancel()
		}
	}
	defer rollback() // a panic in the handler
	res := h(withTx(ctx, owned{tx}))
	if res.Status != nil {
		rollback()
		return Answer{Handler: true}
	}
	cctx, cancel := cleanupContext(ctx)
	err = idem.Commit(cctx, tx)
	cancel()
	ended = true
	if err != nil {
		if errors.Is(err, idem.ErrOutcomeUnknown) {
			return s.failRetry(ctx, m, ReasonOutcomeUnknown,
				"the connection failed while the transaction was committing; whether it committed is unknown", err)
		}
		return s.failRetry(ctx, m, ReasonUnavailable, "the transaction did not commit; retry later", err)
	}
	return Answer{Handler: true}
}

func (s *Server) domain(m *Method) string {
	if s.cfg.ErrorDomain != "" {
		return s.cfg.ErrorDomain
	}
	return m.Service
}

// refused is an answer of the interceptor's own to bad input.
func (s *Server) refused(m *Method, c int32, reason, message string, extra ...proto.Message) Answer {
	return Answer{Status: own(c, reason, s.domain(m), message, 0, extra...)}
}

// refuse answers a call turned away before idem.Run, and reports it to the
// observer as invalid input.
func (s *Server) refuse(ctx context.Context, m *Method, c int32, reason, message string, extra ...proto.Message) Answer {
	if obs := s.observer; obs != nil {
		start := time.Now()
		octx := obs.CallStart(ctx, idem.CallStart{Table: s.table})
		obs.CallEnd(octx, idem.CallEnd{
			Table:    s.table,
			Outcome:  idem.OutcomeInvalid,
			Duration: time.Since(start),
			Err:      refusedError(reason),
		})
	}
	return s.refused(m, c, reason, message, extra...)
}

// failRetry is an UNAVAILABLE answer of the interceptor's own, with a
// RetryInfo, and its cause reported.
func (s *Server) failRetry(ctx context.Context, m *Method, reason, message string, cause error) Answer {
	st := own(CodeUnavailable, reason, s.domain(m), message, s.cfg.RetryDelay)
	s.report(ctx, m, slog.LevelError, st, cause)
	return Answer{Status: st}
}

// fail is a failure answer of the interceptor's own, its cause reported.
func (s *Server) fail(ctx context.Context, m *Method, c int32, reason, message string, cause error) Answer {
	st := own(c, reason, s.domain(m), message, 0)
	s.report(ctx, m, slog.LevelError, st, cause)
	return Answer{Status: st}
}

// report hands a failure of the interceptor's own, and its cause, which the
// client never sees, to the logger and the error callback. The key is not
// logged: it is client data.
func (s *Server) report(ctx context.Context, m *Method, level slog.Level, st *spb.Status, cause error) {
	if ctx.Err() != nil {
		level = slog.LevelWarn // the client left; nobody waits for this answer
	}
	if s.log != nil {
		s.log.Log(ctx, level, s.cfg.Package+": "+st.GetMessage(),
			"method", m.Name, "code", st.GetCode(), "err", cause)
	}
	if s.cfg.OnError != nil {
		s.cfg.OnError(ctx, m.Name, st, cause)
	}
}

// refusedError is the error observers see for a call refused before any
// database work.
type refusedError string

func (e refusedError) Error() string { return "refused before any call: " + string(e) }
