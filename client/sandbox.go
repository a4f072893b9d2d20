package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"time"
)

// errNoClient is returned by the methods of a Sandbox that was not
// obtained from a Client.
var errNoClient = errors.New("moat client: the Sandbox has no Client; get it from Client.CreateSandbox, GetSandbox or Sandbox")

func (s *Sandbox) check() error {
	if s == nil || s.c == nil {
		return errNoClient
	}
	if s.ID == "" {
		return errors.New("moat client: the Sandbox has no ID")
	}
	return nil
}

func (s *Sandbox) path() string { return sandboxPath(s.ID) }

func (s *Sandbox) execPath(execID string) string {
	return s.path() + "/execs/" + url.PathEscape(execID)
}

// Delete destroys the sandbox now, with everything in it, and returns its
// final state. See Client.DeleteSandbox.
func (s *Sandbox) Delete(ctx context.Context) (*Sandbox, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.c.DeleteSandbox(ctx, s.ID)
}

// SetTimeout makes the sandbox expire ttl from now. See Client.SetTimeout.
func (s *Sandbox) SetTimeout(ctx context.Context, ttl time.Duration) (*Sandbox, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return s.c.SetTimeout(ctx, s.ID, ttl)
}

// Exec runs a command in the sandbox and waits for it to end ("wait":
// true). The command's own failure is in the returned Exec's Result.
func (s *Sandbox) Exec(ctx context.Context, req *ExecRequest) (*Exec, error) {
	return s.startExec(ctx, req, true)
}

// Start starts a command in the sandbox and returns at once ("wait":
// false) with the Exec in state running. Follow it with Events, or poll
// with GetExec.
func (s *Sandbox) Start(ctx context.Context, req *ExecRequest) (*Exec, error) {
	return s.startExec(ctx, req, false)
}

func (s *Sandbox) startExec(ctx context.Context, req *ExecRequest, wait bool) (*Exec, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if req == nil {
		return nil, errors.New("moat client: Exec: nil request")
	}
	p := s.path() + "/execs"
	body, err := req.wire(wait)
	if err != nil {
		return nil, fmt.Errorf("moat client: POST %s: %w", p, err)
	}
	// A command the server's effects policy holds is answered 202 with
	// {"approval": {...}} instead of an Exec.
	var e struct {
		Exec
		Approval *Approval `json:"approval"`
	}
	if err := s.c.doJSON(ctx, http.MethodPost, p, nil, body, &e); err != nil {
		return nil, err
	}
	if e.Approval != nil {
		return nil, &HeldError{Approval: e.Approval}
	}
	return &e.Exec, nil
}

// GetExec returns one command of the sandbox, running or ended.
func (s *Sandbox) GetExec(ctx context.Context, execID string) (*Exec, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	var e Exec
	if err := s.c.doJSON(ctx, http.MethodGet, s.execPath(execID), nil, nil, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// ListExecs returns the sandbox's commands, running and ended.
func (s *Sandbox) ListExecs(ctx context.Context) ([]*Exec, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	var list []*Exec
	if err := s.c.doJSON(ctx, http.MethodGet, s.path()+"/execs", nil, nil, listOf(&list, "execs", "items")); err != nil {
		return nil, err
	}
	return list, nil
}

// WriteStdin appends r's bytes to the standard input of a command started
// with StdinOpen.
func (s *Sandbox) WriteStdin(ctx context.Context, execID string, r io.Reader) error {
	if err := s.check(); err != nil {
		return err
	}
	if r == nil {
		r = http.NoBody
	}
	return s.raw(ctx, http.MethodPost, s.execPath(execID)+"/stdin", nil, r)
}

// CloseStdin closes the standard input of a command started with
// StdinOpen: the program reads end of file.
func (s *Sandbox) CloseStdin(ctx context.Context, execID string) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.raw(ctx, http.MethodPost, s.execPath(execID)+"/stdin", url.Values{"eof": {"1"}}, http.NoBody)
}

// Signal sends a signal to a running command: a name such as "SIGTERM" or
// "SIGKILL", or a number such as "15".
func (s *Sandbox) Signal(ctx context.Context, execID, signal string) error {
	if err := s.check(); err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]string{"signal": signal})
	return s.c.doJSON(ctx, http.MethodPost, s.execPath(execID)+"/signal", nil, body, nil)
}

// Resize sets the terminal size of a command started with ExecRequest.TTY
// (it gets SIGWINCH).
func (s *Sandbox) Resize(ctx context.Context, execID string, size TTYSize) error {
	if err := s.check(); err != nil {
		return err
	}
	body, _ := json.Marshal(size)
	return s.c.doJSON(ctx, http.MethodPost, s.execPath(execID)+"/resize", nil, body, nil)
}

// Upload writes r's bytes to path (relative to /workspace) in the
// sandbox, creating its parent directories. mode is the permission bits;
// 0 means the server's default.
func (s *Sandbox) Upload(ctx context.Context, path string, r io.Reader, mode fs.FileMode) error {
	if err := s.check(); err != nil {
		return err
	}
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", octalMode(mode))
	}
	if r == nil {
		r = http.NoBody
	}
	return s.raw(ctx, http.MethodPut, s.path()+"/files", q, r)
}

// Download returns the content of the file at path in the sandbox; the
// caller closes it. The body is streamed, not buffered. For a directory
// the server answers with its JSON listing: use List for those.
func (s *Sandbox) Download(ctx context.Context, path string) (io.ReadCloser, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	resp, err := s.c.do(ctx, request{method: http.MethodGet, path: s.path() + "/files", query: url.Values{"path": {path}}})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// List returns the entries of the directory dir in the sandbox ("" or "."
// is /workspace itself).
func (s *Sandbox) List(ctx context.Context, dir string) ([]FileInfo, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	if dir == "" {
		dir = "."
	}
	var list []FileInfo
	q := url.Values{"path": {dir}}
	if err := s.c.doJSON(ctx, http.MethodGet, s.path()+"/files", q, nil, listOf(&list, "entries", "files", "items")); err != nil {
		return nil, err
	}
	return list, nil
}

// Remove deletes path in the sandbox, a directory with everything in it.
func (s *Sandbox) Remove(ctx context.Context, path string) error {
	if err := s.check(); err != nil {
		return err
	}
	return s.c.doJSON(ctx, http.MethodDelete, s.path()+"/files", url.Values{"path": {path}}, nil, nil)
}

// raw sends body as application/octet-stream and discards the answer.
func (s *Sandbox) raw(ctx context.Context, method, path string, q url.Values, body io.Reader) error {
	resp, err := s.c.do(ctx, request{method: method, path: path, query: q, body: body, contentType: "application/octet-stream"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	return wrapRead(method, path, err)
}
