package main

// Integration tests of 'moat serve' as a real process: the API through the
// Go client, load, a killed server, a disconnecting client, draining on
// SIGTERM. Each server gets a state directory of its own (sharing the
// built images), so what is left in it afterwards is that server's.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/result"
)

type testServer struct {
	t    *testing.T
	home string
	url  string
	key  string
	cmd  *exec.Cmd
	done chan struct{}
	err  error

	mu  sync.Mutex
	log bytes.Buffer
	// ids are the sandbox ids seen in the server's runs directory.
	ids  map[string]bool
	stop chan struct{}
}

// serverHome is a fresh state directory sharing the machine's images.
func serverHome(t *testing.T) string {
	t.Helper()
	home := t.TempDir()
	for _, d := range []string{filepath.Dir(home), home} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	shared := engine.DefaultHome()
	if _, err := os.Stat(filepath.Join(shared, "images")); err != nil {
		t.Skipf("no image store at %s (run scripts/setup): %v", shared, err)
	}
	if err := os.Symlink(filepath.Join(shared, "images"), filepath.Join(home, "images")); err != nil {
		t.Fatal(err)
	}
	return home
}

func createKey(t *testing.T, home string, args ...string) string {
	t.Helper()
	out := moat(t, invocation{args: append([]string{"keys", "create", "--name", "test"}, args...), env: []string{"MOAT_HOME=" + home}})
	if out.code != 0 {
		t.Fatalf("keys create: %s", out)
	}
	return strings.TrimSpace(out.stdout)
}

var listening = regexp.MustCompile(`msg="moat serve listening" url=(\S+)`)

