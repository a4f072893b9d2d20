package e2b

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/manifest"
)

// The E2B spelling of keyReal (audit.E2BToken).
const keyRealE2B = "e2b_0123456789ab00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"

func TestParseInternet(t *testing.T) {
	tests := []struct {
		spec    string
		want    Internet
		wantErr string
	}{
		{"", Internet{}, ""},
		{"none", Internet{}, ""},
		{"refuse", Internet{Refuse: true}, ""},
		{"pypi.org", Internet{Allow: []string{"pypi.org"}}, ""},
		{"pypi.org, *.npmjs.org,192.0.2.0/24", Internet{Allow: []string{"pypi.org", "*.npmjs.org", "192.0.2.0/24"}}, ""},
		{"pypi.org,,x.org", Internet{}, "empty entry"},
		{"*", Internet{}, "open internet"},
		{"0.0.0.0/0", Internet{}, "open internet"},
		{"not a host!", Internet{}, "not a host!"},
	}
	for _, tc := range tests {
		t.Run(tc.spec, func(t *testing.T) {
			got, err := ParseInternet(tc.spec)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), "--e2b-internet") {
					t.Fatalf("ParseInternet(%q) = %+v, %v; want an error naming --e2b-internet and %q", tc.spec, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got.Refuse != tc.want.Refuse || !slices.Equal(got.Allow, tc.want.Allow) {
				t.Fatalf("ParseInternet(%q) = %+v, %v; want %+v", tc.spec, got, err, tc.want)
			}
			if again, err := ParseInternet(got.String()); err != nil || again.String() != got.String() {
				t.Errorf("String %q does not parse back: %+v, %v", got.String(), again, err)
			}
		})
	}
}

// TestInternet: what an E2B sandbox that asks for internet access gets,
// under each operator setting. e2b JS before 2.51 and the Python SDK send
// allow_internet_access true on every create; 2.51 leaves it unset.
func TestInternet(t *testing.T) {
	none, refuse := Internet{}, Internet{Refuse: true}
	list := Internet{Allow: []string{"pypi.org", "192.0.2.0/24"}}
	tests := []struct {
		name     string
		internet Internet
		body     string
		status   int
		hosts    []string // the manifest's network.allow; nil with addrs nil: no network
		addrs    []string
		notice   string // a substring of X-Moat-Notice; "" none
	}{
		{"none: true gets loopback", none, `{"allow_internet_access":true}`, 201, nil, nil, "no network beyond loopback"},
		{"none: unset gets loopback", none, `{}`, 201, nil, nil, "no network beyond loopback"},
		{"none: false, no notice", none, `{"allow_internet_access":false}`, 201, nil, nil, ""},
		{"none: true and allowOut", none, `{"allow_internet_access":true,"network":{"allowOut":["example.com"]}}`, 201, []string{"example.com"}, nil, "plus its network.allowOut example.com"},
		{"none: deny all but allowOut, no notice", none, `{"network":{"allowOut":["example.com"],"denyOut":["0.0.0.0/0"]}}`, 201, []string{"example.com"}, nil, ""},
		{"refuse: true refused", refuse, `{"allow_internet_access":true}`, 400, nil, nil, ""},
		{"refuse: true with allowOut refused", refuse, `{"allow_internet_access":true,"network":{"allowOut":["example.com"]}}`, 400, nil, nil, ""},
		{"refuse: unset gets loopback", refuse, `{}`, 201, nil, nil, "no network"},
		{"refuse: false", refuse, `{"allow_internet_access":false}`, 201, nil, nil, ""},
		{"allowlist: true gets it", list, `{"allow_internet_access":true}`, 201, []string{"pypi.org"}, []string{"192.0.2.0/24"}, "pypi.org,192.0.2.0/24"},
		{"allowlist: unset gets it", list, `{}`, 201, []string{"pypi.org"}, []string{"192.0.2.0/24"}, "operator's internet allowlist"},
		{"allowlist: false gets nothing", list, `{"allow_internet_access":false}`, 201, nil, nil, ""},
		{"allowlist: plus allowOut", list, `{"allow_internet_access":true,"network":{"allowOut":["example.com","pypi.org"]}}`, 201, []string{"example.com", "pypi.org"}, []string{"192.0.2.0/24"}, "example.com"},
		{"allowlist: deny all but allowOut", list, `{"allow_internet_access":true,"network":{"allowOut":["example.com"],"denyOut":["0.0.0.0/0"]}}`, 201, []string{"example.com"}, nil, ""},
		{"allowlist: false and allowOut contradict", list, `{"allow_internet_access":false,"network":{"allowOut":["example.com"]}}`, 400, nil, nil, ""},
		{"not a bool", none, `{"allow_internet_access":"yes"}`, 400, nil, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvConfig(t, []string{"python"}, nil, nil, func(c *Config) { c.Internet = tc.internet })
			resp, body := e.do("POST", "/v2/sandboxes", map[string]string{"X-API-Key": keyA, "Content-Type": "application/json"}, strings.NewReader(tc.body))
			if resp.StatusCode != tc.status {
				t.Fatalf("create %s: %d %s, want %d", tc.body, resp.StatusCode, body, tc.status)
			}
			notice := resp.Header.Get(NoticeHeader)
			if tc.status != 201 {
				wantE2BError(t, tc.name, resp.StatusCode, body, tc.status)
				if e.live() != 0 {
					t.Error("a refused create left a sandbox")
				}
				return
			}
			if tc.notice == "" && notice != "" || !strings.Contains(notice, tc.notice) {
				t.Errorf("%s: %q, want one containing %q", NoticeHeader, notice, tc.notice)
			}
			n := e.b.Sessions()[0].Manifest().Network
			if tc.hosts == nil && tc.addrs == nil {
				if n.Mode == "allowlist" || len(n.Allow)+len(n.AllowAddresses) > 0 {
					t.Errorf("network %+v, want none", n)
				}
				return
			}
			slices.Sort(n.Allow)
			if n.Mode != "allowlist" || !slices.Equal(n.Allow, tc.hosts) || !slices.Equal(n.AllowAddresses, tc.addrs) {
				t.Errorf("network %+v, want allow %v addresses %v", n, tc.hosts, tc.addrs)
			}
		})
	}
}

