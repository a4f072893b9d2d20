package e2b

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/moat-sandbox/moat/audit"
	"github.com/moat-sandbox/moat/policy"
	pb "github.com/moat-sandbox/moat/server/e2b/envdpb/filesystem"
	"github.com/moat-sandbox/moat/service"
	"github.com/moat-sandbox/moat/service/servicetest"
)

func TestEnvdVersionCurrent(t *testing.T) {
	// e2b 2.51's newest gate (allowNetworkMounts) is 0.6.4; metadata
	// needs 0.6.2 and watch entries 0.6.3.
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	if c.EnvdVersion != "0.6.4" {
		t.Errorf("envdVersion %q, want 0.6.4", c.EnvdVersion)
	}
}

func TestChanges(t *testing.T) {
	t0 := time.Unix(1000, 0)
	file := func(size int64, mod time.Time) watchState {
		return watchState{typ: pb.FileType_FILE_TYPE_FILE, size: size, mod: mod, entry: &pb.EntryInfo{Path: "/home/user/x", Size: size}}
	}
	dir := watchState{typ: pb.FileType_FILE_TYPE_DIRECTORY, mod: t0, entry: &pb.EntryInfo{Path: "/home/user/d"}}
	tests := []struct {
		name      string
		entry     bool
		prev, cur map[string]watchState
		want      []string
	}{
		{"empty file created", false, nil, map[string]watchState{"/home/user/a": file(0, t0)}, []string{"CREATE a"}},
		{"file created with content is created then written", false, nil, map[string]watchState{"/home/user/a": file(3, t0)}, []string{"CREATE a", "WRITE a"}},
		{"directory created", false, nil, map[string]watchState{"/home/user/d": dir}, []string{"CREATE d"}},
		{"file grown", false, map[string]watchState{"/home/user/a": file(1, t0)}, map[string]watchState{"/home/user/a": file(2, t0)}, []string{"WRITE a"}},
		{"file touched", false, map[string]watchState{"/home/user/a": file(1, t0)}, map[string]watchState{"/home/user/a": file(1, t0.Add(time.Second))}, []string{"WRITE a"}},
		{"unchanged, other entry pointer", false, map[string]watchState{"/home/user/a": file(1, t0)}, map[string]watchState{"/home/user/a": file(1, t0)}, nil},
		{"directory time changed", false, map[string]watchState{"/home/user/d": dir}, map[string]watchState{"/home/user/d": {typ: dir.typ, mod: t0.Add(time.Second)}}, nil},
		{"removed", false, map[string]watchState{"/home/user/a": file(1, t0)}, nil, []string{"REMOVE a"}},
		{"path order", false, map[string]watchState{"/home/user/b": file(1, t0)}, map[string]watchState{"/home/user/c": file(0, t0), "/home/user/a": file(0, t0)}, []string{"CREATE a", "REMOVE b", "CREATE c"}},
		{"with entries", true, nil, map[string]watchState{"/home/user/a": file(3, t0)}, []string{"CREATE a +entry", "WRITE a +entry"}},
		{"with entries, removed", true, map[string]watchState{"/home/user/a": file(3, t0)}, nil, []string{"REMOVE a +entry"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got []string
			for _, ev := range changes(watchTarget{path: ".", includeEntry: tc.entry}, tc.prev, tc.cur) {
				s := strings.TrimPrefix(ev.Type.String(), "EVENT_TYPE_") + " " + ev.Name
				if ev.Entry != nil {
					s += " +entry"
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("events %q, want %q", got, tc.want)
			}
		})
	}
}

func TestFileMetadata(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	hdr := func(kv ...string) map[string]string {
		h := envdHeaders(c)
		for i := 0; i+1 < len(kv); i += 2 {
			h[kv[i]] = kv[i+1]
		}
		return h
	}
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	w, _ := mw.CreateFormFile("file", "m/multi.txt")
	io.WriteString(w, "m")
	mw.Close()
	uploads := []struct {
		name   string
		path   string
		hdr    map[string]string
		body   io.Reader
		status int
		want   map[string]string // the metadata answered and kept
	}{
		{"octet-stream with metadata", "/files?path=a.txt", hdr("Content-Type", "application/octet-stream", "X-Metadata-Owner", "alice", "X-Metadata-Build_ID", "42"), strings.NewReader("a"), 200, map[string]string{"owner": "alice", "build_id": "42"}},
		{"multipart with metadata", "/files", hdr("Content-Type", mw.FormDataContentType(), "X-Metadata-Kind", "multi"), &mp, 200, map[string]string{"kind": "multi"}},
		{"no metadata", "/files?path=plain.txt", hdr("Content-Type", "application/octet-stream"), strings.NewReader("p"), 200, nil},
		{"a value that is not printable ASCII", "/files?path=bad.txt", hdr("Content-Type", "application/octet-stream", "X-Metadata-K", "caf\xc3\xa9"), strings.NewReader("b"), 400, nil},
		{"a value over the bound", "/files?path=big.txt", hdr("Content-Type", "application/octet-stream", "X-Metadata-K", strings.Repeat("v", 4097)), strings.NewReader("b"), 400, nil},
	}
	for _, tc := range uploads {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := e.do("POST", tc.path, tc.hdr, tc.body)
			if resp.StatusCode != tc.status {
				t.Fatalf("%d %s, want %d", resp.StatusCode, body, tc.status)
			}
			if tc.status != 200 {
				// Refused before anything was written.
				p := strings.TrimPrefix(tc.path, "/files?path=")
				if st, _ := e.unary(c, "filesystem.Filesystem/Stat", map[string]any{"path": p}); st != 404 {
					t.Errorf("a refused upload left %s (Stat %d)", p, st)
				}
				return
			}
			var written []writtenEntry
			if err := json.Unmarshal(body, &written); err != nil || len(written) != 1 {
				t.Fatalf("answer %s: %v", body, err)
			}
			if !mapsEqual(written[0].Metadata, tc.want) {
				t.Errorf("written metadata %v, want %v", written[0].Metadata, tc.want)
			}
			st, out := e.unary(c, "filesystem.Filesystem/Stat", map[string]any{"path": written[0].Path})
			if got := metadataOf(out["entry"]); st != 200 || !mapsEqual(got, tc.want) {
				t.Errorf("Stat: %d metadata %v, want %v", st, got, tc.want)
			}
		})
	}
	t.Run("list, rename and stat keep it", func(t *testing.T) {
		_, out := e.unary(c, "filesystem.Filesystem/ListDir", map[string]any{"path": "/home/user"})
		found := false
		for _, en := range items(out, "entries") {
			m := en.(map[string]any)
			if m["name"] == "a.txt" {
				found = mapsEqual(metadataOf(m), map[string]string{"owner": "alice", "build_id": "42"})
			}
		}
		if !found {
			t.Errorf("ListDir has no a.txt with its metadata: %v", out)
		}
		st, out := e.unary(c, "filesystem.Filesystem/Move", map[string]any{"source": "a.txt", "destination": "b.txt"})
		if got := metadataOf(out["entry"]); st != 200 || got["owner"] != "alice" {
			t.Errorf("Move: %d %v", st, out)
		}
	})
	t.Run("a key given twice", func(t *testing.T) {
		req, _ := http.NewRequest("POST", e.url+"/files?path=twice.txt", strings.NewReader("t"))
		for k, v := range envdHeaders(c) {
			req.Header.Set(k, v)
		}
		req.Header.Set("Content-Type", "application/octet-stream")
		req.Header.Add("X-Metadata-K", "1")
		req.Header.Add("X-Metadata-K", "2")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("status %d, want 400", resp.StatusCode)
		}
	})
}

