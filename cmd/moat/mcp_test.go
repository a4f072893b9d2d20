package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/moat-sandbox/moat/engine"
)

// mcpBearer adds an API key to every request of the MCP client.
type mcpBearer struct{ token string }

func (b mcpBearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// mcpCall calls a tool with the Go SDK's client and decodes its
// structured content into out; a refusal fails the test with its text.
func mcpCall(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if res.IsError {
		t.Fatalf("%s: tool error %v", name, mcpText(res))
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: structured content %s: %v", name, b, err)
		}
	}
	return res
}

func mcpText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

// mcpWork is multi-step work an agent does through the tools, in real
// sandboxes: a one-shot run, then a sandbox kept across calls (a CSV
// written, a program computing from it, the result read back and
// downloaded). It returns the sandbox's id, still alive.
func mcpWork(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	var run struct {
		Result struct {
			ExitCode    int    `json:"exit_code"`
			Termination string `json:"termination"`
			Stdout      struct{ Data string }
		}
	}
	mcpCall(t, cs, "run_code", map[string]any{"language": "python", "code": "print(6*7)"}, &run)
	if run.Result.ExitCode != 0 || run.Result.Stdout.Data != "42\n" {
		t.Fatalf("run_code: %+v", run)
	}
	// The code interpreter's image has pandas and matplotlib: the work
	// then plots too (scripts/test builds it; under CI it must be there).
	plot := chartImage(t)
	var sb struct{ ID string }
	create := map[string]any{"ttl": "5m"}
	if plot {
		create["manifest"] = map[string]any{"image": chartImageName}
	}
	mcpCall(t, cs, "create_sandbox", create, &sb)
	mcpCall(t, cs, "write_file", map[string]any{"sandbox_id": sb.ID, "path": "data.csv", "content": "x\n1\n2\n39\n"}, nil)
	var ex struct {
		State  string
		Result struct {
			ExitCode int `json:"exit_code"`
			Stderr   struct{ Data string }
		}
	}
	code := "import csv\nrows = list(csv.DictReader(open('data.csv')))\nopen('sum.txt', 'w').write(str(sum(int(r['x']) for r in rows)))"
	if plot {
		code = "import pandas as pd\nimport matplotlib.pyplot as plt\ndf = pd.read_csv('data.csv')\n" +
			"open('sum.txt', 'w').write(str(df['x'].sum()))\ndf.plot(y='x')\nplt.savefig('chart.png')"
	}
	mcpCall(t, cs, "exec", map[string]any{"sandbox_id": sb.ID, "language": "python", "code": code}, &ex)
	if ex.Result.ExitCode != 0 {
		t.Fatalf("exec: %+v", ex)
	}
	if plot {
		// The chart comes back as an embedded resource, a real PNG.
		res := mcpCall(t, cs, "download", map[string]any{"sandbox_id": sb.ID, "path": "chart.png"}, nil)
		er, ok := res.Content[len(res.Content)-1].(*mcp.EmbeddedResource)
		if !ok || er.Resource.MIMEType != "image/png" || !bytes.HasPrefix(er.Resource.Blob, []byte("\x89PNG\r\n\x1a\n")) || len(er.Resource.Blob) < 1000 {
			t.Fatalf("download chart.png: %#v", res.Content)
		}
	}
	// The same in the sandbox's Python kernel, state kept across cells.
	var cell struct {
		Status string
		Result map[string]string
	}
	mcpCall(t, cs, "run_cell", map[string]any{"sandbox_id": sb.ID, "code": "import csv\nrows = list(csv.DictReader(open('data.csv')))"}, &cell)
	mcpCall(t, cs, "run_cell", map[string]any{"sandbox_id": sb.ID, "code": "sum(int(r['x']) for r in rows)"}, &cell)
	if cell.Status != "ok" || cell.Result["text/plain"] != "42" {
		t.Fatalf("run_cell: %+v", cell)
	}
	// A snapshot of its files, then gone again.
	var sn struct{ ID string }
	mcpCall(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": sb.ID}, &sn)
	mcpCall(t, cs, "delete_snapshot", map[string]any{"snapshot": sn.ID}, nil)
	var fc struct{ Content string }
	mcpCall(t, cs, "read_file", map[string]any{"sandbox_id": sb.ID, "path": "sum.txt"}, &fc)
	if fc.Content != "42" {
		t.Fatalf("read_file sum.txt: %q", fc.Content)
	}
	res := mcpCall(t, cs, "download", map[string]any{"sandbox_id": sb.ID, "path": "sum.txt"}, nil)
	if len(res.Content) != 2 {
		t.Fatalf("download: %d contents", len(res.Content))
	}
	if er, ok := res.Content[1].(*mcp.EmbeddedResource); !ok || er.Resource.Text != "42" {
		t.Fatalf("download: %#v", res.Content[1])
	}
	return sb.ID
}

// chartImageName is the image with pandas and matplotlib (scripts/test
// builds it).
const chartImageName = "code-interpreter"

// chartImage reports whether the shared image store has chartImageName;
// under CI, where scripts/test builds it, its absence is a failure.
func chartImage(t *testing.T) bool {
	t.Helper()
	if _, err := os.Stat(filepath.Join(engine.DefaultHome(), "images", chartImageName)); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("the %s image is not built (scripts/test builds it): %v", chartImageName, err)
		}
		t.Logf("no %s image (%v): the work does not plot", chartImageName, err)
		return false
	}
	return true
}

