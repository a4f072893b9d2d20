package audit

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/moat-sandbox/moat/output"
	"github.com/moat-sandbox/moat/result"
)

// Prices turn usage into money, in whatever currency the operator thinks
// in (the text report writes "$"). Every field is a price per second of
// one unit and must be finite and non-negative; zero makes that resource
// free.
type Prices struct {
	CPUSecond  float64 `json:"cpu_second"`  // one CPU busy for one second
	GiBSecond  float64 `json:"gib_second"`  // one GiB of memory held for one second
	WallSecond float64 `json:"wall_second"` // one run (a sandbox slot) alive for one second
}

// DefaultPrices are AWS Fargate's on-demand Linux/x86 list prices in
// us-east-1 (USD 0.04048 per vCPU-hour and 0.004445 per GB-hour), per
// second: a familiar reference for what the same work costs on rented
// machines, not a bill. Wall time is free by default, since CPU and memory
// already price what a run consumed; set WallSecond to charge for the
// occupancy of a sandbox slot (a sleeping program holds one of the
// server's --max-concurrent slots without using CPU).
var DefaultPrices = Prices{
	CPUSecond:  0.04048 / 3600,
	GiBSecond:  0.004445 / 3600,
	WallSecond: 0,
}

func (p Prices) validate() error {
	for _, f := range []struct {
		name string
		v    float64
	}{{"cpu_second", p.CPUSecond}, {"gib_second", p.GiBSecond}, {"wall_second", p.WallSecond}} {
		if math.IsNaN(f.v) || math.IsInf(f.v, 0) || f.v < 0 {
			return fmt.Errorf("price %s %v is not a finite, non-negative number", f.name, f.v)
		}
	}
	return nil
}

// ReportTop is how many entries the report's top lists hold (denied
// destinations, timed-out commands, costliest runs); ReportMaxKeys bounds
// the per-key cost table.
const (
	ReportTop     = 10
	ReportMaxKeys = 100
)

// Report summarises what a set of records attempted and what it cost.
//
// Memory is charged as peak memory × wall time (GiB-seconds). The peak is
// what the run actually took from the host at its worst, so the product
// never understates what it held, and a fork bomb that filled its limit
// for 30 s is charged for exactly that. The memory limit × wall time is
// reported beside it as ReservedGiBSeconds but not priced: a cgroup limit
// is a cap, not a reservation (the kernel does not set the memory aside),
// and charging it would bill a 10 MiB script in a default 512 MiB sandbox
// fifty times over.
//
// Every record the filter selects counts, finished or not (a running
// record has no usage yet). A session's own record (kind sandbox) counts
// beside its execs: filter by kind to see one or the other.
type Report struct {
	Generated time.Time `json:"generated"`
	// First and Last are the start times of the oldest and newest record.
	First   time.Time `json:"first,omitzero"`
	Last    time.Time `json:"last,omitzero"`
	Records int       `json:"records"`

	Kinds        []Count `json:"kinds"`
	Statuses     []Count `json:"statuses"`
	Terminations []Count `json:"terminations"` // of records that ended

	// NetworkAttempts counts every attempt, stored one by one or not;
	// NetworkDenied those refused; NetworkOmitted those not stored one by
	// one (Record.NetworkOmitted), and NetworkOmittedReasons why they were
	// refused (from the records' network summaries; the omitted attempts
	// of records written before summaries existed have no reason).
	NetworkAttempts       int     `json:"network_attempts"`
	NetworkDenied         int     `json:"network_denied"`
	NetworkOmitted        int     `json:"network_omitted"`
	NetworkOmittedReasons []Count `json:"network_omitted_reasons"`
	// NetworkBytesOut and NetworkBytesIn are the bytes the proxy forwarded
	// each way, NetworkLookupBytes the bytes of host names it resolved for
	// wildcard rules (charged to max_bytes_out).
	NetworkBytesOut    int64 `json:"network_bytes_out"`
	NetworkBytesIn     int64 `json:"network_bytes_in"`
	NetworkLookupBytes int64 `json:"network_lookup_bytes"`
	// Denied are the most-denied destinations, most first, counting the
	// attempts stored one by one and those only counted in a network
	// summary; DeniedElsewhere counts the denied attempts to the
	// destinations not listed.
	Denied          []Destination `json:"denied"`
	DeniedElsewhere int           `json:"denied_elsewhere"`

	// Limits are the violation kinds the runs ran into, most first.
	Limits []Limit `json:"limits"`
	// TimedOut are the commands that most often ended in a timeout.
	TimedOut []CommandCount `json:"timed_out"`

	Prices Prices `json:"prices"`
	Total  Cost   `json:"total"`
	// PerRecord is Total divided by Records.
	PerRecord Cost `json:"per_record"`
	// Costliest are the most expensive records at Prices, most first.
	Costliest []RecordCost `json:"costliest"`
	// PerKey is the cost of each key's records, most expensive first
	// ("" is the local CLI).
	PerKey []KeyCost `json:"per_key"`
}

