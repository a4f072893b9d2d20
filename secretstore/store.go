// Package secretstore keeps the values of the secrets that runs may use
// (manifest secrets[]), on the host, encrypted at rest.
//
// Each secret is one file, $MOAT_HOME/secrets/NAME.json (0600, in a 0700
// directory), holding its metadata in clear (name, kind, created,
// rotated) and its source sealed with AES-256-GCM under a key kept in a
// separate file ($MOAT_HOME/secrets.key, 0600, or one the operator names),
// never in the audit database: a copy of the database, or of the secrets
// directory alone, reveals no value. The name and kind are the AEAD's
// additional data, so an entry renamed or relabelled does not open.
//
// A source is the value itself, or a reference the operator registered:
// file:PATH (read at each run) or env:VAR (of moat's own process, e.g.
// moat serve). Manifests only ever name a secret; they never name a host
// path or variable, so an API client cannot make moat read one.
//
// The package must never log, print or put a value in an error.
package secretstore

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/egress"
)

// MaxValue bounds a secret's value (and a file a reference names).
const MaxValue = 64 << 10

// Kinds of source.
const (
	KindValue = "value" // the value itself, sealed in the store
	KindFile  = "file"  // file:PATH, read when a run starts
	KindEnv   = "env"   // env:VAR of moat's own process
)

// ErrNotFound is returned for a secret the store does not hold.
var ErrNotFound = errors.New("no such secret")

// Entry is what the store says about a secret without opening it.
type Entry struct {
	Name    string     `json:"name"`
	Kind    string     `json:"kind"`
	Created time.Time  `json:"created"`
	Rotated *time.Time `json:"rotated,omitempty"`
}

// sealed is the file format of one entry.
type sealed struct {
	Entry
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
}

// Store is a directory of sealed secrets and the key that opens them.
type Store struct {
	dir     string
	keyFile string
}

// Open returns the store of the state directory home: secrets in
// home/secrets, the key in keyFile (default home/secrets.key). Nothing is
// created until a secret is added.
func Open(home, keyFile string) *Store {
	if keyFile == "" {
		keyFile = filepath.Join(home, "secrets.key")
	}
	return &Store{dir: filepath.Join(home, "secrets"), keyFile: keyFile}
}

// Dir is where the sealed entries are.
func (s *Store) Dir() string { return s.dir }

// KeyFile is the key's path.
func (s *Store) KeyFile() string { return s.keyFile }

// ParseSource turns what an operator gives into a kind and a sealed
// payload: "file:PATH" (an absolute path) and "env:VAR" are references;
// anything else is not a source (values come from CheckValue).
func ParseSource(ref string) (kind, payload string, err error) {
	switch {
	case strings.HasPrefix(ref, "file:"):
		p := strings.TrimPrefix(ref, "file:")
		if !filepath.IsAbs(p) || strings.IndexByte(p, 0) >= 0 {
			return "", "", fmt.Errorf("reference %q: file: needs an absolute path, e.g. file:/etc/moat/github-token", ref)
		}
		return KindFile, filepath.Clean(p), nil
	case strings.HasPrefix(ref, "env:"):
		v := strings.TrimPrefix(ref, "env:")
		if !isEnvName(v) {
			return "", "", fmt.Errorf("reference %q: env: needs a variable name [A-Za-z_][A-Za-z0-9_]*, e.g. env:GITHUB_TOKEN", ref)
		}
		return KindEnv, v, nil
	}
	return "", "", fmt.Errorf("reference %q: want file:PATH or env:VAR", ref)
}

// CheckValue reports what is wrong with a secret's value, never quoting
// it: empty, too large, or holding NUL, CR or LF (which would let it
// split an HTTP header it is put in). One trailing newline, as `echo`
// and editors leave, is removed first by TrimValue.
func CheckValue(v string) error {
	switch {
	case v == "":
		return errors.New("the value is empty")
	case len(v) > MaxValue:
		return fmt.Errorf("the value is %d bytes; at most %d", len(v), MaxValue)
	case strings.ContainsAny(v, "\x00\r\n"):
		return errors.New("the value contains a NUL, CR or LF byte, which could split an HTTP header; store one line")
	}
	return nil
}

