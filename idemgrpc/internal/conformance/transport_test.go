package conformance_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"

	"github.com/idemhq/idem/idem"
	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/idemgrpc/idemconnect"
	chargev1 "github.com/idemhq/idem/idemgrpc/internal/example/charge/v1"
	"github.com/idemhq/idem/idemgrpc/internal/example/charge/v1/chargev1connect"
)

// method is a covered method's settings, free of any transport.
type method struct {
	required bool
	keyField string
}

// config is an interceptor's configuration, free of any transport: each
// transport builds its package's Config from it.
type config struct {
	methods          map[string]method // by full method name; defaults to Charge keyed by request_id
	scope            func(context.Context) (string, error)
	contextScope     bool // Scope is the package's ContextScope
	shared           bool // SharedKeys; set by scoped() when neither scope is
	wait             time.Duration
	maxResponseBytes int
	observer         idem.Observer
}

// call is one Charge call: the caller (the x-caller metadata an
// authentication interceptor turns into the scope), the idempotency-key
// metadata values, and whether the client loses the answer.
type call struct {
	caller string
	keys   []string
	lose   bool // the server answers, the client discards the answer
}

// result is a call's answer, free of any transport.
type result struct {
	resp     *chargev1.ChargeResponse
	code     int32
	message  string
	details  []proto.Message
	replayed bool
}

// transport serves a bank under one of the interceptors and calls it.
type transport interface {
	name() string
	// check builds the interceptor on db with cfg, as start does, and
	// returns the constructor's error.
	check(db idem.Beginner, cfg config) error
	// defaultStore is the package's DefaultStoreCode.
	defaultStore(code int32) bool
	// start serves b under the interceptor built with cfg until the test
	// ends, and returns a client of it.
	start(t *testing.T, b *bank, cfg config) client
}

type client interface {
	charge(ctx context.Context, c call, req *chargev1.ChargeRequest) result
	getBalance(ctx context.Context, account string, keys ...string) (int64, error)
	listCharges(ctx context.Context, account string, keys ...string) ([]*chargev1.ChargeResponse, error)
}

var transports = []transport{grpcTransport{}, connectTransport{}, connectTransport{json: true}, connectTransport{grpcProtocol: true}}

// eachTransport runs f as a subtest for every transport.
func eachTransport(t *testing.T, f func(t *testing.T, tr transport)) {
	for _, tr := range transports {
		t.Run(tr.name(), func(t *testing.T) { f(t, tr) })
	}
}

// scoped returns cfg with SharedKeys set when it names no scope: for the
// scenarios about something other than scopes.
func (cfg config) scoped() config {
	if cfg.scope == nil && !cfg.contextScope {
		cfg.shared = true
	}
	return cfg
}

func (cfg config) covered() map[string]method {
	if cfg.methods != nil {
		return cfg.methods
	}
	return map[string]method{chargev1.ChargeService_Charge_FullMethodName: {keyField: "request_id"}}
}

// errLost is what a client that lost the answer reports.
var errLost = errors.New("the answer was lost on its way back")

// ---- gRPC ----

type grpcTransport struct{}

func (grpcTransport) name() string { return "grpc" }

// grpcConfig is cfg as idemgrpc's Config.
func grpcConfig(cfg config) *idemgrpc.Config {
	if cfg.contextScope {
		cfg.scope = idemgrpc.ContextScope
	}
	gcfg := &idemgrpc.Config{
		Methods:          map[string]idemgrpc.Method{},
		Scope:            cfg.scope,
		SharedKeys:       cfg.shared,
		Wait:             cfg.wait,
		MaxResponseBytes: cfg.maxResponseBytes,
		Observer:         cfg.observer,
	}
	for name, m := range cfg.covered() {
		gcfg.Methods[name] = idemgrpc.Method{Required: m.required, KeyField: m.keyField}
	}
	return gcfg
}