func startServer(t *testing.T, home, key string, args ...string) *testServer {
	t.Helper()
	s := &testServer{t: t, home: home, key: key, done: make(chan struct{}), ids: map[string]bool{}, stop: make(chan struct{})}
	s.cmd = exec.Command(moatBin, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...)...)
	s.cmd.Env = append(os.Environ(), "MOAT_HOME="+home)
	// A test binary that dies (a panic, a timeout) skips its cleanups:
	// the server must die with it rather than outlive the test.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := s.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	s.cmd.Stderr = s.cmd.Stdout
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			s.mu.Lock()
			s.log.WriteString(sc.Text() + "\n")
			s.mu.Unlock()
			if m := listening.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
		s.err = s.cmd.Wait()
		close(s.done)
	}()
	go s.watchRuns()
	t.Cleanup(func() {
		select {
		case <-s.done:
		default:
			s.cmd.Process.Kill()
			<-s.done
		}
		close(s.stop)
		// A failed test must not leave cgroups of a home that is about
		// to be deleted (nobody's GC would find them).
		s.mu.Lock()
		defer s.mu.Unlock()
		// The killed server's sandboxes die with it, but not at once: a
		// cgroup is removable only once its processes have exited.
		for id := range s.ids {
			dirs, _ := filepath.Glob("/sys/fs/cgroup/*/moat/" + id)
			more, _ := filepath.Glob("/sys/fs/cgroup/moat/" + id)
			for _, d := range append(dirs, more...) {
				for range 100 {
					if err := os.Remove(d); err == nil || os.IsNotExist(err) {
						break
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
		}
	})
	select {
	case s.url = <-found:
	case <-s.done:
		t.Fatalf("moat serve exited before listening: %v\n%s", s.err, s.logs())
	case <-time.After(2 * time.Minute):
		t.Fatalf("moat serve did not start listening\n%s", s.logs())
	}
	return s
}

// watchRuns records every sandbox id that appears in the server's runs
// directory, for the residue checks.
func (s *testServer) watchRuns() {
	for {
		ents, _ := os.ReadDir(filepath.Join(s.home, "runs"))
		s.mu.Lock()
		for _, e := range ents {
			if !strings.HasPrefix(e.Name(), ".") {
				s.ids[e.Name()] = true
			}
		}
		s.mu.Unlock()
		select {
		case <-s.stop:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *testServer) logs() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.log.String()
}

func (s *testServer) client(t *testing.T) *client.Client {
	t.Helper()
	c, err := client.New(s.url, s.key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// terminate sends SIGTERM and waits for a clean exit within bound.
func (s *testServer) terminate(t *testing.T, bound time.Duration) {
	t.Helper()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(bound):
		t.Fatalf("moat serve did not stop within %v of SIGTERM\n%s", bound, s.logs())
	}
	if s.err != nil {
		t.Errorf("moat serve exited with %v after SIGTERM\n%s", s.err, s.logs())
	}
}

// kill sends SIGKILL and waits.
func (s *testServer) kill() {
	s.cmd.Process.Kill()
	<-s.done
}

// residue lists what the server's sandboxes left on the host.
func (s *testServer) residue() []string {
	var left []string
	ents, _ := os.ReadDir(filepath.Join(s.home, "runs"))
	for _, e := range ents {
		left = append(left, "run directory "+e.Name())
	}
	s.mu.Lock()
	ids := make([]string, 0, len(s.ids))
	for id := range s.ids {
		ids = append(ids, id)
	}
	s.mu.Unlock()
	procs, _ := filepath.Glob("/proc/[0-9]*/cgroup")
	for _, id := range ids {
		for _, pat := range []string{"/sys/fs/cgroup/*/moat/" + id, "/sys/fs/cgroup/moat/" + id} {
			m, _ := filepath.Glob(pat)
			for _, p := range m {
				left = append(left, "cgroup "+p)
			}
		}
		for _, p := range procs {
			if b, err := os.ReadFile(p); err == nil && bytes.Contains(b, []byte("/moat/"+id+"\n")) {
				left = append(left, "process "+filepath.Base(filepath.Dir(p))+" of "+id)
			}
		}
	}
	return left
}

func (s *testServer) auditRecords(t *testing.T, args ...string) []audit.Record {
	t.Helper()
	out := moat(t, invocation{args: append([]string{"audit", "--json", "--limit", "10000"}, args...), env: []string{"MOAT_HOME=" + s.home}})
	if out.code != 0 {
		t.Fatalf("moat audit: %s", out)
	}
	var recs []audit.Record
	dec := json.NewDecoder(strings.NewReader(out.stdout))
	for dec.More() {
		var r audit.Record
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("decode audit output: %v\n%s", err, out.stdout)
		}
		recs = append(recs, r)
	}
	return recs
}

func wantExit(t *testing.T, res *result.Result, term result.Termination, code int) {
	t.Helper()
	if res == nil {
		t.Fatal("no result")
	}
	if res.Termination != term || res.ExitCode != code {
		t.Errorf("termination %s exit %d, want %s %d (stderr %q)", res.Termination, res.ExitCode, term, code, res.Stderr.Data)
	}
}

// TestServe drives one server through the API as a client would: a
// one-shot run from the pool, a session with files, streaming, stdin and
// signals, metrics, moat run --server, and the audit log of all of it.
func TestServe(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home)
	s := startServer(t, home, key, "--pool", "1", "--session-pool", "1")
	c := s.client(t)
	ctx := context.Background()

	// A pool fills in the background; give it a moment so the first run
	// can come from it.
	time.Sleep(500 * time.Millisecond)
	run, err := c.Run(ctx, &client.RunRequest{Code: "import sys; print(open('in.txt').read().upper()); sys.exit(3)", Language: "python",
		Files: []client.File{{Path: "in.txt", Content: []byte("hello")}}})
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, run.Result, result.Exited, 3)
	if run.Result.Stdout.Data != "HELLO\n" {
		t.Errorf("stdout %q", run.Result.Stdout.Data)
	}
	if !run.Pooled {
		t.Errorf("the first run did not come from the warm pool")
	}
	if run.Result.ID != run.ID {
		t.Errorf("result id %s differs from the run id %s", run.Result.ID, run.ID)
	}
	again, err := c.GetRun(ctx, run.ID)
	if err != nil || again.Result.ExitCode != 3 {
		t.Errorf("GET run: %v %+v", err, again)
	}

	sb, err := c.CreateSandbox(ctx, &client.SandboxRequest{TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Upload(ctx, "src/main.py", strings.NewReader("print('from main')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ex, err := sb.Exec(ctx, &client.ExecRequest{Argv: []string{"sh", "-c", "python3 src/main.py > out.txt; echo done"}})
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, ex.Result, result.Exited, 0)
	rc, err := sb.Download(ctx, "out.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if string(got) != "from main\n" {
		t.Errorf("downloaded %q", got)
	}
	// Streaming: output arrives before the command ends.
	ex, err = sb.Start(ctx, &client.ExecRequest{Argv: []string{"sh", "-c", "echo first; sleep 30"}})
	if err != nil {
		t.Fatal(err)
	}
	stream, err := sb.Events(ctx, ex.ID, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Next() || !strings.Contains(string(stream.Event().Data), "first") {
		t.Fatalf("first event: %+v %v", stream.Event(), stream.Err())
	}
	if err := sb.Signal(ctx, ex.ID, "SIGTERM"); err != nil {
		t.Fatal(err)
	}
	for stream.Next() {
	}
	stream.Close()
	ex, err = sb.GetExec(ctx, ex.ID)
	if err != nil {
		t.Fatal(err)
	}
	wantExit(t, ex.Result, result.Signaled, 128+15)
	// Open stdin.
	ex, err = sb.Start(ctx, &client.ExecRequest{Argv: []string{"wc", "-l"}, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteStdin(ctx, ex.ID, strings.NewReader("a\nb\n")); err != nil {
		t.Fatal(err)
	}
	if err := sb.CloseStdin(ctx, ex.ID); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100 && ex.Running(); i++ {
		time.Sleep(50 * time.Millisecond)
		ex, _ = sb.GetExec(ctx, ex.ID)
	}
	if ex.Result == nil || strings.TrimSpace(ex.Result.Stdout.Data) != "2" {
		t.Errorf("wc through stdin: %+v", ex.Result)
	}
	// Path tricks are refused and create nothing.
	for _, p := range []string{"../../etc/passwd", "/etc/passwd", "a\x00b"} {
		err := sb.Upload(ctx, p, strings.NewReader("x"), 0o644)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest {
			t.Errorf("upload %q: %v, want 400", p, err)
		}
	}
	// A link the sandbox made out of the workspace is refused (400), not
	// followed and not a server failure.
	if ex, err := sb.Exec(ctx, &client.ExecRequest{Argv: []string{"ln", "-s", "/etc", "esc"}}); err != nil || ex.Result.ExitCode != 0 {
		t.Fatalf("ln: %v %+v", err, ex)
	}
	for _, p := range []string{"esc/passwd", "esc/"} {
		_, err := sb.Download(ctx, p)
		var ce *client.Error
		if !errors.As(err, &ce) || ce.Status != http.StatusBadRequest {
			t.Errorf("download %q through a link out: %v, want 400", p, err)
		}
	}
	// Another key cannot see the sandbox.
	other, _ := client.New(s.url, createKey(t, home))
	if _, err := other.GetSandbox(ctx, sb.ID); err == nil {
		t.Errorf("another key read sandbox %s", sb.ID)
	}
	if _, err := sb.Delete(ctx); err != nil {
		t.Fatal(err)
	}

	// Metrics: the whole server's, for an admin key only.
	req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+key)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("/metrics with a tenant's key: %v %v, want 403", err, resp.Status)
	} else {
		resp.Body.Close()
	}
	req, _ = http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+createKey(t, home, "--admin"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{"moat_runs_total", "moat_pool_ready", "moat_sandboxes_active"} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if resp, err := http.Get(s.url + "/metrics"); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unauthenticated /metrics: %v %v", err, resp.Status)
	}

	// The CLI as a client.
	out := moat(t, invocation{args: []string{"run", "--", "python3", "-c", "print(6*7)"}, env: []string{"MOAT_SERVER=" + s.url, "MOAT_API_KEY=" + key}})
	if out.code != 0 || out.stdout != "42\n" {
		t.Errorf("moat run --server: %s", out)
	}

	// The README's Python example, verbatim but for the address.
	if py, err := exec.LookPath("python3"); err != nil {
		t.Errorf("python3 not on the host: the Python client's README example is not checked (scripts/setup installs it)")
	} else {
		readme, err := os.ReadFile("../../README.md")
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(string(readme), "### Python")
		_, rest, _ = strings.Cut(rest, "```python\n")
		example, _, _ := strings.Cut(rest, "```")
		example = strings.ReplaceAll(example, "http://127.0.0.1:7070", s.url)
		cmd := exec.Command(py, "-")
		cmd.Stdin = strings.NewReader(example)
		cmd.Env = append(os.Environ(), "MOAT_API_KEY="+key, "PYTHONPATH=../../clients/python")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "exited 0 42") || !strings.HasSuffix(strings.TrimSpace(string(out)), "6") {
			t.Errorf("README Python example: %v\n%s", err, out)
		}
	}

	s.terminate(t, 30*time.Second)
	if left := s.residue(); len(left) > 0 {
		t.Errorf("after shutdown: %v", left)
	}
	for _, args := range [][]string{{"audit", "report"}, {"policy", "suggest"}} {
		out := moat(t, invocation{args: args, env: []string{"MOAT_HOME=" + home}})
		out.check(t, 0, nil, nil, nil)
		if len(out.stdout) < 100 {
			t.Errorf("moat %s printed little: %s", strings.Join(args, " "), out)
		}
	}
	recs := s.auditRecords(t)
	kinds := map[audit.Kind]int{}
	for _, r := range recs {
		kinds[r.Kind]++
		if r.Status == audit.Running {
			t.Errorf("record %s still running after shutdown", r.ID)
		}
	}
	// A run and a sandbox with four execs through the Go client, the
	// CLI's run, and the README example's run, sandbox and two execs.
	if kinds[audit.KindRun] != 3 || kinds[audit.KindSandbox] != 2 || kinds[audit.KindExec] != 6 {
		t.Errorf("audit kinds %v, want 3 runs, 2 sandboxes, 6 execs", kinds)
	}
	for _, r := range recs {
		// A sandbox that was deleted or shut down ended normally.
		if r.Kind == audit.KindSandbox && (r.Status != audit.Done || r.Error != "") {
			t.Errorf("sandbox record %s: %s %q, want done", r.ID, r.Status, r.Error)
		}
	}
}

// TestServeLoad: 32 concurrent clients do 500 runs and 50 sandbox sessions
// between them. Every request gets a result or a clear API error, no
// sandbox is left, and the audit log holds every run exactly once.
func TestServeLoad(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home, "--max-sandboxes", "64")
	s := startServer(t, home, key, "--pool", "4", "--session-pool", "2")
	c := s.client(t)
	const clients, runs, sessions = 32, 500, 50
	tasks := make(chan string, runs+sessions)
	for i := 0; i < runs; i++ {
		tasks <- "run"
	}
	for i := 0; i < sessions; i++ {
		tasks <- "session"
	}
	close(tasks)
	var (
		mu       sync.Mutex
		runIDs   = map[string]int{}
		apiErrs  = map[string]int{}
		failures []string
	)
	fail := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 20 {
			failures = append(failures, fmt.Sprintf(format, a...))
		}
	}
	clear := func(err error) bool {
		var ce *client.Error
		if errors.As(err, &ce) && ce.Code != "" && ce.Message != "" && ce.Status != http.StatusInternalServerError {
			mu.Lock()
			apiErrs[ce.Code]++
			mu.Unlock()
			return true
		}
		return false
	}
	start := time.Now()
	var wg sync.WaitGroup
	for w := 0; w < clients; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			ctx := context.Background()
			for task := range tasks {
				switch task {
				case "run":
					r, err := c.Run(ctx, &client.RunRequest{Argv: []string{"sh", "-c", fmt.Sprintf("echo %d", w)}})
					if err != nil {
						if !clear(err) {
							fail("run: %v", err)
						}
						continue
					}
					if r.Result.ExitCode != 0 || r.Result.Stdout.Data != fmt.Sprintf("%d\n", w) {
						fail("run %s: exit %d stdout %q", r.ID, r.Result.ExitCode, r.Result.Stdout.Data)
					}
					mu.Lock()
					runIDs[r.ID]++
					mu.Unlock()
				case "session":
					sb, err := c.CreateSandbox(ctx, &client.SandboxRequest{TTL: time.Minute})
					if err != nil {
						if !clear(err) {
							fail("create sandbox: %v", err)
						}
						continue
					}
					if err := sb.Upload(ctx, "n.txt", strings.NewReader(fmt.Sprint(w)), 0o644); err != nil {
						fail("upload: %v", err)
					}
					for i := 0; i < 2; i++ {
						ex, err := sb.Exec(ctx, &client.ExecRequest{Argv: []string{"cat", "n.txt"}})
						if err != nil {
							if !clear(err) {
								fail("exec: %v", err)
							}
						} else if ex.Result.Stdout.Data != fmt.Sprint(w) {
							fail("exec in %s: stdout %q", sb.ID, ex.Result.Stdout.Data)
						}
					}
					if _, err := sb.Delete(ctx); err != nil {
						fail("delete %s: %v", sb.ID, err)
					}
				}
			}
		}(w)
	}
	wg.Wait()
	took := time.Since(start)
	t.Logf("%d runs and %d sessions from %d clients in %v; API errors: %v", runs, sessions, clients, took, apiErrs)
	for _, f := range failures {
		t.Error(f)
	}
	if len(apiErrs) > 0 {
		// Clear errors are allowed by the contract, but with this quota
		// and queue none should happen: say so loudly.
		t.Errorf("API errors under load: %v", apiErrs)
	}
	s.terminate(t, 60*time.Second)
	if left := s.residue(); len(left) > 0 {
		t.Errorf("after load and shutdown: %v", left)
	}
	recs := s.auditRecords(t, "--kind", "run")
	seen := map[string]int{}
	for _, r := range recs {
		seen[r.ID]++
		if r.Status != audit.Done {
			t.Errorf("run %s: status %s", r.ID, r.Status)
		}
	}
	if len(recs) != len(runIDs) {
		t.Errorf("audit log has %d run records, the clients got %d results", len(recs), len(runIDs))
	}
	for id, n := range runIDs {
		if n != 1 || seen[id] != 1 {
			t.Errorf("run %s: %d responses, %d audit records", id, n, seen[id])
		}
	}
	if n := len(s.auditRecords(t, "--kind", "sandbox")); n != sessions {
		t.Errorf("audit log has %d sandbox records, want %d", n, sessions)
	}
}

