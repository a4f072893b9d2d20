package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/server/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/moat-sandbox/moat/server/e2b/envdpb/process/processconnect"
)

// envd's RPC services over the Connect protocol (connectrpc.com/connect):
// the SDKs use its JSON codec; the binary codec and gzip come with the
// library. Each call carries its sandbox in the context: serveEnvd checks
// the access token before any handler runs.

// maxMessageBytes bounds one Connect message.
const maxMessageBytes = 4 << 20

type callKey struct{}

func callOf(ctx context.Context) *envdCall {
	c, _ := ctx.Value(callKey{}).(*envdCall)
	return c
}

// rpcMux serves the two services.
func newRPCMux() *http.ServeMux {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxMessageBytes), connect.WithRecover(recoverRPC)}
	mux.Handle(processconnect.NewProcessHandler(processService{}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(filesystemService{}, opts...))
	return mux
}

// recoverRPC turns a panic in a handler into an internal error: it must
// not take the server down.
func recoverRPC(ctx context.Context, spec connect.Spec, _ http.Header, p any) error {
	return connect.NewError(connect.CodeInternal, fmt.Errorf("panic in %s: %v", spec.Procedure, p))
}

func rpcErr(code connect.Code, format string, a ...any) *connect.Error {
	return connect.NewError(code, fmt.Errorf(format, a...))
}

// codeOf maps a Moat API status onto a Connect code.
func codeOf(status int) connect.Code {
	switch status {
	case 400:
		return connect.CodeInvalidArgument
	case 401:
		return connect.CodeUnauthenticated
	case 404:
		return connect.CodeNotFound
	case 409:
		return connect.CodeFailedPrecondition
	case 413, 429:
		return connect.CodeResourceExhausted
	case 503:
		return connect.CodeUnavailable
	}
	return connect.CodeInternal
}

// writeRPCError answers a call refused before it reached its handler
// (a bad access token) in Connect's unary error form, which the streaming
// clients also read from a non-200 response.
func writeRPCError(w http.ResponseWriter, status int, e *connect.Error) {
	writeJSON(w, status, map[string]string{"code": e.Code().String(), "message": e.Message()})
}

func asConnect(err error) *connect.Error {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce
	}
	return connect.NewError(connect.CodeInternal, err)
}
