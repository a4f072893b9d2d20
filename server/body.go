package server

import (
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"
)

// drainTimeout bounds the time discardBody spends reading.
const drainTimeout = 30 * time.Second

// trackedBody is a request body that remembers whether anything read it.
type trackedBody struct {
	io.ReadCloser
	started atomic.Bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	b.started.Store(true)
	return b.ReadCloser.Read(p)
}

// discardBody reads and throws away what is left of the request body
// before an error answer, up to DrainBytes and drainTimeout.
//
// Go's server, answering with the body unread, reads at most 256 KiB of it
// and then closes the connection; a client that sends its whole body
// before it reads the answer (Python's http.client) then gets "connection
// reset by peer" instead of the documented 413 or 401. A client that sent
// "Expect: 100-continue" and whose body nobody read yet has not sent it
// (Go answers without "100 Continue"): nothing is read then.
func (s *Server) discardBody(w http.ResponseWriter, r *http.Request) {
	tb, ok := r.Body.(*trackedBody)
	if !ok || s.cfg.DrainBytes <= 0 {
		return
	}
	if !tb.started.Load() && strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		return
	}
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(drainTimeout))
	io.CopyN(io.Discard, tb.ReadCloser, s.cfg.DrainBytes)
	rc.SetReadDeadline(time.Time{})
}
