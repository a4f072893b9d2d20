package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/server/e2b/envdpb/filesystem/filesystemconnect"
	"github.com/moat-sandbox/moat/server/e2b/envdpb/process/processconnect"
	"github.com/moat-sandbox/moat/service"
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
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxMessageBytes), connect.WithRecover(recoverRPC), connect.WithInterceptors(userInterceptor{})}
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

// kinds maps each service error Kind onto the HTTP status of E2B's
// {code, message} answers and onto a Connect code: the one place where
// the E2B layer decides how Moat's errors look.
var kinds = map[service.Kind]struct {
	status int
	code   connect.Code
}{
	service.Internal:        {http.StatusInternalServerError, connect.CodeInternal},
	service.BadRequest:      {http.StatusBadRequest, connect.CodeInvalidArgument},
	service.Invalid:         {http.StatusBadRequest, connect.CodeInvalidArgument},
	service.Unauthenticated: {http.StatusUnauthorized, connect.CodeUnauthenticated},
	service.Forbidden:       {http.StatusForbidden, connect.CodePermissionDenied},
	service.NotFound:        {http.StatusNotFound, connect.CodeNotFound},
	service.Conflict:        {http.StatusConflict, connect.CodeFailedPrecondition},
	service.TooLarge:        {http.StatusRequestEntityTooLarge, connect.CodeResourceExhausted},
	service.Quota:           {http.StatusTooManyRequests, connect.CodeResourceExhausted},
	service.Unavailable:     {http.StatusServiceUnavailable, connect.CodeUnavailable},
}

func kindOf(err error) struct {
	status int
	code   connect.Code
} {
	return kinds[service.KindOf(err)]
}

// rpcFromService is a service error as a Connect error: the code of its
// Kind, the service's message.
func rpcFromService(err error) *connect.Error {
	msg := err.Error()
	var se *service.Error
	if errors.As(err, &se) {
		msg = se.Message
	}
	return rpcErr(kindOf(err).code, "%s", msg)
}

// writeRPCError answers a call refused before it reached its handler
// (a bad access token) in Connect's unary error form, which the streaming
// clients also read from a non-200 response.
func writeRPCError(w http.ResponseWriter, status int, e *connect.Error) {
	writeJSON(w, status, map[string]string{"code": e.Code().String(), "message": e.Message()})
}