func (grpcTransport) check(db idem.Beginner, cfg config) error {
	_, err := idemgrpc.NewUnaryServerInterceptor(db, grpcConfig(cfg))
	return err
}

func (grpcTransport) defaultStore(code int32) bool {
	return idemgrpc.DefaultStoreCode(codes.Code(code))
}

func (grpcTransport) start(t *testing.T, b *bank, cfg config) client {
	t.Helper()
	b.tx = idemgrpc.Tx
	intercept, err := idemgrpc.NewUnaryServerInterceptor(b.pool, grpcConfig(cfg.scoped()))
	if err != nil {
		t.Fatal(err)
	}
	// The authentication interceptor runs first and scopes the call by its
	// caller.
	auth := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if callers := metadata.ValueFromIncomingContext(ctx, "x-caller"); len(callers) == 1 {
			ctx = idem.ContextWithScope(ctx, callers[0])
		}
		return handler(ctx, req)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, intercept))
	chargev1.RegisterChargeServiceServer(srv, &grpcBank{b: b})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithUnaryInterceptor(loseAnswers))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		srv.Stop()
	})
	return &grpcClient{c: chargev1.NewChargeServiceClient(conn)}
}

type loseKey struct{}

// loseAnswers is a client interceptor that, for calls marked with loseKey,
// lets the call complete on the server and discards its answer.
func loseAnswers(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if ctx.Value(loseKey{}) != nil {
		proto.Reset(reply.(proto.Message))
		return status.Error(codes.Unavailable, errLost.Error())
	}
	return err
}

type grpcBank struct {
	chargev1.UnimplementedChargeServiceServer
	b *bank
}

func (s *grpcBank) Charge(ctx context.Context, req *chargev1.ChargeRequest) (*chargev1.ChargeResponse, error) {
	resp, err := s.b.Charge(ctx, req)
	return resp, grpcError(err)
}

func (s *grpcBank) GetBalance(ctx context.Context, req *chargev1.GetBalanceRequest) (*chargev1.GetBalanceResponse, error) {
	resp, err := s.b.GetBalance(ctx, req)
	return resp, grpcError(err)
}

func (s *grpcBank) ListCharges(req *chargev1.ListChargesRequest, stream grpc.ServerStreamingServer[chargev1.ChargeResponse]) error {
	return grpcError(s.b.ListCharges(stream.Context(), req, stream.Send))
}

func grpcError(err error) error {
	var re *rpcError
	if !errors.As(err, &re) {
		return err
	}
	st := status.New(codes.Code(re.code), re.message)
	if len(re.details) > 0 {
		var detailErr error
		if st, detailErr = st.WithDetails(protoadaptAll(re.details)...); detailErr != nil {
			panic(detailErr)
		}
	}
	return st.Err()
}

func protoadaptAll(ms []proto.Message) []protoadapt.MessageV1 {
	out := make([]protoadapt.MessageV1, len(ms))
	for i, m := range ms {
		out[i] = protoadapt.MessageV1Of(m)
	}
	return out
}

type grpcClient struct{ c chargev1.ChargeServiceClient }

func outgoing(ctx context.Context, caller string, keys []string) context.Context {
	var kv []string
	if caller != "" {
		kv = append(kv, "x-caller", caller)
	}
	for _, k := range keys {
		kv = append(kv, idemgrpc.MetadataKey, k)
	}
	return metadata.AppendToOutgoingContext(ctx, kv...)
}

func (c *grpcClient) charge(ctx context.Context, cl call, req *chargev1.ChargeRequest) result {
	ctx = outgoing(ctx, cl.caller, cl.keys)
	if cl.lose {
		ctx = context.WithValue(ctx, loseKey{}, true)
	}
	var header metadata.MD
	resp, err := c.c.Charge(ctx, req, grpc.Header(&header))
	r := result{replayed: len(header.Get(idemgrpc.MetadataReplayed)) > 0}
	if got := header.Get(idemgrpc.MetadataReplayed); len(got) > 0 && (len(got) != 1 || got[0] != "true") {
		panic("unexpected replayed metadata")
	}
	if err != nil {
		st := status.Convert(err)
		r.code, r.message = int32(st.Code()), st.Message()
		for _, d := range st.Details() {
			if m, ok := d.(proto.Message); ok {
				r.details = append(r.details, m)
			}
		}
		return r
	}
	r.resp = resp
	return r
}

