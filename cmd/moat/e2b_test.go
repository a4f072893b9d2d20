package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/client"
	"github.com/moat-sandbox/moat/result"
	processpb "github.com/moat-sandbox/moat/server/e2b/envdpb/process"
	"github.com/moat-sandbox/moat/server/e2b/envdpb/process/processconnect"
)

// e2bSDK is the node_modules directory scripts/setup installs the pinned
// e2b npm package of dir (testdata/e2b, or one of its release
// subdirectories) into, keyed by the lock's digest; $MOAT_E2B_SDK
// replaces the newest (testdata/e2b).
func e2bSDK(t *testing.T, dir string) string {
	t.Helper()
	if d := os.Getenv("MOAT_E2B_SDK"); d != "" && dir == "testdata/e2b" {
		return d
	}
	return pinnedNodeModules(t, dir, "e2b-sdk")
}

// pinnedNodeModules is the node_modules directory scripts/setup installs
// the npm packages pinned by dir's package-lock.json into:
// /var/cache/moat/CACHE/<the lock's digest>.
func pinnedNodeModules(t *testing.T, dir, cache string) string {
	t.Helper()
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(lock)
	return filepath.Join("/var/cache/moat", cache, hex.EncodeToString(sum[:])[:16], "node_modules")
}

// e2bReleases are the e2b npm releases TestServeE2BSDK drives, each
// pinned by its lockfile: the newest the registry serves (testdata/e2b)
// and older ones teams may have pinned, which send allow_internet_access
// true on every create and refuse a key not spelled e2b_<hex> (so they
// get a Moat key from moat keys create --e2b).
var e2bReleases = []struct {
	version, dir string
	e2bKey       bool
}{
	{"2.51.0", "testdata/e2b", false},
	{"2.50.0", "testdata/e2b/2.50.0", true},
	{"2.45.0", "testdata/e2b/2.45.0", true},
}

// The checks sdk.cjs runs; each must print "ok <name>".
var e2bChecks = []string{
	"run", "run-fails", "envs", "background", "kill", "stdin", "files", "gzip-upload", "remove-missing", "user-root", "not-served", "pty", "pty-connect-kill", "pty-bad-size", "watchDir",
	"path-traversal", "oversized-upload", "list", "list-order", "setTimeout", "connect", "wrong-key", "other-key",
	"never-existed", "refused-fields", "pause-resume", "snapshots", "fork", "kill-during-command", "command-timeout", "timeout-during-command", "auto-pause",
	"internet", "signed-urls", "ports", "kill-sandbox", "times-out",
}

