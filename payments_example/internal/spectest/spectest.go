// Package spectest checks the payments example's HTTP traffic against its
// OpenAPI document (api.Spec), with kin-openapi's openapi3filter: every
// request a test sends must match an operation of the spec, and every
// answer, first run, replay or error, must be one the operation declares
// (its status, headers, content type and body schema, problem types
// included). A mismatch fails the test.
package spectest

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"

	"github.com/idemhq/idem/payments_example/api"
)

// A Validator checks requests and responses against the spec.
type Validator struct {
	doc    *openapi3.T
	router routers.Router
}

var (
	loadOnce sync.Once
	loaded   *Validator
	loadErr  error
)

// New returns the Validator of api.Spec, which must load and validate on
// its own.
func New(tb testing.TB) *Validator {
	tb.Helper()
	loadOnce.Do(func() {
		doc, err := Load(context.Background())
		if err != nil {
			loadErr = err
			return
		}
		router, err := legacy.NewRouter(doc)
		if err != nil {
			loadErr = err
			return
		}
		loaded = &Validator{doc: doc, router: router}
	})
	if loadErr != nil {
		tb.Fatalf("spectest: %v", loadErr)
	}
	return loaded
}

// Load loads and validates api.Spec, refusing any reference outside it:
// the served document must stand on its own.
func Load(ctx context.Context) (*openapi3.T, error) {
	loader := openapi3.NewLoader()
	loader.Context = ctx
	doc, err := loader.LoadFromData(api.Spec())
	if err != nil {
		return nil, err
	}
	if err := doc.Validate(ctx); err != nil {
		return nil, err
	}
	return doc, nil
}

// Doc returns the loaded spec. Callers must not modify it.
func (v *Validator) Doc() *openapi3.T { return v.doc }

type invalidKey struct{}

// ExpectInvalidRequest marks a request's context: the test sends it
// outside the spec on purpose (a malformed body, a missing header), so
// only the response is checked, and it must still be one the operation
// declares.
func ExpectInvalidRequest(ctx context.Context) context.Context {
	return context.WithValue(ctx, invalidKey{}, true)
}

func expectsInvalid(ctx context.Context) bool { b, _ := ctx.Value(invalidKey{}).(bool); return b }

// Transport returns a RoundTripper that sends through base and checks
// every request and its response against the spec, reporting mismatches
// with tb.Errorf (safe from any goroutine).
func (v *Validator) Transport(tb testing.TB, base http.RoundTripper) http.RoundTripper {
	return roundTripper{v: v, tb: tb, base: base}
}

type roundTripper struct {
	v    *Validator
	tb   testing.TB
	base http.RoundTripper
}

func (rt roundTripper) RoundTrip(req *http.Request) (*http.Response, error) {
	// A RoundTripper may consume the request's body but not change the
	// request: the body is read once and each copy gets its own reader.
	body, err := drain(req.Body)
	if err != nil {
		return nil, err
	}
	in := rt.v.checkRequest(rt.tb, withBody(req, body))
	res, err := rt.base.RoundTrip(withBody(req, body))
	if err != nil || in == nil {
		return res, err
	}
	resBody, err := drain(res.Body)
	if err != nil {
		return nil, err
	}
	res.Body = io.NopCloser(bytes.NewReader(resBody))
	rt.v.checkResponse(rt.tb, in, res.StatusCode, res.Header, resBody)
	return res, nil
}

// Handler returns h with every request it serves and every response it
// writes checked against the spec, reporting mismatches with tb.Errorf: for
// traffic that a test does not send itself (the demo's client).
func (v *Validator) Handler(tb testing.TB, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := drain(r.Body)
		if err != nil {
			http.Error(w, "spectest: reading the request", http.StatusBadRequest)
			return
		}
		in := v.checkRequest(tb, withBody(r, body))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, withBody(r, body))
		if in != nil {
			v.checkResponse(tb, in, rec.Code, rec.Header(), rec.Body.Bytes())
		}
		for k, vals := range rec.Header() {
			w.Header()[k] = vals
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	})
}

// checkRequest finds req's operation and, unless the test marked it as
// invalid on purpose, validates it. It returns the input the response is
// validated with, or nil when the request matches no operation.
func (v *Validator) checkRequest(tb testing.TB, req *http.Request) *openapi3filter.RequestValidationInput {
	tb.Helper()
	route, params, err := v.router.FindRoute(req)
	if err != nil {
		tb.Errorf("spectest: %s %s matches no operation of the spec: %v", req.Method, req.URL.Path, err)
		return nil
	}
	in := &openapi3filter.RequestValidationInput{
		Request:    req,
		PathParams: params,
		Route:      route,
		Options: &openapi3filter.Options{
			// The service authenticates; the tests check its 401s.
			AuthenticationFunc: openapi3filter.NoopAuthenticationFunc,
			MultiError:         true,
		},
	}
	if expectsInvalid(req.Context()) {
		return in
	}
	if err := openapi3filter.ValidateRequest(req.Context(), in); err != nil {
		tb.Errorf("spectest: request %s %s does not match the spec: %v", req.Method, req.URL.Path, err)
	}
	return in
}

// checkResponse validates a response to the request of in.
func (v *Validator) checkResponse(tb testing.TB, in *openapi3filter.RequestValidationInput, status int, header http.Header, body []byte) {
	tb.Helper()
	out := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in,
		Status:                 status,
		Header:                 header,
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true, // a status the operation does not declare fails
			MultiError:            true,
		},
	}
	out.SetBodyBytes(body)
	if err := openapi3filter.ValidateResponse(in.Request.Context(), out); err != nil {
		tb.Errorf("spectest: response %d to %s %s does not match the spec: %v\nbody: %.300s",
			status, in.Request.Method, in.Request.URL.Path, err, body)
	}
}

// drain reads and closes rc, which may be nil.
func drain(rc io.ReadCloser) ([]byte, error) {
	if rc == nil || rc == http.NoBody {
		return nil, nil
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// withBody returns a copy of r whose body reads body.
func withBody(r *http.Request, body []byte) *http.Request {
	c := r.Clone(r.Context())
	c.Body = http.NoBody
	if body != nil {
		c.Body = io.NopCloser(bytes.NewReader(body))
	}
	return c
}
