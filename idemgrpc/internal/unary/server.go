package unary

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/jackc/pgx/v5"

	"github.com/idemhq/idem/idem"
)

// DefaultMaxResponseBytes bounds the stored reply when the configuration
// sets no limit: 1 MiB, as idemhttp's response limit.
const DefaultMaxResponseBytes = 1 << 20

// DefaultRetryDelay is the delay of the RetryInfo detail when the
// configuration sets none.
const DefaultRetryDelay = time.Second

// Config is an interceptor's configuration, free of transport types.
type Config struct {
	Package          string // "idemgrpc" or "idemconnect": the prefix of errors and log messages
	Methods          map[string]MethodConfig
	Scope            func(context.Context) (string, error)
	SharedKeys       bool
	Fingerprint      func(method string, req proto.Message) (string, error)
	MaxResponseBytes int
	Store            func(code int32) bool
	RetryDelay       time.Duration
	ErrorDomain      string
	Wait             time.Duration
	TxOptions        pgx.TxOptions
	Observer         idem.Observer
	Logger           *slog.Logger
	OnError          func(ctx context.Context, method string, st *spb.Status, cause error)
}

// A Server runs covered calls. It is safe for concurrent use.
type Server struct {
	cfg      Config
	db       idem.Beginner
	methods  map[string]*Method
	idemOpts []idem.Option
	observer idem.Observer
	table    string
	log      *slog.Logger
}

// New checks cfg and returns the Server. An invalid setting is an error
// wrapping idem.ErrInvalidOption.
func New(db idem.Beginner, cfg Config) (*Server, error) {
	bad := func(format string, args ...any) (*Server, error) {
		return nil, fmt.Errorf("%w: %s: %s", idem.ErrInvalidOption, cfg.Package, fmt.Sprintf(format, args...))
	}
	switch {
	case isNil(db):
		return bad("nil database")
	case cfg.Scope == nil && !cfg.SharedKeys:
		return bad("Config.Scope is not set: scope keys by the authenticated caller " +
			"(ContextScope reads the scope an authentication interceptor put in the context), " +
			"or set Config.SharedKeys if every client may share one key space")
	case cfg.Scope != nil && cfg.SharedKeys:
		return bad("SharedKeys has no effect with a Scope function")
	case len(cfg.Methods) == 0:
		return bad("Methods is empty: list the unary methods to make idempotent")
	case cfg.MaxResponseBytes < 0:
		return bad("MaxResponseBytes %d is negative", cfg.MaxResponseBytes)
	case cfg.RetryDelay < 0:
		return bad("RetryDelay %v is negative", cfg.RetryDelay)
	case cfg.Wait < 0:
		return bad("Wait %v is negative", cfg.Wait)
	}
	s := &Server{db: db, methods: make(map[string]*Method, len(cfg.Methods))}
	for name, mc := range cfg.Methods {
		m, err := resolveMethod(name, mc)
		if err != nil {
			return bad("%v", err)
		}
		s.methods[name] = m
	}
	if cfg.Fingerprint == nil {
		cfg.Fingerprint = Fingerprint
	}
	if cfg.MaxResponseBytes == 0 {
		cfg.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if cfg.Store == nil {
		cfg.Store = DefaultStore
	}
	if cfg.RetryDelay == 0 {
		cfg.RetryDelay = DefaultRetryDelay
	}
	if cfg.Wait > 0 {
		s.idemOpts = append(s.idemOpts, idem.WithWait(cfg.Wait))
	}
	if cfg.TxOptions != (pgx.TxOptions{}) {
		s.idemOpts = append(s.idemOpts, idem.WithTxOptions(cfg.TxOptions))
	}
	if cfg.Observer != nil {
		s.idemOpts = append(s.idemOpts, idem.WithObserver(cfg.Observer))
	}
	// An option out of range, or a database given bare beside its Client,
	// is a configuration error, found now rather than on the first call.
	var err error
	if s.observer, err = idem.ObserverOf(db, s.idemOpts...); err != nil {
		return nil, fmt.Errorf("%s: %w", cfg.Package, err)
	}
	s.table = idem.DefaultTable
	if c, ok := db.(*idem.Client); ok {
		s.table = c.Table()
	}
	s.log = cfg.Logger
	if s.log == nil && cfg.OnError == nil {
		s.log = slog.Default()
	}
	s.idemOpts = slices.Clip(s.idemOpts)
	s.cfg = cfg
	return s, nil
}

// isNil reports whether db is nil or a nil pointer (a *pgxpool.Pool that
// was never set, say), on which every call would fail or panic.
func isNil(db idem.Beginner) bool {
	if db == nil {
		return true
	}
	v := reflect.ValueOf(db)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// Method returns the covered method named name, or nil.
func (s *Server) Method(name string) *Method { return s.methods[name] }

// begin begins the plain transaction of a covered call without a key.
func (s *Server) begin(ctx context.Context) (pgx.Tx, error) {
	opts := s.cfg.TxOptions
	if opts == (pgx.TxOptions{}) {
		return s.db.Begin(ctx)
	}
	type txBeginner interface {
		BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
	}
	if tb, ok := s.db.(txBeginner); ok {
		return tb.BeginTx(ctx, opts)
	}
	return nil, fmt.Errorf("%s: TxOptions needs a database that begins transactions with options", s.cfg.Package)
}