// TestServeE2BSDK drives `moat serve --e2b` with the real E2B JavaScript
// SDK (testdata/e2b/sdk.cjs), then checks from Moat's side that its
// sandboxes were Moat sandboxes: audited, reachable through Moat's API by
// the same id, and gone without residue.
func TestServeE2BSDK(t *testing.T) {
	t.Parallel() // one of the slow ones (cli_test.go: TestMain)
	needRoot(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs node (scripts/setup installs nodejs): " + err.Error())
	}
	// e2b 2.51 needs node >= 20.18.1 (its package.json's engines).
	if v, err := exec.Command(node, "-p", "process.versions.node").Output(); err != nil || !nodeAtLeast(strings.TrimSpace(string(v)), 20, 18) {
		t.Skipf("the e2b SDK needs node 20.18 or newer; %s is %q (%v)", node, strings.TrimSpace(string(v)), err)
	}
	home := serverHome(t)
	key := createKey(t, home)
	other := createKey(t, home)
	const maxBody = "1MiB"
	// --e2b-domain: the SDK's getHost(port) names are <port>-<id>.moat.test
	// (its envd traffic goes to E2B_SANDBOX_URL all the same).
	s := startServer(t, home, key, "--e2b", "--e2b-domain", "moat.test", "--pool", "0", "--session-pool", "1", "--max-body", maxBody)

	// The control plane speaks E2B's errors, and a sandbox created
	// through it is a Moat sandbox under the same id.
	t.Run("same sandbox through Moat's API", func(t *testing.T) {
		status, body := e2bCall(t, s.url, key, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":60,"metadata":{"who":"go"}}`)
		if status != http.StatusCreated {
			t.Fatalf("create: %d %s", status, body)
		}
		var created struct{ SandboxID, EnvdAccessToken string }
		json.Unmarshal(body, &created)
		if created.SandboxID == "" || len(created.EnvdAccessToken) < 32 {
			t.Fatalf("create answered %s", body)
		}
		// A process started through envd (the generated Connect client,
		// as the SDKs speak it) is a command whose full Moat result (here
		// its file diff) Moat's API serves under the same ids.
		pc := processconnect.NewProcessClient(http.DefaultClient, s.url, connect.WithProtoJSON(),
			connect.WithInterceptors(envdHeaders(created.SandboxID, created.EnvdAccessToken)))
		stream, err := pc.Start(context.Background(), connect.NewRequest(&processpb.StartRequest{Process: &processpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo made > made.txt"}}}))
		if err != nil {
			t.Fatal(err)
		}
		var pid uint32
		exitCode := int32(-99)
		for stream.Receive() {
			switch ev := stream.Msg().GetEvent().GetEvent().(type) {
			case *processpb.ProcessEvent_Start:
				pid = ev.Start.GetPid()
			case *processpb.ProcessEvent_End:
				exitCode = ev.End.GetExitCode()
			}
		}
		if err := stream.Err(); err != nil || pid == 0 || exitCode != 0 {
			t.Fatalf("envd Start: pid %d exit %d err %v", pid, exitCode, err)
		}
		c := s.client(t)
		// The E2B pid is the command's pid inside the sandbox (never
		// init's), which Moat's API lists with the command.
		execs, err := c.Sandbox(created.SandboxID).ListExecs(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(execs, func(ex *client.Exec) bool { return ex.Pid == int(pid) })
		if pid <= 1 || i < 0 {
			t.Fatalf("E2B process %d: no command of Moat's API has that pid: %+v", pid, execs)
		}
		ex, err := c.Sandbox(created.SandboxID).GetExec(context.Background(), execs[i].ID)
		if err != nil || ex.Result == nil {
			t.Fatalf("Moat's API for E2B process %d (%s): %v", pid, execs[i].ID, err)
		}
		if !slices.ContainsFunc(ex.Result.Files, func(f result.FileChange) bool { return f.Path == "made.txt" }) {
			t.Errorf("the command's file diff through Moat's API: %+v", ex.Result.Files)
		}
		sb, err := c.GetSandbox(context.Background(), created.SandboxID)
		if err != nil {
			t.Fatalf("Moat's API does not know E2B's sandbox %s: %v", created.SandboxID, err)
		}
		if sb.Metadata["who"] != "go" {
			t.Errorf("metadata through Moat's API: %v", sb.Metadata)
		}
		if _, err := c.DeleteSandbox(context.Background(), created.SandboxID); err != nil {
			t.Fatal(err)
		}
		status, body = e2bCall(t, s.url, key, "GET", "/sandboxes/"+created.SandboxID, "")
		var e struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		}
		if err := json.Unmarshal(body, &e); status != http.StatusNotFound || err != nil || e.Code != 404 || e.Message == "" {
			t.Errorf("a sandbox deleted through Moat's API, through E2B's: %d %s", status, body)
		}
		// What e2b before 2.51 sends on every create: by default the
		// sandbox gets loopback only, and the answer says so.
		req, _ := http.NewRequest("POST", s.url+"/v2/sandboxes", strings.NewReader(`{"templateID":"base","timeout":30,"secure":true,"allow_internet_access":true}`))
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var inet struct{ SandboxID string }
		json.NewDecoder(resp.Body).Decode(&inet)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated || !strings.Contains(resp.Header.Get("X-Moat-Notice"), "no network beyond loopback") {
			t.Errorf("allow_internet_access true: %d, notice %q", resp.StatusCode, resp.Header.Get("X-Moat-Notice"))
		}
		if inet.SandboxID != "" {
			if _, err := c.DeleteSandbox(context.Background(), inet.SandboxID); err != nil {
				t.Error(err)
			}
		}
		for _, tc := range []struct {
			name, key, body string
			status          int
		}{
			{"wrong key", "moat_x_y", `{"templateID":"base"}`, 401},
			{"E2B cloud key", "e2b_" + strings.Repeat("0", 40), `{"templateID":"base"}`, 401},
			{"absurd timeout", key, `{"templateID":"base","timeout":18446744074}`, 400},
			{"unknown field", key, `{"templateID":"base","secureX":true}`, 400},
			{"auto pause with memory", key, `{"templateID":"base","autoPause":true,"autoPauseMemory":true}`, 400},
			{"deny list", key, `{"templateID":"base","network":{"denyOut":["10.0.0.0/8"]}}`, 400},
			{"unknown template", key, `{"templateID":"gpu"}`, 400}, // issue 19: an unknown template is a bad request naming it
		} {
			status, body := e2bCall(t, s.url, tc.key, "POST", "/v2/sandboxes", tc.body)
			if status != tc.status || !bytes.Contains(body, []byte(`"code":`)) {
				t.Errorf("%s: %d %s, want %d with {code, message}", tc.name, status, body, tc.status)
			}
		}
	})

	var ids []string // the SDK's sandboxes, main and timed out, of every release
	var mains []string
	for _, rel := range e2bReleases {
		t.Run("sdk "+rel.version, func(t *testing.T) {
			sdk := e2bSDK(t, rel.dir)
			if _, err := os.Stat(filepath.Join(sdk, "e2b", "package.json")); err != nil {
				t.Skipf("the e2b npm package %s is not installed at %s (scripts/setup installs it): %v", rel.version, sdk, err)
			}
			key, other := key, other
			if rel.e2bKey {
				// The older SDKs refuse anything but e2b_<hex> before
				// sending it: the same kind of Moat key, in its E2B
				// spelling.
				key, other = createKey(t, home, "--e2b"), createKey(t, home, "--e2b")
				if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(key) {
					t.Fatalf("moat keys create --e2b printed %q, which e2b %s refuses", key, rel.version)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "testdata/e2b/sdk.cjs")
			cmd.Env = append(os.Environ(),
				"NODE_PATH="+sdk,
				"E2B_API_URL="+s.url, "E2B_SANDBOX_URL="+s.url,
				"E2B_API_KEY="+key, "E2B_OTHER_KEY="+other,
				"E2B_MAX_BODY=1048576", "E2B_RUN="+rel.version,
			)
			out, err := cmd.CombinedOutput()
			t.Logf("sdk.cjs:\n%s", out)
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) {
				t.Fatal(err)
			}
			if !bytes.Contains(out, []byte("\ne2b "+rel.version+"\n")) && !bytes.HasPrefix(out, []byte("e2b "+rel.version+"\n")) {
				t.Errorf("sdk.cjs did not run e2b %s", rel.version)
			}
			for _, name := range e2bChecks {
				if !regexp.MustCompile(`(?m)^ok ` + regexp.QuoteMeta(name) + `$`).Match(out) {
					t.Errorf("check %s did not pass", name)
				}
			}
			if err != nil || !bytes.Contains(out, []byte("\nPASS\n")) {
				t.Fatalf("sdk.cjs failed: %v", err)
			}
			main := regexp.MustCompile(`(?m)^sandbox (\S+)$`).FindSubmatch(out)
			timed := regexp.MustCompile(`(?m)^timeout-sandbox (\S+)$`).FindSubmatch(out)
			if main == nil || timed == nil {
				t.Fatal("sdk.cjs did not name its sandboxes")
			}
			mine := []string{string(main[1]), string(timed[1])}
			for _, id := range mine {
				// A killed or expired sandbox is "deleting" until its
				// destruction is over, then unknown.
				waitFor(t, "sandbox "+id+" to be gone from Moat's API", func() bool {
					var apiErr *client.Error
					_, err := s.client(t).GetSandbox(context.Background(), id)
					return errors.As(err, &apiErr) && apiErr.Code == client.CodeNotFound
				})
			}
			ids = append(ids, mine...)
			mains = append(mains, mine[0])
		})
	}

	// Shutdown waits for every record to be finished.
	s.terminate(t, time.Minute)
	if left := s.residue(); len(left) > 0 {
		t.Errorf("residue after the E2B sandboxes ended:\n%s", strings.Join(left, "\n"))
	}
	if ids == nil {
		return
	}
	recs := s.auditRecords(t)
	for _, id := range ids {
		i := slices.IndexFunc(recs, func(r audit.Record) bool { return r.ID == id && r.Kind == audit.KindSandbox })
		if i < 0 {
			t.Errorf("no audit record of sandbox %s", id)
			continue
		}
		if recs[i].Ended.IsZero() || recs[i].KeyID == "" {
			t.Errorf("sandbox %s: audit record not finished or without key: %+v", id, recs[i])
		}
	}
	for _, main := range mains {
		execs := 0
		for _, r := range recs {
			if r.Kind == audit.KindExec && r.SandboxID == main {
				execs++
			}
		}
		// sdk.cjs runs 11 commands in its main sandbox (run, run-fails,
		// envs, background, kill, stdin, files' cat, pty's and
		// pty-connect-kill's terminals, connect's cat, ports'
		// http.server); the ones it asks to run as root and the terminal
		// of 0 columns are refused before they start.
		if execs != 11 {
			t.Errorf("%d commands of sandbox %s audited, want the 11 the SDK ran", execs, main)
		}
	}
}

func e2bCall(t *testing.T, base, key, method, path, body string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-Key", key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

func nodeAtLeast(v string, major, minor int) bool {
	var ma, mi int
	if _, err := fmt.Sscanf(v, "%d.%d", &ma, &mi); err != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// envdHeaders adds what the SDKs send to envd: the sandbox's id and port
// and its access token.
func envdHeaders(id, token string) connect.Interceptor {
	return &headerInterceptor{h: http.Header{"E2b-Sandbox-Id": {id}, "E2b-Sandbox-Port": {"49983"}, "X-Access-Token": {token}}}
}

type headerInterceptor struct{ h http.Header }

func (i *headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range i.h {
			req.Header()[k] = v
		}
		return next(ctx, req)
	}
}

func (i *headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		for k, v := range i.h {
			conn.RequestHeader()[k] = v
		}
		return conn
	}
}

func (i *headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

// TestE2BFlags: --e2b-internet is checked before the server starts, and
// moat keys create --e2b prints a key the older E2B SDKs accept that is
// the same key as its Moat spelling.
func TestE2BFlags(t *testing.T) {
	home := t.TempDir()
	tests := []struct {
		name    string
		args    []string
		code    int
		wantErr []string
	}{
		{"internet without --e2b", []string{"serve", "--e2b-internet", "pypi.org"}, exitUsage, []string{"--e2b-internet needs --e2b"}},
		{"open internet", []string{"serve", "--e2b", "--e2b-internet", "*"}, exitUsage, []string{"--e2b-internet", "open internet"}},
		{"open internet CIDR", []string{"serve", "--e2b", "--e2b-internet", "pypi.org,0.0.0.0/0"}, exitUsage, []string{"open internet"}},
		{"not a host", []string{"serve", "--e2b", "--e2b-internet", "not a host!"}, exitUsage, []string{"--e2b-internet", "not a host!"}},
		{"empty entry", []string{"serve", "--e2b", "--e2b-internet", "pypi.org,"}, exitUsage, []string{"empty entry"}},
		{"help names it", []string{"serve", "--help"}, 0, []string{"-e2b-internet", "refuse"}},
		{"keys help names --e2b", []string{"keys", "create", "--help"}, 0, []string{"-e2b", "e2b_"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out := moat(t, invocation{args: tc.args, env: []string{"MOAT_HOME=" + home}})
			if tc.code == 0 {
				// Help goes to stdout or stderr depending on the command.
				out.stderr += out.stdout
			}
			out.check(t, tc.code, nil, tc.wantErr, nil)
		})
	}
	t.Run("keys create --e2b", func(t *testing.T) {
		out := moat(t, invocation{args: []string{"keys", "create", "--name", "e2b", "--e2b"}, env: []string{"MOAT_HOME=" + home}})
		out.check(t, 0, []string{"e2b_"}, []string{"E2B_API_KEY"}, nil)
		tok := strings.TrimSpace(out.stdout)
		if !regexp.MustCompile(`^e2b_[0-9a-f]{76}$`).MatchString(tok) {
			t.Fatalf("printed %q, not e2b_ and 76 hex digits", tok)
		}
		st, err := audit.Open(filepath.Join(home, "audit.db"))
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		moatTok, ok := audit.FromE2BToken(tok)
		if !ok {
			t.Fatalf("%q is not a Moat key's E2B spelling", tok)
		}
		if k, err := st.Authenticate(moatTok); err != nil || k.Name != "e2b" {
			t.Errorf("the key behind %q: %+v, %v", tok, k, err)
		}
	})
}
