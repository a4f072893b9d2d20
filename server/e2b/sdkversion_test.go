package e2b

import (
	"net/http"
	"strings"
	"testing"
)

func TestJSSDKBefore(t *testing.T) {
	tests := []struct {
		name, lang, version string
		want                bool
	}{
		{"2.50.0", "js", "2.50.0", true},
		{"2.45.0", "js", "2.45.0", true},
		{"1.9.0", "js", "1.9.0", true},
		{"2.51.0", "js", "2.51.0", false},
		{"2.51.3", "js", "2.51.3", false},
		{"3.0.0", "js", "3.0.0", false},
		{"python 2.45", "python", "2.45.0", false},
		{"no lang", "", "2.45.0", false},
		{"no version", "js", "", false},
		{"garbage version", "js", "x.y", false},
		{"major only", "js", "2", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest("POST", "/", nil)
			if tc.lang != "" {
				r.Header.Set("lang", tc.lang)
			}
			if tc.version != "" {
				r.Header.Set("package_version", tc.version)
			}
			if got := pauseMemoryByDefault(r); got != tc.want {
				t.Errorf("pauseMemoryByDefault(lang %q, package_version %q) = %v, want %v", tc.lang, tc.version, got, tc.want)
			}
		})
	}
}

// TestPauseMemoryDefault: memory: true on pause is refused when the
// caller chose it, and a filesystem-only pause with a notice when an SDK
// release before 2.51 sent it by default.
func TestPauseMemoryDefault(t *testing.T) {
	e := newEnv(t)
	tests := []struct {
		name    string
		headers map[string]string
		status  int
	}{
		{"2.51 explicit keepMemory", map[string]string{"lang": "js", "package_version": "2.51.0"}, 400},
		{"no SDK headers", nil, 400},
		{"python", map[string]string{"lang": "python", "package_version": "2.45.0"}, 400},
		{"2.50 default", map[string]string{"lang": "js", "package_version": "2.50.0"}, 204},
		{"2.45 default", map[string]string{"lang": "js", "package_version": "2.45.0"}, 204},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := e.create(keyA, `{"templateID":"base","timeout":60}`)
			defer e.control("DELETE", "/sandboxes/"+c.SandboxID, keyA, "")
			hdr := map[string]string{"X-API-Key": keyA, "Content-Type": "application/json"}
			for k, v := range tc.headers {
				hdr[k] = v
			}
			resp, body := e.do("POST", "/sandboxes/"+c.SandboxID+"/pause", hdr, strings.NewReader(`{"memory":true}`))
			if tc.status != http.StatusNoContent {
				wantE2BError(t, tc.name, resp.StatusCode, body, tc.status)
				if !e.alive("ka", c.SandboxID) {
					t.Error("a refused pause paused the sandbox")
				}
				return
			}
			if resp.StatusCode != tc.status || !strings.Contains(resp.Header.Get(NoticeHeader), "filesystem-only") {
				t.Fatalf("%d %s, notice %q", resp.StatusCode, body, resp.Header.Get(NoticeHeader))
			}
			if e.alive("ka", c.SandboxID) {
				t.Error("the sandbox is still running")
			}
		})
	}
}
