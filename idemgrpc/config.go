package idemgrpc

import (
	"context"
	"log/slog"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc/internal/unary"
)

// MetadataKey is the metadata that carries the idempotency key: 1 to 255
// bytes of UTF-8 without control characters (idem.ValidateKey), taken as
// it is sent.
const MetadataKey = "idempotency-key"

// MetadataReplayed is the response header metadata set to "true" on every
// replayed answer, response or stored error alike.
const MetadataReplayed = "idempotent-replayed"

// DefaultMaxResponseBytes is the largest stored reply when
// Config.MaxResponseBytes is not set: 1 MiB.
const DefaultMaxResponseBytes = unary.DefaultMaxResponseBytes

// DefaultRetryDelay is the delay of the RetryInfo detail when
// Config.RetryDelay is not set: 1s.
const DefaultRetryDelay = unary.DefaultRetryDelay

// The reasons of the google.rpc.ErrorInfo detail that every answer of the
// interceptor's own carries (see NewUnaryServerInterceptor for the codes).
// They are stable: clients may branch on them. None of these answers is
// stored under the key.
const (
	// ReasonMissingKey: a call of a Required method without a key.
	// INVALID_ARGUMENT.
	ReasonMissingKey = "IDEMPOTENCY_KEY_MISSING"
	// ReasonInvalidKey: the key metadata is malformed or repeated, the key
	// field is not a UUID, or the two disagree. INVALID_ARGUMENT.
	ReasonInvalidKey = "IDEMPOTENCY_KEY_INVALID"
	// ReasonKeyMismatch: the key was used before with another request. Use
	// a new key for a new request; never retry this one as it is.
	// FAILED_PRECONDITION.
	ReasonKeyMismatch = "IDEMPOTENCY_KEY_MISMATCH"
	// ReasonInProgress: a call with this key is running. Retry with the same
	// key after the RetryInfo delay. ABORTED.
	ReasonInProgress = "IDEMPOTENCY_KEY_IN_PROGRESS"
	// ReasonOutcomeUnknown: the connection to the database failed while the
	// transaction was committing. Retry with the same key to learn the
	// outcome; never with a new key. UNAVAILABLE.
	ReasonOutcomeUnknown = "OUTCOME_UNKNOWN"
	// ReasonUnavailable: the database could not be reached or the
	// transaction failed for a passing reason; nothing was stored. Retry
	// with the same key. UNAVAILABLE.
	ReasonUnavailable = "DATABASE_UNAVAILABLE"
	// ReasonUnauthenticated: Config.Scope returned an error, so the call has
	// no principal to scope its key by. UNAUTHENTICATED.
	ReasonUnauthenticated = "NO_PRINCIPAL"
	// ReasonInvalidRequest: the request could not be fingerprinted, or the
	// principal is not a valid scope (idem.ValidateScope). INVALID_ARGUMENT.
	ReasonInvalidRequest = "INVALID_REQUEST"
	// ReasonResponseTooLarge: the handler's answer exceeds
	// Config.MaxResponseBytes; its writes rolled back. A retry fails the
	// same way. INTERNAL.
	ReasonResponseTooLarge = "RESPONSE_TOO_LARGE"
	// ReasonCallEnded: the call was cancelled or its deadline passed before
	// the handler started; nothing was done. CANCELED or DEADLINE_EXCEEDED.
	ReasonCallEnded = "CALL_ENDED"
	// ReasonInternal: a failure a retry will not cure, such as a stored
	// reply that cannot be read back. INTERNAL.
	ReasonInternal = "INTERNAL"
)

// Method is how one covered method takes its key.
type Method struct {
	// Required makes a key mandatory: a call without one is answered
	// INVALID_ARGUMENT (ReasonMissingKey) and the handler does not run.
	// Defaults to false: a call without a key runs in a plain transaction
	// (AIP-155 makes request IDs optional).
	Required bool

	// KeyField names a singular string field of the request that carries
	// the key, as AIP-155's request_id does. Its values must be UUIDs
	// (8-4-4-4-12 hexadecimal digits, any version, not the nil UUID); a
	// call whose field is empty takes the key from MetadataKey instead, and
	// a call that sets both must set them to the same value. Defaults to
	// "": the key comes from MetadataKey only.
	KeyField string
}