// TestPythonSDKCreate replays the create request of the E2B Python SDK
// 2.x (e2b on PyPI; not installable here, so this is its body as its
// source builds it, e2b/sandbox_sync/sandbox_api.py _create_sandbox with
// the generated NewSandbox model: every defaulted field sent, UNSET ones
// omitted), then its list and connect, against a default server.
func TestPythonSDKCreate(t *testing.T) {
	e := newEnv(t)
	const body = `{"templateID":"base","autoPause":false,"metadata":{},"timeout":300,"envVars":{},"secure":true,"allow_internet_access":true}`
	resp, data := e.do("POST", "/sandboxes", map[string]string{"X-API-Key": keyA, "Content-Type": "application/json", "User-Agent": "e2b-python-sdk/2.45.0"}, strings.NewReader(body))
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("the Python SDK's create: %d %s", resp.StatusCode, data)
	}
	if !strings.Contains(resp.Header.Get(NoticeHeader), "no network beyond loopback") {
		t.Errorf("%s: %q", NoticeHeader, resp.Header.Get(NoticeHeader))
	}
	var c created
	json.Unmarshal(data, &c)
	if c.SandboxID == "" || c.EnvdVersion == "" || c.EnvdAccessToken == "" {
		t.Fatalf("created %s", data)
	}
	if n := e.b.Sessions()[0].Manifest().Network; n.Mode == "allowlist" {
		t.Errorf("network %+v, want none", n)
	}
	// Its list sends state twice and the metadata filter; its connect a
	// timeout and a memory flag.
	status, data := e.control("GET", "/v2/sandboxes?state=running&state=paused&limit=100", keyA, "")
	if status != 200 || !strings.Contains(string(data), c.SandboxID) {
		t.Errorf("list: %d %s", status, data)
	}
	status, data = e.control("POST", "/sandboxes/"+c.SandboxID+"/connect", keyA, `{"timeout":300,"memory":true}`)
	if status != 200 {
		t.Errorf("connect: %d %s", status, data)
	}
}

func TestE2BKeySpelling(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyRealE2B, `{"templateID":"base"}`)
	tests := []struct {
		name, key string
		status    int
	}{
		{"E2B spelling", keyRealE2B, 200},
		{"Moat spelling, same key", keyReal, 200},
		{"E2B cloud key", "e2b_" + strings.Repeat("0", 40), 401},
		{"E2B spelling, one digit changed", keyRealE2B[:len(keyRealE2B)-1] + "0", 401},
		{"E2B spelling, upper case", "e2b_" + strings.ToUpper(keyRealE2B[4:]), 401},
		{"another key's sandbox", keyA, 404},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.control("GET", "/sandboxes/"+c.SandboxID, tc.key, "")
			if status != tc.status {
				t.Fatalf("%d %s, want %d", status, body, tc.status)
			}
			if status != 200 {
				wantE2BError(t, tc.name, status, body, tc.status)
			}
		})
	}
}

