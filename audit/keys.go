package audit

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Token format: "moat_" + id + "_" + secret, where id is "k" and 12
// lower-case hex digits (48 random bits: public, it only names the key)
// and secret is 32 random bytes in lower-case hex (256 bits).
const (
	tokenPrefix  = "moat_"
	idHexLen     = 12
	idLen        = 1 + idHexLen
	secretBytes  = 32
	secretHexLen = 2 * secretBytes
	tokenLen     = len(tokenPrefix) + idLen + 1 + secretHexLen
)

// MaxKeyName bounds a key's name, in characters.
const MaxKeyName = 64

// Bounds on a quota, so a typo cannot grant the unbounded.
const (
	MaxQuotaSandboxes        = 100_000
	MaxQuotaCPUSecondsPerDay = 1e9
)

// CreateKey creates an API key named name with quota q (zero fields take
// DefaultQuota's) and returns the token, the only time it exists outside
// the caller: the store keeps only the SHA-256 of its secret.
func (s *Store) CreateKey(name string, q Quota) (token string, k Key, err error) {
	return s.createKey(name, q, false)
}

// CreateAdminKey creates an admin key (Key.Admin) as CreateKey creates a
// tenant's: for the operator's monitoring, never for a tenant.
func (s *Store) CreateAdminKey(name string, q Quota) (token string, k Key, err error) {
	return s.createKey(name, q, true)
}

// CreateScopedKey creates a key that may do what scope names and nothing
// else (Key.Scope; one of Scopes), with the default quota: it runs
// nothing.
func (s *Store) CreateScopedKey(name, scope string) (token string, k Key, err error) {
	if !slices.Contains(Scopes, scope) {
		return "", Key{}, fmt.Errorf("key scope %q is not one Moat knows; accepted: %s", scope, strings.Join(Scopes, ", "))
	}
	return s.createKeyScoped(name, Quota{}, false, scope)
}

func (s *Store) createKey(name string, q Quota, admin bool) (token string, k Key, err error) {
	return s.createKeyScoped(name, q, admin, "")
}

