// Package unary is what the gRPC and Connect interceptors share: the
// covered methods, the key taken from metadata or from a request field, the
// request fingerprint, the stored reply, the run of the handler inside
// idem.Run, and the statuses the interceptors answer by themselves.
//
// It imports neither google.golang.org/grpc nor connectrpc.com/connect, so
// that a service using one of them does not build the other. Codes are
// google.rpc.Code values (int32), which gRPC's codes.Code and connect.Code
// share; errors travel as google.rpc.Status protos.
package unary