// TestMCP runs an agent's work through the built moat, with the Go SDK's
// client, over stdio (moat mcp, started as a desktop client starts it)
// and over Streamable HTTP (moat serve --mcp).
func TestMCP(t *testing.T) {
	needSandbox(t)
	home := serverHome(t)
	key := createKey(t, home)

	t.Run("stdio", func(t *testing.T) {
		cmd := exec.Command(moatBin, "mcp")
		cmd.Env = append(os.Environ(), "MOAT_HOME="+home, "MOAT_API_KEY="+key)
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		client := mcp.NewClient(&mcp.Implementation{Name: "moat-test", Version: "1"}, nil)
		cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatalf("connect to moat mcp: %v\n%s", err, stderr.String())
		}
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil || len(tools.Tools) < 8 {
			t.Fatalf("list tools: %v %v", tools, err)
		}
		id := mcpWork(t, cs)
		t.Logf("sandbox %s", id)
		// Closing the session (stdin) ends moat mcp, which destroys the
		// sandbox it created (the session's end does, not the service's
		// shutdown after it) and exits 0; nothing of it is left.
		if err := cs.Close(); err != nil {
			t.Errorf("moat mcp did not exit cleanly when its session ended: %v\n%s", err, stderr.String())
		}
		if !regexp.MustCompile(`msg="sandbox destroyed" sandbox=` + id + ` reason="deleted by its key"`).MatchString(stderr.String()) {
			t.Errorf("the session's end did not delete sandbox %s:\n%s", id, stderr.String())
		}
		for _, tr := range hostTraces() {
			if tr == id {
				t.Errorf("sandbox %s of the ended session is still on the host\n%s", id, stderr.String())
			}
		}
		// Its record, and its commands', ended in the audit log.
		out := moat(t, invocation{args: []string{"audit", "--sandbox", id, "--json"}, env: []string{"MOAT_HOME=" + home}})
		if out.code != 0 || !strings.Contains(out.stdout, id) || strings.Contains(out.stdout, `"status":"running"`) {
			t.Errorf("the session's sandbox in the audit log: %s", out)
		}
	})

	t.Run("no key", func(t *testing.T) {
		out := moat(t, invocation{args: []string{"mcp"}, env: []string{"MOAT_HOME=" + home, "MOAT_API_KEY="}})
		out.check(t, exitUsage, nil, []string{"MOAT_API_KEY"}, nil)
		out = moat(t, invocation{args: []string{"mcp"}, env: []string{"MOAT_HOME=" + home, "MOAT_API_KEY=moat_k000000000000_nope"}})
		out.check(t, exitMoat, nil, []string{"not a valid key"}, nil)
	})

	t.Run("streamable http", func(t *testing.T) {
		s := startServer(t, home, key, "--mcp", "--pool", "0", "--session-pool", "0")
		rq, _ := http.NewRequest("POST", s.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		rq.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("/mcp without a key: %d, want 401", resp.StatusCode)
		}
		client := mcp.NewClient(&mcp.Implementation{Name: "moat-test", Version: "1"}, nil)
		cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: s.url + "/mcp", HTTPClient: &http.Client{Transport: mcpBearer{key}}}, nil)
		if err != nil {
			t.Fatalf("connect to /mcp: %v", err)
		}
		defer cs.Close()
		id := mcpWork(t, cs)
		// The sandbox is the key's, through Moat's own API too.
		if _, err := s.client(t).GetSandbox(context.Background(), id); err != nil {
			t.Errorf("the MCP sandbox through /v1: %v", err)
		}
		mcpCall(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}, nil)
		s.terminate(t, 30*time.Second)
	})
}

