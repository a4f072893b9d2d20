package result

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestFileChangeJSON(t *testing.T) {
	tests := []struct {
		name string
		in   FileChange
		// want are substrings of the JSON form.
		want []string
		// lacks must not be in it.
		lacks []string
	}{
		{name: "UTF-8 names as text, no encoding",
			in:    FileChange{Path: "dir/résumé.txt", Change: Added, Type: "file", Mode: "0644"},
			want:  []string{`"path":"dir/résumé.txt"`},
			lacks: []string{`"encoding"`}},
		{name: "invalid byte: base64",
			in:   FileChange{Path: "a\xff", Change: Added, Type: "file", Mode: "0644"},
			want: []string{`"path":"Yf8="`, `"encoding":"base64"`}},
		{name: "latin-1 name: base64",
			in:   FileChange{Path: "caf\xe9", Change: Added, Type: "file", Mode: "0644"},
			want: []string{`"path":"Y2Fm6Q=="`, `"encoding":"base64"`}},
		{name: "symlink with a non-UTF-8 target: path and target base64",
			in:   FileChange{Path: "link", Change: Added, Type: "symlink", Mode: "0777", Target: "\xfe"},
			want: []string{`"path":"bGluaw=="`, `"target":"/g=="`, `"encoding":"base64"`}},
		{name: "non-UTF-8 path, UTF-8 target: both base64",
			in:   FileChange{Path: "l\x80", Change: Added, Type: "symlink", Mode: "0777", Target: "t"},
			want: []string{`"path":"bIA="`, `"target":"dA=="`, `"encoding":"base64"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !strings.Contains(string(b), w) {
					t.Errorf("JSON %s lacks %s", b, w)
				}
			}
			for _, l := range tc.lacks {
				if strings.Contains(string(b), l) {
					t.Errorf("JSON %s has %s", b, l)
				}
			}
			var back FileChange
			if err := json.Unmarshal(b, &back); err != nil {
				t.Fatalf("decode %s: %v", b, err)
			}
			if back != tc.in {
				t.Errorf("round trip: %+v, want %+v", back, tc.in)
			}
		})
	}
}

// TestDistinctNamesStayDistinct: two names that differ only in bytes that
// are not UTF-8 must not collapse to one path in the result's JSON.
func TestDistinctNamesStayDistinct(t *testing.T) {
	res := Result{
		Files: []FileChange{
			{Path: "a\xff", Change: Added, Type: "file", Mode: "0644"},
			{Path: "a\xfe", Change: Added, Type: "file", Mode: "0644"},
			{Path: "a\ufffd", Change: Added, Type: "file", Mode: "0644"},
		},
		CopyOut: &CopyOut{Skipped: []Skip{{Path: "b\xff", Reason: "r"}, {Path: "b\xfe", Reason: "r"}}},
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		Files []struct {
			Path     string `json:"path"`
			Encoding string `json:"encoding"`
		} `json:"files"`
		CopyOut struct {
			Skipped []struct {
				Path     string `json:"path"`
				Encoding string `json:"encoding"`
			} `json:"skipped"`
		} `json:"copy_out"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	seen := map[[2]string]bool{}
	for _, f := range raw.Files {
		k := [2]string{f.Path, f.Encoding}
		if seen[k] {
			t.Errorf("two diff entries read %q (encoding %q): %s", f.Path, f.Encoding, b)
		}
		seen[k] = true
	}
	if s := raw.CopyOut.Skipped; len(s) != 2 || s[0].Path == s[1].Path || s[0].Encoding != EncodingBase64 {
		t.Errorf("copy-out skips %+v, want two distinct base64 paths", s)
	}
	var back Result
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	for i, f := range back.Files {
		if f.Path != res.Files[i].Path {
			t.Errorf("files[%d] decodes to %q, want %q", i, f.Path, res.Files[i].Path)
		}
	}
	for i, s := range back.CopyOut.Skipped {
		if s.Path != res.CopyOut.Skipped[i].Path {
			t.Errorf("skipped[%d] decodes to %q, want %q", i, s.Path, res.CopyOut.Skipped[i].Path)
		}
	}
}

func TestFileChangeJSONRefused(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"unknown encoding", `{"path":"x","encoding":"hex"}`, `encoding "hex"`},
		{"bad base64 path", `{"path":"not base64!","encoding":"base64"}`, "path"},
		{"bad base64 target", `{"path":"eA==","target":"%%","encoding":"base64"}`, "target"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var c FileChange
			err := json.Unmarshal([]byte(tc.in), &c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("decode %s: %v, want an error naming %q", tc.in, err, tc.want)
			}
		})
	}
}

func TestImageJSON(t *testing.T) {
	tests := []struct {
		name string
		in   Image
		want string
	}{
		{name: "built image: no source fields",
			in:   Image{Name: "python", Digest: "sha256:aa"},
			want: `{"name":"python","digest":"sha256:aa"}`},
		{name: "imported image: source and its digest beside Moat's",
			in:   Image{Name: "app", Digest: "sha256:aa", Source: "oci-archive:app.tar", SourceDigest: "sha256:bb"},
			want: `{"name":"app","digest":"sha256:aa","source":"oci-archive:app.tar","source_digest":"sha256:bb"}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.in)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("JSON %s, want %s", b, tc.want)
			}
			var back Image
			if err := json.Unmarshal(b, &back); err != nil || back != tc.in {
				t.Errorf("round trip: %+v (%v), want %+v", back, err, tc.in)
			}
		})
	}
}
