package e2b

import (
	"bytes"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
)

// signedQuery is the query the SDK's downloadUrl/uploadUrl build for path,
// operation and user with token, expiring at exp (zero: never).
func signedQuery(path, operation, user, token string, exp time.Time) url.Values {
	q := url.Values{}
	if path != "" {
		q.Set("path", path)
	}
	if user != "" {
		q.Set("username", user)
	}
	e := ""
	if !exp.IsZero() {
		e = strconv.FormatInt(exp.Unix(), 10)
		q.Set(sigExpParam, e)
	}
	q.Set(sigParam, fileSignature(path, operation, user, token, e))
	return q
}

// TestFileSignatureMatchesSDK pins the signature to what e2b JS 2.51.0's
// getSignature returns for the same inputs (run with node against the
// cached SDK; the second at Date.now = 1699999940 s, expiring in 60 s).
func TestFileSignatureMatchesSDK(t *testing.T) {
	tests := []struct {
		name, path, op, user, token, exp, want string
	}{
		{"no user, no expiration", "hello.txt", "read", "", "tok", "", "v1_dEkXrS/Y6p/Op9rMpEpzXeRJ5bBL0LYkjrRJr9/Zz44"},
		{"user and expiration", "/home/user/a b.txt", "write", "user", "tok", "1700000000", "v1_hlI+3cdDzgRfTtbK586duwtISc5AdkHh71izK3Kkaf8"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := fileSignature(tc.path, tc.op, tc.user, tc.token, tc.exp); got != tc.want {
				t.Errorf("got %s, want the SDK's %s", got, tc.want)
			}
		})
	}
}

