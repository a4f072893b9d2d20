package incident

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/moat-sandbox/moat/manifest"
	"github.com/moat-sandbox/moat/result"
)

// Policy sizes and retains the bundles. Zero fields take the defaults.
type Policy struct {
	// MaxBundleBytes caps one bundle: the JSON files are always kept,
	// the workspace's files fill what is left, in the diff's order, and
	// the rest are listed in workspace.json as omitted. Default 16 MiB.
	MaxBundleBytes int64
	// MaxTotalBytes caps all bundles together: writing a bundle first
	// prunes the oldest ones until it fits. Default 256 MiB.
	MaxTotalBytes int64
	// MaxAge is how long a bundle is kept: older ones are pruned when a
	// bundle is written and by `moat gc`. Default 30 days.
	MaxAge time.Duration
}

// The defaults of Policy.
const (
	DefaultMaxBundleBytes = 16 << 20
	DefaultMaxTotalBytes  = 256 << 20
	DefaultMaxAge         = 30 * 24 * time.Hour
)

func (p Policy) withDefaults() Policy {
	if p.MaxBundleBytes <= 0 {
		p.MaxBundleBytes = DefaultMaxBundleBytes
	}
	if p.MaxTotalBytes <= 0 {
		p.MaxTotalBytes = DefaultMaxTotalBytes
	}
	if p.MaxAge <= 0 {
		p.MaxAge = DefaultMaxAge
	}
	return p
}

// ErrNotFound is returned (wrapped) for an id no bundle has.
var ErrNotFound = errors.New("no such incident")

// ErrExists is returned (wrapped) by Export when its file exists.
var ErrExists = errors.New("file exists")

// Store is a directory of bundles ($MOAT_HOME/incidents).
type Store struct {
	// mu orders this process's writers and pruners (moat serve keeps
	// bundles of concurrent runs); a bundle another process removed
	// meanwhile is simply gone.
	mu  sync.Mutex
	dir string
	pol Policy
	// now is the clock (tests move it).
	now func() time.Time
}

// Open returns the store in dir (created on first write) with pol.
func Open(dir string, pol Policy) *Store {
	return &Store{dir: dir, pol: pol.withDefaults(), now: time.Now}
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// Policy is the store's policy, defaults filled in.
func (s *Store) Policy() Policy { return s.pol }

// Evidence is what the engine hands over about a flagged run.
type Evidence struct {
	RunID string
	// Key is the API key id that asked for the run ("" for the local CLI).
	Key      string
	Manifest *manifest.Manifest
	// Commands are the command(s) the run ran.
	Commands [][]string
	Result   *result.Result
	// Procs is the sandbox's process list when the run ended flagged;
	// ProcsNote says why there is none ("not available: ...").
	Procs     []Process
	ProcsNote string
	// Audit is the run's audit record(s) as JSON; nil: none (the local
	// CLI keeps no audit log).
	Audit json.RawMessage
	// WorkspaceDir is the sandbox's workspace on the host, still in
	// place: the added and modified files of Result.Files are copied
	// from it. Empty: no workspace to copy from (a closed session).
	WorkspaceDir string
}

// Process is one process of the sandbox, as the host saw it.
type Process struct {
	PID     int      `json:"pid"`
	Name    string   `json:"name"`
	Cmdline []string `json:"cmdline"`
}

// Summary is a bundle's summary.json: what `moat incident list` shows.
type Summary struct {
	ID       string     `json:"id"`
	Time     time.Time  `json:"time"`
	RunID    string     `json:"run_id"`
	Key      string     `json:"key"`
	Reasons  []string   `json:"reasons"`
	Tier     string     `json:"tier"`
	Commands [][]string `json:"commands"`
	// Bytes is the bundle's size on disk (its files).
	Bytes    int64    `json:"bytes"`
	Exposure Exposure `json:"exposure"`
	// Files are the bundle's files, relative to its directory.
	Files []string `json:"files"`
}

// Exposure is what the run could reach, from its manifest: the data paths
// the playbook checks after an incident.
type Exposure struct {
	Inputs         []string      `json:"inputs"`
	Network        string        `json:"network"`
	Allow          []string      `json:"allow"`
	AllowAddresses []string      `json:"allow_addresses,omitempty"`
	Secrets        []SecretHosts `json:"secrets"`
	SecretsUsed    []string      `json:"secrets_used"`
	Packages       []string      `json:"packages"`
}

// SecretHosts is one secret the run was granted and where it could go.
type SecretHosts struct {
	Name  string   `json:"name"`
	Hosts []string `json:"hosts"`
}

// ExposureOf is what m lets a run reach, and the secrets res says were
// used.
func ExposureOf(m *manifest.Manifest, res *result.Result) Exposure {
	x := Exposure{Inputs: []string{}, Allow: []string{}, Secrets: []SecretHosts{}, SecretsUsed: []string{}, Packages: []string{}}
	if m != nil {
		for _, in := range m.Inputs {
			x.Inputs = append(x.Inputs, in.Src+" -> /workspace/"+in.Dst)
		}
		x.Network = m.Network.Mode
		x.Allow = append(x.Allow, m.Network.Allow...)
		x.AllowAddresses = slices.Clone(m.Network.AllowAddresses)
		for _, s := range m.Secrets {
			x.Secrets = append(x.Secrets, SecretHosts{Name: s.Name, Hosts: slices.Clone(s.Hosts)})
		}
		for _, p := range m.Packages.PyPI.Allow {
			x.Packages = append(x.Packages, "pypi:"+p)
		}
		for _, p := range m.Packages.NPM.Allow {
			x.Packages = append(x.Packages, "npm:"+p)
		}
	}
	if res != nil {
		for _, u := range res.SecretsUsed {
			x.SecretsUsed = append(x.SecretsUsed, fmt.Sprintf("%s -> %s (%d requests)", u.Name, u.Host, u.Requests))
		}
	}
	return x
}

// idPattern is every bundle id: the time it was written and 8 random hex
// digits. An id from a command line is checked against it before it
// becomes part of a path.
var idPattern = regexp.MustCompile(`^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{8}$`)

// CheckID refuses what is not a bundle id.
func CheckID(id string) error {
	if !idPattern.MatchString(id) {
		return fmt.Errorf("%w: %q is not an incident id (like 20261204T212400Z-0a1b2c3d; see moat incident list)", ErrNotFound, id)
	}
	return nil
}

func newID(t time.Time) string {
	var b [4]byte
	rand.Read(b[:])
	return t.UTC().Format("20060102T150405Z") + "-" + hex.EncodeToString(b[:])
}

// Path is the directory of bundle id, or ErrNotFound.
func (s *Store) Path(id string) (string, error) {
	if err := CheckID(id); err != nil {
		return "", err
	}
	p := filepath.Join(s.dir, id)
	if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
		return "", fmt.Errorf("%w: %s (see moat incident list)", ErrNotFound, id)
	}
	return p, nil
}