// TrimValue removes one trailing "\n" or "\r\n".
func TrimValue(v string) string {
	v = strings.TrimSuffix(v, "\n")
	return strings.TrimSuffix(v, "\r")
}

// Add stores a new secret; an existing name is an error (use Rotate).
// kind is KindValue (payload: the value) or a reference kind from
// ParseSource.
func (s *Store) Add(name, kind, payload string) error {
	if _, err := s.entry(name); err == nil {
		return fmt.Errorf("secret %s exists; use moat secrets rotate %s to replace its value, or rm it first", name, name)
	} else if !errors.Is(err, ErrNotFound) {
		return err
	}
	return s.write(Entry{Name: name, Kind: kind, Created: time.Now().UTC()}, payload)
}

// Rotate replaces the source of an existing secret, keeping its name and
// creation time. Placeholders are per run, so runs that start afterwards
// get the new value; a running one keeps the value it started with.
func (s *Store) Rotate(name, kind, payload string) error {
	e, err := s.entry(name)
	if err != nil {
		return err
	}
	now := time.Now().UTC()
	e.Kind, e.Rotated = kind, &now
	return s.write(e, payload)
}

// Remove deletes a secret.
func (s *Store) Remove(name string) error {
	if !egress.ValidSecretName(name) {
		return nameError(name)
	}
	err := os.Remove(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("secret %s: %w (moat secrets list shows the names)", name, ErrNotFound)
	}
	return err
}

// List returns every secret's entry, by name. It needs no key.
func (s *Store) List() ([]Entry, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []Entry{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list secrets: %w", err)
	}
	out := []Entry{}
	for _, de := range ents {
		name, ok := strings.CutSuffix(de.Name(), ".json")
		if !ok || !egress.ValidSecretName(name) {
			continue
		}
		e, err := s.entry(name)
		if err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Has reports whether the store holds name.
func (s *Store) Has(name string) bool {
	_, err := s.entry(name)
	return err == nil
}

// Value opens the secret and returns its value, following a reference.
// Errors name the secret and what to fix, never the value.
func (s *Store) Value(name string) (string, error) {
	e, payload, err := s.open(name)
	if err != nil {
		return "", err
	}
	var v string
	switch e.Kind {
	case KindValue:
		v = payload
	case KindFile:
		b, err := readBounded(payload)
		if err != nil {
			return "", fmt.Errorf("secret %s: its file %s: %w", name, payload, err)
		}
		v = TrimValue(string(b))
	case KindEnv:
		var ok bool
		if v, ok = os.LookupEnv(payload); !ok {
			return "", fmt.Errorf("secret %s: its variable %s is not set in moat's environment; set it where moat (serve) starts", name, payload)
		}
	default:
		return "", fmt.Errorf("secret %s: unknown kind %q", name, e.Kind)
	}
	if err := CheckValue(v); err != nil {
		return "", fmt.Errorf("secret %s (%s): %w", name, e.Kind, err)
	}
	return v, nil
}

// Source returns a reference's text (file:PATH, env:VAR), or "" for a
// stored value: references are not secret, values are never shown.
func (s *Store) Source(name string) (string, error) {
	e, payload, err := s.open(name)
	if err != nil || e.Kind == KindValue {
		return "", err
	}
	return e.Kind + ":" + payload, nil
}

func readBounded(p string) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxValue+2))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxValue+1 {
		return nil, fmt.Errorf("is larger than %d bytes", MaxValue)
	}
	return b, nil
}

func (s *Store) path(name string) string { return filepath.Join(s.dir, name+".json") }

func nameError(name string) error {
	return fmt.Errorf("secret name %q: want 1 to %d of a-z 0-9 _ -, starting with a letter or digit, e.g. github-token", name, egress.MaxSecretName)
}

// entry reads an entry's clear metadata.
func (s *Store) entry(name string) (Entry, error) {
	e, err := s.read(name)
	return e.Entry, err
}

func (s *Store) read(name string) (sealed, error) {
	if !egress.ValidSecretName(name) {
		return sealed{}, nameError(name)
	}
	b, err := os.ReadFile(s.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return sealed{}, fmt.Errorf("secret %s: %w; add it with moat secrets add %s", name, ErrNotFound, name)
	}
	if err != nil {
		return sealed{}, fmt.Errorf("secret %s: %w", name, err)
	}
	var e sealed
	if err := json.Unmarshal(b, &e); err != nil || e.Name != name {
		return sealed{}, fmt.Errorf("secret %s: %s is damaged; remove it and add the secret again", name, s.path(name))
	}
	return e, nil
}

