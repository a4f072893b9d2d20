package e2b

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/server"
)

// A Backend whose sessions keep files in a temporary directory and whose
// "programs" are a few scripted behaviours chosen by the last argument:
// "fail" writes "bad" to stderr and exits 3, "cat" copies stdin to stdout,
// "sleep" waits for a signal, anything else is echoed.

type fakeBackend struct {
	dir  string
	n    atomic.Int64
	mu   sync.Mutex
	live map[string]*fakeSession
	reqs []*engine.SessionRequest
}

func (b *fakeBackend) Run(ctx context.Context, req *engine.Request) (*result.Result, error) {
	return nil, errors.New("fake: no one-shot runs")
}

func (b *fakeBackend) NewSession(ctx context.Context, req *engine.SessionRequest) (server.Session, error) {
	id := fmt.Sprintf("sbx%04d", b.n.Add(1))
	d := filepath.Join(b.dir, id)
	if err := os.MkdirAll(d, 0o755); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(d)
	if err != nil {
		return nil, err
	}
	s := &fakeSession{id: id, root: root, dir: d, b: b, env: req.Manifest.Env}
	b.mu.Lock()
	b.live[id] = s
	b.reqs = append(b.reqs, req)
	b.mu.Unlock()
	return s, nil
}

func (b *fakeBackend) liveCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.live)
}

type fakeSession struct {
	id   string
	root *os.Root
	dir  string
	b    *fakeBackend
	n    atomic.Int64
	once sync.Once
	env  map[string]string // the manifest's
}

func (s *fakeSession) ID() string { return s.id }
func (s *fakeSession) Info() engine.SessionInfo {
	return engine.SessionInfo{ID: s.id, Tier: "fake", Image: result.Image{Name: "python", Digest: "sha256:0"}, Created: time.Now()}
}

func (s *fakeSession) Start(ctx context.Context, req *engine.ExecRequest) (server.Process, error) {
	p := &fakeProcess{id: fmt.Sprintf("%s-%d", s.id, s.n.Add(1)), argv: req.Argv, done: make(chan struct{}), sig: make(chan unix.Signal, 1)}
	var stdin io.Reader = req.Stdin
	if req.StdinOpen {
		pr, pw := io.Pipe()
		p.stdin, stdin = pw, pr
	}
	last := req.Argv[len(req.Argv)-1]
	go func() {
		res := &result.Result{Termination: result.Exited, Command: req.Argv}
		switch {
		case last == "fail":
			io.WriteString(req.Stderr, "bad\n")
			res.ExitCode = 3
		case last == "cat":
			if stdin != nil {
				io.Copy(req.Stdout, stdin)
			}
		case last == "sleep":
			sig := <-p.sig
			res.Termination, res.Signal = result.Signaled, int(sig)
		case last == "env":
			who := s.env["WHO"]
			if v, ok := req.Env["WHO"]; ok {
				who = v
			}
			io.WriteString(req.Stdout, who+"\n")
		default:
			io.WriteString(req.Stdout, last+"\n")
		}
		p.res.Store(res)
		close(p.done)
	}()
	return p, nil
}

func (s *fakeSession) WriteFile(p string, r io.Reader, mode fs.FileMode) (int64, error) {
	if d := filepath.Dir(p); d != "." {
		if err := s.root.MkdirAll(d, 0o755); err != nil {
			return 0, err
		}
	}
	f, err := s.root.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	return io.Copy(f, r)
}

func (s *fakeSession) info(p string) (engine.FileInfo, error) {
	fi, err := s.root.Lstat(p)
	if err != nil {
		return engine.FileInfo{}, err
	}
	typ := "file"
	switch {
	case fi.IsDir():
		typ = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		typ = "symlink"
	}
	name := fi.Name()
	if p == "." {
		name = "."
	}
	return engine.FileInfo{Name: name, Path: p, Type: typ, Size: fi.Size(), Mode: fmt.Sprintf("%04o", fi.Mode().Perm()), ModTime: fi.ModTime()}, nil
}

func (s *fakeSession) Open(p string) (*os.File, engine.FileInfo, error) {
	fi, err := s.info(p)
	if err != nil {
		return nil, fi, err
	}
	f, err := s.root.Open(p)
	return f, fi, err
}

func (s *fakeSession) ReadDir(p string) ([]engine.FileInfo, error) {
	f, err := s.root.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, err
	}
	var out []engine.FileInfo
	for _, n := range names {
		child := n
		if p != "." {
			child = p + "/" + n
		}
		fi, err := s.info(child)
		if err != nil {
			return nil, err
		}
		out = append(out, fi)
	}
	return out, nil
}

func (s *fakeSession) Stat(p string) (engine.FileInfo, error) { return s.info(p) }
func (s *fakeSession) MakeDir(p string) error                 { return s.root.MkdirAll(p, 0o755) }
func (s *fakeSession) Rename(from, to string) error           { return s.root.Rename(from, to) }
func (s *fakeSession) Remove(p string) error {
	if strings.Contains(p, "..") {
		return errors.New("fake: ..")
	}
	return s.root.RemoveAll(p)
}

func (s *fakeSession) Close() error {
	s.once.Do(func() {
		s.root.Close()
		os.RemoveAll(s.dir)
		s.b.mu.Lock()
		delete(s.b.live, s.id)
		s.b.mu.Unlock()
	})
	return nil
}

type fakeProcess struct {
	id    string
	argv  []string
	stdin io.WriteCloser
	done  chan struct{}
	sig   chan unix.Signal
	res   atomic.Pointer[result.Result]
}

func (p *fakeProcess) ID() string            { return p.id }
func (p *fakeProcess) Argv() []string        { return p.argv }
func (p *fakeProcess) Stdin() io.WriteCloser { return p.stdin }
func (p *fakeProcess) Done() <-chan struct{} { return p.done }
func (p *fakeProcess) Result() *result.Result {
	return p.res.Load()
}
func (p *fakeProcess) Signal(sig unix.Signal) error {
	select {
	case p.sig <- sig:
	default:
	}
	return nil
}

// fakeAuditor knows two keys.
type fakeAuditor struct{}

var keys = map[string]audit.Key{
	"moat_ka_secret": {ID: "ka", Name: "a"},
	"moat_kb_secret": {ID: "kb", Name: "b"},
}

func (fakeAuditor) Authenticate(token string) (audit.Key, error) {
	k, ok := keys[token]
	if !ok {
		return audit.Key{}, audit.ErrBadKey
	}
	return k, nil
}
func (fakeAuditor) Begin(audit.Record) error                   { return nil }
func (fakeAuditor) Finish(string, *result.Result, error) error { return nil }
func (fakeAuditor) CPUSecondsToday(string) (float64, error)    { return 0, nil }

// fakeKeys is the key store: every key of keys, some revoked.
type fakeKeys struct {
	mu      sync.Mutex
	revoked map[string]bool
}

func (f *fakeKeys) revoke(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.revoked[id] = true
}

func (f *fakeKeys) Key(id string) (audit.Key, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range keys {
		if k.ID == id {
			if f.revoked[id] {
				now := time.Now()
				k.Revoked = &now
			}
			return k, nil
		}
	}
	return audit.Key{}, audit.ErrBadKey
}
