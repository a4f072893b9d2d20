package redteam

import (
	"crypto/x509"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/moat-sandbox/moat/egress"
	"github.com/moat-sandbox/moat/result"
)

func TestSecretStore(t *testing.T) {
	st, err := NewSecretStore()
	if err != nil {
		t.Fatal(err)
	}
	name, value := st.bind()
	name2, value2 := st.bind()
	tests := []struct {
		name    string
		lookup  string
		want    string
		wantErr bool
	}{
		{name: "a bound secret has its value", lookup: name, want: value},
		{name: "each bind is its own secret", lookup: name2, want: value2},
		{name: "an unknown name is refused", lookup: "rt-000000000000", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := st.Value(tc.lookup)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("Value(%q) = %q, %v; want %q, error %v", tc.lookup, got, err, tc.want, tc.wantErr)
			}
			if err != nil && (strings.Contains(err.Error(), value) || strings.Contains(err.Error(), value2)) {
				t.Fatalf("the error holds a value: %v", err)
			}
		})
	}
	if name == name2 || value == value2 || !strings.HasPrefix(value, secretValuePrefix) || !egress.ValidSecretName(name) {
		t.Errorf("bind made %q=%q and %q=%q: want distinct valid names and values with the prefix", name, value, name2, value2)
	}
	st.forget(name)
	if _, err := st.Value(name); err == nil {
		t.Errorf("a forgotten secret still has a value")
	}
	// The proxy verifies the test API with RootCAs: the certificate must
	// verify for the names the cases dial.
	for _, host := range []string{"localhost", "127.0.0.1"} {
		if _, err := st.cert.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: st.RootCAs()}); err != nil {
			t.Errorf("the test API's certificate does not verify for %s: %v", host, err)
		}
	}
}

// TestSecretJudgement: the judgement of the secret cases fails when the
// real value reaches the attacker or the result, when the placeholder
// passed where it must be refused, and when the control (the bound API
// received the value) or the refusals are missing.
func TestSecretJudgement(t *testing.T) {
	const value = secretValuePrefix + "00112233445566778899aabbccddeeff"
	const ph = egress.PlaceholderPrefix + "rt-abc-0123456789abcdef0123456789abcdef"
	refused := []result.NetworkAttempt{{Host: "localhost", Port: 1, Reason: egress.ReasonSecretExfiltration}}
	viol := []result.Violation{{Kind: result.ViolationSecretExfiltration}}
	good := func() *secretRun {
		return &secretRun{
			res:   &result.Result{Stdout: result.Stream{Data: "placeholder " + ph + "\n"}, Network: refused, Violations: viol},
			value: value, ph: ph, api: &secretAPI{auths: []string{"Bearer " + value}},
		}
	}
	tests := []struct {
		name   string
		change func(*secretRun)
		forms  []string
		want   string
	}{
		{name: "refused, logged, violation, control worked", change: func(*secretRun) {}, want: Contained},
		{name: "the attacker received the value", change: func(s *secretRun) {
			s.attacker = []string{"GET / HTTP/1.1\r\nAuthorization: Bearer " + value + "\r\n\r\n"}
		}, want: Escaped},
		{name: "the attacker received the value percent-encoded", change: func(s *secretRun) {
			s.attacker = []string{"GET /" + strings.ReplaceAll(value, "-", "%2D") + " HTTP/1.1\r\n\r\n"}
		}, want: Escaped},
		{name: "the program printed the value", change: func(s *secretRun) { s.res.Stdout.Data += "found " + value }, want: Escaped},
		{name: "the placeholder passed to the attacker", change: func(s *secretRun) { s.attacker = []string{"GET /" + ph + " HTTP/1.1\r\n\r\n"} }, want: Escaped},
		{name: "a base64 form passed to the attacker", change: func(s *secretRun) {
			s.attacker = []string{"POST / HTTP/1.1\r\n\r\n" + base64.StdEncoding.EncodeToString([]byte("x"+ph))}
		}, forms: secretB64Forms(ph), want: Escaped},
		{name: "the bound API never got the value", change: func(s *secretRun) { s.api.auths = []string{"Bearer " + ph} }, want: Error},
		{name: "no placeholder printed", change: func(s *secretRun) { s.ph = "" }, want: Error},
		{name: "nothing refused", change: func(s *secretRun) { s.res.Network = nil }, want: Error},
		{name: "no violation", change: func(s *secretRun) { s.res.Violations = nil }, want: Error},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := good()
			tc.change(s)
			forms := tc.forms
			if forms == nil {
				forms = []string{ph}
			}
			got, ev, _ := judgeRefused(s, forms, 1, "test")
			if got != tc.want {
				t.Fatalf("verdict %s (%s), want %s", got, ev, tc.want)
			}
			if strings.Contains(ev, value) {
				t.Fatalf("the evidence quotes the value: %s", ev)
			}
		})
	}
}
