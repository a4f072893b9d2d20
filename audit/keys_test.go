package audit

import (
	"database/sql"
	"errors"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var tokenRE = regexp.MustCompile(`^moat_k[0-9a-f]{12}_[0-9a-f]{64}$`)

func TestKeyLifecycle(t *testing.T) {
	s := newStore(t)
	tok, k, err := s.CreateKey("agent-1", Quota{MaxSandboxes: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !tokenRE.MatchString(tok) {
		t.Fatalf("token %q does not have the form moat_k<12 hex>_<64 hex>", tok)
	}
	if !strings.HasPrefix(tok, "moat_"+k.ID+"_") {
		t.Errorf("token %q does not carry the key id %s", tok, k.ID)
	}
	if k.Quota != (Quota{MaxSandboxes: 3, CPUSecondsPerDay: DefaultQuota.CPUSecondsPerDay}) {
		t.Errorf("quota %+v: zero fields should take the defaults", k.Quota)
	}

	// The secret is not stored, only its hash.
	var stored []byte
	if err := s.r.QueryRow(`SELECT secret_sha256 FROM keys WHERE id = ?`, k.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if len(stored) != 32 || strings.Contains(string(stored), tok[len(tok)-64:]) {
		t.Errorf("stored secret column is %d bytes %x, want a 32-byte hash", len(stored), stored)
	}

	got, err := s.Authenticate(tok)
	if err != nil {
		t.Fatalf("authenticate a fresh key: %v", err)
	}
	if got.ID != k.ID || got.Name != "agent-1" || got.Quota != k.Quota || !got.Created.Equal(k.Created) || got.Revoked != nil {
		t.Errorf("authenticated as %+v, want %+v", got, k)
	}

	// A second key is independent.
	tok2, k2, err := s.CreateKey("agent-2", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	if k2.ID == k.ID || tok2 == tok {
		t.Fatal("two keys share an id or token")
	}

	tampered := []byte(tok)
	last := len(tampered) - 1
	if tampered[last] == '0' {
		tampered[last] = '1'
	} else {
		tampered[last] = '0'
	}
	swapped := "moat_" + k2.ID + tok[len("moat_")+13:] // key 2's id with key 1's secret
	for name, bad := range map[string]string{
		"tampered secret":             string(tampered),
		"another key's id":            swapped,
		"unknown id":                  "moat_k000000000000" + tok[len("moat_")+13:],
		"upper-case spelling":         strings.ToUpper(tok[:5]) + tok[5:],
		"upper-case hex":              tok[:len(tok)-64] + strings.ToUpper(tok[len(tok)-64:]),
		"empty":                       "",
		"prefix only":                 "moat_",
		"missing secret":              "moat_" + k.ID + "_",
		"short secret":                tok[:len(tok)-1],
		"long secret":                 tok + "0",
		"bearer prefix left in":       "Bearer " + tok,
		"trailing newline":            tok + "\n",
		"non-hex secret":              tok[:len(tok)-1] + "g",
		"wrong separator":             strings.Replace(tok, "_", "-", 1),
		"id without k":                "moat_x" + tok[len("moat_k"):],
		"NUL inside":                  tok[:20] + "\x00" + tok[21:],
		"multibyte of the same width": tok[:len(tok)-2] + "é",
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := s.Authenticate(bad); !errors.Is(err, ErrBadKey) {
				t.Errorf("Authenticate(%q) = %v, want ErrBadKey", bad, err)
			}
		})
	}

	if err := s.RevokeKey(k.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(tok); !errors.Is(err, ErrBadKey) {
		t.Errorf("a revoked key authenticated: %v", err)
	} else if err.Error() != ErrBadKey.Error() {
		t.Errorf("the refusal %q says more than ErrBadKey", err)
	}
	if _, err := s.Authenticate(tok2); err != nil {
		t.Errorf("revoking one key refused another: %v", err)
	}
	first, err := s.Key(k.ID)
	if err != nil || first.Revoked == nil {
		t.Fatalf("Key(%s) = %+v, %v; want it revoked", k.ID, first, err)
	}
	if err := s.RevokeKey(k.ID); err != nil {
		t.Errorf("revoking twice: %v", err)
	}
	again, _ := s.Key(k.ID)
	if again.Revoked == nil || !again.Revoked.Equal(*first.Revoked) {
		t.Errorf("revoking twice moved the revocation time from %v to %v", first.Revoked, again.Revoked)
	}
	err = s.RevokeKey("k0123456789ab")
	if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "k0123456789ab") {
		t.Errorf("revoking an unknown id: %v; want ErrNotFound naming it", err)
	}

	keys, err := s.Keys()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 2 || keys[0].ID != k.ID || keys[0].Revoked == nil || keys[1].ID != k2.ID || keys[1].Revoked != nil {
		t.Errorf("Keys() = %+v, want key 1 (revoked) then key 2", keys)
	}
}

func TestCreateKeyValidation(t *testing.T) {
	s := newStore(t)
	tests := []struct {
		name    string
		key     string
		quota   Quota
		wantErr string // "" means accepted
	}{
		{"plain", "agent-1", Quota{}, ""},
		{"spaces inside", "CI runner 7", Quota{}, ""},
		{"unicode", "équipe-données", Quota{}, ""},
		{"64 characters", strings.Repeat("é", 64), Quota{}, ""},
		{"explicit quota", "q", Quota{MaxSandboxes: 1, CPUSecondsPerDay: 0.5}, ""},
		{"empty", "", Quota{}, "empty"},
		{"65 characters", strings.Repeat("a", 65), Quota{}, "at most 64"},
		{"newline", "a\nb", Quota{}, "not printable"},
		{"escape sequence", "a\x1b[2Jb", Quota{}, "not printable"},
		{"bidi override", "abc\u202edef", Quota{}, "not printable"},
		{"tab", "a\tb", Quota{}, "not printable"},
		{"leading space", " a", Quota{}, "space"},
		{"invalid UTF-8", "a\xffb", Quota{}, "UTF-8"},
		{"negative sandboxes", "q", Quota{MaxSandboxes: -1}, "max_sandboxes"},
		{"huge sandboxes", "q", Quota{MaxSandboxes: MaxQuotaSandboxes + 1}, "max_sandboxes"},
		{"negative CPU", "q", Quota{CPUSecondsPerDay: -1}, "cpu_seconds_per_day"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tok, k, err := s.CreateKey(tc.key, tc.quota)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if k.Name != tc.key {
					t.Errorf("name %q, want %q", k.Name, tc.key)
				}
				if got, err := s.Authenticate(tok); err != nil || got.Name != tc.key {
					t.Errorf("authenticate: %+v, %v", got, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("CreateKey(%q, %+v) = %v, want an error saying %q", tc.key, tc.quota, err, tc.wantErr)
			}
			if tok != "" {
				t.Errorf("a refused key returned a token")
			}
		})
	}
}

// TestAdminKey: only keys created as admin keys say so, through every
// way a key is read, and keys of a database from before admin keys are
// tenants'.
func TestAdminKey(t *testing.T) {
	s := newStore(t)
	tenantTok, tenant, err := s.CreateKey("tenant", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	adminTok, admin, err := s.CreateAdminKey("monitoring", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		token string
		id    string
		want  bool
	}{
		{"tenant", tenantTok, tenant.ID, false},
		{"admin", adminTok, admin.ID, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, err := s.Authenticate(tc.token)
			if err != nil || a.Admin != tc.want {
				t.Errorf("Authenticate: admin %v, %v; want %v", a.Admin, err, tc.want)
			}
			k, err := s.Key(tc.id)
			if err != nil || k.Admin != tc.want {
				t.Errorf("Key: admin %v, %v; want %v", k.Admin, err, tc.want)
			}
		})
	}
	keys, err := s.Keys()
	if err != nil || len(keys) != 2 || keys[0].Admin || !keys[1].Admin {
		t.Errorf("Keys: %+v, %v", keys, err)
	}
}

func TestAdminKeyUpgrade(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`CREATE TABLE schema_version (version INTEGER NOT NULL) STRICT`,
		`INSERT INTO schema_version (version) VALUES (1)`,
		migrations[0],
		`INSERT INTO keys (id, name, secret_sha256, created, max_sandboxes, cpu_seconds_per_day) VALUES ('k000000000001', 'old', x'00', 0, 8, 36000)`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()
	s, err := Open(path)
	if err != nil {
		t.Fatalf("open a version-1 database: %v", err)
	}
	defer s.Close()
	if k, err := s.Key("k000000000001"); err != nil || k.Admin || k.Scope != "" {
		t.Errorf("a key from before admin keys: %+v, %v; want a tenant's full key", k, err)
	}
}

// TestScopedKey: a metrics key authenticates only through
// AuthenticateScope with its scope; Authenticate, which every front door
// uses, refuses it as it refuses an unknown key.
func TestScopedKey(t *testing.T) {
	s := newStore(t)
	fullTok, _, err := s.CreateKey("tenant", Quota{})
	if err != nil {
		t.Fatal(err)
	}
	metricsTok, metrics, err := s.CreateScopedKey("scraper", ScopeMetrics)
	if err != nil || metrics.Scope != ScopeMetrics || metrics.Admin {
		t.Fatalf("CreateScopedKey: %+v, %v", metrics, err)
	}
	if _, _, err := s.CreateScopedKey("x", "admin"); err == nil || !strings.Contains(err.Error(), `key scope "admin" is not one Moat knows; accepted: metrics`) {
		t.Errorf("an unknown scope: %v", err)
	}
	tests := []struct {
		name      string
		token     string
		scope     string // "": Authenticate
		wantErr   bool
		wantScope string
	}{
		{"a full key authenticates", fullTok, "", false, ""},
		{"a metrics key does not authenticate", metricsTok, "", true, ""},
		{"a metrics key authenticates for its scope", metricsTok, ScopeMetrics, false, ScopeMetrics},
		{"a full key is not a scoped one", fullTok, ScopeMetrics, true, ""},
		{"a metrics key is not for another scope", metricsTok, "sandboxes", true, ""},
		{"a wrong secret is refused for the scope", wrongLast(metricsTok), ScopeMetrics, true, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var k Key
			var err error
			if tc.scope == "" {
				k, err = s.Authenticate(tc.token)
			} else {
				k, err = s.AuthenticateScope(tc.token, tc.scope)
			}
			if tc.wantErr {
				if !errors.Is(err, ErrBadKey) {
					t.Fatalf("got %+v, %v; want ErrBadKey", k, err)
				}
				return
			}
			if err != nil || k.Scope != tc.wantScope {
				t.Fatalf("got %+v, %v; want scope %q", k, err, tc.wantScope)
			}
		})
	}
	if k, err := s.Key(metrics.ID); err != nil || k.Scope != ScopeMetrics {
		t.Errorf("Key: %+v, %v", k, err)
	}
	if keys, err := s.Keys(); err != nil || len(keys) != 2 || keys[0].Scope != "" || keys[1].Scope != ScopeMetrics {
		t.Errorf("Keys: %+v, %v", keys, err)
	}
}

// wrongLast returns tok with its last character changed: replacing it
// with a fixed "0" left a token whose secret ended in 0 (one in sixteen)
// unchanged, and CI once saw that "wrong" secret authenticate.
func wrongLast(tok string) string {
	last := tok[len(tok)-1]
	swap := byte('0')
	if last == '0' {
		swap = '1'
	}
	return tok[:len(tok)-1] + string(swap)
}
