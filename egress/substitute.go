package egress

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"

	"github.com/moat-sandbox/moat/output"
)

// Placeholder substitution and scrubbing (issue 20 §1). Everything here
// works on bytes the sandbox sent or a destination answered: bounded,
// streaming, and never putting a secret's value into an error.

// errExfiltration is returned by a scan that found a placeholder where
// it may not go. It names no secret and no value.
var errExfiltration = errors.New("a secret's placeholder where its binding does not allow it")

// secretSet is the compiled form of Policy.Secrets.
type secretSet struct {
	bindings []secretBinding
	// detect are the forms of every placeholder the proxy recognises
	// (raw, base64, base64url, hex), for refusing them where they may
	// not go; detectLower the same in lower case, for host names.
	detect      [][]byte
	detectLower [][]byte
	// fold are the placeholders in lower case: the raw placeholder is
	// also recognised with its letters in any case (an encoder or a
	// program may change it), where base64 forms cannot be folded.
	fold [][]byte
	// canaryLower are the forms of the run's canaries (Policy.Canaries)
	// in lower case; they are also in detect and fold, so a canary is
	// refused everywhere as a placeholder bound nowhere is. canarySeen
	// records that a check found one (Proxy.CanarySeen).
	canaryLower [][]byte
	canarySeen  atomic.Bool
}

type secretBinding struct {
	SecretBinding
	rules []Rule
}

// minPlaceholder is the shortest placeholder the proxy accepts: shorter
// ones would match ordinary bytes by chance (and are not what
// NewPlaceholder makes).
const minPlaceholder = 16

func compileSecrets(bs []SecretBinding) *secretSet { return compileGuarded(bs, nil) }

// compileGuarded is compileSecrets with the run's canaries.
func compileGuarded(bs []SecretBinding, canaries []string) *secretSet {
	if len(bs) == 0 && len(canaries) == 0 {
		return nil
	}
	s := &secretSet{}
	for _, c := range canaries {
		if len(c) < minPlaceholder || !placeholderChars(c) {
			continue // Validate reports it
		}
		// A canary binds nothing and goes nowhere: its forms are
		// refused in every request, host name and body.
		s.fold = append(s.fold, bytes.ToLower([]byte(c)))
		for _, f := range encodedForms([]byte(c)) {
			s.detect = append(s.detect, f)
			s.detectLower = append(s.detectLower, bytes.ToLower(f))
			s.canaryLower = append(s.canaryLower, bytes.ToLower(f))
		}
	}
	for _, b := range bs {
		if len(b.Placeholder) < minPlaceholder || b.Value == "" || !placeholderChars(b.Placeholder) {
			// Validate reports it; an unusable binding binds nothing
			// and its placeholder is still refused where it is seen.
			b.Value = ""
		}
		sb := secretBinding{SecretBinding: b}
		for _, r := range b.Hosts {
			if cr, ok := compileRule(r); ok {
				sb.rules = append(sb.rules, cr)
			}
		}
		s.bindings = append(s.bindings, sb)
		if b.Placeholder != "" {
			s.fold = append(s.fold, bytes.ToLower([]byte(b.Placeholder)))
			for _, f := range encodedForms([]byte(b.Placeholder)) {
				s.detect = append(s.detect, f)
				s.detectLower = append(s.detectLower, bytes.ToLower(f))
			}
		}
	}
	return s
}

