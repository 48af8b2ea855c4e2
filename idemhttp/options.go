package idemhttp

import (
	"net/http"
	"time"

	"github.com/idemhq/idem/idem"
)

// An Option configures the middleware New returns.
//
// Deprecated: use NewMiddleware with a Config, where each option has a
// field of the same name.
type Option func(*options)

// options is what New's options build: a Config, and idem options passed
// through to every call.
type options struct {
	cfg      Config
	idemOpts []idem.Option
}

// WithMethods sets Config.Methods.
//
// Deprecated: set Config.Methods.
func WithMethods(methods ...string) Option {
	return func(o *options) { o.cfg.Methods = methods }
}

// WithRequired sets Config.Required.
//
// Deprecated: set Config.Required.
func WithRequired(required bool) Option {
	return func(o *options) { o.cfg.Required = required }
}

// WithScope sets Config.Scope.
//
// Deprecated: set Config.Scope, or put the scope in the request's context
// with idem.ContextWithScope.
func WithScope(f func(*http.Request) (string, error)) Option {
	return func(o *options) { o.cfg.Scope = f }
}

// WithFingerprint sets Config.Fingerprint.
//
// Deprecated: set Config.Fingerprint.
func WithFingerprint(f func(r *http.Request, body []byte) (string, error)) Option {
	return func(o *options) { o.cfg.Fingerprint = f }
}

// WithFingerprintHeaders adds to Config.FingerprintHeaders.
//
// Deprecated: set Config.FingerprintHeaders.
func WithFingerprintHeaders(names ...string) Option {
	return func(o *options) { o.cfg.FingerprintHeaders = append(o.cfg.FingerprintHeaders, names...) }
}

// WithMaxBodyBytes sets Config.MaxBodyBytes, which limits every covered
// request's body, with or without a key. A non-positive n keeps the default.
//
// Deprecated: set Config.MaxBodyBytes.
func WithMaxBodyBytes(n int64) Option {
	return func(o *options) {
		if n > 0 {
			o.cfg.MaxBodyBytes = n
		}
	}
}

// WithReplayHeaders adds to Config.ReplayHeaders.
//
// Deprecated: set Config.ReplayHeaders.
func WithReplayHeaders(names ...string) Option {
	return func(o *options) { o.cfg.ReplayHeaders = append(o.cfg.ReplayHeaders, names...) }
}

// WithStoreStatus sets Config.StoreStatus; nil keeps the default.
//
// Deprecated: set Config.StoreStatus.
func WithStoreStatus(f func(status int) bool) Option {
	return func(o *options) { o.cfg.StoreStatus = f }
}

// WithRetryAfter sets Config.RetryAfter; a non-positive d keeps the default.
//
// Deprecated: set Config.RetryAfter.
func WithRetryAfter(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.cfg.RetryAfter = d
		}
	}
}

// WithIdemOptions passes options to every idem call the middleware makes
// for a request with a key: idem.WithWait, idem.WithTxOptions,
// idem.WithObserver, and the deprecated idem.WithTTL, idem.WithTable,
// idem.WithSealer. An option that does not apply to a call (idem.WithReplayed,
// idem.WithBatchSize) makes New panic.
//
// Deprecated: put deployment settings in the idem.Client's Config and pass
// the Client as the database; set Config.Wait, Config.TxOptions and
// Config.Observer for the rest.
func WithIdemOptions(opts ...idem.Option) Option {
	return func(o *options) { o.idemOpts = append(o.idemOpts, opts...) }
}