func metadataOf(v any) map[string]string {
	m, _ := v.(map[string]any)
	md, _ := m["metadata"].(map[string]any)
	if len(md) == 0 {
		return nil
	}
	out := map[string]string{}
	for k, v := range md {
		out[k], _ = v.(string)
	}
	return out
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

func TestWatcherEntries(t *testing.T) {
	tests := []struct {
		name         string
		includeEntry bool
	}{
		{"without entries", false},
		{"with entries", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			c := e.create(keyA, `{"templateID":"base"}`)
			st, out := e.unary(c, "filesystem.Filesystem/CreateWatcher", map[string]any{"path": "/home/user", "includeEntry": tc.includeEntry})
			id, _ := out["watcherId"].(string)
			if st != 200 || id == "" {
				t.Fatalf("CreateWatcher: %d %v", st, out)
			}
			e.session(c.SandboxID).WriteFile("w.txt", strings.NewReader("abc"), 0o644)
			_, out = e.unary(c, "filesystem.Filesystem/GetWatcherEvents", map[string]any{"watcherId": id})
			var types []string
			for _, ev := range items(out, "events") {
				m := ev.(map[string]any)
				types = append(types, m["type"].(string))
				en, has := m["entry"].(map[string]any)
				if has != tc.includeEntry || (has && (en["path"] != "/home/user/w.txt" || en["size"] != "3")) {
					t.Errorf("event %v: entry %v, want included %v", m, en, tc.includeEntry)
				}
			}
			if !slices.Equal(types, []string{"EVENT_TYPE_CREATE", "EVENT_TYPE_WRITE"}) {
				t.Errorf("events %v, want a create then a write", types)
			}
		})
	}
}