func (s *Store) createKeyScoped(name string, q Quota, admin bool, scope string) (token string, k Key, err error) {
	if err := validKeyName(name); err != nil {
		return "", Key{}, err
	}
	if q, err = q.withDefaults(); err != nil {
		return "", Key{}, err
	}
	var idRaw [idHexLen / 2]byte
	var secret [secretBytes]byte
	if _, err := rand.Read(idRaw[:]); err != nil {
		return "", Key{}, fmt.Errorf("create key: %w", err)
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", Key{}, fmt.Errorf("create key: %w", err)
	}
	sum := sha256.Sum256(secret[:])
	k = Key{
		ID:      "k" + hex.EncodeToString(idRaw[:]),
		Name:    name,
		Created: time.Now().UTC(),
		Quota:   q,
		Admin:   admin,
		Scope:   scope,
	}
	_, err = s.w.Exec(`INSERT INTO keys (id, name, secret_sha256, created, max_sandboxes, cpu_seconds_per_day, admin, scope) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
		k.ID, k.Name, sum[:], nanos(k.Created), q.MaxSandboxes, q.CPUSecondsPerDay, admin, scope)
	if err != nil {
		if isPrimaryKeyViolation(err) {
			// 48 random bits collide about once in 16 million keys; say so
			// rather than pretend it cannot happen.
			return "", Key{}, fmt.Errorf("create key: generated id %s is taken; try again", k.ID)
		}
		return "", Key{}, fmt.Errorf("create key: %w", err)
	}
	return tokenPrefix + k.ID + "_" + hex.EncodeToString(secret[:]), k, nil
}

// CheckKeyName reports what is wrong with name as a key's name (1 to
// MaxKeyName printable characters, no leading or trailing space), or nil.
// CreateKey checks it too; callers use it to refuse a name before opening
// anything.
func CheckKeyName(name string) error { return validKeyName(name) }

func validKeyName(name string) error {
	switch {
	case name == "":
		return errors.New("key name is empty; give 1 to 64 printable characters, e.g. agent-1")
	case !utf8.ValidString(name):
		return fmt.Errorf("key name %q is not valid UTF-8", name)
	case utf8.RuneCountInString(name) > MaxKeyName:
		return fmt.Errorf("key name %.20q... is %d characters; at most %d", name, utf8.RuneCountInString(name), MaxKeyName)
	case strings.TrimSpace(name) != name:
		return fmt.Errorf("key name %q starts or ends with a space; remove it", name)
	}
	for _, r := range name {
		// unicode.IsPrint admits only the ASCII space among spaces, and no
		// control, format (bidi overrides) or private-use characters: a
		// name is shown in listings and must not rewrite the terminal.
		if !unicode.IsPrint(r) {
			return fmt.Errorf("key name %q contains %U, which is not printable; use letters, digits, punctuation and spaces", name, r)
		}
	}
	return nil
}

func (q Quota) withDefaults() (Quota, error) {
	if q.MaxSandboxes < 0 || q.MaxSandboxes > MaxQuotaSandboxes {
		return q, fmt.Errorf("quota max_sandboxes %d is out of range; accepted 1..%d (0 means the default %d)", q.MaxSandboxes, MaxQuotaSandboxes, DefaultQuota.MaxSandboxes)
	}
	if math.IsNaN(q.CPUSecondsPerDay) || q.CPUSecondsPerDay < 0 || q.CPUSecondsPerDay > MaxQuotaCPUSecondsPerDay {
		return q, fmt.Errorf("quota cpu_seconds_per_day %v is out of range; accepted a positive number up to %g (0 means the default %g)", q.CPUSecondsPerDay, float64(MaxQuotaCPUSecondsPerDay), DefaultQuota.CPUSecondsPerDay)
	}
	if q.MaxSandboxes == 0 {
		q.MaxSandboxes = DefaultQuota.MaxSandboxes
	}
	if q.CPUSecondsPerDay == 0 {
		q.CPUSecondsPerDay = DefaultQuota.CPUSecondsPerDay
	}
	return q, nil
}

const keyColumns = `id, name, created, revoked, max_sandboxes, cpu_seconds_per_day, admin, scope`

func scanKey(sc interface{ Scan(...any) error }) (Key, error) {
	var k Key
	var created int64
	var revoked sql.NullInt64
	if err := sc.Scan(&k.ID, &k.Name, &created, &revoked, &k.Quota.MaxSandboxes, &k.Quota.CPUSecondsPerDay, &k.Admin, &k.Scope); err != nil {
		return Key{}, err
	}
	k.Created = fromNanos(created)
	if revoked.Valid {
		t := fromNanos(revoked.Int64)
		k.Revoked = &t
	}
	return k, nil
}

// Keys lists every key, revoked ones included, oldest first.
func (s *Store) Keys() ([]Key, error) {
	rows, err := s.r.Query(`SELECT ` + keyColumns + ` FROM keys ORDER BY created, id`)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	defer rows.Close()
	keys := []Key{}
	for rows.Next() {
		k, err := scanKey(rows)
		if err != nil {
			return nil, fmt.Errorf("list keys: %w", err)
		}
		keys = append(keys, k)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	rows.Close()
	for i := range keys {
		if keys[i], err = s.withSecrets(keys[i], nil); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// Key returns the key with this id, revoked or not.
func (s *Store) Key(id string) (Key, error) {
	k, err := scanKey(s.r.QueryRow(`SELECT `+keyColumns+` FROM keys WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("key %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return Key{}, fmt.Errorf("key %q: %w", id, err)
	}
	return s.withSecrets(k, nil)
}

// RevokeKey revokes the key with this id: Authenticate refuses it from now
// on. Revoking a revoked key keeps its first revocation time and is not an
// error; an unknown id is (wrapping ErrNotFound).
func (s *Store) RevokeKey(id string) error {
	res, err := s.w.Exec(`UPDATE keys SET revoked = COALESCE(revoked, ?) WHERE id = ?`, nanos(time.Now()), id)
	if err != nil {
		return fmt.Errorf("revoke key %q: %w", id, err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("revoke key %q: %w", id, err)
	} else if n == 0 {
		return fmt.Errorf("revoke key %q: no such key (moat keys list shows the ids): %w", id, ErrNotFound)
	}
	return nil
}

// dummyHash is compared against when the id is unknown, so that an
// unknown id and a wrong secret take the same path through the code.
var dummyHash = sha256.Sum256([]byte("moat: no such key"))

// Authenticate returns the live full key a token belongs to, or ErrBadKey
// for a malformed, unknown or revoked token, never saying which. A scoped
// key (Key.Scope) is ErrBadKey here too: it authenticates only through
// AuthenticateScope, so that no front door grants it more by not knowing
// about scopes. Other errors mean the database failed.
func (s *Store) Authenticate(token string) (Key, error) {
	k, err := s.authenticate(token)
	if err != nil {
		return Key{}, err
	}
	if k.Scope != "" {
		return Key{}, ErrBadKey
	}
	return k, nil
}

// AuthenticateScope returns the live key a token belongs to when it is a
// key of this scope, else ErrBadKey (a full key too: the caller asks
// Authenticate first).
func (s *Store) AuthenticateScope(token, scope string) (Key, error) {
	k, err := s.authenticate(token)
	if err != nil {
		return Key{}, err
	}
	if scope == "" || k.Scope != scope {
		return Key{}, ErrBadKey
	}
	return k, nil
}

func (s *Store) authenticate(token string) (Key, error) {
	id, secret, ok := parseToken(token)
	if !ok {
		return Key{}, ErrBadKey
	}
	var k Key
	var created int64
	var revoked sql.NullInt64
	var stored []byte
	err := s.r.QueryRow(`SELECT id, name, created, revoked, max_sandboxes, cpu_seconds_per_day, admin, scope, secret_sha256 FROM keys WHERE id = ?`, id).
		Scan(&k.ID, &k.Name, &created, &revoked, &k.Quota.MaxSandboxes, &k.Quota.CPUSecondsPerDay, &k.Admin, &k.Scope, &stored)
	found := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return Key{}, fmt.Errorf("authenticate: %w", err)
	}
	if !found || len(stored) != sha256.Size {
		stored = dummyHash[:]
	}
	sum := sha256.Sum256(secret)
	match := subtle.ConstantTimeCompare(sum[:], stored) == 1
	if !found || !match || revoked.Valid {
		return Key{}, ErrBadKey
	}
	k.Created = fromNanos(created)
	return s.withSecrets(k, nil)
}

// parseToken splits "moat_<id>_<secret>" and decodes the secret. Only the
// exact format CreateKey produces is accepted (lower-case hex), so one key
// has one spelling.
func parseToken(token string) (id string, secret []byte, ok bool) {
	if len(token) != tokenLen || !strings.HasPrefix(token, tokenPrefix) {
		return "", nil, false
	}
	rest := token[len(tokenPrefix):]
	id, sec := rest[:idLen], rest[idLen:]
	if !validKeyID(id) || sec[0] != '_' || !isLowerHex(sec[1:]) {
		return "", nil, false
	}
	secret, err := hex.DecodeString(sec[1:])
	if err != nil {
		return "", nil, false
	}
	return id, secret, true
}

// validKeyID reports whether id has the form "k" + 12 lower-case hex digits.
func validKeyID(id string) bool {
	return len(id) == idLen && id[0] == 'k' && isLowerHex(id[1:])
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// e2bPrefix starts a token's E2B spelling (E2BToken).
const e2bPrefix = "e2b_"

// E2BToken is token in the spelling the E2B SDKs accept: releases 2.2x to
// 2.50 of the `e2b` npm package refuse, before sending anything, a key
// that is not "e2b_" and hex digits. It is the same key, lossless:
// "e2b_" + the id's 12 hex digits + the secret's 64, so the E2B layer
// turns it back with FromE2BToken and nothing else stores or accepts it.
// ok is false when token is not a token CreateKey produces.
func E2BToken(token string) (e2b string, ok bool) {
	id, secret, ok := parseToken(token)
	if !ok {
		return "", false
	}
	return e2bPrefix + id[1:] + hex.EncodeToString(secret), true
}

// FromE2BToken is the Moat token an E2BToken spelling stands for, or ok
// false when s is not one (any other "e2b_" key, such as one of E2B's
// cloud, is not a Moat key).
func FromE2BToken(s string) (token string, ok bool) {
	rest, found := strings.CutPrefix(s, e2bPrefix)
	if !found || len(rest) != idHexLen+secretHexLen || !isLowerHex(rest) {
		return "", false
	}
	return tokenPrefix + "k" + rest[:idHexLen] + "_" + rest[idHexLen:], true
}
