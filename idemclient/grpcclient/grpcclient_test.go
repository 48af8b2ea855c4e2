package grpcclient_test

import (
	"context"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idemhq/idem/idemclient"
	"github.com/idemhq/idem/idemclient/grpcclient"
	"github.com/idemhq/idem/idemgrpc"
	"github.com/idemhq/idem/testkit/testdb"
)

func TestMain(m *testing.M) { os.Exit(testdb.Main(m)) }

var fast = &idemclient.Policy{MaxAttempts: 4, MinBackoff: time.Millisecond, MaxBackoff: 2 * time.Millisecond}

// health is the service of these tests (grpc.health.v1, whose messages are
// in the protobuf registry, as idemgrpc requires): Check answers as check
// says, and every call's key is recorded.
type health struct {
	healthpb.UnimplementedHealthServer
	mu    sync.Mutex
	keys  []string
	check func(ctx context.Context, call int, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error)
}

func (h *health) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.mu.Lock()
	h.keys = append(h.keys, metadata.ValueFromIncomingContext(ctx, grpcclient.MetadataKey)...)
	call := len(h.keys)
	h.mu.Unlock()
	return h.check(ctx, call, req)
}

func (h *health) received() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.keys...)
}

// dial serves h in process (bufconn) behind the server options, and
// returns a Health client through the interceptor built with p and the
// dial options.
func dial(t *testing.T, h *health, p *idemclient.Policy, server []grpc.ServerOption, opts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	ln := bufconn.Listen(1 << 20)
	srv := grpc.NewServer(server...)
	healthpb.RegisterHealthServer(srv, h)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	intercept, err := grpcclient.UnaryClientInterceptor(p)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient("passthrough:///bufnet", append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(intercept),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func withRetryInfo(code codes.Code, delay time.Duration) error {
	st, _ := status.New(code, "later").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	return st.Err()
}

var serving = &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}

// TestCodes: what is retried, with one key on every attempt, and what the
// caller receives.
func TestCodes(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name         string
		first        error // the answer to every call up to fails, then SERVING
		fails        int
		wantCode     codes.Code
		wantAttempts int
	}{
		{"UNAVAILABLE: retried", status.Error(codes.Unavailable, "down"), 2, codes.OK, 3},
		{"UNAVAILABLE with RetryInfo: retried", withRetryInfo(codes.Unavailable, time.Millisecond), 1, codes.OK, 2},
		{"ABORTED with RetryInfo (in progress): retried", withRetryInfo(codes.Aborted, time.Millisecond), 1, codes.OK, 2},
		{"ABORTED without RetryInfo: not retried", status.Error(codes.Aborted, "conflict"), 1, codes.Aborted, 1},
		{"FAILED_PRECONDITION (key reused): not retried", status.Error(codes.FailedPrecondition, "mismatch"), 1, codes.FailedPrecondition, 1},
		{"INVALID_ARGUMENT: not retried", status.Error(codes.InvalidArgument, "bad"), 1, codes.InvalidArgument, 1},
		{"INTERNAL: not retried", status.Error(codes.Internal, "bug"), 1, codes.Internal, 1},
		{"UNAVAILABLE every time: the last error", status.Error(codes.Unavailable, "down"), 9, codes.Unavailable, 4},
		{"ABORTED with a RetryInfo past the deadline: at once", withRetryInfo(codes.Aborted, time.Minute), 1, codes.Aborted, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := &health{check: func(_ context.Context, call int, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
				if call <= tt.fails {
					return nil, tt.first
				}
				return serving, nil
			}}
			c := dial(t, h, fast, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var res idemclient.Result
			_, err := c.Check(ctx, &healthpb.HealthCheckRequest{}, grpcclient.WithResult(&res))
			if status.Code(err) != tt.wantCode || res.Attempts != tt.wantAttempts {
				t.Fatalf("%v after %d attempts, want %v after %d", err, res.Attempts, tt.wantCode, tt.wantAttempts)
			}
			keys := h.received()
			if len(keys) != tt.wantAttempts || keys[0] != res.Key {
				t.Fatalf("keys %q, result %+v", keys, res)
			}
			for _, k := range keys {
				if k != keys[0] || k == "" {
					t.Fatalf("keys %q: want one key on every attempt", keys)
				}
			}
		})
	}
}

// TestGRPCRetryPolicy: grpc-go's own retries (a service config's
// retryPolicy) re-send the call below the interceptor with the key it set
// once: the server sees three calls with one key, the interceptor one
// attempt.
func TestGRPCRetryPolicy(t *testing.T) {
	t.Parallel()
	h := &health{check: func(_ context.Context, call int, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if call <= 2 {
			return nil, status.Error(codes.Unavailable, "down")
		}
		return serving, nil
	}}
	c := dial(t, h, fast, nil, grpc.WithDefaultServiceConfig(`{"methodConfig":[{
		"name":[{"service":"grpc.health.v1.Health"}],
		"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.002s","backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}`))
	var res idemclient.Result
	if _, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpcclient.WithResult(&res)); err != nil {
		t.Fatal(err)
	}
	keys := h.received()
	if res.Attempts != 1 || len(keys) != 3 || keys[0] != keys[1] || keys[1] != keys[2] || keys[0] != res.Key {
		t.Fatalf("result %+v, keys %q: want grpc-go's 3 attempts with the interceptor's one key", res, keys)
	}
}

// TestIdemServer: against idemgrpc's server interceptor on a real
// PostgreSQL. A call whose handler fails UNAVAILABLE (rolled back, not
// stored) is retried and committed once; the same logical call made again
// (the same key, ContextWithKey) is replayed; the key with another request
// is FAILED_PRECONDITION, not retried.
func TestIdemServer(t *testing.T) {
	t.Parallel()
	pool := testdb.New(t)
	if _, err := pool.Exec(t.Context(), "create table checks (id bigserial primary key, service text not null)"); err != nil {
		t.Fatal(err)
	}
	intercept, err := idemgrpc.NewUnaryServerInterceptor(pool, &idemgrpc.Config{
		Methods:    map[string]idemgrpc.Method{healthpb.Health_Check_FullMethodName: {Required: true}},
		SharedKeys: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	h := &health{check: func(ctx context.Context, call int, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if call == 1 {
			return nil, status.Error(codes.Unavailable, "try again")
		}
		if _, err := idemgrpc.Tx(ctx).Exec(ctx, "insert into checks (service) values ($1)", req.GetService()); err != nil {
			return nil, status.Error(codes.Unavailable, err.Error())
		}
		return serving, nil
	}}
	c := dial(t, h, fast, []grpc.ServerOption{grpc.UnaryInterceptor(intercept)})
	ctx := idemclient.ContextWithKey(t.Context(), "check-1")

	var first, again, other idemclient.Result
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: "a"}, grpcclient.WithResult(&first)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{Service: "a"}, grpcclient.WithResult(&again)); err != nil {
		t.Fatal(err)
	}
	_, err = c.Check(ctx, &healthpb.HealthCheckRequest{Service: "b"}, grpcclient.WithResult(&other))
	var rows int
	if err := pool.QueryRow(t.Context(), "select count(*) from checks").Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if first.Attempts != 2 || first.Replayed || !again.Replayed || again.Attempts != 1 || rows != 1 {
		t.Fatalf("first %+v, again %+v, %d rows: want 2 attempts, then a replay, one row", first, again, rows)
	}
	if status.Code(err) != codes.FailedPrecondition || other.Attempts != 1 {
		t.Fatalf("another request with the key: %v after %d attempts, want FAILED_PRECONDITION at once", err, other.Attempts)
	}
}