// Count is a value and how many times it occurred.
type Count struct {
	Name  string `json:"name"`
	Count int    `json:"count"`
}

// Destination is a host:port the proxy refused, with why.
type Destination struct {
	Host    string  `json:"host"`
	Port    int     `json:"port"`
	Count   int     `json:"count"`
	Reasons []Count `json:"reasons"`
}

// Limit is one violation kind: how many violations, in how many records.
type Limit struct {
	Kind    string `json:"kind"`
	Hits    int    `json:"hits"`
	Records int    `json:"records"`
}

// CommandCount is a command line and how many records ran it.
type CommandCount struct {
	Command []string `json:"command"`
	Count   int      `json:"count"`
}

// Cost is usage and its price.
type Cost struct {
	CPUSeconds  float64 `json:"cpu_seconds"`
	GiBSeconds  float64 `json:"gib_seconds"` // peak memory × wall
	WallSeconds float64 `json:"wall_seconds"`
	// ReservedGiBSeconds is memory limit × wall, for comparison; unpriced.
	ReservedGiBSeconds float64 `json:"reserved_gib_seconds"`
	Price              float64 `json:"price"`
}

// RecordCost is one record's cost.
type RecordCost struct {
	ID          string             `json:"id"`
	Kind        Kind               `json:"kind"`
	KeyID       string             `json:"key_id"`
	Termination result.Termination `json:"termination,omitempty"`
	Command     []string           `json:"command"`
	Cost
}

// KeyCost is the cost of one key's records.
type KeyCost struct {
	KeyID   string `json:"key_id"`
	Records int    `json:"records"`
	Cost
}

func (p Prices) price(c *Cost) {
	c.Price = c.CPUSeconds*p.CPUSecond + c.GiBSeconds*p.GiBSecond + c.WallSeconds*p.WallSecond
}

// Usage columns in seconds and GiB-seconds, as SQL over a records row.
const (
	cpuSQL      = `(cpu_ms / 1000.0)`
	gibSQL      = `(CAST(peak_memory_bytes AS REAL) * wall_ms / 1000.0 / 1073741824.0)`
	reservedSQL = `(CAST(memory_limit_bytes AS REAL) * wall_ms / 1000.0 / 1073741824.0)`
	wallSQL     = `(wall_ms / 1000.0)`
	// priceSQL takes the three prices as parameters.
	priceSQL = `(` + cpuSQL + ` * ? + ` + gibSQL + ` * ? + ` + wallSQL + ` * ?)`
	costCols = `SUM(` + cpuSQL + `), SUM(` + gibSQL + `), SUM(` + wallSQL + `), SUM(` + reservedSQL + `)`
)

