package main

import (
	"bufio"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestSystemdUnit checks packaging/moat.service against what moat serve
// does: a unit edited without the server (or a --drain default changed
// without the unit) fails here, not on a user's machine.
// scripts/test-package boots it for real.
func TestSystemdUnit(t *testing.T) {
	f, err := os.Open("../../packaging/moat.service")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unit := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			unit[k] = v
		}
	}
	tests := []struct {
		key, want, why string
	}{
		{"Type", "notify", "moat serve sends READY=1 after listen (internal/sdnotify)"},
		{"NotifyAccess", "main", "only moat serve itself may report readiness, not a sandbox"},
		{"Delegate", "yes", "runs live in the unit's cgroup subtree (cgroup.v2Base)"},
		{"KillMode", "mixed", "SIGTERM to moat serve alone, so that it drains"},
		{"StateDirectory", "moat", "/var/lib/moat, the CLI's home as root"},
		{"Environment", "MOAT_HOME=/var/lib/moat", "the service and the CLI share keys and the audit log"},
		{"ExecStart", "/usr/bin/moat serve $SERVE_ARGS", "the .deb installs moat there (packaging/nfpm-moat.yaml)"},
		{"Restart", "on-failure", "a crashed server comes back and cleans up after itself"},
	}
	for _, tc := range tests {
		t.Run(tc.key, func(t *testing.T) {
			if got := unit[tc.key]; got != tc.want {
				t.Errorf("%s=%q, want %q: %s", tc.key, got, tc.want, tc.why)
			}
		})
	}
	for _, banned := range []string{"NoNewPrivileges", "ProtectSystem", "PrivateDevices", "RestrictNamespaces", "SystemCallFilter", "RestrictSUIDSGID"} {
		if _, ok := unit[banned]; ok {
			t.Errorf("%s is set: it confines or breaks the sandboxes below moat serve (docs/PACKAGING.md)", banned)
		}
	}

	t.Run("TimeoutStopSec longer than the drain", func(t *testing.T) {
		stop, err := time.ParseDuration(unit["TimeoutStopSec"])
		if err != nil {
			t.Fatalf("TimeoutStopSec=%q: %v", unit["TimeoutStopSec"], err)
		}
		out := moat(t, invocation{args: []string{"serve", "-h"}})
		m := regexp.MustCompile(`(?s)-drain duration\n[^\n]*\(default ([0-9a-z.]+)\)`).FindStringSubmatch(out.stdout + out.stderr)
		if m == nil {
			t.Fatalf("no --drain default in moat serve -h:\n%s", out)
		}
		drain, err := time.ParseDuration(m[1])
		if err != nil {
			t.Fatal(err)
		}
		// The drain, then the listener's 5 s and the sandboxes' teardown.
		if stop < drain+30*time.Second {
			t.Errorf("TimeoutStopSec=%s, --drain default %s: systemd would SIGKILL moat serve during its drain; want at least %s", stop, drain, drain+30*time.Second)
		}
	})
}
