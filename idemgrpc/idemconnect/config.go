package idemconnect

import (
	"context"
	"log/slog"
	"time"

	"connectrpc.com/connect"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc/internal/unary"
)

// HeaderKey is the request header (gRPC metadata) that carries the
// idempotency key: 1 to 255 bytes of UTF-8 without control characters
// (idem.ValidateKey), taken as it is sent. It is the header idemhttp reads,
// without its quoted form.
const HeaderKey = "Idempotency-Key"

// HeaderReplayed is the response header set to "true" on every replayed
// answer: in the response's headers, or in the error's metadata for a
// replayed error.
const HeaderReplayed = "Idempotent-Replayed"

// DefaultMaxResponseBytes is the largest stored reply when
// Config.MaxResponseBytes is not set: 1 MiB.
const DefaultMaxResponseBytes = unary.DefaultMaxResponseBytes

// DefaultRetryDelay is the delay of the RetryInfo detail when
// Config.RetryDelay is not set: 1s.
const DefaultRetryDelay = unary.DefaultRetryDelay

// The reasons of the google.rpc.ErrorInfo detail that every answer of the
// interceptor's own carries, with the codes NewInterceptor lists. They are
// idemgrpc's reasons, for the same causes, and idemgrpc documents each
// (github.com/idemhq/idem/idemgrpc.ReasonMissingKey and the rest). They
// are stable: clients may branch on them. None of these answers is stored
// under the key.
const (
	ReasonMissingKey       = "IDEMPOTENCY_KEY_MISSING"
	ReasonInvalidKey       = "IDEMPOTENCY_KEY_INVALID"
	ReasonKeyMismatch      = "IDEMPOTENCY_KEY_MISMATCH"
	ReasonInProgress       = "IDEMPOTENCY_KEY_IN_PROGRESS"
	ReasonOutcomeUnknown   = "OUTCOME_UNKNOWN"
	ReasonUnavailable      = "DATABASE_UNAVAILABLE"
	ReasonUnauthenticated  = "NO_PRINCIPAL"
	ReasonInvalidRequest   = "INVALID_REQUEST"
	ReasonResponseTooLarge = "RESPONSE_TOO_LARGE"
	ReasonCallEnded        = "CALL_ENDED"
	ReasonInternal         = "INTERNAL"
)

// Method is how one covered procedure takes its key: the fields of
// idemgrpc.Method, with the key's header HeaderKey.
type Method struct {
	// Required makes a key mandatory: a call without one is answered
	// invalid_argument (ReasonMissingKey). Defaults to false.
	Required bool

	// KeyField names a singular string field of the request that carries
	// the key as a UUID, as AIP-155's request_id does; a call whose field
	// is empty takes the key from HeaderKey, and one that sets both must
	// set them alike. Defaults to "": HeaderKey only.
	KeyField string
}

// Config is the interceptor's settings, checked once by NewInterceptor.
// Its fields are idemgrpc.Config's, with Connect's types, and mean what
// idemgrpc documents there, defaults included; a field's comment here says
// only what differs. Deployment settings of the keys themselves (table,
// TTL, sealer) belong to the idem.Client the interceptor is given.
type Config struct {
	// Methods are the unary procedures covered, by name (the generated
	// *Procedure constants). Required.
	Methods map[string]Method

	// Scope names the key's scope for a call: the authenticated principal.
	// Required unless SharedKeys is set; ContextScope reads the scope an
	// authentication interceptor listed before this one (or HTTP
	// middleware in front of the handler) put in the context. A call
	// without a principal is answered unauthenticated.
	Scope func(ctx context.Context) (string, error)

	// SharedKeys, set, makes every client share one key space: any client
	// that sends another client's key with the same request receives that
	// client's stored answer. An error together with Scope.
	SharedKeys bool

	// Fingerprint replaces DefaultFingerprint.
	Fingerprint func(procedure string, req proto.Message) (string, error)

	// MaxResponseBytes bounds the stored reply. Defaults to
	// DefaultMaxResponseBytes.
	MaxResponseBytes int

	// StoreCode decides which error codes of the handler are stored and
	// replayed. Defaults to DefaultStoreCode.
	StoreCode func(connect.Code) bool

	// RetryDelay is the delay of the RetryInfo detail. Defaults to
	// DefaultRetryDelay.
	RetryDelay time.Duration

	// ErrorDomain is the domain of the ErrorInfo detail. Defaults to the
	// called procedure's service.
	ErrorDomain string

	// Wait is how long a call whose key is in progress waits for the first
	// call's answer. Defaults to 0: aborted at once.
	Wait time.Duration

	// TxOptions sets the isolation and deferrable modes of the call's
	// transaction. Defaults to the server's default.
	TxOptions pgx.TxOptions

	// Observer replaces the idem Client's Config.Observer for these calls.
	Observer idem.Observer

	// Logger receives every unavailable and internal answer of the
	// interceptor's own with its cause. Defaults to slog.Default() unless
	// OnError is set.
	Logger *slog.Logger

	// OnError, if set, is called with every unavailable and internal
	// answer of the interceptor's own, as the *connect.Error the client
	// receives, and its cause.
	OnError func(ctx context.Context, procedure string, err *connect.Error, cause error)
}

// DefaultStoreCode is the storing rule when Config.StoreCode is not set:
// idemgrpc.DefaultStoreCode's. Stored: not_found, already_exists,
// failed_precondition and out_of_range; every other code is not.
func DefaultStoreCode(c connect.Code) bool { return unary.DefaultStore(int32(c)) }

// DefaultFingerprint is the request fingerprint when Config.Fingerprint is
// not set: idemgrpc.DefaultFingerprint's, which documents its stability.
// A call served by either package fingerprints alike.
func DefaultFingerprint(procedure string, req proto.Message) (string, error) {
	return unary.Fingerprint(procedure, req)
}

// unary is cfg in the shared form.
func (cfg *Config) unary() unary.Config {
	u := unary.Config{
		Package:          "idemconnect",
		Methods:          make(map[string]unary.MethodConfig, len(cfg.Methods)),
		Scope:            cfg.Scope,
		SharedKeys:       cfg.SharedKeys,
		Fingerprint:      cfg.Fingerprint,
		MaxResponseBytes: cfg.MaxResponseBytes,
		RetryDelay:       cfg.RetryDelay,
		ErrorDomain:      cfg.ErrorDomain,
		Wait:             cfg.Wait,
		TxOptions:        cfg.TxOptions,
		Observer:         cfg.Observer,
		Logger:           cfg.Logger,
	}
	for name, m := range cfg.Methods {
		u.Methods[name] = unary.MethodConfig{Required: m.Required, KeyField: m.KeyField}
	}
	if store := cfg.StoreCode; store != nil {
		u.Store = func(c int32) bool { return store(connect.Code(c)) }
	}
	if onError := cfg.OnError; onError != nil {
		u.OnError = func(ctx context.Context, method string, st *spb.Status, cause error) {
			onError(ctx, method, errorOf(st), cause)
		}
	}
	return u
}