// Report summarises the records f selects, at prices p. Filter.Limit 0
// covers every matching record (not DefaultQueryLimit: a report is about
// all of them); a positive Limit covers the newest Limit.
func (s *Store) Report(f Filter, p Prices) (*Report, error) {
	if err := p.validate(); err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	if f.Limit < 0 {
		return nil, fmt.Errorf("report: filter limit %d is negative; give 0 for every record", f.Limit)
	}
	where, cargs := f.where()
	// recs is the selection; every statement below starts with it, so its
	// arguments come first. Without a limit there is nothing to sort.
	cte := `WITH recs AS (SELECT * FROM records` + where + `) `
	if f.Limit > 0 {
		cte = `WITH recs AS (SELECT * FROM records` + where + ` ORDER BY started DESC, rowid DESC LIMIT ?) `
		cargs = append(cargs, f.Limit)
	}
	args := func(more ...any) []any { return append(append([]any{}, cargs...), more...) }

	ctx := context.Background()
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("report: %w", err)
	}
	defer tx.Rollback()
	rep := &Report{Generated: time.Now().UTC(), Prices: p,
		Kinds: []Count{}, Statuses: []Count{}, Terminations: []Count{}, Denied: []Destination{}, NetworkOmittedReasons: []Count{},
		Limits: []Limit{}, TimedOut: []CommandCount{}, Costliest: []RecordCost{}, PerKey: []KeyCost{}}

	var first, last sql.NullInt64
	var netOmitted sql.NullInt64
	var cpu, gib, wall, reserved sql.NullFloat64
	err = tx.QueryRowContext(ctx, cte+`SELECT COUNT(*), MIN(started), MAX(started), SUM(network_omitted), `+costCols+` FROM recs`, args()...).
		Scan(&rep.Records, &first, &last, &netOmitted, &cpu, &gib, &wall, &reserved)
	if err != nil {
		return nil, fmt.Errorf("report: totals: %w", err)
	}
	if first.Valid {
		rep.First, rep.Last = fromNanos(first.Int64), fromNanos(last.Int64)
	}
	rep.NetworkOmitted = int(netOmitted.Int64)
	rep.Total = Cost{CPUSeconds: cpu.Float64, GiBSeconds: gib.Float64, WallSeconds: wall.Float64, ReservedGiBSeconds: reserved.Float64}
	p.price(&rep.Total)
	if rep.Records > 0 {
		n := float64(rep.Records)
		t := rep.Total
		rep.PerRecord = Cost{CPUSeconds: t.CPUSeconds / n, GiBSeconds: t.GiBSeconds / n, WallSeconds: t.WallSeconds / n,
			ReservedGiBSeconds: t.ReservedGiBSeconds / n, Price: t.Price / n}
	}

	for _, c := range []struct {
		col string
		out *[]Count
	}{{"kind", &rep.Kinds}, {"status", &rep.Statuses}, {"termination", &rep.Terminations}} {
		*c.out, err = counts(ctx, tx, cte+`SELECT `+c.col+`, COUNT(*) FROM recs WHERE `+c.col+` <> '' GROUP BY 1 ORDER BY 2 DESC, 1`, args())
		if err != nil {
			return nil, fmt.Errorf("report: %s counts: %w", c.col, err)
		}
	}

	const inRecs = ` record_id IN (SELECT id FROM recs)`
	var denied, bytesOut, bytesIn sql.NullInt64
	err = tx.QueryRowContext(ctx, cte+`SELECT COUNT(*), SUM(allowed = 0), SUM(bytes_out), SUM(bytes_in) FROM network_attempts WHERE`+inRecs, args()...).
		Scan(&rep.NetworkAttempts, &denied, &bytesOut, &bytesIn)
	if err != nil {
		return nil, fmt.Errorf("report: network: %w", err)
	}
	// Attempts not stored one by one are denied ones, counted in the
	// summary; before summaries existed, they could be anything.
	var omittedDenied, lookupBytes sql.NullInt64
	err = tx.QueryRowContext(ctx, cte+`SELECT SUM(network_omitted), SUM(json_extract(network_summary, '$.lookup_bytes'))
		FROM recs WHERE network_summary <> ''`, args()...).Scan(&omittedDenied, &lookupBytes)
	if err != nil {
		return nil, fmt.Errorf("report: network summaries: %w", err)
	}
	rep.NetworkAttempts += rep.NetworkOmitted
	rep.NetworkDenied = int(denied.Int64 + omittedDenied.Int64)
	rep.NetworkBytesOut, rep.NetworkBytesIn, rep.NetworkLookupBytes = bytesOut.Int64, bytesIn.Int64, lookupBytes.Int64
	rep.NetworkOmittedReasons, err = counts(ctx, tx, cte+`SELECT CAST(j.key AS TEXT), SUM(j.value) FROM recs, json_each(recs.network_summary, '$.omitted_reasons') j
		WHERE recs.network_summary <> '' GROUP BY 1 ORDER BY 2 DESC, 1`, args())
	if err != nil {
		return nil, fmt.Errorf("report: omitted network attempts: %w", err)
	}
	if err := rep.loadDenied(ctx, tx, cte, args); err != nil {
		return nil, fmt.Errorf("report: denied destinations: %w", err)
	}

	rows, err := tx.QueryContext(ctx, cte+`SELECT kind, COUNT(*), COUNT(DISTINCT record_id) FROM violations WHERE`+inRecs+
		` GROUP BY kind ORDER BY 2 DESC, 1`, args()...)
	if err != nil {
		return nil, fmt.Errorf("report: limits: %w", err)
	}
	for rows.Next() {
		var l Limit
		if err := rows.Scan(&l.Kind, &l.Hits, &l.Records); err != nil {
			rows.Close()
			return nil, fmt.Errorf("report: limits: %w", err)
		}
		rep.Limits = append(rep.Limits, l)
	}
	if err := closeRows(rows); err != nil {
		return nil, fmt.Errorf("report: limits: %w", err)
	}

	rows, err = tx.QueryContext(ctx, cte+`SELECT command, COUNT(*) FROM recs WHERE termination = ? GROUP BY command ORDER BY 2 DESC, 1 LIMIT ?`,
		args(string(result.Timeout), ReportTop)...)
	if err != nil {
		return nil, fmt.Errorf("report: timed-out commands: %w", err)
	}
	for rows.Next() {
		var cmd string
		var cc CommandCount
		if err := rows.Scan(&cmd, &cc.Count); err != nil {
			rows.Close()
			return nil, fmt.Errorf("report: timed-out commands: %w", err)
		}
		cc.Command = decodeCommand(cmd)
		rep.TimedOut = append(rep.TimedOut, cc)
	}
	if err := closeRows(rows); err != nil {
		return nil, fmt.Errorf("report: timed-out commands: %w", err)
	}

	rows, err = tx.QueryContext(ctx, cte+`SELECT id, kind, key_id, termination, command, `+cpuSQL+`, `+gibSQL+`, `+wallSQL+`, `+reservedSQL+
		` FROM recs ORDER BY `+priceSQL+` DESC, cpu_ms DESC, wall_ms DESC, id LIMIT ?`,
		args(p.CPUSecond, p.GiBSecond, p.WallSecond, ReportTop)...)
	if err != nil {
		return nil, fmt.Errorf("report: costliest records: %w", err)
	}
	for rows.Next() {
		var rc RecordCost
		var kind, term, cmd string
		if err := rows.Scan(&rc.ID, &kind, &rc.KeyID, &term, &cmd, &rc.CPUSeconds, &rc.GiBSeconds, &rc.WallSeconds, &rc.ReservedGiBSeconds); err != nil {
			rows.Close()
			return nil, fmt.Errorf("report: costliest records: %w", err)
		}
		rc.Kind, rc.Termination, rc.Command = Kind(kind), result.Termination(term), decodeCommand(cmd)
		p.price(&rc.Cost)
		rep.Costliest = append(rep.Costliest, rc)
	}
	if err := closeRows(rows); err != nil {
		return nil, fmt.Errorf("report: costliest records: %w", err)
	}

	rows, err = tx.QueryContext(ctx, cte+`SELECT key_id, COUNT(*), `+costCols+` FROM recs GROUP BY key_id
		ORDER BY SUM`+priceSQL+` DESC, SUM(cpu_ms) DESC, key_id LIMIT ?`,
		args(p.CPUSecond, p.GiBSecond, p.WallSecond, ReportMaxKeys)...)
	if err != nil {
		return nil, fmt.Errorf("report: per-key cost: %w", err)
	}
	for rows.Next() {
		var kc KeyCost
		if err := rows.Scan(&kc.KeyID, &kc.Records, &kc.CPUSeconds, &kc.GiBSeconds, &kc.WallSeconds, &kc.ReservedGiBSeconds); err != nil {
			rows.Close()
			return nil, fmt.Errorf("report: per-key cost: %w", err)
		}
		p.price(&kc.Cost)
		rep.PerKey = append(rep.PerKey, kc)
	}
	if err := closeRows(rows); err != nil {
		return nil, fmt.Errorf("report: per-key cost: %w", err)
	}
	return rep, nil
}

