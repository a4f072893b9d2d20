package output

import (
	"bytes"
	"crypto/rand"
	"crypto/sha1"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/hex"
	"strings"
	"testing"
)

func randomBytes(t testing.TB, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

func TestScanFormats(t *testing.T) {
	sum := sha256.Sum256([]byte("hello"))
	sum512 := sha512.Sum512([]byte("hello"))
	tests := []struct {
		name string
		in   string
		want []string // kinds, in offset order; nil: nothing
	}{
		{"aws access key", "key=AKIAIOSFODNN7EXAMPLE\n", []string{KindAWSKey}},
		{"github token", "token ghp_" + strings.Repeat("aB3", 12) + " end", []string{KindGitHubToken}},
		{"github fine-grained pat", "github_pat_11ABCDEFG0123456789_abcdefghijkl", []string{KindGitHubToken}},
		{"pem private key", "-----BEGIN RSA PRIVATE KEY-----\nMIIE\n", []string{KindPrivateKey}},
		{"openssh private key", "-----BEGIN OPENSSH PRIVATE KEY-----\n", []string{KindPrivateKey}},
		{"jwt", "Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", []string{KindJWT}},
		{"slack token", "xoxb-1234567890-abcdefghij", []string{KindSlackToken}},
		{"hex blob", hex.EncodeToString(randomBytes(t, 100)), []string{KindHexBlob}},
		{"base64 blob", base64.StdEncoding.EncodeToString(randomBytes(t, 300)), []string{KindBase64Blob}},
		{"wrapped base64 blob", wrap(base64.StdEncoding.EncodeToString(randomBytes(t, 300)), 76), []string{KindBase64Blob}},
		{"high-entropy token", "api_key: " + "Zx8Qp2LmN4vR7tY1wK9sD3fG6hJ0cB5a", []string{KindHighEntropy}},
		// Benign counter-examples: what programs print every day.
		{"uuid", "id 123e4567-e89b-12d3-a456-426614174000 done", nil},
		{"sha256sum", hex.EncodeToString(sum[:]) + "  file.txt\n", nil},
		{"sha512sum", hex.EncodeToString(sum512[:]) + "  file.txt\n", nil},
		{"git log", "commit 8a77d13c4f0e6a1b2c3d4e5f60718293a4b5c6d7\n", nil},
		{"long path", "/usr/lib/python3/dist-packages/setuptools/_vendor/packaging/requirements.py", nil},
		{"prose", strings.Repeat("the quick brown fox jumps over the lazy dog ", 20), nil},
		{"long identifier", "ThisIsAVeryLongJavaStyleIdentifierNameFactoryBean2", nil},
		{"short base64", base64.StdEncoding.EncodeToString([]byte("hello world, it's me")), nil},
		{"empty", "", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Scan([]byte(tc.in), "stdout", Tokens{})
			var ks []string
			for _, f := range got {
				ks = append(ks, f.Kind)
				if f.Where != "stdout" {
					t.Errorf("where %q, want stdout", f.Where)
				}
				if f.Offset < 0 || int(f.Offset)+f.Length > len(tc.in) {
					t.Errorf("span %d+%d outside input of %d", f.Offset, f.Length, len(tc.in))
				}
				if f.Length > 8 && strings.Contains(f.Preview, tc.in[f.Offset:int(f.Offset)+f.Length]) {
					t.Errorf("preview %q holds the match", f.Preview)
				}
			}
			if strings.Join(ks, ",") != strings.Join(tc.want, ",") {
				t.Errorf("kinds %v, want %v (findings %+v)", ks, tc.want, got)
			}
		})
	}
}

func wrap(s string, n int) string {
	var b strings.Builder
	for len(s) > n {
		b.WriteString(s[:n] + "\n")
		s = s[n:]
	}
	b.WriteString(s)
	return b.String()
}