// Get reads bundle id's summary.
func (s *Store) Get(id string) (Summary, error) {
	p, err := s.Path(id)
	if err != nil {
		return Summary{}, err
	}
	b, err := os.ReadFile(filepath.Join(p, "summary.json"))
	if err != nil {
		return Summary{}, fmt.Errorf("incident %s: %w", id, err)
	}
	var sum Summary
	if err := json.Unmarshal(b, &sum); err != nil {
		return Summary{}, fmt.Errorf("incident %s: summary.json: %w", id, err)
	}
	return sum, nil
}

// List returns every bundle's summary, newest first. A directory that is
// not a readable bundle (a write cut short) is skipped.
func (s *Store) List() ([]Summary, error) {
	ents, err := os.ReadDir(s.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return []Summary{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list incidents: %w", err)
	}
	out := []Summary{}
	for _, e := range ents {
		if !idPattern.MatchString(e.Name()) {
			continue
		}
		sum, err := s.Get(e.Name())
		if err != nil {
			continue
		}
		out = append(out, sum)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID > out[j].ID })
	return out, nil
}

// Remove deletes bundle id.
func (s *Store) Remove(id string) error {
	p, err := s.Path(id)
	if err != nil {
		return err
	}
	return removeBundle(p)
}

// removeBundle makes the read-only tree writable again (for a non-root
// owner) and removes it. Nothing in it is followed: WalkDir does not
// follow symlinks and the bundle holds none.
func removeBundle(p string) error {
	filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(path, 0o700)
		}
		return nil
	})
	if err := os.RemoveAll(p); err != nil {
		return fmt.Errorf("remove incident %s: %w", filepath.Base(p), err)
	}
	return nil
}

// Prune removes bundles older than the policy's MaxAge, then the oldest
// until the rest take at most MaxTotalBytes less reserve (the size of a
// bundle about to be written). It returns the ids it removed.
func (s *Store) Prune(reserve int64) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.prune(reserve)
}

func (s *Store) prune(reserve int64) ([]string, error) {
	s.removeStale()
	sums, err := s.List()
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	cutoff := s.now().Add(-s.pol.MaxAge)
	var total int64
	keep := sums[:0:0]
	for _, sum := range sums { // newest first
		if sum.Time.Before(cutoff) {
			if err := s.Remove(sum.ID); err != nil && !errors.Is(err, ErrNotFound) {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, sum.ID)
			continue
		}
		total += sum.Bytes
		keep = append(keep, sum)
	}
	for i := len(keep) - 1; i >= 0 && total+reserve > s.pol.MaxTotalBytes; i-- {
		if err := s.Remove(keep[i].ID); err != nil && !errors.Is(err, ErrNotFound) {
			errs = append(errs, err)
			continue
		}
		total -= keep[i].Bytes
		removed = append(removed, keep[i].ID)
	}
	return removed, errors.Join(errs...)
}

// staleAfter is how old a bundle still being written (".tmp-*") must be
// before pruning takes it for the remains of a writer that died.
const staleAfter = time.Hour

// removeStale removes the remains of writes cut short.
func (s *Store) removeStale() {
	ents, _ := os.ReadDir(s.dir)
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), ".tmp-") {
			continue
		}
		if fi, err := e.Info(); err == nil && s.now().Sub(fi.ModTime()) > staleAfter {
			removeBundle(filepath.Join(s.dir, e.Name()))
		}
	}
}