// TestNotServed: routes of E2B's API Moat does not serve answer 501 with
// the reason, never 404 (which the SDKs turn into "sandbox not found").
func TestNotServed(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	tests := []struct {
		name, method, path, want string
	}{
		{"a sandbox's snapshots by GET", "GET", "/sandboxes/" + c.SandboxID + "/snapshots", "not part of the E2B API"},
		{"a sandbox's logs", "GET", "/sandboxes/" + c.SandboxID + "/logs", "not as sandbox logs"},
		{"templates", "GET", "/templates", "moat image build"},
		{"unknown", "GET", "/nothing/here", "not part of the E2B API"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.control(tc.method, tc.path, keyA, "{}")
			wantE2BError(t, tc.name, status, body, http.StatusNotImplemented)
			if !strings.Contains(string(body), tc.want) {
				t.Errorf("%s: %s, want the reason %q", tc.name, body, tc.want)
			}
		})
	}
	t.Run("envd", func(t *testing.T) {
		resp, body := e.do("GET", "/nothing", envdHeaders(c), nil)
		if resp.StatusCode != http.StatusNotImplemented || !strings.Contains(string(body), "does not implement") {
			t.Errorf("envd /nothing: %d %s, want 501", resp.StatusCode, body)
		}
	})
}

func TestRemoveMissing(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	tests := []struct {
		name, path string
		status     int
	}{
		{"never existed", "nope.txt", 200},
		{"missing directory's child", "no/such/dir/x", 200},
		{"outside the workspace", "/etc/passwd", 403},
		{"the workspace", "/home/user", 403},
		{"empty", "", 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, out := e.unary(c, "filesystem.Filesystem/Remove", map[string]any{"path": tc.path})
			if status != tc.status {
				t.Errorf("Remove %q: %d %v, want %d", tc.path, status, out, tc.status)
			}
		})
	}
	// A sandbox that is gone is not a missing file.
	e.control("DELETE", "/sandboxes/"+c.SandboxID, keyA, "")
	if status, out := e.unary(c, "filesystem.Filesystem/Remove", map[string]any{"path": "nope.txt"}); status == 200 {
		t.Errorf("Remove in a killed sandbox: %d %v", status, out)
	}
}

