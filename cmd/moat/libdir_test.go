package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPrefixLayout: moat finds moat-guest in <prefix>/lib/moat beside its
// own <prefix>/bin without $MOAT_GUEST, the layout of the .deb
// (/usr/bin, /usr/lib/moat) and of the release archive (internal/libdir),
// and runs a program with it.
func TestPrefixLayout(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: moat-guest must be root-owned, and a run needs the native tier")
	}
	prefix := t.TempDir()
	for _, d := range []string{filepath.Dir(prefix), prefix} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	moat, guest := filepath.Join(prefix, "bin", "moat"), filepath.Join(prefix, "lib", "moat", "moat-guest")
	for _, d := range []string{filepath.Dir(moat), filepath.Dir(guest)} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command("../../scripts/build-pair", moat, guest).CombinedOutput(); err != nil {
		t.Fatalf("scripts/build-pair: %v\n%s", err, out)
	}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "MOAT_GUEST=") {
			env = append(env, kv)
		}
	}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{name: "doctor", args: []string{"doctor"}, want: "inside sandboxes: " + guest + " (built from the same source"},
		{name: "run", args: []string{"run", "--no-build", "--", "python3", "-c", "print(6*7)"}, want: "42\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(moat, tc.args...)
			cmd.Env = env
			out, _ := cmd.CombinedOutput()
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("moat %s: want %q in:\n%s", strings.Join(tc.args, " "), tc.want, out)
			}
		})
	}
}
