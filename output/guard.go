package output

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"math"
	"regexp"
	"sort"

	"github.com/moat-sandbox/moat/result"
)

// The output-channel guard (issue 21 §3): what a sandbox writes back
// (stdout, stderr, the files of its diff) is searched for the shapes
// stolen data takes on its way out, and for the run's canaries. It
// reports where (kind, offset, length) and never the content beyond a
// short redacted preview: a report that repeated the secret would be one
// more channel for it.

// Thresholds of the blob detectors; docs/RATIONALE.md "Output-channel
// guard" says why these numbers (benign output they must not report:
// UUIDs, git and sha256/sha512 hashes, paths, prose).
const (
	// MinHexBlob is the shortest run of hex digits reported: longer
	// than a sha512 digest (128), so `sha512sum` output is quiet.
	MinHexBlob = 160
	// MinBase64Blob is the shortest run of base64 characters reported
	// as a blob, whatever its entropy above MinBlobEntropy.
	MinBase64Blob = 200
	// MinBlobEntropy is the least Shannon entropy, in bits per
	// character, of a base64 run reported as a blob (random base64 is
	// near 6; long identifiers and paths near 4).
	MinBlobEntropy = 4.5
	// MinHighEntropy and MinTokenEntropy: a shorter run of 32+
	// characters mixing upper case, lower case and digits, with at
	// least this entropy, is reported as a high-entropy token (an API
	// key of unknown format). Hex alone cannot reach it (at most 4 bits).
	MinHighEntropy  = 32
	MinTokenEntropy = 4.2
	// maxFindings bounds the report of one stream or file: output
	// made of blobs must not make the result huge.
	maxFindings = 64
)

// Finding kinds, result.Finding.Kind.
const (
	KindCanary       = "canary"
	KindAWSKey       = "aws-access-key"
	KindGitHubToken  = "github-token"
	KindPrivateKey   = "private-key"
	KindJWT          = "jwt"
	KindSlackToken   = "slack-token"
	KindHexBlob      = "hex-blob"
	KindBase64Blob   = "base64-blob"
	KindHighEntropy  = "high-entropy"
	KindSecretValue  = "secret-value"
	KindFilename     = "filename-escape"
	KindCanaryEgress = "canary-egress"
)

