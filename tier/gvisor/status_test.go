package gvisor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Lines as runsc 20250205 writes them (runsc/cli/main.go, sandbox.go).
const (
	logHead   = "I1202 19:17:29.094912   26908 main.go:195] **************** gVisor ****************\nI1202 19:17:29.235738   26908 network.go:56] Setting up network\n"
	logExit   = "I1202 19:17:29.294232   26908 main.go:221] Exiting with status: %s\n"
	logWaitRP = "W1202 19:17:29.291355   26908 sandbox.go:1299] Wait RPC to container \"abc\" failed: urpc method \"containerManager.Wait\" failed: EOF. Will try waiting on the sandbox process instead.\n"
)

func TestReadRunLog(t *testing.T) {
	tests := []struct {
		name string
		log  string
		want runLog
	}{
		{"exit 3", logHead + strings.Replace(logExit, "%s", "768", 1), runLog{status: 768, exited: true}},
		{"killed by SIGTERM", logHead + strings.Replace(logExit, "%s", "15", 1), runLog{status: 15, exited: true}},
		{"the Sentry died", logHead + logWaitRP + strings.Replace(logExit, "%s", "9", 1), runLog{status: 9, exited: true, sandboxDied: true}},
		{"runsc failed", logHead, runLog{}},
		{"absurd status is ignored", logHead + strings.Replace(logExit, "%s", "99999999", 1), runLog{}},
		{"no log", "", runLog{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "run.log")
			if tc.log != "" {
				os.WriteFile(p, []byte(tc.log), 0o600)
			}
			if got := readRunLog(p); got != tc.want {
				t.Errorf("readRunLog = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestRunscError(t *testing.T) {
	p := filepath.Join(t.TempDir(), "errors.json")
	os.WriteFile(p, []byte(`{"msg":"first","level":"error"}`+"\n"+`not json`+"\n"+`{"msg":"last\u001b[2Jone","level":"error"}`+"\n"), 0o600)
	if got := runscError(p); got != "last [2Jone" {
		t.Errorf("runscError = %q", got)
	}
}

func TestVersionDates(t *testing.T) {
	tests := []struct {
		version, date string
	}{
		{"v0.0.0-20250205023644-9414b50a5633", "20250205"},
		{"v0.0.0-20221219000000-abcdefabcdef", "20221219"},
		{"v1.2.3", ""},
	}
	for _, tc := range tests {
		got := ""
		if m := pseudoDate().FindStringSubmatch(tc.version); m != nil {
			got = m[1]
		}
		if got != tc.date {
			t.Errorf("date of %s = %q, want %q", tc.version, got, tc.date)
		}
	}
	if m := releaseDate().FindStringSubmatch("runsc version release-20221219.0"); m == nil || m[1] != "20221219" {
		t.Errorf("release date not found: %v", m)
	}
}