// open reads and decrypts an entry.
func (s *Store) open(name string) (Entry, string, error) {
	e, err := s.read(name)
	if err != nil {
		return Entry{}, "", err
	}
	aead, err := s.aead(false)
	if err != nil {
		return Entry{}, "", err
	}
	if len(e.Nonce) != aead.NonceSize() {
		return Entry{}, "", fmt.Errorf("secret %s: %s is damaged; remove it and add the secret again", name, s.path(name))
	}
	plain, err := aead.Open(nil, e.Nonce, e.Ciphertext, additional(e.Entry))
	if err != nil {
		return Entry{}, "", fmt.Errorf("secret %s: the key %s does not open it (a different key, or the entry was changed); add the secret again", name, s.keyFile)
	}
	return e.Entry, string(plain), nil
}

func (s *Store) write(e Entry, payload string) error {
	if !egress.ValidSecretName(e.Name) {
		return nameError(e.Name)
	}
	switch e.Kind {
	case KindValue:
		if err := CheckValue(payload); err != nil {
			return fmt.Errorf("secret %s: %w", e.Name, err)
		}
	case KindFile, KindEnv:
		if _, _, err := ParseSource(e.Kind + ":" + payload); err != nil {
			return fmt.Errorf("secret %s: %w", e.Name, err)
		}
	default:
		return fmt.Errorf("secret %s: unknown kind %q", e.Name, e.Kind)
	}
	aead, err := s.aead(true)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return fmt.Errorf("secrets directory: %w", err)
	}
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return fmt.Errorf("secrets directory: %w", err)
	}
	out := sealed{Entry: e, Nonce: make([]byte, aead.NonceSize())}
	if _, err := rand.Read(out.Nonce); err != nil {
		return fmt.Errorf("secret %s: %w", e.Name, err)
	}
	out.Ciphertext = aead.Seal(nil, out.Nonce, []byte(payload), additional(e))
	b, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return fmt.Errorf("secret %s: %w", e.Name, err)
	}
	return writeFile(s.path(e.Name), append(b, '\n'))
}

// additional binds a ciphertext to its entry's name and kind.
func additional(e Entry) []byte {
	return []byte("moat-secret-v1\x00" + e.Name + "\x00" + e.Kind)
}

// keySize is AES-256's.
const keySize = 32

// aead loads the key (creating it when create is set and it is missing).
// A key file others may read is refused: the key is the whole protection.
func (s *Store) aead(create bool) (cipher.AEAD, error) {
	key, err := os.ReadFile(s.keyFile)
	if errors.Is(err, fs.ErrNotExist) && create {
		key = make([]byte, keySize)
		if _, err := rand.Read(key); err != nil {
			return nil, fmt.Errorf("create secrets key: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(s.keyFile), 0o700); err != nil {
			return nil, fmt.Errorf("create secrets key: %w", err)
		}
		f, err := os.OpenFile(s.keyFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return nil, fmt.Errorf("create secrets key %s: %w", s.keyFile, err)
		}
		_, werr := f.Write(key)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			os.Remove(s.keyFile)
			return nil, fmt.Errorf("create secrets key %s: %w", s.keyFile, werr)
		}
	} else if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("secrets key %s does not exist; secrets were added with another key (--key-file / MOAT_SECRETS_KEY), or none were added", s.keyFile)
	} else if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	st, err := os.Stat(s.keyFile)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("secrets key %s has mode %04o; others may read it: chmod 600 %s", s.keyFile, st.Mode().Perm(), s.keyFile)
	}
	if len(key) != keySize {
		return nil, fmt.Errorf("secrets key %s is %d bytes; want %d random bytes", s.keyFile, len(key), keySize)
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("secrets key: %w", err)
	}
	return cipher.NewGCM(block)
}

// writeFile replaces p atomically with a 0600 file.
func writeFile(p string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(p), ".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if _, err := io.Copy(tmp, bytes.NewReader(b)); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", p, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", p, err)
	}
	return os.Rename(tmp.Name(), p)
}

func isEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range []byte(s) {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}
