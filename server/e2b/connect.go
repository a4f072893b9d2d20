package e2b

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
)

// The Connect protocol (connectrpc.com/docs/protocol) with the JSON codec,
// the part envd's clients use: unary calls are a JSON body answered by a
// JSON body; streams are envelopes (one flag byte, a 4-byte big-endian
// length, a JSON message), the last one flagged end-of-stream carrying
// the error if any. Messages follow protojson: lowerCamelCase names,
// enums by name, bytes in base64, int64 as strings.

const (
	flagEndStream   = 0x02
	flagCompressed  = 0x01
	maxMessageBytes = 4 << 20
)

// rpcError is a Connect error: code is one of Connect's names.
type rpcError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *rpcError) Error() string { return e.Code + ": " + e.Message }

func rpcErr(code, format string, a ...any) *rpcError {
	return &rpcError{Code: code, Message: fmt.Sprintf(format, a...)}
}

// connectStatus is the HTTP status of a unary error, by Connect's table.
var connectStatus = map[string]int{
	"canceled": 499, "unknown": 500, "invalid_argument": 400, "deadline_exceeded": 504,
	"not_found": 404, "already_exists": 409, "permission_denied": 403, "resource_exhausted": 429,
	"failed_precondition": 400, "aborted": 409, "out_of_range": 400, "unimplemented": 501,
	"internal": 500, "unavailable": 503, "data_loss": 500, "unauthenticated": 401,
}

// codeOf maps a Moat API status onto a Connect code.
func codeOf(status int) string {
	switch status {
	case 400:
		return "invalid_argument"
	case 401:
		return "unauthenticated"
	case 404:
		return "not_found"
	case 409:
		return "failed_precondition"
	case 413, 429:
		return "resource_exhausted"
	case 503:
		return "unavailable"
	}
	return "internal"
}

func writeUnaryError(w http.ResponseWriter, e *rpcError) {
	status := connectStatus[e.Code]
	if status == 0 {
		status = 500
	}
	writeJSON(w, status, e)
}

// readUnary decodes a unary request's JSON body.
func readUnary(r *http.Request, v any) *rpcError {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		return rpcErr("invalid_argument", "content type %q: Moat's envd speaks Connect with the JSON codec only (application/json)", ct)
	}
	if r.Header.Get("Content-Encoding") != "" && r.Header.Get("Content-Encoding") != "identity" {
		return rpcErr("unimplemented", "compressed requests are not supported")
	}
	data, err := io.ReadAll(io.LimitReader(r.Body, maxMessageBytes+1))
	if err != nil {
		return rpcErr("invalid_argument", "read request: %v", err)
	}
	if len(data) > maxMessageBytes {
		return rpcErr("resource_exhausted", "the message is over %d bytes", maxMessageBytes)
	}
	if len(data) == 0 {
		data = []byte("{}")
	}
	if err := json.Unmarshal(data, v); err != nil {
		return rpcErr("invalid_argument", "decode request: %v", err)
	}
	return nil
}

// readEnvelope reads one enveloped message; io.EOF at a clean end.
func readEnvelope(r io.Reader) (flags byte, msg []byte, err error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > maxMessageBytes {
		return 0, nil, rpcErr("resource_exhausted", "a message of %d bytes is over the %d-byte limit", n, maxMessageBytes)
	}
	msg = make([]byte, n)
	if _, err := io.ReadFull(r, msg); err != nil {
		return 0, nil, fmt.Errorf("truncated message: %w", err)
	}
	if hdr[0]&flagCompressed != 0 {
		return 0, nil, rpcErr("unimplemented", "compressed messages are not supported")
	}
	return hdr[0], msg, nil
}

// stream is the response side of a streaming call.
type stream struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	mu      sync.Mutex
	started bool
	ended   bool
}

func newStream(w http.ResponseWriter) *stream {
	return &stream{w: w, rc: http.NewResponseController(w)}
}

func (s *stream) begin() {
	if !s.started {
		s.started = true
		s.w.Header().Set("Content-Type", "application/connect+json")
		s.w.WriteHeader(http.StatusOK)
	}
}

func (s *stream) frame(flags byte, data []byte) error {
	s.begin()
	var hdr [5]byte
	hdr[0] = flags
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(data)))
	if _, err := s.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := s.w.Write(data); err != nil {
		return err
	}
	return s.rc.Flush()
}

// send writes one message.
func (s *stream) send(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return errors.New("stream ended")
	}
	return s.frame(0, data)
}

// end writes the end-of-stream message, with e if not nil.
func (s *stream) end(e *rpcError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended {
		return
	}
	s.ended = true
	body := map[string]any{}
	if e != nil {
		body["error"] = e
	}
	data, _ := json.Marshal(body)
	s.frame(flagEndStream, data)
}

// readStreamRequest reads the single request message of a server stream.
func readStreamRequest(r *http.Request, v any) *rpcError {
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/connect+json") {
		return rpcErr("invalid_argument", "content type %q: streams take application/connect+json", ct)
	}
	_, msg, err := readEnvelope(r.Body)
	if err != nil {
		var re *rpcError
		if errors.As(err, &re) {
			return re
		}
		return rpcErr("invalid_argument", "read request message: %v", err)
	}
	if err := json.Unmarshal(msg, v); err != nil {
		return rpcErr("invalid_argument", "decode request: %v", err)
	}
	return nil
}