func FuzzUploadMetadata(f *testing.F) {
	f.Add("X-Metadata-Owner", "alice")
	f.Add("x-metadata-build_id", "42")
	f.Add("X-Metadata-", "v")
	f.Add("X-Metadata-K", "caf\xc3\xa9")
	f.Add("X-Metadata-"+strings.Repeat("k", 300), "v")
	f.Fuzz(func(t *testing.T, name, value string) {
		h := http.Header{}
		h[name] = []string{value}
		md, e := uploadMetadata(h)
		if e != nil {
			if e.Code != 400 || e.Message == "" {
				t.Errorf("refusal %+v", e)
			}
			return
		}
		for k, v := range md {
			if k == "" || k != strings.ToLower(k) || len(v) > 4096 {
				t.Errorf("accepted %q=%q", k, v)
			}
			for i := 0; i < len(v); i++ {
				if v[i] < 0x20 || v[i] > 0x7e {
					t.Errorf("accepted a value with byte %#x", v[i])
				}
			}
		}
	})
}

func TestGetMetrics(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	e.session(c.SandboxID).WriteFile("data.bin", strings.NewReader(strings.Repeat("x", 1000)), 0o644)
	path := "/sandboxes/" + c.SandboxID + "/metrics"
	now := time.Now().Unix()
	tests := []struct {
		name   string
		path   string
		key    string
		status int
		n      int // samples wanted, when 200 (-1: at least one)
	}{
		{"the sandbox's", path, keyA, 200, -1},
		{"within start and end", path + "?start=" + strconv.FormatInt(now-60, 10) + "&end=" + strconv.FormatInt(now+60, 10), keyA, 200, -1},
		{"before any sample", path + "?end=" + strconv.FormatInt(now-3600, 10), keyA, 200, 0},
		{"end before start", path + "?start=" + strconv.FormatInt(now, 10) + "&end=" + strconv.FormatInt(now-10, 10), keyA, 400, 0},
		{"start not a number", path + "?start=yesterday", keyA, 400, 0},
		{"start negative", path + "?start=-1", keyA, 400, 0},
		{"another key's sandbox", path, keyB, 404, 0},
		{"an unknown sandbox", "/sandboxes/nope/metrics", keyA, 404, 0},
		{"no key", path, "", 401, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.control("GET", tc.path, tc.key, "")
			if status != tc.status {
				t.Fatalf("%d %s, want %d", status, body, tc.status)
			}
			if status != 200 {
				wantE2BError(t, tc.name, status, body, tc.status)
				return
			}
			var ms []sandboxMetric
			if err := json.Unmarshal(body, &ms); err != nil {
				t.Fatalf("%s: %v", body, err)
			}
			if (tc.n < 0 && len(ms) == 0) || (tc.n >= 0 && len(ms) != tc.n) {
				t.Fatalf("%d samples, want %d (-1: some): %s", len(ms), tc.n, body)
			}
			for _, m := range ms {
				if m.DiskUsed != 1000 || m.DiskTotal <= 0 || m.MemTotal <= 0 || m.CPUCount < 1 || m.TimestampUnix != m.Timestamp.Unix() || m.CPUUsedPct < 0 || m.CPUUsedPct > 100 {
					t.Errorf("sample %+v", m)
				}
			}
		})
	}
}