func TestScanCanaries(t *testing.T) {
	c, err := NewCanaries()
	if err != nil {
		t.Fatal(err)
	}
	other, err := NewCanaries()
	if err != nil {
		t.Fatal(err)
	}
	tok := Tokens{Canaries: c.Tokens}
	ssh := string(c.Files[".ssh/id_ed25519"])
	aws := c.Env["AWS_SECRET_ACCESS_KEY"]
	tests := []struct {
		name   string
		in     string
		canary bool
		offset int
	}{
		{"raw secret key", "x=" + aws, true, 2},
		{"lower-cased key id", "id " + strings.ToLower(c.Env["AWS_ACCESS_KEY_ID"]), true, 3},
		{"ssh key file printed", ssh, true, strings.Index(ssh, "\n") + 1},
		{"base64 of the ssh key file", base64.StdEncoding.EncodeToString([]byte(ssh)), true, -1},
		{"base64url of the token", "q=" + base64.URLEncoding.EncodeToString([]byte("x"+c.Env["GITHUB_TOKEN"])), true, -1},
		{"hex of the netrc", hex.EncodeToString(c.Files[".netrc"]), true, -1},
		{"upper hex", strings.ToUpper(hex.EncodeToString([]byte(aws))), true, 0},
		{"another run's canary", "x=" + other.Env["AWS_SECRET_ACCESS_KEY"], false, 0},
		{"nothing", "hello\n", false, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Scan([]byte(tc.in), "stderr", tok)
			var seen bool
			for _, f := range got {
				if f.Kind == KindCanary {
					seen = true
					if tc.offset >= 0 && f.Offset != int64(tc.offset) {
						t.Errorf("offset %d, want %d", f.Offset, tc.offset)
					}
				}
			}
			if seen != tc.canary {
				t.Errorf("canary seen %v, want %v (%+v)", seen, tc.canary, got)
			}
		})
	}
}

func TestNewCanariesUnique(t *testing.T) {
	a, err := NewCanaries()
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewCanaries()
	if err != nil {
		t.Fatal(err)
	}
	for i := range a.Tokens {
		if a.Tokens[i] == b.Tokens[i] {
			t.Errorf("token %d is the same in two runs", i)
		}
		if !placeholderLike(a.Tokens[i]) {
			t.Errorf("token %d %q is not [A-Za-z0-9] only, 16+ long", i, a.Tokens[i])
		}
	}
	// Every planted decoy holds a token, so reading and sending any of
	// them flags the run.
	for p, data := range a.Files {
		if len(Scan(data, p, Tokens{Canaries: a.Tokens})) == 0 {
			t.Errorf("file %s holds no token", p)
		}
	}
	for k, v := range a.Env {
		if len(Scan([]byte(v), k, Tokens{Canaries: a.Tokens})) == 0 {
			t.Errorf("variable %s holds no token", k)
		}
	}
}

func placeholderLike(s string) bool {
	if len(s) < 16 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

func TestRedact(t *testing.T) {
	secrets := []Secret{{"api", "s3cr3t-value-123"}, {"short", "abc"}}
	tests := []struct {
		name  string
		in    string
		want  string
		found int
	}{
		{"echoed value", "got s3cr3t-value-123!", "got [moat: secret api redacted]!", 1},
		{"twice", "s3cr3t-value-123s3cr3t-value-123", "[moat: secret api redacted][moat: secret api redacted]", 2},
		{"too short to redact", "abc abc", "abc abc", 0},
		{"absent", "nothing here", "nothing here", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, found := Redact([]byte(tc.in), "stdout", secrets)
			if string(got) != tc.want || len(found) != tc.found {
				t.Errorf("Redact = %q, %d findings; want %q, %d", got, len(found), tc.want, tc.found)
			}
			for _, f := range found {
				if bytes.Contains([]byte(f.Preview), []byte("s3cr3t")) {
					t.Errorf("finding holds the value: %+v", f)
				}
			}
		})
	}
}

func FuzzScan(f *testing.F) {
	f.Add([]byte("AKIAIOSFODNN7EXAMPLE"), "c4n4ryT0kenAbcdefgh")
	f.Add([]byte("-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n"), "b3BlbnNzaC1rZXktdjEabcdef")
	f.Add([]byte(strings.Repeat("QUJD", 80)+"\n"+strings.Repeat("ab", 100)), "QUJDQUJDQUJDQUJD")
	f.Add([]byte("\x1b]52;c;aGVsbG8=\x07 eyJhbGciOiJI.eyJzdWIiOiIx.abcdefghij"), "")
	f.Fuzz(func(t *testing.T, b []byte, canary string) {
		got := Scan(b, "stdout", Tokens{Canaries: []string{canary}})
		if len(got) > maxFindings {
			t.Fatalf("%d findings, cap %d", len(got), maxFindings)
		}
		for _, fd := range got {
			if fd.Offset < 0 || fd.Length < 0 || int(fd.Offset)+fd.Length > len(b) {
				t.Fatalf("span %d+%d outside %d bytes", fd.Offset, fd.Length, len(b))
			}
		}
		out, found := Redact(b, "stdout", []Secret{{"s", canary}})
		if len(canary) >= minRedact && bytes.Contains(out, []byte(canary)) && !strings.Contains("[moat: secret s redacted]", canary) {
			t.Fatalf("value left after Redact (%d findings)", len(found))
		}
	})
}