// mcpSDK is where scripts/setup installed the pinned MCP TypeScript SDK
// of testdata/mcp/package-lock.json (its node_modules).
func mcpSDK(t *testing.T) string {
	t.Helper()
	return pinnedNodeModules(t, "testdata/mcp", "mcp-sdk")
}

// The checks client.cjs runs; each must print "ok <name>".
var mcpChecks = []string{"list-tools", "run-code", "keep-sandbox", "read-file", "download", "bad-arguments", "other-key", "quota", "kill"}

// TestMCPTypeScriptSDK drives moat mcp (stdio) and moat serve --mcp
// (Streamable HTTP) with the real MCP TypeScript SDK
// (testdata/mcp/client.cjs) in real native sandboxes.
func TestMCPTypeScriptSDK(t *testing.T) {
	needSandbox(t)
	// CI runs scripts/setup, which installs both: there a missing one is
	// a failure, not a skip.
	missing := t.Skipf
	if os.Getenv("CI") == "true" {
		missing = t.Fatalf
	}
	node, err := exec.LookPath("node")
	if err != nil {
		missing("needs node (scripts/setup installs nodejs): %v", err)
	}
	sdk := mcpSDK(t)
	if _, err := os.Stat(filepath.Join(sdk, "@modelcontextprotocol", "sdk", "package.json")); err != nil {
		missing("the MCP TypeScript SDK is not installed at %s (scripts/setup installs it): %v", sdk, err)
	}
	home := serverHome(t)
	key, other := createKey(t, home), createKey(t, home)
	small := createKey(t, home, "--max-sandboxes", "1")
	for _, tr := range []string{"stdio", "http"} {
		t.Run(tr, func(t *testing.T) {
			env := append(os.Environ(), "NODE_PATH="+sdk, "MCP_TRANSPORT="+tr, "MOAT_HOME="+home, "MOAT_BIN="+moatBin,
				"MOAT_API_KEY="+key, "MCP_OTHER_KEY="+other, "MCP_SMALL_KEY="+small)
			var s *testServer
			if tr == "http" {
				s = startServer(t, home, key, "--mcp", "--pool", "0", "--session-pool", "0")
				env = append(env, "MCP_URL="+s.url+"/mcp")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "testdata/mcp/client.cjs")
			cmd.Env = env
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
			out, err := cmd.CombinedOutput()
			t.Logf("client.cjs:\n%s", out)
			if !bytes.Contains(out, []byte("mcp sdk 1.32.2 over "+tr)) {
				t.Errorf("client.cjs did not run the pinned SDK 1.32.2")
			}
			for _, name := range mcpChecks {
				if !regexp.MustCompile(`(?m)^ok ` + regexp.QuoteMeta(name) + `$`).Match(out) {
					t.Errorf("check %s did not pass", name)
				}
			}
			if err != nil || !bytes.Contains(out, []byte("\nPASS\n")) {
				t.Fatalf("client.cjs failed: %v", err)
			}
			if s != nil {
				s.terminate(t, 30*time.Second)
			}
		})
	}
}

func TestMCPFlags(t *testing.T) {
	home := t.TempDir()
	tests := []struct {
		name             string
		args             []string
		env              []string
		code             int
		wantOut, wantErr []string
	}{
		{name: "help", args: []string{"mcp", "--help"}, wantOut: []string{"Usage: moat mcp", "MOAT_API_KEY", "-key", "-db", "-policy", "destroyed when it ends"}},
		{name: "serve names --mcp", args: []string{"serve", "--help"}, wantOut: []string{"-mcp", "/mcp"}},
		{name: "no arguments", args: []string{"mcp", "extra"}, code: exitUsage, wantErr: []string{"mcp takes no arguments"}},
		{name: "no key", args: []string{"mcp"}, env: []string{"MOAT_API_KEY="}, code: exitUsage, wantErr: []string{"MOAT_API_KEY", "moat keys create"}},
		{name: "no database", args: []string{"mcp", "--db", home + "/none.db"}, env: []string{"MOAT_API_KEY=moat_k000000000000_x"}, code: exitMoat, wantErr: []string{"no audit database", "none.db"}},
		{name: "bad ttl", args: []string{"mcp", "--max-ttl", "-1s"}, env: []string{"MOAT_API_KEY=x"}, code: exitUsage, wantErr: []string{"--max-ttl"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			moat(t, invocation{args: tc.args, env: append([]string{"MOAT_HOME=" + home}, tc.env...)}).check(t, tc.code, tc.wantOut, tc.wantErr, nil)
		})
	}
}