func (c *grpcClient) getBalance(ctx context.Context, account string, keys ...string) (int64, error) {
	resp, err := c.c.GetBalance(outgoing(ctx, "", keys), &chargev1.GetBalanceRequest{AccountId: account})
	return resp.GetBalance(), err
}

func (c *grpcClient) listCharges(ctx context.Context, account string, keys ...string) ([]*chargev1.ChargeResponse, error) {
	stream, err := c.c.ListCharges(outgoing(ctx, "", keys), &chargev1.ListChargesRequest{AccountId: account})
	if err != nil {
		return nil, err
	}
	var out []*chargev1.ChargeResponse
	for {
		c, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		out = append(out, c)
	}
}

// ---- Connect ----

type connectTransport struct {
	grpcProtocol bool // the gRPC protocol over HTTP/2 instead of the Connect protocol
	json         bool // JSON messages instead of binary protobuf
}

func (c connectTransport) name() string {
	switch {
	case c.grpcProtocol:
		return "connect-grpc-protocol"
	case c.json:
		return "connect-json"
	}
	return "connect"
}

// connectConfig is cfg as idemconnect's Config.
func connectConfig(cfg config) *idemconnect.Config {
	if cfg.contextScope {
		cfg.scope = idemconnect.ContextScope
	}
	ccfg := &idemconnect.Config{
		Methods:          map[string]idemconnect.Method{},
		Scope:            cfg.scope,
		SharedKeys:       cfg.shared,
		Wait:             cfg.wait,
		MaxResponseBytes: cfg.maxResponseBytes,
		Observer:         cfg.observer,
	}
	for name, m := range cfg.covered() {
		ccfg.Methods[name] = idemconnect.Method{Required: m.required, KeyField: m.keyField}
	}
	return ccfg
}

func (connectTransport) check(db idem.Beginner, cfg config) error {
	_, err := idemconnect.NewInterceptor(db, connectConfig(cfg))
	return err
}

func (connectTransport) defaultStore(code int32) bool {
	return idemconnect.DefaultStoreCode(connect.Code(code))
}

func (c connectTransport) start(t *testing.T, b *bank, cfg config) client {
	t.Helper()
	b.tx = idemconnect.Tx
	intercept, err := idemconnect.NewInterceptor(b.pool, connectConfig(cfg.scoped()))
	if err != nil {
		t.Fatal(err)
	}
	auth := connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			if callers := req.Header().Values("X-Caller"); len(callers) == 1 {
				ctx = idem.ContextWithScope(ctx, callers[0])
			}
			return next(ctx, req)
		}
	})
	mux := http.NewServeMux()
	mux.Handle(chargev1connect.NewChargeServiceHandler(&connectBank{b: b}, connect.WithInterceptors(auth, intercept)))
	srv := httptest.NewUnstartedServer(mux)
	var opts []connect.ClientOption
	if c.grpcProtocol {
		srv.EnableHTTP2 = true
		srv.StartTLS()
		opts = append(opts, connect.WithGRPC())
	} else {
		srv.Start()
	}
	if c.json {
		opts = append(opts, connect.WithProtoJSON())
	}
	opts = append(opts, connect.WithInterceptors(loseConnectAnswers))
	t.Cleanup(func() {
		srv.Client().CloseIdleConnections()
		srv.Close()
	})
	return &connectClient{c: chargev1connect.NewChargeServiceClient(srv.Client(), srv.URL, opts...)}
}