// loadDenied fills the top denied destinations and, for each, the counts
// of its reasons. Two steps, so the rows read are bounded by ReportTop
// however many distinct destinations a hostile run tried. The denied
// attempts are those stored one by one and those a network summary counts
// by destination (a summary holds at most 256 destinations).
func (rep *Report) loadDenied(ctx context.Context, tx *sql.Tx, cte string, args func(...any) []any) error {
	const denied = ` FROM (SELECT host, port, reason, 1 AS n FROM network_attempts WHERE allowed = 0 AND record_id IN (SELECT id FROM recs)
		UNION ALL SELECT json_extract(j.value, '$.host'), json_extract(j.value, '$.port'), json_extract(j.value, '$.reason'), json_extract(j.value, '$.count')
		FROM recs, json_each(recs.network_summary, '$.omitted_destinations') j WHERE recs.network_summary <> '')`
	rows, err := tx.QueryContext(ctx, cte+`SELECT host, port, SUM(n)`+denied+` GROUP BY host, port ORDER BY 3 DESC, 1, 2 LIMIT ?`, args(ReportTop)...)
	if err != nil {
		return err
	}
	listed := 0
	for rows.Next() {
		d := Destination{Reasons: []Count{}}
		if err := rows.Scan(&d.Host, &d.Port, &d.Count); err != nil {
			rows.Close()
			return err
		}
		listed += d.Count
		rep.Denied = append(rep.Denied, d)
	}
	if err := closeRows(rows); err != nil {
		return err
	}
	rep.DeniedElsewhere = rep.NetworkDenied - listed
	for i := range rep.Denied {
		d := &rep.Denied[i]
		d.Reasons, err = counts(ctx, tx, cte+`SELECT reason, SUM(n)`+denied+` WHERE host = ? AND port = ? GROUP BY 1 ORDER BY 2 DESC, 1`, args(d.Host, d.Port))
		if err != nil {
			return err
		}
	}
	return nil
}