// secretFormats are the known secret formats, each a pattern whose match
// is the secret (or, for PEM, its header).
var secretFormats = []struct {
	kind string
	re   *regexp.Regexp
}{
	{KindAWSKey, regexp.MustCompile(`\b(?:AKIA|ASIA|AGPA|AIDA|AROA)[0-9A-Z]{16}\b`)},
	{KindGitHubToken, regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})\b`)},
	{KindPrivateKey, regexp.MustCompile(`-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----`)},
	{KindJWT, regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`)},
	{KindSlackToken, regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`)},
}

// Tokens are the byte strings a scan looks for besides the known
// formats: the run's canaries (any encoded form) and the real secret
// values Moat knows (to redact and report).
type Tokens struct {
	// Canaries are the run's decoys; seeing one is a canary finding.
	Canaries []string
}

// Scan returns what b (a stream or a file named where) holds that looks
// like data on its way out: canaries in any encoded form, known secret
// formats, long hex or base64 blobs and high-entropy tokens. Offsets are
// into b; findings are sorted by offset, at most maxFindings per kind
// group, and never hold the matched bytes beyond Preview.
func Scan(b []byte, where string, tok Tokens) []result.Finding {
	var out []result.Finding
	add := func(kind string, off, n int) {
		if len(out) < maxFindings {
			out = append(out, result.Finding{Kind: kind, Where: where, Offset: int64(off), Length: n, Preview: preview(b[off : off+n])})
		}
	}
	covered := make([][2]int, 0, 8)
	for _, c := range tok.Canaries {
		for _, m := range findForms([]byte(c), b) {
			add(KindCanary, m[0], m[1]-m[0])
			covered = append(covered, m)
		}
	}
	for _, f := range secretFormats {
		for _, m := range f.re.FindAllIndex(b, maxFindings) {
			if !overlaps(covered, m[0], m[1]) {
				add(f.kind, m[0], m[1]-m[0])
				covered = append(covered, [2]int{m[0], m[1]})
			}
		}
	}
	for _, r := range tokenRuns(b) {
		if overlaps(covered, r[0], r[1]) {
			continue
		}
		if kind := classifyRun(b[r[0]:r[1]]); kind != "" && !labelledDigest(b, r[0], r[1]) {
			add(kind, r[0], r[1]-r[0])
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Offset < out[j].Offset })
	return out
}

// findForms returns the spans of b holding token in one of its encoded
// forms, or raw in any letter case.
func findForms(token, b []byte) [][2]int {
	var spans [][2]int
	seen := map[[2]int]bool{}
	find := func(hay, needle []byte) {
		for i := 0; len(needle) > 0; {
			j := bytes.Index(hay[i:], needle)
			if j < 0 {
				return
			}
			s := [2]int{i + j, i + j + len(needle)}
			if !seen[s] {
				seen[s] = true
				spans = append(spans, s)
			}
			i += j + 1
		}
	}
	for _, f := range EncodedForms(token, minCanaryForm) {
		find(b, f)
	}
	// ASCII folding only: bytes.ToLower changes the length of text
	// that is not UTF-8 (an invalid byte becomes U+FFFD), which would
	// shift the offsets (the fuzzer found it).
	find(asciiLower(b), asciiLower(token))
	return spans
}

// asciiLower is b with A-Z in lower case, every other byte as is: same
// length, same offsets.
func asciiLower(b []byte) []byte {
	out := make([]byte, len(b))
	for i, c := range b {
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		out[i] = c
	}
	return out
}

// minCanaryForm is the shortest base64 part of a canary that counts:
// the egress proxy's placeholder minimum, for the same reason.
const minCanaryForm = 16

func overlaps(spans [][2]int, s, e int) bool {
	for _, c := range spans {
		if s < c[1] && c[0] < e {
			return true
		}
	}
	return false
}

// tokenChar reports whether c can be part of a base64, base64url or hex
// token.
func tokenChar(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=' || c == '_' || c == '-'
}

// tokenRuns are the maximal runs of token characters at least
// MinHighEntropy long. A base64 text wrapped at 76 columns is joined:
// a newline between two full-width runs continues the run.
func tokenRuns(b []byte) [][2]int {
	var runs [][2]int
	for i := 0; i < len(b); {
		if !tokenChar(b[i]) {
			i++
			continue
		}
		j := i
		for j < len(b) {
			if tokenChar(b[j]) {
				j++
				continue
			}
			// "\n" or "\r\n" inside a wrapped blob (lines of 60+).
			k := j
			if k < len(b) && b[k] == '\r' {
				k++
			}
			if k < len(b) && b[k] == '\n' && k+1 < len(b) && tokenChar(b[k+1]) && lineLen(b, j) >= 60 {
				j = k + 1
				continue
			}
			break
		}
		if j-i >= MinHighEntropy {
			runs = append(runs, [2]int{i, j})
		}
		i = j
	}
	return runs
}

// lineLen is the number of token characters before b[end] on its line.
func lineLen(b []byte, end int) int {
	n := 0
	for i := end - 1; i >= 0 && tokenChar(b[i]); i-- {
		n++
	}
	return n
}

// classifyRun says what kind of blob run is, or "" when it is benign.
func classifyRun(run []byte) string {
	clean := bytes.ReplaceAll(bytes.ReplaceAll(run, []byte("\n"), nil), []byte("\r"), nil)
	if isHex(clean) {
		if len(clean) >= MinHexBlob {
			return KindHexBlob
		}
		return ""
	}
	h := entropy(clean)
	if len(clean) >= MinBase64Blob && h >= MinBlobEntropy {
		return KindBase64Blob
	}
	if len(clean) < MinBase64Blob && mixed(clean) && h >= MinTokenEntropy {
		return KindHighEntropy
	}
	return ""
}

// digestSizes are the hash algorithms whose digests tools write with
// their name as a label, and each digest's size in bytes: pip's wheel
// RECORD ("sha256=" and 43 base64url characters, PEP 376), npm's
// integrity ("sha512-" and 88 base64 characters, Subresource
// Integrity), pip's --hash and OCI digests ("sha256:" and 64 hex
// digits). Random base64 of a digest's length is a high-entropy token
// to classifyRun, and a pip install in a sandbox wrote dozens of them.
var digestSizes = map[string]int{
	"md5":    16,
	"sha1":   20,
	"sha224": 28,
	"sha256": 32,
	"sha384": 48,
	"sha512": 64,
}

// labelledDigest reports whether the run b[s:e] is a digest labelled
// with its algorithm: "ALG=" or "ALG-" at the start of the run, or
// "ALG:" just before it, and then exactly the digest's size in hex,
// base64 or base64url (padded or not). Nothing else is exempt: the
// same characters one longer, or without the label, are still a
// finding. The exemption costs little: a digest's bytes carry at most
// its size, findings other than canaries are a report, and canaries are
// found before this (in any form, labelled or not).
func labelledDigest(b []byte, s, e int) bool {
	run := b[s:e]
	for alg, size := range digestSizes {
		for _, sep := range []byte{'=', '-'} {
			if len(run) > len(alg)+1 && string(run[:len(alg)]) == alg && run[len(alg)] == sep {
				return isDigest(run[len(alg)+1:], size)
			}
		}
		// "ALG:" before the run, not the end of a longer word
		// ("xsha256:").
		if l := len(alg) + 1; s >= l && string(b[s-l:s-1]) == alg && b[s-1] == ':' &&
			(s == l || !isAlnum(b[s-l-1])) {
			return isDigest(run, size)
		}
	}
	return false
}

// isDigest reports whether d is exactly size bytes in hex, or in
// base64 or base64url, padded or not.
func isDigest(d []byte, size int) bool {
	if len(d) == 2*size && isHex(d) {
		return true
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		if len(d) != enc.EncodedLen(size) {
			continue
		}
		if n, err := enc.Strict().Decode(make([]byte, enc.DecodedLen(len(d))), d); err == nil && n == size {
			return true
		}
	}
	return false
}

func isAlnum(c byte) bool {
	return c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
}

func isHex(b []byte) bool {
	for _, c := range b {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			return false
		}
	}
	return true
}

// mixed reports whether b has upper case, lower case and digits, and
// changes between those classes at least minClassChanges of the time: a
// random token does (about 0.6 for [A-Za-z0-9]), while an identifier
// ("FactoryBean2"), a word or a path changes class only at its word
// boundaries.
func mixed(b []byte) bool {
	class := func(c byte) int {
		switch {
		case c >= 'A' && c <= 'Z':
			return 1
		case c >= 'a' && c <= 'z':
			return 2
		case c >= '0' && c <= '9':
			return 3
		}
		return 0
	}
	var seen [4]bool
	changes := 0
	for i, c := range b {
		seen[class(c)] = true
		if i > 0 && class(c) != class(b[i-1]) {
			changes++
		}
	}
	return seen[1] && seen[2] && seen[3] && float64(changes) >= minClassChanges*float64(len(b)-1)
}

// minClassChanges: see mixed.
const minClassChanges = 0.5

// entropy is the Shannon entropy of b's bytes, in bits per byte.
func entropy(b []byte) float64 {
	if len(b) == 0 {
		return 0
	}
	var n [256]int
	for _, c := range b {
		n[c]++
	}
	h := 0.0
	for _, k := range n {
		if k > 0 {
			p := float64(k) / float64(len(b))
			h -= p * math.Log2(p)
		}
	}
	return h
}

// preview is a redacted hint of a match: its first four bytes (escaped
// if they are not printable) and its length, never the rest.
func preview(m []byte) string {
	n := 4
	if len(m) < 12 {
		n = len(m) / 3
	}
	return fmt.Sprintf("%s…(%d bytes)", Display(string(m[:n])), len(m))
}

// Secret is a real secret value Moat knows (a manifest secret resolved
// from the host's store), for Redact.
type Secret struct {
	Name, Value string
}

// minRedact is the shortest value Redact replaces: a shorter one would
// replace ordinary text by chance (and say what the secret is).
const minRedact = 8

// Redact replaces every occurrence of a secret's value in b with a
// notice naming the secret, and returns the findings of where (offsets
// into b as it was). The program never holds these values (only
// placeholders); a value in output means a destination echoed it or
// Moat has a bug, and it must not reach whoever reads the output.
func Redact(b []byte, where string, secrets []Secret) ([]byte, []result.Finding) {
	var found []result.Finding
	type hit struct {
		s, e int
		name string
	}
	var hits []hit
	for _, s := range secrets {
		if len(s.Value) < minRedact {
			continue
		}
		v := []byte(s.Value)
		for i := 0; ; {
			j := bytes.Index(b[i:], v)
			if j < 0 {
				break
			}
			hits = append(hits, hit{i + j, i + j + len(v), s.Name})
			i += j + len(v)
		}
	}
	if len(hits) == 0 {
		return b, nil
	}
	sort.Slice(hits, func(i, j int) bool { return hits[i].s < hits[j].s })
	out := make([]byte, 0, len(b))
	last := 0
	for _, h := range hits {
		if h.s < last {
			continue // overlapping values: the first one wins
		}
		out = append(out, b[last:h.s]...)
		out = append(out, "[moat: secret "+h.name+" redacted]"...)
		found = append(found, result.Finding{Kind: KindSecretValue, Where: where, Offset: int64(h.s), Length: h.e - h.s, Preview: "secret " + h.name})
		last = h.e
	}
	out = append(out, b[last:]...)
	return out, found
}

// Canaries are one run's planted decoys: credentials that look real, are
// unique to the run and work nowhere, so that seeing one anywhere
// outside the sandbox proves the program read and sent it.
type Canaries struct {
	// Env are variables set for the program.
	Env map[string]string
	// Files are planted in the workspace (paths relative to it).
	Files map[string][]byte
	// Tokens are the strings whose presence, in any encoded form,
	// flags the run; every decoy above contains at least one.
	Tokens []string
}

const (
	upperDigits = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
	alnum       = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
)

// randomString is n characters of alphabet from crypto/rand.
func randomString(alphabet string, n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("canary: read random: %w", err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b), nil
}

// NewCanaries makes a fresh set of decoys: an AWS-style key pair, a
// GitHub-style token, an SSH private key, a .netrc password. Every token
// is made of [A-Za-z0-9] only, so it reads the same raw, in a URL, a
// header and JSON, and the egress proxy can treat it as it treats a
// placeholder.
func NewCanaries() (*Canaries, error) {
	var r [5]string
	var err error
	for i, spec := range []struct {
		alpha string
		n     int
	}{{upperDigits, 16}, {alnum, 40}, {alnum, 36}, {alnum, 68}, {alnum, 32}} {
		if r[i], err = randomString(spec.alpha, spec.n); err != nil {
			return nil, err
		}
	}
	awsID, awsSecret, gh, sshLine, netrc := "AKIA"+r[0], r[1], "ghp_"+r[2], "b3BlbnNzaC1rZXktdjE"+r[3], r[4]
	c := &Canaries{
		Env: map[string]string{
			"AWS_ACCESS_KEY_ID":     awsID,
			"AWS_SECRET_ACCESS_KEY": awsSecret,
			"GITHUB_TOKEN":          gh,
		},
		Files: map[string][]byte{
			".aws/credentials":     []byte("[default]\naws_access_key_id = " + awsID + "\naws_secret_access_key = " + awsSecret + "\n"),
			".ssh/id_ed25519":      []byte("-----BEGIN OPENSSH PRIVATE KEY-----\n" + sshLine + "\n-----END OPENSSH PRIVATE KEY-----\n"),
			".netrc":               []byte("machine github.com login moat-ci password " + netrc + "\n"),
			".config/gh/hosts.yml": []byte("github.com:\n    oauth_token: " + gh + "\n    user: moat-ci\n"),
		},
		Tokens: []string{awsID, awsSecret, gh, sshLine, netrc},
	}
	return c, nil
}
