package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunServerInputs: a run on a server sends its inputs as files, read
// on this host (workspace.InputFiles) before any request. What cannot be
// sent as it is here is a warning, what cannot be sent at all an exit 2,
// both before the server is asked; the server here listens nowhere.
func TestRunServerInputs(t *testing.T) {
	tests := []struct {
		name  string
		build func(t *testing.T, dir string)
		root  bool // a file of mode 0000 is readable here only by root
		code  int
		// wantErr are whole lines of moat's stderr, in this order.
		wantErr []string
	}{
		{
			name: "empty directory and mode 0000 warned, link to a directory refused",
			root: true,
			build: func(t *testing.T, dir string) {
				mkInputDir(t, filepath.Join(dir, "d"))
				mkInputFile(t, filepath.Join(dir, "d", "f"), 0o644)
				mkInputDir(t, filepath.Join(dir, "empty"))
				mkInputFile(t, filepath.Join(dir, "locked"), 0)
				mkInputLink(t, "d", filepath.Join(dir, "todir"))
			},
			code: exitUsage,
			wantErr: []string{
				"moat: warning: empty directory in/empty is not sent: the HTTP API carries files only",
				"moat: warning: in/locked has mode 0000 here and is sent with the server's default mode 0644",
				`moat: copy inputs: symlink in/todir -> "d" leads to a directory: a run on a server receives regular files only; replace the link with the file`,
			},
		},
		{
			name: "a name with a terminal escape is shown inert",
			build: func(t *testing.T, dir string) {
				mkInputDir(t, filepath.Join(dir, "e\x1b]0;pwned\x07"))
				mkInputLink(t, "nowhere", filepath.Join(dir, "z"))
			},
			code: exitUsage,
			wantErr: []string{
				`moat: warning: empty directory "in/e\x1b]0;pwned\a" is not sent: the HTTP API carries files only`,
				`moat: copy inputs: symlink in/z -> "nowhere" leads to nothing: a run on a server receives regular files only; replace the link with the file`,
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.root && os.Geteuid() != 0 {
				t.Skip("needs root: a file of mode 0000 is readable only by root")
			}
			dir := filepath.Join(t.TempDir(), "in")
			mkInputDir(t, dir)
			tc.build(t, dir)
			out := moat(t, invocation{
				args: []string{"run", "--server", "http://127.0.0.1:1", "--input", dir, "--", "true"},
				env:  []string{"MOAT_API_KEY=moat_k000000000000_x"},
			})
			out.check(t, tc.code, nil, nil, nil)
			if got, want := strings.TrimSuffix(out.stderr, "\n"), strings.Join(tc.wantErr, "\n"); got != want {
				t.Errorf("stderr:\n%s\nwant:\n%s", got, want)
			}
			if out.stdout != "" {
				t.Errorf("a refused run printed on stdout: %q", out.stdout)
			}
		})
	}
}

func mkInputDir(t *testing.T, p string) {
	t.Helper()
	if err := os.Mkdir(p, 0o755); err != nil {
		t.Fatal(err)
	}
}

func mkInputFile(t *testing.T, p string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func mkInputLink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}