// TestListMetrics: GET /sandboxes/metrics answers the newest sample of
// each named running sandbox of the caller's, keyed by id; others are left
// out, and a missing or absurd list is a 400 naming sandbox_ids.
func TestListMetrics(t *testing.T) {
	e := newEnv(t)
	a1 := e.create(keyA, `{"templateID":"base"}`)
	a2 := e.create(keyA, `{"templateID":"base"}`)
	b := e.create(keyB, `{"templateID":"base"}`)
	e.session(a1.SandboxID).WriteFile("data.bin", strings.NewReader(strings.Repeat("x", 500)), 0o644)
	many := make([]string, maxMetricsIDs+1)
	for i := range many {
		many[i] = fmt.Sprintf("sb%d", i)
	}
	tests := []struct {
		name   string
		query  string
		key    string
		status int
		want   []string // the ids answered
	}{
		{"comma-separated", "sandbox_ids=" + a1.SandboxID + "," + a2.SandboxID, keyA, 200, []string{a1.SandboxID, a2.SandboxID}},
		{"repeated", "sandbox_ids=" + a1.SandboxID + "&sandbox_ids=" + a2.SandboxID, keyA, 200, []string{a1.SandboxID, a2.SandboxID}},
		{"another key's and unknown ones are left out", "sandbox_ids=" + a1.SandboxID + "," + b.SandboxID + ",nope", keyA, 200, []string{a1.SandboxID}},
		{"only another key's", "sandbox_ids=" + b.SandboxID, keyA, 200, nil},
		{"none named", "", keyA, 400, nil},
		{"only commas", "sandbox_ids=,,", keyA, 400, nil},
		{"too many", "sandbox_ids=" + strings.Join(many, ","), keyA, 400, nil},
		{"no key", "sandbox_ids=" + a1.SandboxID, "", 401, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, body := e.control("GET", "/sandboxes/metrics?"+tc.query, tc.key, "")
			if status != tc.status {
				t.Fatalf("%d %s, want %d", status, body, tc.status)
			}
			if status != 200 {
				wantE2BError(t, tc.name, status, body, tc.status)
				if status == 400 && !strings.Contains(string(body), "sandbox_ids") {
					t.Errorf("%s does not name sandbox_ids", body)
				}
				return
			}
			var out struct {
				Sandboxes map[string]sandboxMetric `json:"sandboxes"`
			}
			if err := json.Unmarshal(body, &out); err != nil || out.Sandboxes == nil {
				t.Fatalf("%s: %v", body, err)
			}
			if len(out.Sandboxes) != len(tc.want) {
				t.Fatalf("answered %d sandboxes, want %v: %s", len(out.Sandboxes), tc.want, body)
			}
			for _, id := range tc.want {
				m, ok := out.Sandboxes[id]
				if !ok || m.MemTotal <= 0 || m.CPUCount < 1 {
					t.Errorf("%s: %+v (present %v)", id, m, ok)
				}
			}
			if m, ok := out.Sandboxes[a1.SandboxID]; ok && m.DiskUsed != 500 {
				t.Errorf("disk of %s: %d, want 500", a1.SandboxID, m.DiskUsed)
			}
		})
	}
}