// Config is the interceptor's settings, checked once by
// NewUnaryServerInterceptor. The zero value of every field but Methods
// means the default it states. Deployment settings of the keys themselves
// (table, TTL, sealer) belong to the idem.Client the interceptor is given.
type Config struct {
	// Methods are the unary methods the interceptor covers, by full method
	// name ("/idem.example.charge.v1.ChargeService/Charge", the generated
	// *_FullMethodName constants). Calls of other methods pass through
	// untouched, even with a key, and Tx returns nil for them. Each must be
	// a unary method of a service registered with the protobuf registry
	// (generated code registers its services). Required: an interceptor
	// covering nothing is an error.
	Methods map[string]Method

	// Scope names the key's scope for a call: the authenticated principal
	// or tenant. The same key in two scopes is two unrelated keys.
	// Required unless SharedKeys is set: the constructor refuses a Config
	// with neither. ContextScope reads the scope that an authentication
	// interceptor that runs before this one put in the context (idem.ContextWithScope).
	//
	// Keys are chosen by clients and may leak or be guessed, so the scope,
	// not the key's randomness, keeps one caller from receiving another's
	// stored response. An error from Scope, or an empty scope, means the
	// call has no principal: it is answered UNAUTHENTICATED
	// (ReasonUnauthenticated) and the handler does not run.
	Scope func(ctx context.Context) (string, error)

	// SharedKeys, set, makes every client share one key space: a keyed
	// call is scoped by the scope in its context if an interceptor put one
	// there (idem.ContextWithScope), and by the empty scope otherwise. Any
	// client that sends another client's key with the same request then
	// receives that client's stored answer. Set it only where a single
	// client (one internal caller, say) can reach the service. It is an
	// error together with Scope. Defaults to false: a Scope function is
	// required.
	SharedKeys bool

	// Fingerprint replaces the function that fingerprints a request: the
	// same key with another fingerprint is answered FAILED_PRECONDITION
	// (ReasonKeyMismatch). The result must be 1 to 255 bytes without
	// control characters. An error is answered INVALID_ARGUMENT
	// (ReasonInvalidRequest). Defaults to DefaultFingerprint.
	Fingerprint func(fullMethod string, req proto.Message) (string, error)

	// MaxResponseBytes bounds the stored reply (the encoded response or
	// error status). A handler whose answer is larger is answered INTERNAL
	// (ReasonResponseTooLarge): its writes roll back and nothing is stored.
	// Defaults to DefaultMaxResponseBytes (1 MiB); must not be negative.
	MaxResponseBytes int

	// StoreCode decides which error codes of the handler are stored and
	// replayed, with the full status (message and details): the handler's
	// writes roll back and the key keeps the status, which every retry
	// receives again. An error whose code is not stored rolls everything
	// back and frees the key, so a retry runs the handler again. Responses
	// (OK) are always stored. Defaults to DefaultStoreCode.
	StoreCode func(codes.Code) bool

	// RetryDelay is the delay of the RetryInfo detail sent with ABORTED
	// (key in progress) and UNAVAILABLE answers of the interceptor's own.
	// Defaults to DefaultRetryDelay (1s); must not be negative.
	RetryDelay time.Duration

	// ErrorDomain is the domain of the ErrorInfo detail of the interceptor's
	// own answers. Defaults to the full name of the called method's service
	// ("idem.example.charge.v1.ChargeService").
	ErrorDomain string

	// Wait makes a call whose key is in progress wait up to Wait for the
	// first call to finish and then receive its answer, instead of ABORTED
	// at once (idem.WithWait). Defaults to 0.
	Wait time.Duration

	// TxOptions sets the isolation and deferrable modes of the call's
	// transaction, with or without a key (idem.WithTxOptions). Defaults to
	// the server's default.
	TxOptions pgx.TxOptions

	// Observer, if set, is told about every covered call with a key, and
	// about calls refused before any database work (idem.OutcomeInvalid).
	// It replaces the idem Client's Config.Observer for these calls.
	// Defaults to the Client's.
	Observer idem.Observer

	// Logger receives every UNAVAILABLE and INTERNAL answer of the
	// interceptor's own with its cause, which the client never sees.
	// Defaults to slog.Default() unless OnError is set.
	Logger *slog.Logger

	// OnError, if set, is called with every UNAVAILABLE and INTERNAL answer
	// of the interceptor's own and its cause: for error trackers.
	OnError func(ctx context.Context, fullMethod string, st *status.Status, cause error)
}

// DefaultStoreCode is the storing rule when Config.StoreCode is not set.
// Stored and replayed, because they report the outcome of an operation
// that ran and a retry would meet the same state: NOT_FOUND,
// ALREADY_EXISTS, FAILED_PRECONDITION and OUT_OF_RANGE. Not stored, so the
// key stays free and a retry runs the handler: every other code. That is
// INVALID_ARGUMENT (validation: fix the request and retry with the same
// key), UNAUTHENTICATED and PERMISSION_DENIED (credentials and permissions
// change), and the codes of passing or unknown failures: CANCELED,
// UNKNOWN, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, UNIMPLEMENTED,
// INTERNAL, UNAVAILABLE and DATA_LOSS. It follows idemhttp.DefaultStoreStatus.
func DefaultStoreCode(c codes.Code) bool { return unary.DefaultStore(int32(c)) }

// DefaultFingerprint is the request fingerprint when Config.Fingerprint is
// not set: the hex SHA-256 of the full method name and the request's
// deterministic protobuf encoding (proto.MarshalOptions{Deterministic:
// true}).
//
// The server computes it from the request as it parsed it, so the client's
// language and library do not matter. Deterministic encoding is not
// canonical, though: it is stable within one build of the server, and may
// change with the version of google.golang.org/protobuf or with the schema
// (a field added to the request, fields unknown to the server, which are
// hashed as the bytes the client sent). A change during a key's lifetime
// can turn a faithful retry into a mismatch, never a different request
// into a replay.
func DefaultFingerprint(fullMethod string, req proto.Message) (string, error) {
	return unary.Fingerprint(fullMethod, req)
}

// unary is cfg in the shared form.
func (cfg *Config) unary() unary.Config {
	u := unary.Config{
		Package:          "idemgrpc",
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
		u.Store = func(c int32) bool { return store(codes.Code(c)) }
	}
	if onError := cfg.OnError; onError != nil {
		u.OnError = func(ctx context.Context, method string, st *spb.Status, cause error) {
			onError(ctx, method, status.FromProto(st), cause)
		}
	}
	return u
}
