package audit

import (
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Errors callers branch on, wrapped with the id they concern.
var (
	// ErrNotFound: no key or record has that id.
	ErrNotFound = errors.New("not found")
	// ErrExists: Begin was given an id that is already recorded.
	ErrExists = errors.New("already recorded")
	// ErrFinished: Finish was called for a record that is no longer running.
	ErrFinished = errors.New("already finished")
)

// SchemaVersion is the version of the database layout this package writes.
// Open upgrades an older database and refuses a newer one.
const SchemaVersion = 5

// migrations[i] takes a database from schema version i to i+1. Append only:
// a released migration never changes.
var migrations = []string{
	// 0 -> 1: the first layout. Times are Unix nanoseconds (UTC), so range
	// filters are integer comparisons on an index. Network attempts and
	// violations are child rows, so reports aggregate them with GROUP BY
	// instead of decoding JSON in Go.
	`
CREATE TABLE keys (
	id                  TEXT PRIMARY KEY,
	name                TEXT NOT NULL,
	secret_sha256       BLOB NOT NULL,
	created             INTEGER NOT NULL,
	revoked             INTEGER,
	max_sandboxes       INTEGER NOT NULL,
	cpu_seconds_per_day REAL NOT NULL
) STRICT;

CREATE TABLE records (
	id                 TEXT PRIMARY KEY,
	kind               TEXT NOT NULL,
	key_id             TEXT NOT NULL,
	sandbox_id         TEXT NOT NULL,
	started            INTEGER NOT NULL,
	ended              INTEGER,
	status             TEXT NOT NULL,
	tier               TEXT NOT NULL,
	image              TEXT NOT NULL,
	image_digest       TEXT NOT NULL,
	manifest_digest    TEXT NOT NULL,
	manifest           TEXT NOT NULL,
	command            TEXT NOT NULL, -- JSON array of strings
	pooled             INTEGER NOT NULL,
	termination        TEXT NOT NULL DEFAULT '',
	exit_code          INTEGER NOT NULL DEFAULT 0,
	wall_ms            REAL NOT NULL DEFAULT 0,
	cpu_ms             REAL NOT NULL DEFAULT 0,
	peak_memory_bytes  INTEGER NOT NULL DEFAULT 0,
	memory_limit_bytes INTEGER NOT NULL DEFAULT 0,
	files_changed      INTEGER NOT NULL DEFAULT 0,
	network_omitted    INTEGER NOT NULL DEFAULT 0,
	violations_omitted INTEGER NOT NULL DEFAULT 0,
	error              TEXT NOT NULL DEFAULT ''
) STRICT;
CREATE INDEX records_started ON records(started);
CREATE INDEX records_key_started ON records(key_id, started);
CREATE INDEX records_sandbox ON records(sandbox_id) WHERE sandbox_id <> '';
CREATE INDEX records_running ON records(status) WHERE status = 'running';

CREATE TABLE network_attempts (
	record_id TEXT NOT NULL REFERENCES records(id) ON DELETE CASCADE,
	seq       INTEGER NOT NULL,
	time      INTEGER NOT NULL,
	method    TEXT NOT NULL,
	host      TEXT NOT NULL,
	port      INTEGER NOT NULL,
	address   TEXT NOT NULL,
	allowed   INTEGER NOT NULL,
	reason    TEXT NOT NULL,
	bytes_out INTEGER NOT NULL,
	bytes_in  INTEGER NOT NULL,
	PRIMARY KEY (record_id, seq)
) STRICT, WITHOUT ROWID;

CREATE TABLE violations (
	record_id   TEXT NOT NULL REFERENCES records(id) ON DELETE CASCADE,
	seq         INTEGER NOT NULL,
	kind        TEXT NOT NULL,
	detail      TEXT NOT NULL,
	limit_value TEXT NOT NULL,
	PRIMARY KEY (record_id, seq)
) STRICT, WITHOUT ROWID;
`,
	// 1 -> 2: admin keys, the only ones that read server-wide state
	// (GET /metrics). Every existing key is a tenant's.
	`ALTER TABLE keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0;`,
	// 2 -> 3: the run's network summary (result.NetworkSummary as JSON):
	// totals over every attempt and the denied attempts not stored one by
	// one, by reason and destination. Reports aggregate it with json_each
	// in SQL; '' for records without one.
	`
ALTER TABLE records ADD COLUMN network_summary TEXT NOT NULL DEFAULT '';
`,
	// 3 -> 4: the secrets each key may use (manifest secrets[].name); a
	// key starts with none. Names only: values live in the secret store,
	// never in this database.
	`
CREATE TABLE IF NOT EXISTS key_secrets (
	key_id TEXT NOT NULL REFERENCES keys(id),
	secret TEXT NOT NULL,
	PRIMARY KEY (key_id, secret)
) STRICT, WITHOUT ROWID;
`,
	// 4 -> 5: scoped keys (Key.Scope): "metrics" keys read GET /metrics
	// and nothing else. Every existing key is a full one ('').
	`ALTER TABLE keys ADD COLUMN scope TEXT NOT NULL DEFAULT '';`,
}

// Store is an open audit database. It is safe for concurrent use.
//
// Writes go through one connection (database/sql queues callers for it),
// so transactions of this process never contend with each other for
// SQLite's write lock; reads use a small pool of read-only connections
// and, in WAL mode, never wait for the writer. Another process (moat keys
// create beside a running server) contends through the file lock and
// waits up to busyTimeout.
type Store struct {
	path string
	w    *sql.DB // the writer: exactly one connection
	r    *sql.DB // readers: query_only connections

	// claim is the lock file Claim holds (a server's), nil when not
	// claimed.
	claimMu sync.Mutex
	claim   *os.File
}

const (
	// busyTimeout is how long a statement waits for another process's
	// lock before failing with SQLITE_BUSY.
	busyTimeout = 5 * time.Second
	// readers bounds the read connections: enough for 32 HTTP clients
	// authenticating at once, each read being sub-millisecond.
	readers = 8
)

// Open opens (creating if absent) the audit database at path. A new file
// is created mode 0600, and missing parent directories 0700: the database
// holds key hashes and what every run did. The schema is created or
// upgraded to SchemaVersion.
//
// The database runs in WAL mode with synchronous=NORMAL: a crash of moat
// (or of the machine's power) can lose at most the last transactions
// before a checkpoint, never corrupt the file, and a commit costs no fsync,
// which is what lets one writer keep up with hundreds of runs a second.
func Open(path string) (*Store, error) {
	if path == "" {
		return nil, errors.New("open audit database: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("open audit database %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(abs), 0o700); err != nil {
		return nil, fmt.Errorf("open audit database: %w", err)
	}
	// Create the file ourselves so its mode is 0600 from the first byte;
	// SQLite gives the -wal and -shm files the main file's permissions.
	f, err := os.OpenFile(abs, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open audit database: %w", err)
	}
	fi, err := f.Stat()
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("open audit database: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("open audit database %s: not a regular file", abs)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		// An older or hand-made file readable by others: the key hashes
		// are not secrets, but what every run did may be.
		if err := os.Chmod(abs, 0o600); err != nil {
			return nil, fmt.Errorf("open audit database: %s is mode %v and cannot be made 0600: %w", abs, fi.Mode().Perm(), err)
		}
	}

	s := &Store{path: abs}
	s.w, err = sql.Open("sqlite", dsn(abs, url.Values{
		"_txlock":       {"immediate"}, // take the write lock at BEGIN: no deadlock on upgrade
		"_journal":      {"WAL"},
		"_sync":         {"NORMAL"},
		"_fk":           {"1"},
		"_busy_timeout": {fmt.Sprint(busyTimeout.Milliseconds())},
	}))
	if err != nil {
		return nil, fmt.Errorf("open audit database %s: %w", abs, err)
	}
	s.w.SetMaxOpenConns(1)
	s.w.SetMaxIdleConns(1)
	s.w.SetConnMaxLifetime(0)
	if err := s.migrate(); err != nil {
		s.w.Close()
		return nil, fmt.Errorf("open audit database %s: %w", abs, err)
	}
	s.r, err = sql.Open("sqlite", dsn(abs, url.Values{
		"_query_only":   {"1"},
		"_fk":           {"1"},
		"_busy_timeout": {fmt.Sprint(busyTimeout.Milliseconds())},
	}))
	if err != nil {
		s.w.Close()
		return nil, fmt.Errorf("open audit database %s: %w", abs, err)
	}
	s.r.SetMaxOpenConns(readers)
	s.r.SetMaxIdleConns(readers)
	if err := s.r.Ping(); err != nil {
		s.Close()
		return nil, fmt.Errorf("open audit database %s: %w", abs, err)
	}
	return s, nil
}

// dsn is a file: URI for path, so a path holding '?', '#' or '%' names
// the file it says; the driver's parameters follow the '?'.
func dsn(path string, params url.Values) string {
	u := url.URL{Scheme: "file", Path: path, RawQuery: params.Encode()}
	return u.String()
}

// Path is the database file's absolute path.
func (s *Store) Path() string { return s.path }

// Close closes the database. The last connection to close checkpoints the
// WAL into the main file.
func (s *Store) Close() error {
	var errs []error
	if s.r != nil {
		errs = append(errs, s.r.Close())
	}
	if s.w != nil {
		errs = append(errs, s.w.Close())
	}
	// Last: the database is closed before another server may claim it.
	errs = append(errs, s.releaseClaim())
	return errors.Join(errs...)
}

// migrate brings the schema to SchemaVersion in one transaction, so two
// processes opening a new database at once cannot both create it.
func (s *Store) migrate() error {
	tx, err := s.w.Begin()
	if err != nil {
		return fmt.Errorf("begin schema transaction: %w", err)
	}
	defer tx.Rollback()
	if _, err := tx.Exec(`CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL) STRICT`); err != nil {
		return fmt.Errorf("create schema_version: %w", err)
	}
	var v int
	switch err := tx.QueryRow(`SELECT version FROM schema_version`).Scan(&v); {
	case errors.Is(err, sql.ErrNoRows):
		if _, err := tx.Exec(`INSERT INTO schema_version (version) VALUES (0)`); err != nil {
			return fmt.Errorf("initialise schema_version: %w", err)
		}
	case err != nil:
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("schema version %d is newer than this moat understands (%d); use a newer moat", v, len(migrations))
	}
	if v == len(migrations) {
		return nil
	}
	for ; v < len(migrations); v++ {
		if _, err := tx.Exec(migrations[v]); err != nil {
			return fmt.Errorf("upgrade schema to version %d: %w", v+1, err)
		}
	}
	if _, err := tx.Exec(`UPDATE schema_version SET version = ?`, v); err != nil {
		return fmt.Errorf("record schema version: %w", err)
	}
	return tx.Commit()
}

// isPrimaryKeyViolation reports whether err is SQLite refusing a duplicate
// primary key.
func isPrimaryKeyViolation(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code() == sqlite3.SQLITE_CONSTRAINT_PRIMARYKEY
}

// nanos and fromNanos convert between time.Time and the stored form.
func nanos(t time.Time) int64 { return t.UTC().UnixNano() }

func fromNanos(n int64) time.Time { return time.Unix(0, n).UTC() }