func TestListing(t *testing.T) {
	e := newEnvWith(t, []string{"node", "python"}, nil)
	var ids []string // oldest first
	for i, tpl := range []string{"base", "node", "base", "node", "base"} {
		c := e.create(keyA, `{"templateID":"`+tpl+`","metadata":{"i":"`+string(rune('0'+i))+`"}}`)
		ids = append(ids, c.SandboxID)
		time.Sleep(2 * time.Millisecond) // distinct start times
	}
	e.create(keyB, `{"templateID":"base"}`)
	var mid time.Time
	{
		_, body := e.control("GET", "/sandboxes/"+ids[2], keyA, "")
		var l listed
		json.Unmarshal(body, &l)
		mid = l.StartedAt
	}
	rev := slices.Clone(ids)
	slices.Reverse(rev)
	tests := []struct {
		name, query string
		want        []string
		status      int
	}{
		{"newest first", "", rev, 200},
		{"desc", "?order=desc", rev, 200},
		{"asc", "?order=asc", ids, 200},
		{"template", "?template=node", []string{ids[3], ids[1]}, 200},
		{"template base", "?template=base&order=asc", []string{ids[0], ids[2], ids[4]}, 200},
		{"no such template", "?template=gpu", nil, 200},
		{"startedAfter", "?startedAfter=" + url.QueryEscape(mid.Format(time.RFC3339Nano)), []string{ids[4], ids[3], ids[2]}, 200},
		{"startedAfter in the future", "?startedAfter=" + url.QueryEscape(time.Now().Add(time.Hour).Format(time.RFC3339)), nil, 200},
		{"state twice, as the SDKs send it", "?state=running&state=paused", rev, 200},
		{"paused only", "?state=paused", nil, 200},
		{"filters combined", "?template=base&metadata=i%3D2", []string{ids[2]}, 200},
		{"bad startedAfter", "?startedAfter=yesterday", nil, 400},
		{"bad order", "?order=random", nil, 400},
		{"unknown filter", "?endedBefore=2026-01-01T00:00:00Z", nil, 400},
		{"limit too big", "?limit=101", nil, 400},
		{"limit absurd", "?limit=99999999999999999999", nil, 400},
		{"forged token", "?nextToken=" + base64.RawURLEncoding.EncodeToString([]byte("x_y")), nil, 400},
		{"token not base64", "?nextToken=%%%", nil, 400},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.control("GET", "/v2/sandboxes"+tc.query, keyA, "")
			if status != tc.status {
				t.Fatalf("%d %s, want %d", status, body, tc.status)
			}
			if status != 200 {
				wantE2BError(t, tc.name, status, body, tc.status)
				return
			}
			var l []listed
			json.Unmarshal(body, &l)
			var got []string
			for _, s := range l {
				got = append(got, s.SandboxID)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("listed %v, want %v", got, tc.want)
			}
		})
	}
	t.Run("v1 newest first, refuses v2 filters", func(t *testing.T) {
		status, body := e.control("GET", "/sandboxes", keyA, "")
		var l []listed
		json.Unmarshal(body, &l)
		if status != 200 || len(l) != 5 || l[0].SandboxID != ids[4] {
			t.Errorf("GET /sandboxes: %d %s", status, body)
		}
		status, body = e.control("GET", "/sandboxes?template=node", keyA, "")
		wantE2BError(t, "v1 template", status, body, 400)
	})
	t.Run("pages, with a sandbox ending between them", func(t *testing.T) {
		var got []string
		token := ""
		for page := 0; page < 10; page++ {
			q := "?limit=2"
			if token != "" {
				q += "&nextToken=" + url.QueryEscape(token)
			}
			resp, body := e.do("GET", "/v2/sandboxes"+q, map[string]string{"X-API-Key": keyA}, nil)
			if resp.StatusCode != 200 {
				t.Fatalf("page %d: %d %s", page, resp.StatusCode, body)
			}
			var l []listed
			json.Unmarshal(body, &l)
			for _, s := range l {
				got = append(got, s.SandboxID)
			}
			if page == 0 {
				// The first sandbox of the next page ends: the token
				// still continues the list.
				e.control("DELETE", "/sandboxes/"+ids[2], keyA, "")
			}
			if token = resp.Header.Get("X-Next-Token"); token == "" {
				break
			}
		}
		if want := []string{ids[4], ids[3], ids[1], ids[0]}; !slices.Equal(got, want) {
			t.Errorf("pages gave %v, want %v", got, want)
		}
	})
	t.Run("another key's token shows none of this key's", func(t *testing.T) {
		resp, _ := e.do("GET", "/v2/sandboxes?limit=1", map[string]string{"X-API-Key": keyA}, nil)
		tok := resp.Header.Get("X-Next-Token")
		status, body := e.control("GET", "/v2/sandboxes?nextToken="+url.QueryEscape(tok), keyB, "")
		if status != 200 || strings.Contains(string(body), ids[0]) {
			t.Errorf("key B with key A's token: %d %s", status, body)
		}
	})
}

// TestConnectExtendsOnly: connect's timeout (the SDKs send 5 minutes by
// default) never shortens a sandbox's life; setTimeout still sets it.
func TestConnectExtendsOnly(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base","timeout":3600}`)
	endIn := func() time.Duration {
		t.Helper()
		_, body := e.control("GET", "/sandboxes/"+c.SandboxID, keyA, "")
		var l listed
		json.Unmarshal(body, &l)
		return time.Until(l.EndAt)
	}
	tests := []struct {
		name, path, body string
		status           int
		min, max         time.Duration
	}{
		{"shorter connect keeps the hour", "/sandboxes/" + c.SandboxID + "/connect", `{"timeout":300}`, 200, 3500 * time.Second, 3601 * time.Second},
		{"v2 connect too", "/v2/sandboxes/" + c.SandboxID + "/connect", `{"timeout":10}`, 200, 3500 * time.Second, 3601 * time.Second},
		{"no timeout", "/v2/sandboxes/" + c.SandboxID + "/connect", `{}`, 200, 3500 * time.Second, 3601 * time.Second},
		{"longer connect extends", "/v2/sandboxes/" + c.SandboxID + "/connect", `{"timeout":7200}`, 200, 7100 * time.Second, 7201 * time.Second},
		{"absurd timeout", "/v2/sandboxes/" + c.SandboxID + "/connect", `{"timeout":18446744074}`, 400, 7100 * time.Second, 7201 * time.Second},
		{"negative", "/v2/sandboxes/" + c.SandboxID + "/connect", `{"timeout":-5}`, 400, 7100 * time.Second, 7201 * time.Second},
		{"malformed", "/v2/sandboxes/" + c.SandboxID + "/connect", `{"timeout":"long"}`, 400, 7100 * time.Second, 7201 * time.Second},
		{"other key", "/v2/sandboxes/" + c.SandboxID + "/connect", `{"timeout":99999}`, 404, 7100 * time.Second, 7201 * time.Second},
		{"setTimeout may shorten", "/sandboxes/" + c.SandboxID + "/timeout", `{"timeout":600}`, 204, 500 * time.Second, 601 * time.Second},
		{"setTimeout absurd", "/sandboxes/" + c.SandboxID + "/timeout", `{"timeout":18446744074}`, 400, 500 * time.Second, 601 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			key := keyA
			if tc.name == "other key" {
				key = keyB
			}
			status, body := e.control("POST", tc.path, key, tc.body)
			if status != tc.status {
				t.Fatalf("%d %s, want %d", status, body, tc.status)
			}
			if left := endIn(); left < tc.min || left > tc.max {
				t.Errorf("ends in %s, want %s to %s", left, tc.min, tc.max)
			}
		})
	}
	t.Run("create with an absurd timeout", func(t *testing.T) {
		status, body := e.control("POST", "/v2/sandboxes", keyA, `{"timeout":18446744074}`)
		wantE2BError(t, "absurd create timeout", status, body, 400)
	})
}

