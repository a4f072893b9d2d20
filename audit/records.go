package audit

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/result"
)

// Bounds on what one record stores. A sandboxed program controls how many
// connections it attempts and, through its command line and errors, some
// of the text; the audit log must not grow without bound because of it.
const (
	// MaxNetworkAttempts is the number of denied network attempts kept
	// one by one per record, as many as the egress proxy logs by default;
	// the rest are counted in Record.NetworkOmitted and, by reason and
	// destination, in Record.NetworkSummary. Allowed attempts are all
	// kept (MaxAllowedAttempts).
	MaxNetworkAttempts = 10000
	// MaxViolations is the number of violations kept per record.
	MaxViolations = 1000
	// MaxIDLen bounds record, key and sandbox ids.
	MaxIDLen = 256
	// maxCommandBytes bounds the stored command line (the JSON of argv).
	maxCommandBytes = 64 << 10
	// maxErrorBytes bounds the stored error text; maxFieldBytes any other
	// string that came from a sandbox or a client (host, detail, image).
	maxErrorBytes = 4 << 10
	maxFieldBytes = 1 << 10
)

// Query limits.
const (
	DefaultQueryLimit = 100
	MaxQueryLimit     = 10000
)

// Begin records the start of a run, sandbox or exec, with Status Running.
// r.ID must be new: a duplicate is an error wrapping ErrExists, so every
// run is recorded exactly once. A zero r.Started means now. The outcome
// fields of r (termination, usage, network...) are ignored: Finish sets
// them.
func (s *Store) Begin(r Record) error {
	if err := validID("record id", r.ID); err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if !slices.Contains([]Kind{KindRun, KindSandbox, KindExec, KindApproval, KindSnapshot, KindNetwork}, r.Kind) {
		return fmt.Errorf("begin %s: kind %q is not a record kind; accepted: run, sandbox, exec, approval, snapshot, network", r.ID, r.Kind)
	}
	if r.KeyID != "" {
		if err := validID("key id", r.KeyID); err != nil {
			return fmt.Errorf("begin %s: %w", r.ID, err)
		}
	}
	if r.SandboxID != "" {
		if err := validID("sandbox id", r.SandboxID); err != nil {
			return fmt.Errorf("begin %s: %w", r.ID, err)
		}
	}
	if r.Started.IsZero() {
		r.Started = time.Now()
	}
	cmd, err := commandJSON(r.Command)
	if err != nil {
		return fmt.Errorf("begin %s: %w", r.ID, err)
	}
	_, err = s.w.Exec(`INSERT INTO records (id, kind, key_id, sandbox_id, started, status, tier, image, image_digest,
		manifest_digest, manifest, command, pooled, memory_limit_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		r.ID, string(r.Kind), r.KeyID, r.SandboxID, nanos(r.Started), string(Running),
		clip(r.Tier, maxFieldBytes), clip(r.Image, maxFieldBytes), clip(r.ImageDigest, maxFieldBytes),
		clip(r.ManifestDigest, maxFieldBytes), r.Manifest, cmd, r.Pooled, max(r.MemoryLimit, 0))
	if err != nil {
		if isPrimaryKeyViolation(err) {
			return fmt.Errorf("begin: record %q: %w", r.ID, ErrExists)
		}
		return fmt.Errorf("begin %s: %w", r.ID, err)
	}
	return nil
}

// Finish records how the run, sandbox or exec id ended. res is its result
// (nil when there is none); runErr is Moat's own failure, if any. The
// record becomes Failed when runErr is set, when there is no result or
// when the result says infra-error, and Done otherwise: a program that
// exited non-zero, timed out or was OOM-killed is Done, with its
// Termination. Finishing a record twice is an error wrapping ErrFinished;
// an unknown id wraps ErrNotFound.
func (s *Store) Finish(id string, res *result.Result, runErr error) error {
	status, term := Done, result.Termination("")
	var errText []string
	if runErr != nil {
		status = Failed
		errText = append(errText, runErr.Error())
	}
	if res == nil {
		status, term = Failed, result.InfraError
		if runErr == nil {
			errText = append(errText, "no result was recorded for this run")
		}
		res = &result.Result{}
	} else {
		term = res.Termination
		if term == result.InfraError {
			status = Failed
		}
		if res.Error != "" && (runErr == nil || !strings.Contains(runErr.Error(), res.Error)) {
			errText = append(errText, res.Error)
		}
	}
	if status == Failed && term == "" {
		term = result.InfraError
	}

	tx, err := s.w.Begin()
	if err != nil {
		return fmt.Errorf("finish %s: %w", id, err)
	}
	defer tx.Rollback()
	var cur string
	switch err := tx.QueryRow(`SELECT status FROM records WHERE id = ?`, id).Scan(&cur); {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("finish: record %q: %w (Begin was not called for it)", id, ErrNotFound)
	case err != nil:
		return fmt.Errorf("finish %s: %w", id, err)
	case Status(cur) != Running:
		return fmt.Errorf("finish: record %q is %s: %w", id, cur, ErrFinished)
	}

	network, summary := splitNetwork(res.Network, res.NetworkSummary)
	violations := res.Violations
	netOmitted, violOmitted := 0, 0
	summaryJSON := ""
	if summary != nil {
		netOmitted = summary.Omitted
		b, err := json.Marshal(summary)
		if err != nil {
			return fmt.Errorf("finish %s: network summary: %w", id, err)
		}
		summaryJSON = string(b)
	}
	if len(violations) > MaxViolations {
		violOmitted = len(violations) - MaxViolations
		violations = violations[:MaxViolations]
	}
	cmd, err := commandJSON(res.Command)
	if err != nil {
		return fmt.Errorf("finish %s: %w", id, err)
	}
	// What Begin did not know (the image digest of a pooled sandbox, the
	// tier actually chosen) is taken from the result; what it did know
	// is kept.
	_, err = tx.Exec(`UPDATE records SET ended = ?, status = ?, termination = ?, exit_code = ?,
		wall_ms = ?, cpu_ms = ?, peak_memory_bytes = ?, files_changed = ?,
		network_omitted = ?, network_summary = ?, violations_omitted = ?, error = ?,
		tier = CASE WHEN tier = '' THEN ? ELSE tier END,
		image = CASE WHEN image = '' THEN ? ELSE image END,
		image_digest = CASE WHEN image_digest = '' THEN ? ELSE image_digest END,
		manifest_digest = CASE WHEN manifest_digest = '' THEN ? ELSE manifest_digest END,
		command = CASE WHEN command = '[]' THEN ? ELSE command END,
		pooled = pooled OR ?
		WHERE id = ?`,
		nanos(time.Now()), string(status), string(term), res.ExitCode,
		nonNegative(res.DurationMS), nonNegative(res.CPUMS), max(res.PeakMemoryBytes, 0), len(res.Files),
		netOmitted, summaryJSON, violOmitted, clip(strings.Join(errText, "; "), maxErrorBytes),
		clip(res.Tier, maxFieldBytes), clip(res.Image.Name, maxFieldBytes), clip(res.Image.Digest, maxFieldBytes),
		clip(res.Manifest, maxFieldBytes), cmd, res.Pooled, id)
	if err != nil {
		return fmt.Errorf("finish %s: %w", id, err)
	}
	if len(network) > 0 {
		st, err := tx.Prepare(`INSERT INTO network_attempts (record_id, seq, time, method, host, port, address, allowed, reason, bytes_out, bytes_in)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
		if err != nil {
			return fmt.Errorf("finish %s: %w", id, err)
		}
		defer st.Close()
		for i, a := range network {
			var t int64
			if !a.Time.IsZero() {
				t = nanos(a.Time)
			}
			if _, err := st.Exec(id, i, t, clip(a.Method, maxFieldBytes), clip(a.Host, maxFieldBytes), a.Port,
				clip(a.Address, maxFieldBytes), a.Allowed, clip(a.Reason, maxFieldBytes), a.BytesOut, a.BytesIn); err != nil {
				return fmt.Errorf("finish %s: network attempt %d: %w", id, i, err)
			}
		}
	}
	if len(violations) > 0 {
		st, err := tx.Prepare(`INSERT INTO violations (record_id, seq, kind, detail, limit_value) VALUES (?, ?, ?, ?, ?)`)
		if err != nil {
			return fmt.Errorf("finish %s: %w", id, err)
		}
		defer st.Close()
		for i, v := range violations {
			if _, err := st.Exec(id, i, clip(v.Kind, maxFieldBytes), clip(v.Detail, maxFieldBytes), clip(v.Limit, maxFieldBytes)); err != nil {
				return fmt.Errorf("finish %s: violation %d: %w", id, i, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("finish %s: %w", id, err)
	}
	return nil
}

// DefaultFailReason is what FailRunning records when given no reason.
const DefaultFailReason = "moat stopped while this was running"

// FailRunning settles every record still running: a server calls it at
// start-up, for what was running when the previous server died and will
// never finish. Each becomes Failed (termination infra-error) with reason
// as its error; it keeps the usage accrued while it ran (Accrue), and its
// end is the last time that usage was recorded (started + wall time), not
// the time of the restart. It returns how many there were.
//
// It takes the store's claim first (Claim): records of a server that is
// still running on this database are never settled; with such a server
// it changes nothing and returns an error wrapping ErrInUse.
func (s *Store) FailRunning(reason string) (int, error) {
	if err := s.Claim(); err != nil {
		return 0, fmt.Errorf("fail running records: %w", err)
	}
	if reason == "" {
		reason = DefaultFailReason
	}
	res, err := s.w.Exec(`UPDATE records SET status = ?, ended = started + CAST(wall_ms * 1000000 AS INTEGER), error = ?,
		termination = CASE WHEN termination = '' THEN ? ELSE termination END
		WHERE status = ?`,
		string(Failed), clip(reason, maxErrorBytes), string(result.InfraError), string(Running))
	if err != nil {
		return 0, fmt.Errorf("fail running records: %w", err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("fail running records: %w", err)
	}
	return int(n), nil
}

// Accrual is what a running record has used so far.
type Accrual struct {
	ID     string
	WallMS float64 // since the record's start
	CPUMS  float64
}

// Accrue records, in one transaction, the usage of records still running.
// A server calls it every few seconds, so that a crash loses at most that
// interval of a run's accounting (FailRunning keeps what was accrued) and
// the daily CPU quota counts programs while they run. Recorded usage never
// decreases; records no longer running, and unknown ids, are left alone:
// Finish has the final numbers.
func (s *Store) Accrue(as []Accrual) error {
	if len(as) == 0 {
		return nil
	}
	tx, err := s.w.Begin()
	if err != nil {
		return fmt.Errorf("accrue usage: %w", err)
	}
	defer tx.Rollback()
	st, err := tx.Prepare(`UPDATE records SET wall_ms = MAX(wall_ms, ?), cpu_ms = MAX(cpu_ms, ?) WHERE id = ? AND status = ?`)
	if err != nil {
		return fmt.Errorf("accrue usage: %w", err)
	}
	defer st.Close()
	for _, a := range as {
		if _, err := st.Exec(nonNegative(a.WallMS), nonNegative(a.CPUMS), a.ID, string(Running)); err != nil {
			return fmt.Errorf("accrue usage of %s: %w", a.ID, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("accrue usage: %w", err)
	}
	return nil
}

// Get returns the record with this id, or an error wrapping ErrNotFound.
func (s *Store) Get(id string) (Record, error) {
	recs, err := s.query(`SELECT rowid FROM records WHERE id = ?`, []any{id})
	if err != nil {
		return Record{}, fmt.Errorf("get record %s: %w", id, err)
	}
	if len(recs) == 0 {
		return Record{}, fmt.Errorf("record %q: %w", id, ErrNotFound)
	}
	return recs[0], nil
}

// Query returns the records f selects, newest first. Limit 0 means
// DefaultQueryLimit; more than MaxQueryLimit means MaxQueryLimit; negative
// is an error.
func (s *Store) Query(f Filter) ([]Record, error) {
	limit, err := f.limit()
	if err != nil {
		return nil, err
	}
	where, args := f.where()
	recs, err := s.query(`SELECT rowid FROM records`+where+` ORDER BY started DESC, rowid DESC LIMIT ?`, append(args, limit))
	if err != nil {
		return nil, fmt.Errorf("query records: %w", err)
	}
	return recs, nil
}

func (f Filter) limit() (int, error) {
	switch {
	case f.Limit < 0:
		return 0, fmt.Errorf("filter limit %d is negative; give 0 (the default, %d) up to %d", f.Limit, DefaultQueryLimit, MaxQueryLimit)
	case f.Limit == 0:
		return DefaultQueryLimit, nil
	case f.Limit > MaxQueryLimit:
		return MaxQueryLimit, nil
	}
	return f.Limit, nil
}

// where renders f's conditions (not its limit) as a WHERE clause on
// records, or "" when it selects everything.
func (f Filter) where() (string, []any) {
	var conds []string
	var args []any
	add := func(cond string, arg any) {
		conds = append(conds, cond)
		args = append(args, arg)
	}
	if f.KeyID != "" {
		add("key_id = ?", f.KeyID)
	}
	if f.SandboxID != "" {
		add("sandbox_id = ?", f.SandboxID)
	}
	if f.Kind != "" {
		add("kind = ?", string(f.Kind))
	}
	if f.Status != "" {
		add("status = ?", string(f.Status))
	}
	if f.Termination != "" {
		add("termination = ?", string(f.Termination))
	}
	if !f.Since.IsZero() {
		add("started >= ?", nanos(f.Since))
	}
	if !f.Until.IsZero() {
		add("started < ?", nanos(f.Until))
	}
	if len(conds) == 0 {
		return "", nil
	}
	return " WHERE " + strings.Join(conds, " AND "), args
}

const recordColumns = `id, kind, key_id, sandbox_id, started, ended, status, tier, image, image_digest,
	manifest_digest, manifest, command, pooled, termination, exit_code, wall_ms, cpu_ms,
	peak_memory_bytes, memory_limit_bytes, files_changed, network_omitted, network_summary, violations_omitted, error`

// query loads the records whose rowids sel (a SELECT of rowids) returns,
// newest first, with their network attempts and violations, in one read
// transaction so the three reads see the same snapshot.
func (s *Store) query(sel string, args []any) ([]Record, error) {
	ctx := context.Background()
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	// A temporary table would need a writable connection; a CTE, reused
	// by the three statements, keeps everything on the reader.
	cte := `WITH sel(rid) AS (` + sel + `) `
	rows, err := tx.QueryContext(ctx, cte+`SELECT `+recordColumns+` FROM records WHERE rowid IN sel ORDER BY started DESC, rowid DESC`, args...)
	if err != nil {
		return nil, err
	}
	recs := []Record{}
	index := map[string]int{}
	for rows.Next() {
		r, err := scanRecord(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		index[r.ID] = len(recs)
		recs = append(recs, r)
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(recs) == 0 {
		return recs, nil
	}

	rows, err = tx.QueryContext(ctx, cte+`SELECT n.record_id, n.time, n.method, n.host, n.port, n.address, n.allowed, n.reason, n.bytes_out, n.bytes_in
		FROM network_attempts n WHERE n.record_id IN (SELECT id FROM records WHERE rowid IN sel)
		ORDER BY n.record_id, n.seq`, args...)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var id string
		var t int64
		var a result.NetworkAttempt
		if err := rows.Scan(&id, &t, &a.Method, &a.Host, &a.Port, &a.Address, &a.Allowed, &a.Reason, &a.BytesOut, &a.BytesIn); err != nil {
			rows.Close()
			return nil, err
		}
		if t != 0 {
			a.Time = fromNanos(t)
		}
		if i, ok := index[id]; ok {
			recs[i].Network = append(recs[i].Network, a)
		}
	}
	if err := rows.Close(); err != nil {
		return nil, err
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}

	rows, err = tx.QueryContext(ctx, cte+`SELECT v.record_id, v.kind, v.detail, v.limit_value
		FROM violations v WHERE v.record_id IN (SELECT id FROM records WHERE rowid IN sel)
		ORDER BY v.record_id, v.seq`, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var id string
		var v result.Violation
		if err := rows.Scan(&id, &v.Kind, &v.Detail, &v.Limit); err != nil {
			return nil, err
		}
		if i, ok := index[id]; ok {
			recs[i].Violations = append(recs[i].Violations, v)
		}
	}
	return recs, rows.Err()
}

func scanRecord(sc interface{ Scan(...any) error }) (Record, error) {
	var r Record
	var kind, status, term, cmd, summary string
	var started int64
	var ended sql.NullInt64
	err := sc.Scan(&r.ID, &kind, &r.KeyID, &r.SandboxID, &started, &ended, &status, &r.Tier, &r.Image, &r.ImageDigest,
		&r.ManifestDigest, &r.Manifest, &cmd, &r.Pooled, &term, &r.ExitCode, &r.WallMS, &r.CPUMS,
		&r.PeakMemoryBytes, &r.MemoryLimit, &r.Files, &r.NetworkOmitted, &summary, &r.ViolationsOmitted, &r.Error)
	if err != nil {
		return Record{}, err
	}
	r.Kind, r.Status, r.Termination = Kind(kind), Status(status), result.Termination(term)
	r.Started = fromNanos(started)
	if ended.Valid {
		r.Ended = fromNanos(ended.Int64)
	}
	r.Command = []string{}
	if err := json.Unmarshal([]byte(cmd), &r.Command); err != nil {
		return Record{}, fmt.Errorf("record %s: stored command is not a JSON list: %w", r.ID, err)
	}
	if summary != "" {
		r.NetworkSummary = &result.NetworkSummary{}
		if err := json.Unmarshal([]byte(summary), r.NetworkSummary); err != nil {
			return Record{}, fmt.Errorf("record %s: stored network summary is not valid: %w", r.ID, err)
		}
	}
	// Lists are never null in JSON.
	r.Network = []result.NetworkAttempt{}
	r.Violations = []result.Violation{}
	return r, nil
}

// CPUSecondsToday is the CPU time of keyID's records started since 00:00
// UTC today, for the per-key daily quota. Records still running count
// with the usage accrued so far (Accrue).
func (s *Store) CPUSecondsToday(keyID string) (float64, error) {
	y, m, d := time.Now().UTC().Date()
	midnight := time.Date(y, m, d, 0, 0, 0, 0, time.UTC)
	var ms float64
	err := s.r.QueryRow(`SELECT COALESCE(SUM(cpu_ms), 0) FROM records WHERE key_id = ? AND started >= ?`, keyID, nanos(midnight)).Scan(&ms)
	if err != nil {
		return 0, fmt.Errorf("CPU seconds of key %s today: %w", keyID, err)
	}
	return ms / 1000, nil
}

// validID accepts 1 to MaxIDLen printable ASCII characters without spaces:
// ids are shown in listings and passed on command lines.
func validID(what, id string) error {
	if id == "" {
		return fmt.Errorf("%s is empty", what)
	}
	if len(id) > MaxIDLen {
		return fmt.Errorf("%s %.40q... is %d bytes; at most %d", what, id, len(id), MaxIDLen)
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; c <= ' ' || c >= 0x7f {
			return fmt.Errorf("%s %q contains %q; use printable ASCII without spaces", what, id, c)
		}
	}
	return nil
}

// commandJSON encodes argv for storage, cutting it at maxCommandBytes: the
// arguments that do not fit are replaced by one marker argument saying
// how many were dropped.
func commandJSON(argv []string) (string, error) {
	if argv == nil {
		argv = []string{}
	}
	total := 2
	for i, a := range argv {
		total += len(a) + 3
		if total > maxCommandBytes {
			kept := append(slices.Clone(argv[:i]), clip(a, maxCommandBytes/2), fmt.Sprintf("...(%d more arguments not recorded)", len(argv)-i-1))
			argv = kept
			break
		}
	}
	b, err := json.Marshal(argv)
	if err != nil {
		return "", fmt.Errorf("encode command: %w", err)
	}
	return string(b), nil
}

// clip shortens s to at most n bytes on a rune boundary, marking the cut,
// and replaces invalid UTF-8, so stored text is always valid text.
func clip(s string, n int) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if len(s) <= n {
		return s
	}
	const mark = "...(truncated)"
	n -= len(mark)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + mark
}

func nonNegative(f float64) float64 {
	if f > 0 {
		return f
	}
	return 0
}