// TestSignedURLs: a signed URL stands in for the access token on /files,
// for its one path, operation and user, until it expires, in both
// addressing modes; anything else is 401.
func TestSignedURLs(t *testing.T) {
	e := newEnv(t)
	a := e.create(keyA, `{"templateID":"base","secure":true}`)
	other := e.create(keyB, `{"templateID":"base"}`)
	resp, body := e.do("POST", "/files?path=secret.txt", map[string]string{"E2b-Sandbox-Id": a.SandboxID, "X-Access-Token": a.EnvdAccessToken, "Content-Type": "application/octet-stream"}, strings.NewReader("s3cret"))
	if resp.StatusCode != 200 {
		t.Fatalf("upload with token: %d %s", resp.StatusCode, body)
	}
	host := map[string]string{"Host": "49983-" + a.SandboxID + ".moat.test"}
	none := map[string]string{}
	future, past := time.Now().Add(time.Hour), time.Now().Add(-time.Minute)
	tamper := func(q url.Values) url.Values {
		s := []byte(q.Get(sigParam))
		s[5] ^= 1
		q.Set(sigParam, string(s))
		return q
	}
	withExp := func(q url.Values, exp string) url.Values { q.Set(sigExpParam, exp); return q }
	tests := []struct {
		name   string
		method string
		hdr    map[string]string
		q      url.Values
		body   string
		want   int
	}{
		{"read, host mode", "GET", host, signedQuery("secret.txt", "read", "", a.EnvdAccessToken, time.Time{}), "", 200},
		{"read, path mode", "GET", none, signedQuery("secret.txt", "read", "", a.EnvdAccessToken, time.Time{}), "", 200},
		{"read, header mode", "GET", map[string]string{"E2b-Sandbox-Id": a.SandboxID}, signedQuery("secret.txt", "read", "", a.EnvdAccessToken, time.Time{}), "", 200},
		{"read with user, not expired", "GET", host, signedQuery("/home/user/secret.txt", "read", "user", a.EnvdAccessToken, future), "", 200},
		{"expired, host mode", "GET", host, signedQuery("secret.txt", "read", "", a.EnvdAccessToken, past), "", 401},
		{"expired, path mode", "GET", none, signedQuery("secret.txt", "read", "", a.EnvdAccessToken, past), "", 401},
		{"expiration moved later", "GET", host, withExp(signedQuery("secret.txt", "read", "", a.EnvdAccessToken, past), strconv.FormatInt(future.Unix(), 10)), "", 401},
		{"expiration not a number", "GET", host, withExp(signedQuery("secret.txt", "read", "", a.EnvdAccessToken, time.Time{}), "soon"), "", 401},
		{"wrong path", "GET", host, func() url.Values {
			q := signedQuery("other.txt", "read", "", a.EnvdAccessToken, time.Time{})
			q.Set("path", "secret.txt")
			return q
		}(), "", 401},
		{"wrong operation", "GET", host, func() url.Values {
			return signedQuery("secret.txt", "write", "", a.EnvdAccessToken, time.Time{})
		}(), "", 401},
		{"wrong user", "GET", host, func() url.Values {
			q := signedQuery("secret.txt", "read", "user", a.EnvdAccessToken, time.Time{})
			q.Del("username")
			return q
		}(), "", 401},
		{"tampered", "GET", host, tamper(signedQuery("secret.txt", "read", "", a.EnvdAccessToken, time.Time{})), "", 401},
		{"tampered, path mode", "GET", none, tamper(signedQuery("secret.txt", "read", "", a.EnvdAccessToken, time.Time{})), "", 401},
		{"another sandbox's token", "GET", host, signedQuery("secret.txt", "read", "", other.EnvdAccessToken, time.Time{}), "", 401},
		{"missing signature and token", "GET", host, url.Values{"path": {"secret.txt"}}, "", 401},
		{"missing signature, path mode", "GET", none, url.Values{"path": {"secret.txt"}}, "", 401},
		{"missing signature, path mode, upload", "POST", none, url.Values{"path": {"secret.txt"}}, "overwritten", 401},
		{"empty signature", "GET", host, url.Values{"path": {"secret.txt"}, sigParam: {""}}, "", 401},
		{"read signature used to write", "POST", host, signedQuery("secret.txt", "read", "", a.EnvdAccessToken, time.Time{}), "overwritten", 401},
		{"write, host mode", "POST", host, signedQuery("up.txt", "write", "", a.EnvdAccessToken, future), "uploaded", 200},
		{"write, path mode", "POST", none, signedQuery("up2.txt", "write", "", a.EnvdAccessToken, time.Time{}), "uploaded", 200},
		{"write, expired", "POST", host, signedQuery("up3.txt", "write", "", a.EnvdAccessToken, past), "uploaded", 401},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hdr := map[string]string{}
			for k, v := range tc.hdr {
				hdr[k] = v
			}
			var body io.Reader
			if tc.method == "POST" {
				hdr["Content-Type"] = "application/octet-stream"
				body = strings.NewReader(tc.body)
			}
			resp, got := e.do(tc.method, "/files?"+tc.q.Encode(), hdr, body)
			if resp.StatusCode != tc.want {
				t.Fatalf("status %d (%s), want %d", resp.StatusCode, got, tc.want)
			}
			if tc.want != 200 {
				wantE2BError(t, tc.name, resp.StatusCode, got, tc.want)
				return
			}
			if tc.method == "GET" && string(got) != "s3cret" {
				t.Errorf("downloaded %q", got)
			}
			if tc.method == "POST" {
				resp, got := e.do("GET", "/files?path="+url.QueryEscape(tc.q.Get("path")), envdHeaders(a), nil)
				if resp.StatusCode != 200 || string(got) != tc.body {
					t.Errorf("after a signed upload the file reads %d %q, want %q", resp.StatusCode, got, tc.body)
				}
			}
		})
	}
	t.Run("a file was not overwritten by a refused upload", func(t *testing.T) {
		resp, got := e.do("GET", "/files?path=secret.txt", envdHeaders(a), nil)
		if resp.StatusCode != 200 || string(got) != "s3cret" {
			t.Errorf("secret.txt reads %d %q", resp.StatusCode, got)
		}
	})
	t.Run("a signed upload writes its path only", func(t *testing.T) {
		var mp bytes.Buffer
		mw := multipart.NewWriter(&mp)
		for _, name := range []string{"mine.txt", "elsewhere.txt"} {
			w, _ := mw.CreateFormFile("file", name)
			io.WriteString(w, "x")
		}
		mw.Close()
		q := signedQuery("mine.txt", "write", "", a.EnvdAccessToken, time.Time{})
		resp, got := e.do("POST", "/files?"+q.Encode(), map[string]string{"Host": host["Host"], "Content-Type": mw.FormDataContentType()}, &mp)
		if resp.StatusCode != 403 {
			t.Errorf("second part to another path: %d %s, want 403", resp.StatusCode, got)
		}
		if resp, _ := e.do("GET", "/files?path=elsewhere.txt", envdHeaders(a), nil); resp.StatusCode != 404 {
			t.Errorf("elsewhere.txt: %d, want 404 (not written)", resp.StatusCode)
		}
	})
	t.Run("a killed sandbox's signed URL", func(t *testing.T) {
		q := signedQuery("secret.txt", "read", "", a.EnvdAccessToken, time.Time{})
		if status, body := e.control("DELETE", "/sandboxes/"+a.SandboxID, keyA, ""); status != 204 {
			t.Fatalf("kill: %d %s", status, body)
		}
		for _, hdr := range []map[string]string{host, none} {
			if resp, got := e.do("GET", "/files?"+q.Encode(), hdr, nil); resp.StatusCode == 200 {
				t.Errorf("%v: %d %s after kill", hdr, resp.StatusCode, got)
			}
		}
	})
}

// FuzzCheckSignature: whatever the query and method, a request is
// accepted only with the signature of its own path, operation, user and
// expiration under the token, and never after it expired.
func FuzzCheckSignature(f *testing.F) {
	now := time.Unix(1_700_000_000, 0)
	f.Add(signedQuery("a.txt", "read", "", "tok", time.Time{}).Encode(), "GET")
	f.Add(signedQuery("/home/user/a b.txt", "write", "user", "tok", now.Add(time.Minute)).Encode(), "POST")
	f.Add(signedQuery("a.txt", "read", "", "tok", now.Add(-time.Minute)).Encode(), "GET")
	f.Add("path=a.txt&signature=v1_&signature_expiration=-1", "GET")
	f.Add("signature=%00&path=%2e%2e", "DELETE")
	f.Fuzz(func(t *testing.T, query, method string) {
		r := &http.Request{Method: method, URL: &url.URL{Path: "/files", RawQuery: query}}
		if checkSignature(r, "tok", now) != "" {
			return
		}
		q := r.URL.Query()
		if q.Get(sigParam) != fileSignature(q.Get("path"), signedOperation(method), q.Get("username"), "tok", q.Get(sigExpParam)) {
			t.Fatalf("accepted %q %s without its signature", query, method)
		}
		if q.Has(sigExpParam) {
			exp, err := strconv.ParseInt(q.Get(sigExpParam), 10, 64)
			if err != nil || exp < now.Unix() {
				t.Fatalf("accepted %q with expiration %q at %d", query, q.Get(sigExpParam), now.Unix())
			}
		}
	})
}