// TestUser: the SDKs' user option ("Authorization: Basic base64(user:)"
// on RPCs, ?username= on /files) is honoured for E2B's default user and
// refused, naming it, for any other: Moat never runs as root.
func TestUser(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	basic := func(u string) string { return "Basic " + base64.StdEncoding.EncodeToString([]byte(u+":")) }
	tests := []struct {
		name, path, auth string
		status           int
		want             string
	}{
		{"no user", "/filesystem.Filesystem/Stat", "", 200, ""},
		{"user", "/filesystem.Filesystem/Stat", basic("user"), 200, ""},
		{"root", "/filesystem.Filesystem/Stat", basic("root"), 400, `user \"root\" is not supported`},
		{"root on process", "/process.Process/List", basic("root"), 400, "unprivileged"},
		{"another user", "/filesystem.Filesystem/Stat", basic("postgres"), 400, "postgres"},
		{"not Basic", "/filesystem.Filesystem/Stat", "Bearer x", 400, "Basic"},
		{"not base64", "/filesystem.Filesystem/Stat", "Basic !!!", 400, "Basic"},
		{"files as user", "/files?path=a.txt&username=user", "", 200, ""},
		{"files as root", "/files?path=a.txt&username=root", "", 400, "root"},
		{"files as root by header", "/files?path=a.txt", basic("root"), 400, "root"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hdr := envdHeaders(c)
			if tc.auth != "" {
				hdr["Authorization"] = tc.auth
			}
			method, body := "POST", `{"path":"/home/user"}`
			if strings.HasPrefix(tc.path, "/files?") {
				hdr["Content-Type"] = "application/octet-stream"
				body = "x"
			} else {
				hdr["Content-Type"] = "application/json"
				if strings.HasSuffix(tc.path, "/List") {
					body = "{}"
				}
			}
			resp, out := e.do(method, tc.path, hdr, strings.NewReader(body))
			if resp.StatusCode != tc.status || !strings.Contains(string(out), tc.want) {
				t.Errorf("%d %s, want %d with %q", resp.StatusCode, out, tc.status, tc.want)
			}
		})
	}
}

// FuzzListQuery: any list query is parsed or refused with E2B's error,
// and a page token round-trips.
func FuzzListQuery(f *testing.F) {
	for _, s := range []string{"", "state=running&state=paused", "metadata=a%3Db&limit=5", "startedAfter=2026-01-02T15:04:05.123Z&order=asc",
		"nextToken=" + (pageToken{time.Unix(0, 42), "sb-1"}).String(), "template=base", "limit=0", "x=1", "nextToken=%%", "order=desc&limit=100"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, err := url.ParseQuery(raw)
		if err != nil {
			return
		}
		lq, e := parseList(q, true)
		if e != nil {
			if e.Code != 400 || e.Message == "" {
				t.Fatalf("refusal %+v", e)
			}
			return
		}
		if lq.limit < 1 || lq.limit > 100 {
			t.Fatalf("limit %d", lq.limit)
		}
		if lq.after != nil {
			back, ok := parsePageToken(lq.after.String())
			if !ok || !back.started.Equal(lq.after.started) || back.id != lq.after.id {
				t.Fatalf("token %+v does not round-trip: %+v %v", lq.after, back, ok)
			}
		}
	})
}

var _ = manifest.Default // the image names the tests above expect come from it