func counts(ctx context.Context, tx *sql.Tx, q string, args []any) ([]Count, error) {
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	out := []Count{}
	for rows.Next() {
		var c Count
		if err := rows.Scan(&c.Name, &c.Count); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, c)
	}
	return out, closeRows(rows)
}

func closeRows(rows *sql.Rows) error {
	if err := rows.Err(); err != nil {
		rows.Close()
		return err
	}
	return rows.Close()
}

func decodeCommand(s string) []string {
	cmd := []string{}
	if json.Unmarshal([]byte(s), &cmd) != nil {
		return []string{s}
	}
	return cmd
}

// WriteText renders the report for a person. Every string that came from
// a sandbox or a client (commands, hosts, key ids) is escaped, so a record
// cannot write control sequences to the reader's terminal.
func (rep *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	if rep.Records == 0 {
		fmt.Fprintln(ew, "No audit records match.")
		return ew.err
	}
	fmt.Fprintf(ew, "Audit report: %d records started %s .. %s UTC\n", rep.Records,
		rep.First.Format("2006-01-02 15:04:05"), rep.Last.Format("2006-01-02 15:04:05"))
	fmt.Fprintf(ew, "  kinds:        %s\n", joinCounts(rep.Kinds))
	fmt.Fprintf(ew, "  statuses:     %s\n", joinCounts(rep.Statuses))
	fmt.Fprintf(ew, "  terminations: %s\n", joinCounts(rep.Terminations))

	fmt.Fprintf(ew, "\nNetwork: %d attempts, %d denied", rep.NetworkAttempts, rep.NetworkDenied)
	if rep.NetworkOmitted > 0 {
		fmt.Fprintf(ew, " (%d not stored one by one", rep.NetworkOmitted)
		if len(rep.NetworkOmittedReasons) > 0 {
			fmt.Fprintf(ew, ": %s", joinCounts(rep.NetworkOmittedReasons))
		}
		fmt.Fprint(ew, ")")
	}
	fmt.Fprintf(ew, "; %s out, %s in", humanBytes(rep.NetworkBytesOut), humanBytes(rep.NetworkBytesIn))
	if rep.NetworkLookupBytes > 0 {
		fmt.Fprintf(ew, ", %s of host names looked up for wildcard rules", humanBytes(rep.NetworkLookupBytes))
	}
	fmt.Fprintln(ew)
	if len(rep.Denied) > 0 {
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  most denied\tattempts\treasons")
		for _, d := range rep.Denied {
			fmt.Fprintf(tw, "  %s\t%d\t%s\n", Display(hostPort(d.Host, d.Port)), d.Count, joinCounts(d.Reasons))
		}
		if rep.DeniedElsewhere > 0 {
			fmt.Fprintf(tw, "  (elsewhere)\t%d\t\n", rep.DeniedElsewhere)
		}
		tw.Flush()
	}

	fmt.Fprintln(ew, "\nLimits hit:")
	if len(rep.Limits) == 0 {
		fmt.Fprintln(ew, "  none")
	} else {
		tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  kind\thits\trecords")
		for _, l := range rep.Limits {
			fmt.Fprintf(tw, "  %s\t%d\t%d\n", Display(l.Kind), l.Hits, l.Records)
		}
		tw.Flush()
	}

	fmt.Fprintln(ew, "\nCommands that timed out:")
	if len(rep.TimedOut) == 0 {
		fmt.Fprintln(ew, "  none")
	}
	for _, c := range rep.TimedOut {
		fmt.Fprintf(ew, "  %6d  %s\n", c.Count, DisplayCommand(c.Command, 100))
	}

	p := rep.Prices
	fmt.Fprintf(ew, "\nCost at %s/CPU-second, %s/GiB-second, %s/wall-second (memory charged as peak × wall):\n",
		money(p.CPUSecond), money(p.GiBSecond), money(p.WallSecond))
	tw := tabwriter.NewWriter(ew, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tCPU-s\tGiB-s\twall-s\tcost\t(reserved GiB-s)\t")
	costRow := func(label string, c Cost) {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t\n", label, num(c.CPUSeconds), num(c.GiBSeconds), num(c.WallSeconds), money(c.Price), num(c.ReservedGiBSeconds))
	}
	costRow("total", rep.Total)
	costRow("per record", rep.PerRecord)
	tw.Flush()

	fmt.Fprintln(ew, "\nCostliest records:")
	tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  id\tkey\ttermination\tCPU-s\tGiB-s\twall-s\tcost\tcommand")
	for _, r := range rep.Costliest {
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", Display(r.ID), keyLabel(r.KeyID), orDash(string(r.Termination)),
			num(r.CPUSeconds), num(r.GiBSeconds), num(r.WallSeconds), money(r.Price), DisplayCommand(r.Command, 60))
	}
	tw.Flush()

	fmt.Fprintln(ew, "\nCost per key:")
	tw = tabwriter.NewWriter(ew, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  key\trecords\tCPU-s\tGiB-s\twall-s\tcost")
	for _, k := range rep.PerKey {
		fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%s\t%s\n", keyLabel(k.KeyID), k.Records, num(k.CPUSeconds), num(k.GiBSeconds), num(k.WallSeconds), money(k.Price))
	}
	tw.Flush()
	return ew.err
}

// errWriter keeps the first write error, so the renderer checks once.
type errWriter struct {
	w   io.Writer
	err error
}

func (e *errWriter) Write(b []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	n, err := e.w.Write(b)
	e.err = err
	return n, err
}

func joinCounts(cs []Count) string {
	if len(cs) == 0 {
		return "none"
	}
	parts := make([]string, len(cs))
	for i, c := range cs {
		parts[i] = Display(c.Name) + " " + strconv.Itoa(c.Count)
	}
	return strings.Join(parts, ", ")
}

func keyLabel(id string) string {
	if id == "" {
		return "(local)"
	}
	return Display(id)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return Display(s)
}

func hostPort(host string, port int) string {
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + strconv.Itoa(port)
}

// num renders a usage figure with three significant digits, without an
// exponent.
func num(v float64) string {
	if v == 0 {
		return "0"
	}
	return trimZeros(strconv.FormatFloat(v, 'f', decimals(v, 0), 64), 0)
}

// money renders a price with at least two decimals and three significant
// digits: $12.30, $0.000337.
func money(v float64) string {
	if v == 0 {
		return "$0"
	}
	return "$" + trimZeros(strconv.FormatFloat(v, 'f', decimals(v, 2), 64), 2)
}

// decimals is how many decimals show three significant digits of v, at
// least least and at most 12.
func decimals(v float64, least int) int {
	d := 3 - int(math.Floor(math.Log10(math.Abs(v)))) - 1
	return min(max(d, least), 12)
}

// trimZeros removes trailing zeros after the decimal point of s, keeping
// at least least decimals.
func trimZeros(s string, least int) string {
	dot := strings.IndexByte(s, '.')
	if dot < 0 {
		return s
	}
	keep := dot + 1 + least
	for len(s) > keep && s[len(s)-1] == '0' {
		s = s[:len(s)-1]
	}
	return strings.TrimSuffix(s, ".")
}

// Display returns s as is when every character is printable, else quoted
// with Go escapes: output.Display, the one rule for what a sandbox or a
// client chose and a terminal shows.
func Display(s string) string {
	return output.Display(s)
}

// DisplayCommand renders argv as a command line for a person: plain words
// as they are, others quoted with Go escapes; cut to about width
// characters.
func DisplayCommand(argv []string, width int) string {
	parts := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && output.Display(a) == a && !strings.ContainsAny(a, " \t\"'\\$`;&|<>(){}*?[]#~!") {
			parts[i] = a
		} else {
			parts[i] = strconv.Quote(a)
		}
	}
	s := strings.Join(parts, " ")
	if width > 3 && utf8.RuneCountInString(s) > width {
		r := []rune(s)
		s = string(r[:width-3]) + "..."
	}
	return s
}