// placeholderChars reports whether p is made of [A-Za-z0-9-_] only: such
// a token reads the same raw, percent-encoded or not, in a header, a URL
// and a JSON string.
func placeholderChars(p string) bool {
	for i := 0; i < len(p); i++ {
		c := p[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// encodedForms are the forms of a placeholder the proxy recognises
// (output.EncodedForms, the one owner of that rule).
func encodedForms(p []byte) [][]byte { return output.EncodedForms(p, minPlaceholder) }

// inName reports whether a host name, as the sandbox wrote it, carries a
// placeholder: asking the resolver for it would carry the placeholder off
// the host (DNS exfiltration). Names are case-insensitive.
func (s *secretSet) inName(host string) bool {
	if s == nil {
		return false
	}
	h := []byte(strings.ToLower(host))
	s.noteCanary(h)
	for _, f := range s.detectLower {
		if bytes.Contains(h, f) {
			return true
		}
	}
	return false
}

// contains reports whether b carries any placeholder in any form.
func (s *secretSet) contains(b []byte) bool {
	if s == nil {
		return false
	}
	for _, f := range s.detect {
		if bytes.Contains(b, f) {
			s.noteCanary(bytes.ToLower(b))
			return true
		}
	}
	lower := bytes.ToLower(b)
	s.noteCanary(lower)
	for _, f := range s.fold {
		if bytes.Contains(lower, f) {
			return true
		}
	}
	return false
}

// noteCanary records whether lower (bytes in lower case) carries one of
// the run's canaries.
func (s *secretSet) noteCanary(lower []byte) {
	for _, f := range s.canaryLower {
		if bytes.Contains(lower, f) {
			s.canarySeen.Store(true)
			return
		}
	}
}

func (s *secretSet) containsString(v string) bool { return s.contains([]byte(v)) }

// bound returns the bindings whose hosts include host:port.
func (s *secretSet) bound(host string, port int) []*secretBinding {
	if s == nil {
		return nil
	}
	var out []*secretBinding
	for i := range s.bindings {
		b := &s.bindings[i]
		if b.Value == "" {
			continue
		}
		for _, r := range b.rules {
			if r.matches(host, port) {
				out = append(out, b)
				break
			}
		}
	}
	return out
}

// substitution is what rewriteRequest did to one request.
type substitution struct {
	used []string // names of the secrets put into it
	// body is true when the body must go through a replacer (some
	// binding in scope has Body set).
	body []*secretBinding
	// scrub are the credentials the proxy itself encoded with a value
	// (Basic), each mapped back to what the program sent: an answer that
	// echoes the header gets the program's own credential back, not the
	// value in base64.
	scrub []replacement
}

// rewriteRequest replaces placeholders in req by their values where the
// bindings in bs allow it (header, path prefix, query), and refuses the
// request if any placeholder, in any recognised form, is left in its
// target or headers: a placeholder outside its binding's scope is an
// attempt to move the value somewhere the manifest did not say (into a
// URL the destination logs or publishes, a header it echoes). bs is empty
// for a host no secret is bound to: then any placeholder is refused.
func (s *secretSet) rewriteRequest(req *http.Request, bs []*secretBinding) (substitution, error) {
	var sub substitution
	if s == nil {
		return sub, nil
	}
	used := map[string]bool{}
	path := req.URL.EscapedPath()
	for _, b := range bs {
		if b.PathPrefix != "" && !pathUnder(req.URL.Path, b.PathPrefix) {
			continue
		}
		ph := b.Placeholder
		for name, vs := range req.Header {
			if b.Header != "" && !strings.EqualFold(name, b.Header) {
				continue
			}
			for i, v := range vs {
				nv, back := replaceHeaderValue(v, ph, b.Value)
				if nv != v {
					vs[i] = nv
					used[b.Name] = true
				}
				if back != nil {
					sub.scrub = append(sub.scrub, *back)
				}
			}
		}
		if b.Query && strings.Contains(req.URL.RawQuery, ph) {
			req.URL.RawQuery = strings.ReplaceAll(req.URL.RawQuery, ph, b.Value)
			used[b.Name] = true
		}
		if b.Body {
			sub.body = append(sub.body, b)
		}
	}
	// What is left must carry no placeholder. The target is checked as
	// sent and percent-decoded, so %6Doat... does not slip past.
	target := path + "?" + req.URL.RawQuery
	if s.containsString(target) || s.containsString(unescapeLoose(target)) || s.containsString(req.URL.Fragment) {
		return sub, errExfiltration
	}
	for name, vs := range req.Header {
		if s.containsString(name) {
			return sub, errExfiltration
		}
		for _, v := range vs {
			if s.containsString(v) || s.containsString(unescapeLoose(v)) || s.basicContains(v) {
				return sub, errExfiltration
			}
		}
	}
	if s.containsString(req.Host) {
		return sub, errExfiltration
	}
	for _, b := range bs {
		if used[b.Name] {
			sub.used = append(sub.used, b.Name)
		}
	}
	return sub, nil
}

// maxScrubCredential bounds a Basic credential the proxy maps back in
// answers (the stream replacer holds back as many bytes).
const maxScrubCredential = 8 << 10

// replaceHeaderValue replaces ph by val in a header value, and inside the
// credentials of "Basic <base64>" (RFC 7617), where the placeholder is
// the user or the password of an HTTP basic credential. For a Basic
// credential it also returns the replacement that turns the encoded
// credential it made back into the one the program sent: the value is in
// it, base64-encoded, and a destination that echoes the header must not
// hand it to the sandbox.
func replaceHeaderValue(v, ph, val string) (string, *replacement) {
	v = strings.ReplaceAll(v, ph, val)
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return v, nil
	}
	cred = strings.TrimSpace(cred)
	raw, err := base64.StdEncoding.DecodeString(cred)
	if err != nil || !bytes.Contains(raw, []byte(ph)) {
		return v, nil
	}
	enc := base64.StdEncoding.EncodeToString(bytes.ReplaceAll(raw, []byte(ph), []byte(val)))
	var back *replacement
	if len(enc) <= maxScrubCredential {
		back = &replacement{old: []byte(enc), new: []byte(cred)}
	}
	return scheme + " " + enc, back
}

// basicContains reports whether a Basic credential decodes to bytes that
// carry a placeholder (the base64 forms catch most, not a short one at
// the very start or end of the credential).
func (s *secretSet) basicContains(v string) bool {
	scheme, cred, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	return err == nil && s.contains(raw)
}

// pathUnder reports whether path is prefix or below it, on a segment
// boundary when prefix does not end in "/": "/v1" covers "/v1" and
// "/v1/x", not "/v10". Dot segments are refused: "/v1/../admin" is not
// under "/v1" whatever the destination makes of it.
func pathUnder(path, prefix string) bool {
	for _, seg := range strings.Split(path, "/") {
		if seg == "." || seg == ".." {
			return false
		}
	}
	if !strings.HasPrefix(path, prefix) {
		return false
	}
	return strings.HasSuffix(prefix, "/") || len(path) == len(prefix) || path[len(prefix)] == '/' || path[len(prefix)] == '?'
}

func unescapeLoose(s string) string {
	if u, err := url.QueryUnescape(s); err == nil {
		return u
	}
	if u, err := url.PathUnescape(s); err == nil {
		return u
	}
	return s
}

// replacement is one pattern a streamReplacer acts on: old is replaced by
// new, or, when refuse is set, ends the stream with errExfiltration
// before any byte of it is passed on.
type replacement struct {
	old, new []byte
	refuse   bool
	// seen, when set, is stored true when this refused pattern is met
	// (a canary's: secretSet.canarySeen).
	seen *atomic.Bool
}

// streamReplacer reads r and returns its bytes with every pattern acted
// on, however the occurrences are split across reads: it holds back the
// last longest-pattern-minus-one bytes until more arrive, so a pattern
// never leaves in two pieces. The earliest occurrence wins; at one
// position the first pattern in the list.
type streamReplacer struct {
	r       io.Reader
	pats    []replacement
	hold    int    // longest pattern - 1
	buf     []byte // read, not yet decided
	out     []byte // decided, not yet returned
	err     error  // from r, returned once buf and out are drained
	failed  error  // errExfiltration, returned at once
	scratch []byte
	hits    []int // replacements made, by pattern
}

// refused reports whether the stream met a refused pattern; nil-safe. Call
// it only once the stream's reader is done.
func (s *streamReplacer) refused() bool { return s != nil && s.failed != nil }

// replacedIn names the bindings whose placeholder (the first len(bs)
// patterns, requestBodyPatterns' order) the stream replaced.
func (s *streamReplacer) replacedIn(bs []*secretBinding) []string {
	if s == nil {
		return nil
	}
	var out []string
	for i, b := range bs {
		if i < len(s.hits) && s.hits[i] > 0 {
			out = append(out, b.Name)
		}
	}
	return out
}

// maxReplacerBuf bounds what a streamReplacer reads ahead.
const maxReplacerBuf = 32 << 10

func newStreamReplacer(r io.Reader, pats []replacement) *streamReplacer {
	h := 0
	for _, p := range pats {
		h = max(h, len(p.old)-1)
	}
	return &streamReplacer{r: r, pats: pats, hold: h, scratch: make([]byte, maxReplacerBuf), hits: make([]int, len(pats))}
}

func (s *streamReplacer) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if s.failed != nil {
			return 0, s.failed
		}
		if s.err != nil && len(s.buf) == 0 {
			return 0, s.err
		}
		if s.err == nil {
			n, err := s.r.Read(s.scratch)
			s.buf = append(s.buf, s.scratch[:n]...)
			if err != nil {
				s.err = err
			}
			if n == 0 && err == nil {
				continue
			}
		}
		s.decide(s.err != nil)
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	if len(s.out) == 0 {
		s.out = nil
	}
	return n, nil
}

// Close closes the underlying reader when it has a Close.
func (s *streamReplacer) Close() error {
	if c, ok := s.r.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// decide moves what can be decided from buf to out; at the end of the
// input (final) that is everything.
func (s *streamReplacer) decide(final bool) {
	for {
		at, which := -1, -1
		for i, p := range s.pats {
			if len(p.old) == 0 {
				continue
			}
			if j := bytes.Index(s.buf, p.old); j >= 0 && (at < 0 || j < at) {
				at, which = j, i
			}
		}
		if at < 0 {
			break
		}
		s.out = append(s.out, s.buf[:at]...)
		if s.pats[which].refuse {
			if s.pats[which].seen != nil {
				s.pats[which].seen.Store(true)
			}
			s.buf = nil
			s.failed = errExfiltration
			return
		}
		s.out = append(s.out, s.pats[which].new...)
		if which < len(s.hits) {
			s.hits[which]++
		}
		s.buf = s.buf[at+len(s.pats[which].old):]
	}
	// No whole pattern in buf: one could only begin in its last hold
	// bytes.
	safe := len(s.buf)
	if !final {
		safe = max(0, len(s.buf)-s.hold)
	}
	s.out = append(s.out, s.buf[:safe]...)
	s.buf = append([]byte(nil), s.buf[safe:]...)
}

// replaceAll is the reference the stream must agree with: the same rule
// applied to the whole input at once. It reports refusal as the stream
// does, with the output before the refused pattern.
func replaceAll(in []byte, pats []replacement) ([]byte, bool) {
	s := &streamReplacer{pats: pats, buf: append([]byte(nil), in...)}
	s.decide(true)
	return s.out, s.failed != nil
}

// scrubPatterns replace each bound secret's value by its placeholder in
// what a destination answers: a destination that echoes a credential
// (a debug endpoint, an error message) must not hand it to the sandbox.
func scrubPatterns(bs []*secretBinding) []replacement {
	var out []replacement
	for _, b := range bs {
		out = append(out, replacement{old: []byte(b.Value), new: []byte(b.Placeholder)})
	}
	return out
}

// requestBodyPatterns are the patterns of a request body to a host with
// bindings bs in scope: the placeholder of a binding with Body set is
// replaced by its value, every other recognised placeholder form refused.
func (s *secretSet) requestBodyPatterns(body []*secretBinding) []replacement {
	var out []replacement
	for _, b := range body {
		out = append(out, replacement{old: []byte(b.Placeholder), new: []byte(b.Value)})
	}
	canary := map[string]bool{}
	for _, f := range s.canaryLower {
		canary[string(f)] = true
	}
	for _, f := range s.detect {
		r := replacement{old: f, refuse: true}
		if canary[string(bytes.ToLower(f))] {
			r.seen = &s.canarySeen
		}
		out = append(out, r)
	}
	return out
}

// validateSecrets reports every binding the proxy could not honour. The
// value is never part of a message.
func validateSecrets(bs []SecretBinding) []error {
	var errs []error
	seen := map[string]bool{}
	for i, b := range bs {
		where := fmt.Sprintf("secrets[%d] %q", i, b.Name)
		if len(b.Placeholder) < minPlaceholder || !placeholderChars(b.Placeholder) {
			errs = append(errs, fmt.Errorf("%s: placeholder must be at least %d characters of [A-Za-z0-9_-]; make it with egress.NewPlaceholder", where, minPlaceholder))
		}
		if seen[b.Placeholder] {
			errs = append(errs, fmt.Errorf("%s: placeholder used by another secret; every secret needs its own", where))
		}
		seen[b.Placeholder] = true
		if b.Value == "" {
			errs = append(errs, fmt.Errorf("%s: empty value; give the secret a value on the host", where))
		}
		if b.Value != "" && strings.Contains(b.Value, b.Placeholder) {
			errs = append(errs, fmt.Errorf("%s: the value contains its own placeholder", where))
		}
		if len(b.Hosts) == 0 {
			errs = append(errs, fmt.Errorf("%s: no hosts; bind the secret to the hosts it is for", where))
		}
		for j, r := range b.Hosts {
			if _, ok := compileRule(r); !ok {
				errs = append(errs, fmt.Errorf("%s hosts[%d] %q: not a valid rule; build it with egress.ParseRule", where, j, r.String()))
			}
		}
		if b.Header != "" && strings.ContainsAny(b.Header, " :\r\n") {
			errs = append(errs, fmt.Errorf("%s: header %q is not a header name", where, b.Header))
		}
		if b.PathPrefix != "" && !strings.HasPrefix(b.PathPrefix, "/") {
			errs = append(errs, fmt.Errorf("%s: path prefix %q must start with /", where, b.PathPrefix))
		}
	}
	return errs
}

// maxBufferedBody is the largest request body read whole, through the
// patterns, before anything of the request goes out: a body refused for a
// placeholder then never reaches the destination, not even its header,
// and a body whose placeholder was replaced keeps an exact
// Content-Length. A larger body streams: its head may leave before a
// placeholder further on ends it (the placeholder itself never leaves).
const maxBufferedBody = 1 << 20

// checkedBody is a request body after prepareBody.
type checkedBody struct {
	rep     *streamReplacer
	body    io.ReadCloser
	length  int64 // -1: unknown, send chunked
	refused bool
}

// prepareBody runs a request body (of length n, -1 unknown) through
// the patterns for a request with the Body-scoped bindings sub.
func (s *secretSet) prepareBody(body io.ReadCloser, n int64, sub []*secretBinding) (checkedBody, error) {
	if s == nil || body == nil || body == http.NoBody || n == 0 {
		return checkedBody{body: body, length: n}, nil
	}
	rep := newStreamReplacer(body, s.requestBodyPatterns(sub))
	head, err := io.ReadAll(io.LimitReader(rep, maxBufferedBody+1))
	if rep.refused() {
		return checkedBody{rep: rep, refused: true}, nil
	}
	if err != nil {
		return checkedBody{}, err
	}
	if len(head) <= maxBufferedBody {
		return checkedBody{rep: rep, body: io.NopCloser(bytes.NewReader(head)), length: int64(len(head))}, nil
	}
	length := n
	if len(sub) > 0 {
		// A replaced placeholder may change the length.
		length = -1
	}
	return checkedBody{rep: rep, body: struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(head), rep), body}, length: length}, nil
}

// apply puts the checked body into req.
func (c checkedBody) apply(req *http.Request) {
	req.Body = c.body
	req.ContentLength = c.length
	req.TransferEncoding = nil
	if c.length < 0 {
		req.TransferEncoding = []string{"chunked"}
	}
}
