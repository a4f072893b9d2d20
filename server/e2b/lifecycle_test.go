package e2b

import (
	"encoding/json"
	"net/http"
	"os"
	"testing"
)

// TestLifecycleRoutes drives pause, resume (connect), snapshots and fork
// as the JS SDK sends them, with bad input for each.
func TestLifecycleRoutes(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"templateID":"base","timeout":60}`)
	if code, m := e.unary(c, "filesystem.Filesystem/MakeDir", map[string]any{"path": "/workspace/d"}); code != http.StatusOK {
		t.Fatalf("make dir: %d %v", code, m)
	}
	if err := os.WriteFile(e.session(c.SandboxID).Dir()+"/d/f.txt", []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	sid := c.SandboxID
	var snapID string
	steps := []struct {
		name, method, path, key, body string
		want                          int
		check                         func(t *testing.T, body []byte)
	}{
		{"pause with memory is refused", "POST", "/sandboxes/" + sid + "/pause", keyA, `{"memory":true}`, 400, nil},
		{"pause another key's", "POST", "/sandboxes/" + sid + "/pause", keyB, `{}`, 404, nil},
		{"pause unknown", "POST", "/sandboxes/nope/pause", keyA, `{}`, 404, nil},
		{"pause malformed", "POST", "/sandboxes/" + sid + "/pause", keyA, `{"memory":"x"}`, 400, nil},
		{"snapshot bad name", "POST", "/sandboxes/" + sid + "/snapshots", keyA, `{"name":"../x"}`, 400, nil},
		{"snapshot another key's", "POST", "/sandboxes/" + sid + "/snapshots", keyB, `{}`, 404, nil},
		{"snapshot", "POST", "/sandboxes/" + sid + "/snapshots", keyA, `{"name":"snap1"}`, 201, func(t *testing.T, body []byte) {
			var si snapshotInfo
			if err := json.Unmarshal(body, &si); err != nil || si.SnapshotID == "" || len(si.Names) != 1 || si.Names[0] != "snap1" {
				t.Fatalf("snapshot info %s (%v)", body, err)
			}
			snapID = si.SnapshotID
		}},
		{"list by sandbox", "GET", "/snapshots?sandboxID=" + sid, keyA, ``, 200, func(t *testing.T, body []byte) {
			var l []snapshotInfo
			if err := json.Unmarshal(body, &l); err != nil || len(l) != 1 || l[0].SnapshotID != snapID {
				t.Fatalf("list %s (%v)", body, err)
			}
		}},
		{"list another key", "GET", "/snapshots", keyB, ``, 200, func(t *testing.T, body []byte) {
			if string(body) != "[]\n" && string(body) != "[]" {
				t.Fatalf("another key lists %s", body)
			}
		}},
		{"list bad limit", "GET", "/snapshots?limit=0", keyA, ``, 400, nil},
		{"fork count 0", "POST", "/sandboxes/" + sid + "/fork", keyA, `{"count":0}`, 400, nil},
		{"fork count -1", "POST", "/sandboxes/" + sid + "/fork", keyA, `{"count":-1}`, 400, nil},
		{"fork count 1000", "POST", "/sandboxes/" + sid + "/fork", keyA, `{"count":1000}`, 400, nil},
		{"fork another key's", "POST", "/sandboxes/" + sid + "/fork", keyB, `{"count":1}`, 404, nil},
		{"fork 2", "POST", "/sandboxes/" + sid + "/fork", keyA, `{"count":2,"timeout":30}`, 201, func(t *testing.T, body []byte) {
			var l []forkResult
			if err := json.Unmarshal(body, &l); err != nil || len(l) != 2 {
				t.Fatalf("fork %s (%v)", body, err)
			}
			for _, f := range l {
				if f.Sandbox == nil || f.Sandbox.SandboxID == sid || f.Sandbox.EnvdAccessToken == "" {
					t.Fatalf("fork result %s", body)
				}
				if b, err := os.ReadFile(e.session(f.Sandbox.SandboxID).Dir() + "/d/f.txt"); err != nil || string(b) != "kept" {
					t.Errorf("fork's file: %q %v", b, err)
				}
			}
		}},
		{"pause", "POST", "/sandboxes/" + sid + "/pause", keyA, `{}`, 204, nil},
		{"pause again", "POST", "/sandboxes/" + sid + "/pause", keyA, `{}`, 409, nil},
		{"listed as paused", "GET", "/v2/sandboxes?state=paused", keyA, ``, 200, func(t *testing.T, body []byte) {
			var l []listed
			if err := json.Unmarshal(body, &l); err != nil || len(l) != 1 || l[0].SandboxID != sid || l[0].State != "paused" {
				t.Fatalf("state=paused lists %s (%v), want the paused sandbox", body, err)
			}
		}},
		{"not listed as running", "GET", "/v2/sandboxes?state=running", keyA, ``, 200, func(t *testing.T, body []byte) {
			var l []listed
			if err := json.Unmarshal(body, &l); err != nil {
				t.Fatal(err)
			}
			for _, x := range l {
				if x.SandboxID == sid {
					t.Fatalf("state=running lists the paused sandbox: %s", body)
				}
			}
		}},
		{"getInfo of a paused one", "GET", "/sandboxes/" + sid, keyA, ``, 200, func(t *testing.T, body []byte) {
			var l listed
			if err := json.Unmarshal(body, &l); err != nil || l.State != "paused" {
				t.Fatalf("getInfo %s (%v), want state paused", body, err)
			}
		}},
		{"connect with memory to a paused one", "POST", "/v2/sandboxes/" + sid + "/connect", keyA, `{"timeout":30,"memory":true}`, 400, nil},
		{"connect another key's", "POST", "/v2/sandboxes/" + sid + "/connect", keyB, `{"timeout":30}`, 404, nil},
		{"connect resumes", "POST", "/v2/sandboxes/" + sid + "/connect", keyA, `{"timeout":30}`, 200, func(t *testing.T, body []byte) {
			var got created
			if err := json.Unmarshal(body, &got); err != nil || got.SandboxID != sid || got.EnvdAccessToken != c.EnvdAccessToken {
				t.Fatalf("connect %s (%v)", body, err)
			}
			if !e.alive("ka", sid) {
				t.Fatal("not running after connect")
			}
		}},
		{"resume a running one", "POST", "/sandboxes/" + sid + "/resume", keyA, `{}`, 409, nil},
		{"delete another key's snapshot", "DELETE", "/templates/snap1", keyB, ``, 404, nil},
		{"delete snapshot", "DELETE", "/templates/snap1", keyA, ``, 204, nil},
		{"delete it again", "DELETE", "/templates/snap1", keyA, ``, 404, nil},
	}
	for _, tc := range steps {
		t.Run(tc.name, func(t *testing.T) {
			code, body := e.control(tc.method, tc.path, tc.key, tc.body)
			if code != tc.want {
				t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.path, code, body, tc.want)
			}
			if tc.check != nil {
				tc.check(t, body)
			}
		})
	}
	// After resume the files are there, through envd with the old token.
	code, m := e.unary(c, "filesystem.Filesystem/Stat", map[string]any{"path": "/workspace/d/f.txt"})
	if code != http.StatusOK {
		t.Fatalf("stat after resume: %d %v", code, m)
	}
}

// TestCreateFromSnapshot: a templateID naming the key's snapshot starts
// from its files, three times; another key's name is just a template.
func TestCreateFromSnapshot(t *testing.T) {
	e := newEnv(t)
	c := e.create(keyA, `{"timeout":60}`)
	if err := os.WriteFile(e.session(c.SandboxID).Dir()+"/state.json", []byte(`{"step":1}`), 0o644); err != nil {
		t.Fatal(err)
	}
	code, body := e.control("POST", "/sandboxes/"+c.SandboxID+"/snapshots", keyA, `{}`)
	if code != 201 {
		t.Fatalf("snapshot: %d %s", code, body)
	}
	var si snapshotInfo
	json.Unmarshal(body, &si)
	for i := range 3 {
		n := e.create(keyA, `{"templateID":"`+si.SnapshotID+`","timeout":60}`)
		if b, err := os.ReadFile(e.session(n.SandboxID).Dir() + "/state.json"); err != nil || string(b) != `{"step":1}` {
			t.Errorf("sandbox %d from the snapshot: %q %v", i, b, err)
		}
	}
	code, body = e.control("POST", "/v2/sandboxes", keyB, `{"templateID":"`+si.SnapshotID+`"}`)
	if code != 400 {
		t.Errorf("another key creating from the snapshot: %d %s, want 400 (unknown template)", code, body)
	}
}