func TestPids(t *testing.T) {
	tests := []struct {
		name string
		ex   service.Exec
		want uint32
	}{
		{"the tier's pid", service.Exec{ID: "e-1", Pid: 42}, 42},
		{"no pid: above PID_MAX_LIMIT", service.Exec{ID: "e-7"}, noPidBase + 7},
		{"init's pid is never given", service.Exec{ID: "e-1", Pid: 1}, noPidBase + 1},
		{"a pid beyond PID_MAX_LIMIT is not believed", service.Exec{ID: "e-2", Pid: noPidBase + 5}, noPidBase + 2},
		{"not a command id", service.Exec{ID: "x"}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := &box{}
			got := b.pidOf(tc.ex)
			if got != tc.want {
				t.Fatalf("pidOf(%+v) = %d, want %d", tc.ex, got, tc.want)
			}
			if got != 0 && b.execOf(got) != tc.ex.ID {
				t.Errorf("execOf(%d) = %q, want %q", got, b.execOf(got), tc.ex.ID)
			}
		})
	}
	t.Run("unknown pids name no command", func(t *testing.T) {
		b := &box{}
		b.pidOf(service.Exec{ID: "e-1", Pid: 42})
		for _, pid := range []uint32{0, 1, 7, 43, noPidBase} {
			if id := b.execOf(pid); id != "" {
				t.Errorf("execOf(%d) = %q", pid, id)
			}
		}
	})
	t.Run("a reused pid names the newest command", func(t *testing.T) {
		b := &box{}
		b.pidOf(service.Exec{ID: "e-1", Pid: 42})
		b.pidOf(service.Exec{ID: "e-9", Pid: 42})
		if id := b.execOf(42); id != "e-9" {
			t.Errorf("execOf(42) = %q", id)
		}
	})
	t.Run("bounded, the oldest forgotten", func(t *testing.T) {
		b := &box{}
		for i := 1; i <= maxPids+5; i++ {
			b.pidOf(service.Exec{ID: "e-" + strconv.Itoa(i), Pid: 1000 + i})
		}
		if len(b.pids) > maxPids {
			t.Errorf("%d pids kept", len(b.pids))
		}
		if b.execOf(1001) != "" || b.execOf(uint32(1000+maxPids+5)) == "" {
			t.Errorf("the oldest kept or the newest lost")
		}
	})
}