func TestCaptureRedact(t *testing.T) {
	tests := []struct {
		name    string
		written string
		cap     int64
		want    string
		found   int
	}{
		{"value echoed", "echo: s3cr3t-value-123\n", 1 << 20, "echo: [moat: secret api redacted]\n", 1},
		{"nothing", "hello\n", 1 << 20, "hello\n", 0},
		{"value cut by the cap is not whole", "xx s3cr3t-val", 12, "xx s3cr3t-va", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := NewCapture(tc.cap, nil)
			c.Write([]byte(tc.written))
			found := c.Redact("stdout", []Secret{{"api", "s3cr3t-value-123"}})
			if got := c.Stream().Data; got != tc.want || len(found) != tc.found {
				t.Errorf("stream %q, %d findings; want %q, %d", got, len(found), tc.want, tc.found)
			}
			if c.Total() != int64(len(tc.written)) {
				t.Errorf("Total %d, want what the program wrote (%d)", c.Total(), len(tc.written))
			}
		})
	}
}

func TestUnsafeName(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want bool
	}{
		{"plain", "src/main.go", false},
		{"spaces and unicode", "my file – ünïcode.txt", false},
		{"osc title", "a\x1b]0;pwned\x07b", true},
		{"csi", "x\x1b[2J", true},
		{"newline", "a\nb", true},
		{"bidi override", "evil\u202etxt.sh", true},
		{"c1 csi", "a\u009bb", true},
		{"raw 8-bit csi", "a\x9bb", true},
		{"invalid utf-8", "a\xffb", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := UnsafeName(tc.in); got != tc.want {
				t.Errorf("UnsafeName(%q) = %v, want %v", tc.in, got, tc.want)
			}
		})
	}
}

// TestHighEntropyRecall holds the recall RATIONALE.md quotes for random
// API-key-like tokens (measured ~89% at 32 characters) above 80%.
func TestHighEntropyRecall(t *testing.T) {
	const n = 500
	hit := 0
	for i := 0; i < n; i++ {
		s, err := randomString(alnum, 32)
		if err != nil {
			t.Fatal(err)
		}
		if classifyRun([]byte(s)) == KindHighEntropy {
			hit++
		}
	}
	if hit < n*8/10 {
		t.Errorf("%d of %d random 32-character tokens reported, want 80%%+", hit, n)
	}
}

// TestScanLabelledDigests: digests that tools write labelled with their
// algorithm (pip's RECORD, npm's integrity, pip's --hash, OCI digests)
// are not reported, while the same characters unlabelled, under another
// label or of another length still are.
func TestScanLabelledDigests(t *testing.T) {
	d256 := sha256.Sum256([]byte("numpy/__init__.py"))
	d512 := sha512.Sum512([]byte("is-number-7.0.0.tgz"))
	d1 := sha1.Sum([]byte("left-pad-1.3.0.tgz"))
	record := base64.RawURLEncoding.EncodeToString(d256[:])
	integrity := base64.StdEncoding.EncodeToString(d512[:])
	// A token of the high-entropy shape, for the cases that must still
	// be reported.
	const token = "Zx8Qp2LmN4vR7tY1wK9sD3fG6hJ0cB5aQ7wE3rT9yUs"
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"pip RECORD", "numpy/__init__.py,sha256=" + record + ",1234\nnumpy-1.26.4.dist-info/RECORD,,\n", nil},
		{"pip RECORD, many lines", strings.Repeat("numpy/core/x.py,sha256="+record+",99\n", 100), nil},
		{"npm integrity sha512", `"integrity": "sha512-` + integrity + `",` + "\n", nil},
		{"npm integrity sha1", `"integrity": "sha1-` + base64.StdEncoding.EncodeToString(d1[:]) + `"`, nil},
		{"pip --hash, hex", "numpy==1.26.4 --hash=sha256:" + strings.ToUpper(hex.EncodeToString(d256[:])), nil},
		{"oci digest, base64", "digest sha256:" + base64.StdEncoding.EncodeToString(d256[:]), nil},
		// Still reported.
		{"the digest unlabelled", "x " + record + " y", []string{KindHighEntropy}},
		{"the integrity unlabelled", "x " + integrity + " y", []string{KindHighEntropy}},
		{"a token under a key", "api_key=" + token, []string{KindHighEntropy}},
		{"a token labelled sha256=, one character long", "sha256=" + record + "A", []string{KindHighEntropy}},
		{"a token labelled sha256:, the label inside a word", "xsha256:" + record, []string{KindHighEntropy}},
		{"a token labelled sha512- of sha256's length", "sha512-" + record, []string{KindHighEntropy}},
		{"an unknown algorithm", "sha3=" + record, []string{KindHighEntropy}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ks []string
			for _, f := range Scan([]byte(tc.in), "file:RECORD", Tokens{}) {
				ks = append(ks, f.Kind)
			}
			if strings.Join(ks, ",") != strings.Join(tc.want, ",") {
				t.Errorf("kinds %v, want %v", ks, tc.want)
			}
		})
	}
}