// TestServeKilled: a server killed with SIGKILL mid-run takes its
// sandboxes with it; the next start removes what they left and marks their
// records failed; a client that disconnects cancels its run; SIGTERM
// drains a running run and destroys open sandboxes.
func TestServeKilled(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home)
	s := startServer(t, home, key, "--pool", "0", "--session-pool", "0")
	c := s.client(t)
	ctx := context.Background()

	sb, err := c.CreateSandbox(ctx, &client.SandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.Start(ctx, &client.ExecRequest{Argv: []string{"sleep", "60"}}); err != nil {
		t.Fatal(err)
	}
	runDone := make(chan error, 1)
	go func() {
		_, err := c.Run(ctx, &client.RunRequest{Argv: []string{"sleep", "60"}})
		runDone <- err
	}()
	waitFor(t, "two sandboxes in the runs directory", func() bool {
		ents, _ := os.ReadDir(filepath.Join(home, "runs"))
		return len(ents) == 2
	})
	time.Sleep(200 * time.Millisecond)
	s.kill()
	if err := <-runDone; err == nil {
		t.Errorf("a run survived its server's death")
	}
	// The sandboxes' processes die with the server (parent-death signal).
	waitFor(t, "the dead server's sandbox processes to exit", func() bool {
		for _, l := range s.residue() {
			if strings.HasPrefix(l, "process ") {
				return false
			}
		}
		return true
	})

	s2 := startServer(t, home, key, "--pool", "0", "--session-pool", "0")
	s.mu.Lock()
	for id := range s.ids {
		s2.mu.Lock()
		s2.ids[id] = true
		s2.mu.Unlock()
	}
	s.mu.Unlock()
	if left := s2.residue(); len(left) > 0 {
		t.Errorf("the restarted server did not collect the dead one's sandboxes: %v", left)
	}
	failed := s2.auditRecords(t, "--outcome", "failed")
	kinds := map[audit.Kind]int{}
	for _, r := range failed {
		kinds[r.Kind]++
	}
	if kinds[audit.KindRun] != 1 || kinds[audit.KindSandbox] != 1 || kinds[audit.KindExec] != 1 {
		t.Errorf("failed records after the crash: %v, want the run, the sandbox and its exec", kinds)
	}

	// A client that disconnects mid-run cancels it.
	c2 := s2.client(t)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		for i := 0; i < 1000; i++ {
			if ents, _ := os.ReadDir(filepath.Join(home, "runs")); len(ents) == 1 {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	if _, err := c2.Run(cctx, &client.RunRequest{Argv: []string{"sleep", "60"}}); err == nil {
		t.Errorf("a cancelled request got a result")
	}
	waitFor(t, "the disconnected client's run to be destroyed", func() bool {
		ents, _ := os.ReadDir(filepath.Join(home, "runs"))
		return len(ents) == 0
	})

	// SIGTERM: the running run finishes, the open sandbox is destroyed.
	sb2, err := c2.CreateSandbox(ctx, &client.SandboxRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb2.Start(ctx, &client.ExecRequest{Argv: []string{"sleep", "60"}}); err != nil {
		t.Fatal(err)
	}
	drained := make(chan *client.RunResponse, 1)
	go func() {
		r, _ := c2.Run(ctx, &client.RunRequest{Argv: []string{"sh", "-c", "sleep 1; echo finished"}})
		drained <- r
	}()
	waitFor(t, "the run to start", func() bool {
		ents, _ := os.ReadDir(filepath.Join(home, "runs"))
		return len(ents) == 2
	})
	start := time.Now()
	s2.terminate(t, 20*time.Second)
	t.Logf("SIGTERM to exit: %v", time.Since(start))
	if r := <-drained; r == nil || r.Result.Stdout.Data != "finished\n" {
		t.Errorf("the run in flight at SIGTERM did not finish: %+v", r)
	}
	if left := s2.residue(); len(left) > 0 {
		t.Errorf("after SIGTERM: %v", left)
	}
}

// TestServeSecondServer: a second server on the same $MOAT_HOME is refused
// with a message naming the first, and the first server's run in flight
// is untouched: finished by its own server, recorded done with its CPU.
// (The second server used to mark every running record failed.)
func TestServeSecondServer(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home)
	s := startServer(t, home, key, "--pool", "0", "--session-pool", "0")
	c := s.client(t)
	type answer struct {
		r   *client.RunResponse
		err error
	}
	ran := make(chan answer, 1)
	go func() {
		r, err := c.Run(context.Background(), &client.RunRequest{Argv: []string{"python3", "-c", "import time\nend = time.time() + 3\nwhile time.time() < end: pass\nprint('done')"}})
		ran <- answer{r, err}
	}()
	waitFor(t, "the run to start", func() bool {
		ents, _ := os.ReadDir(filepath.Join(home, "runs"))
		return len(ents) == 1
	})

	second := exec.Command(moatBin, "serve", "--listen", "127.0.0.1:0", "--pool", "0", "--session-pool", "0")
	second.Env = append(os.Environ(), "MOAT_HOME="+home)
	second.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	done := make(chan []byte, 1)
	go func() {
		out, _ := second.CombinedOutput()
		done <- out
	}()
	select {
	case out := <-done:
		if second.ProcessState.ExitCode() == 0 || !strings.Contains(string(out), "in use by another moat serve") || !strings.Contains(string(out), "pid ") {
			t.Errorf("second server: exit %d, output %s; want a refusal naming the first", second.ProcessState.ExitCode(), out)
		}
	case <-time.After(30 * time.Second):
		second.Process.Kill()
		t.Fatalf("a second moat serve on the same home kept running:\n%s", <-done)
	}

	a := <-ran
	if a.err != nil || a.r.Result.Stdout.Data != "done\n" {
		t.Fatalf("the first server's run: %v %+v", a.err, a.r)
	}
	s.terminate(t, 20*time.Second)
	recs := s.auditRecords(t, "--kind", "run")
	if len(recs) != 1 || recs[0].Status != audit.Done || recs[0].CPUMS < 1000 || recs[0].Error != "" {
		t.Errorf("the run's record: %+v; want done with its CPU time", recs)
	}
}

// TestServeKilledAccounting: a server killed while a program burns CPU
// loses no more than a few seconds of its accounting: the restart settles
// the record as failed but keeps the wall and CPU time it accrued, ends it
// when that was last recorded (not at the restart), and counts it in the
// key's daily CPU use.
func TestServeKilledAccounting(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home)
	s := startServer(t, home, key, "--pool", "0", "--session-pool", "0")
	c := s.client(t)
	go c.Run(context.Background(), &client.RunRequest{Argv: []string{"python3", "-c", "while True: pass"}})
	waitFor(t, "the run to start", func() bool {
		ents, _ := os.ReadDir(filepath.Join(home, "runs"))
		return len(ents) == 1
	})
	time.Sleep(5 * time.Second) // two accruals at least
	killed := time.Now()
	s.kill()
	waitFor(t, "the dead server's sandbox processes to exit", func() bool {
		for _, l := range s.residue() {
			if strings.HasPrefix(l, "process ") {
				return false
			}
		}
		return true
	})
	time.Sleep(time.Second)
	s2 := startServer(t, home, key, "--pool", "0", "--session-pool", "0")
	recs := s2.auditRecords(t, "--kind", "run")
	if len(recs) != 1 {
		t.Fatalf("run records: %+v", recs)
	}
	r := recs[0]
	if r.Status != audit.Failed || r.WallMS < 2000 || r.CPUMS < 1000 {
		t.Errorf("the killed run's record: status %s wall %.0fms cpu %.0fms; want failed with the time and CPU it had used", r.Status, r.WallMS, r.CPUMS)
	}
	if r.Ended.After(killed) {
		t.Errorf("the killed run ended at %v, after the server was killed (%v): the restart's time, not the run's", r.Ended, killed)
	}
	s2.terminate(t, 20*time.Second)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestServeTLS: with --tls-cert and --tls-key the API is HTTPS only.
func TestServeTLS(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home)
	certPEM, keyPEM := selfSigned(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, certPEM, 0o600)
	os.WriteFile(keyFile, keyPEM, 0o600)
	s := startServer(t, home, key, "--pool", "0", "--session-pool", "0", "--tls-cert", certFile, "--tls-key", keyFile)
	if !strings.HasPrefix(s.url, "https://") {
		t.Fatalf("listening on %s, want https", s.url)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	c, err := client.New(s.url, key, client.WithHTTPClient(hc))
	if err != nil {
		t.Fatal(err)
	}
	run, err := c.Run(context.Background(), &client.RunRequest{Argv: []string{"echo", "over tls"}})
	if err != nil || run.Result.Stdout.Data != "over tls\n" {
		t.Fatalf("run over TLS: %v %+v", err, run)
	}
	if resp, err := http.Get(strings.Replace(s.url, "https://", "http://", 1) + "/v1/health"); err == nil {
		if resp.StatusCode == http.StatusOK {
			t.Errorf("plain HTTP answered 200 on the TLS port")
		}
		resp.Body.Close()
	}
	s.terminate(t, 20*time.Second)
}

// selfSigned returns a certificate for 127.0.0.1 and its key, in PEM.
func selfSigned(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "moat test"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &priv.PublicKey, priv)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

// TestServeAndCLIRunsTogether: a `moat serve` and `moat run` processes on
// the same home at once (an operator's CLI beside the daemon, or agents
// that use both). Every `moat run` starts with a GC of the home, which
// must never take a live run of the server (or of another CLI) for dead;
// every run, sandbox and command succeeds, and nothing is left.
func TestServeAndCLIRunsTogether(t *testing.T) {
	needRoot(t)
	home := serverHome(t)
	key := createKey(t, home, "--max-sandboxes", "32")
	s := startServer(t, home, key, "--pool", "2", "--session-pool", "1")
	c := s.client(t)
	const workers, each = 6, 12
	var mu sync.Mutex
	var failures []string
	fail := func(format string, a ...any) {
		mu.Lock()
		defer mu.Unlock()
		failures = append(failures, fmt.Sprintf(format, a...))
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(3)
		go func() { // one-shot runs through the API
			defer wg.Done()
			for i := range each {
				r, err := c.Run(context.Background(), &client.RunRequest{Argv: []string{"sh", "-c", fmt.Sprintf("echo %d-%d", w, i)}})
				if err != nil {
					fail("API run: %v", err)
				} else if r.Result.ExitCode != 0 || r.Result.Stdout.Data != fmt.Sprintf("%d-%d\n", w, i) {
					fail("API run %s: %s exit %d stdout %q", r.ID, r.Result.Termination, r.Result.ExitCode, r.Result.Stdout.Data)
				}
			}
		}()
		go func() { // a sandbox through the API, a command at a time
			defer wg.Done()
			sb, err := c.CreateSandbox(context.Background(), &client.SandboxRequest{TTL: time.Minute})
			if err != nil {
				fail("create sandbox: %v", err)
				return
			}
			defer sb.Delete(context.Background())
			for i := range each {
				ex, err := sb.Exec(context.Background(), &client.ExecRequest{Argv: []string{"echo", fmt.Sprint(i)}})
				if err != nil {
					fail("exec in %s: %v", sb.ID, err)
				} else if ex.Result.Stdout.Data != fmt.Sprintf("%d\n", i) {
					fail("exec %d in %s: %s exit %d stdout %q stderr %q", i, sb.ID, ex.Result.Termination, ex.Result.ExitCode, ex.Result.Stdout.Data, ex.Result.Stderr.Data)
				}
			}
		}()
		go func() { // moat run processes on the same home
			defer wg.Done()
			for range each {
				out := moat(t, invocation{args: []string{"run", "--", "true"}, env: []string{"MOAT_HOME=" + home}})
				if out.code != 0 || out.stderr != "" {
					fail("moat run: exit %d, stderr %q", out.code, out.stderr)
				}
			}
		}()
	}
	wg.Wait()
	if len(failures) > 0 {
		// The failures last, nearest the FAIL line: CI prints the lines
		// before it, and a long server log pushed them out of sight.
		t.Errorf("server log:\n%s\n%d failures, e.g.:\n%s", s.logs(), len(failures), strings.Join(failures[:min(len(failures), 10)], "\n"))
	}
	s.terminate(t, 30*time.Second)
	if left := s.residue(); len(left) > 0 {
		t.Errorf("left behind: %v", left)
	}
}