// loseConnectAnswers is a client interceptor that, for calls marked with
// loseKey, lets the call complete on the server and discards its answer.
var loseConnectAnswers = connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		resp, err := next(ctx, req)
		if ctx.Value(loseKey{}) != nil {
			return nil, connect.NewError(connect.CodeUnavailable, errLost)
		}
		return resp, err
	}
})

type connectBank struct{ b *bank }

func (s *connectBank) Charge(ctx context.Context, req *connect.Request[chargev1.ChargeRequest]) (*connect.Response[chargev1.ChargeResponse], error) {
	resp, err := s.b.Charge(ctx, req.Msg)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(resp), nil
}

func (s *connectBank) GetBalance(ctx context.Context, req *connect.Request[chargev1.GetBalanceRequest]) (*connect.Response[chargev1.GetBalanceResponse], error) {
	resp, err := s.b.GetBalance(ctx, req.Msg)
	if err != nil {
		return nil, connectError(err)
	}
	return connect.NewResponse(resp), nil
}

func (s *connectBank) ListCharges(ctx context.Context, req *connect.Request[chargev1.ListChargesRequest], stream *connect.ServerStream[chargev1.ChargeResponse]) error {
	return connectError(s.b.ListCharges(ctx, req.Msg, stream.Send))
}

func connectError(err error) error {
	var re *rpcError
	if !errors.As(err, &re) {
		return err
	}
	ce := connect.NewError(connect.Code(re.code), errors.New(re.message))
	for _, d := range re.details {
		detail, derr := connect.NewErrorDetail(d)
		if derr != nil {
			panic(derr)
		}
		ce.AddDetail(detail)
	}
	return ce
}

type connectClient struct {
	c chargev1connect.ChargeServiceClient
}

func (c *connectClient) charge(ctx context.Context, cl call, req *chargev1.ChargeRequest) result {
	r := connect.NewRequest(req)
	if cl.caller != "" {
		r.Header().Set("X-Caller", cl.caller)
	}
	for _, k := range cl.keys {
		r.Header().Add(idemconnect.HeaderKey, k)
	}
	if cl.lose {
		ctx = context.WithValue(ctx, loseKey{}, true)
	}
	resp, err := c.c.Charge(ctx, r)
	if err != nil {
		var res result
		var ce *connect.Error
		if !errors.As(err, &ce) {
			return result{code: codeInternal, message: err.Error()}
		}
		res.code, res.message = int32(ce.Code()), ce.Message()
		res.replayed = replayedHeader(ce.Meta())
		for _, d := range ce.Details() {
			m, derr := d.Value()
			if derr != nil {
				return result{code: codeInternal, message: derr.Error()}
			}
			res.details = append(res.details, m)
		}
		return res
	}
	return result{resp: resp.Msg, replayed: replayedHeader(resp.Header())}
}

func replayedHeader(h http.Header) bool {
	switch v := h.Values(idemconnect.HeaderReplayed); {
	case len(v) == 0:
		return false
	case len(v) == 1 && v[0] == "true":
		return true
	}
	panic("unexpected replayed header")
}

func (c *connectClient) getBalance(ctx context.Context, account string, keys ...string) (int64, error) {
	r := connect.NewRequest(&chargev1.GetBalanceRequest{AccountId: account})
	for _, k := range keys {
		r.Header().Add(idemconnect.HeaderKey, k)
	}
	resp, err := c.c.GetBalance(ctx, r)
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetBalance(), nil
}

func (c *connectClient) listCharges(ctx context.Context, account string, keys ...string) ([]*chargev1.ChargeResponse, error) {
	r := connect.NewRequest(&chargev1.ListChargesRequest{AccountId: account})
	for _, k := range keys {
		r.Header().Add(idemconnect.HeaderKey, k)
	}
	stream, err := c.c.ListCharges(ctx, r)
	if err != nil {
		return nil, err
	}
	defer stream.Close()
	var out []*chargev1.ChargeResponse
	for stream.Receive() {
		out = append(out, stream.Msg())
	}
	return out, stream.Err()
}