// The SDK's commands.kill(pid) and commands.list use the pids the
// sandbox's programs see.
func TestKillByPid(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base"}`)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A blocking command, started through Start and left running.
	data, _ := json.Marshal(map[string]any{"process": map[string]any{"cmd": "fake", "args": []string{"block"}}})
	var buf bytes.Buffer
	buf.WriteByte(0)
	binary.Write(&buf, binary.BigEndian, uint32(len(data)))
	buf.Write(data)
	req, _ := http.NewRequestWithContext(ctx, "POST", e.url+"/process.Process/Start", &buf)
	for k, v := range envdHeaders(c) {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, first, err := readEnvelope(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var start struct {
		Event struct {
			Start struct {
				Pid uint32 `json:"pid"`
			} `json:"start"`
		} `json:"event"`
	}
	json.Unmarshal(first, &start)
	pid := start.Event.Start.Pid
	if pid != servicetest.FirstPid {
		t.Fatalf("start event %s: pid %d, want the sandbox's %d", first, pid, servicetest.FirstPid)
	}
	st, out := e.unary(c, "process.Process/List", map[string]any{})
	listed := false
	for _, p := range items(out, "processes") {
		listed = listed || p.(map[string]any)["pid"] == float64(pid)
	}
	if st != 200 || !listed {
		t.Errorf("List: %d %v, want pid %d", st, out, pid)
	}
	tests := []struct {
		name string
		pid  uint32
		code string
	}{
		{"init", 1, "not_found"},
		{"an unknown pid", pid + 1, "not_found"},
		{"the command's pid", pid, ""},
		{"again, ended", pid, "not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, out := e.unary(c, "process.Process/SendSignal", map[string]any{"process": map[string]any{"pid": tc.pid}, "signal": "SIGNAL_SIGKILL"})
			if (tc.code == "" && st != 200) || (tc.code != "" && out["code"] != tc.code) {
				t.Errorf("SendSignal(%d): %d %v, want %q", tc.pid, st, out, tc.code)
			}
			if tc.code == "" {
				// The stream ends with the command.
				for {
					if _, _, err := readEnvelope(resp.Body); err != nil {
						break
					}
				}
			}
		})
	}
}

func TestUpdateNetwork(t *testing.T) {
	pol, err := policy.Parse([]byte("require_justifications: false\ndefault:\n  network:\n    mode: allowlist\n    allow: [\"*.example.com\", \"pypi.org\"]\n    allow_addresses: [\"10.0.0.0/8\"]\n"), "policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		internet Internet
		create   string // "" : with an allowlist
		key      string
		body     string
		status   int
		text     string
		hosts    []string // the allowlist the sandbox got
		addrs    []string
	}{
		{name: "replaced", body: `{"allowOut":["api.example.com"],"denyOut":["0.0.0.0/0"]}`, status: 204, hosts: []string{"api.example.com"}},
		{name: "hosts and addresses", body: `{"allowOut":["api.example.com","10.1.2.0/24"],"denyOut":["0.0.0.0/0"]}`, status: 204, hosts: []string{"api.example.com"}, addrs: []string{"10.1.2.0/24"}},
		{name: "emptied: deny everything", body: `{"denyOut":["0.0.0.0/0"]}`, status: 204, hosts: []string{}},
		{name: "internet is the operator's", internet: Internet{Allow: []string{"pypi.org"}}, body: `{"allow_internet_access":true}`, status: 204, hosts: []string{"pypi.org"}},
		{name: "no internet defined: nothing", body: `{"allow_internet_access":true}`, status: 204, hosts: []string{}},
		{name: "internet refused by the operator", internet: Internet{Refuse: true}, body: `{"allow_internet_access":true}`, status: 400, text: "--e2b-internet=refuse"},
		{name: "beyond the key's ceiling", body: `{"allowOut":["example.org"],"denyOut":["0.0.0.0/0"]}`, status: 403, text: "exceeds this key's ceiling"},
		{name: "an address beyond the ceiling", body: `{"allowOut":["192.168.0.0/16"],"denyOut":["0.0.0.0/0"]}`, status: 403, text: "allow_addresses"},
		{name: "not a host", body: `{"allowOut":["exa mple.com"],"denyOut":["0.0.0.0/0"]}`, status: 400, text: "network.allow"},
		{name: "a narrower deny", body: `{"allowOut":["api.example.com"],"denyOut":["1.2.3.4/32"]}`, status: 400, text: "denyOut"},
		{name: "rules", body: `{"rules":{"api.example.com":[{"transform":{"headers":{"X":"y"}}}]}}`, status: 400, text: "network.rules"},
		{name: "an egress proxy", body: `{"egressProxy":{"address":"p:1080"}}`, status: 400, text: "egressProxy"},
		{name: "malformed", body: `{"allowOut":"api.example.com"}`, status: 400, text: "not the JSON"},
		{name: "unknown field", body: `{"allowOut":[],"bogus":1}`, status: 400, text: "bogus"},
		{name: "another key's sandbox", key: keyB, body: `{"allowOut":["api.example.com"]}`, status: 404},
		{name: "created without network", create: `{"templateID":"base","allow_internet_access":false}`, body: `{"allowOut":["api.example.com"],"denyOut":["0.0.0.0/0"]}`, status: 400, text: "network.mode none"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnvConfig(t, []string{"python"}, nil, pol, func(c *Config) { c.Internet = tc.internet })
			create := cmp.Or(tc.create, `{"templateID":"base","network":{"allowOut":["pypi.org"],"denyOut":["0.0.0.0/0"]}}`)
			c := e.create(keyA, create)
			status, body := e.control("PUT", "/sandboxes/"+c.SandboxID+"/network", cmp.Or(tc.key, keyA), tc.body)
			if status != tc.status {
				t.Fatalf("%d %s, want %d", status, body, tc.status)
			}
			if status != 204 {
				wantE2BError(t, tc.name, status, body, tc.status)
				if !strings.Contains(string(body), tc.text) {
					t.Errorf("%s, want %q", body, tc.text)
				}
			}
			n := e.session(c.SandboxID).Network()
			if tc.status != 204 {
				if n != nil {
					t.Errorf("a refused update changed the allowlist to %+v", n)
				}
			} else if n == nil || !slices.Equal(n.Allow, tc.hosts) || !slices.Equal(n.AllowAddresses, tc.addrs) {
				t.Errorf("allowlist %+v, want %v %v", n, tc.hosts, tc.addrs)
			}
			// Every update the service saw is audited, refused or not.
			recs := e.au.Records(audit.KindNetwork)
			if tc.status == 204 || tc.status == 403 {
				if len(recs) != 1 || recs[0].SandboxID != c.SandboxID || recs[0].Status == audit.Running {
					t.Errorf("audit records %+v", recs)
				}
			}
		})
	}
}
