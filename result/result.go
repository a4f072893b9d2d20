// Package result defines the one Result type that every isolation tier
// returns, and the closed taxonomy of how a run can end.
//
// A sandbox's outcome is not a Go error: a non-zero exit, a signal, an OOM
// kill or a timeout are all recorded here. A Go error from Moat means Moat
// itself failed (Termination "infra-error" when it is reported as a Result).
//
// This package must never import anything that touches the host: it is data.
package result

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"
)

// Termination says why a run ended. It is a closed set shared by all tiers;
// never free text.
type Termination string

// The termination causes.
const (
	Exited      Termination = "exited"       // the program exited by itself (any exit code)
	Signaled    Termination = "signaled"     // the program was killed by a signal it did not catch
	Timeout     Termination = "timeout"      // the wall-clock timeout fired; the whole sandbox was killed
	CPUTime     Termination = "cpu-time"     // the CPU-time limit fired (SIGXCPU/SIGKILL from RLIMIT_CPU)
	OOM         Termination = "oom"          // the memory limit was hit and the kernel OOM-killed a process
	Pids        Termination = "pids"         // the process limit was hit and the program died of it
	OutputLimit Termination = "output-limit" // the output budget was exhausted and the run was stopped
	DiskLimit   Termination = "disk-limit"   // the workspace size or file-count limit was hit
	Policy      Termination = "policy"       // the run was refused or killed by policy (e.g. a seccomp kill)
	InfraError  Termination = "infra-error"  // Moat itself failed; see Error
)

// SchemaVersion is the version of the JSON form of Result. It changes only
// when a field changes meaning or is removed.
const SchemaVersion = 1

// Result is the structured outcome of one run. Its JSON form is documented in
// docs/RESULT.md and is the same for every tier.
type Result struct {
	Schema   int    `json:"schema"`
	ID       string `json:"id"`
	Tier     string `json:"tier"`
	Image    Image  `json:"image"`
	Manifest string `json:"manifest_digest"`
	// Justifications are the manifest's reasons for its widenings beyond
	// Moat's defaults, by field ("resources.memory"), so a reviewer of the
	// result reads why the run had what it had. Absent: none given.
	Justifications map[string]string `json:"justifications,omitempty"`
	Command        []string          `json:"command"`
	// Pooled is true when the sandbox came prepared from a warm pool.
	Pooled      bool        `json:"pooled,omitempty"`
	Termination Termination `json:"termination"`
	// ExitCode is the program's exit status (0-255) when it exited, or the
	// shell convention 128+N when it was killed by signal N, 124 on timeout.
	ExitCode   int    `json:"exit_code"`
	Signal     int    `json:"signal,omitempty"`
	SignalName string `json:"signal_name,omitempty"`
	TimedOut   bool   `json:"timed_out"`
	OOMKilled  bool   `json:"oom_killed"`

	StartedAt       time.Time `json:"started_at"`
	DurationMS      float64   `json:"duration_ms"`
	CPUMS           float64   `json:"cpu_ms"`
	PeakMemoryBytes int64     `json:"peak_memory_bytes"`

	Stdout Stream `json:"stdout"`
	Stderr Stream `json:"stderr"`

	Files []FileChange `json:"files"`
	// Network lists the destinations the run tried through the egress
	// proxy (empty with network mode none: there is no path out to try):
	// every attempt let through, with its bytes, and the first refused
	// ones; NetworkSummary counts the refused attempts it does not list.
	Network []NetworkAttempt `json:"network"`
	// NetworkSummary accounts for every attempt through the egress proxy,
	// listed in Network or not; nil with network mode none.
	NetworkSummary *NetworkSummary `json:"network_summary,omitempty"`
	// SecretsUsed lists the manifest's secrets the egress proxy put into
	// requests, by host, with how many requests: never their values or
	// placeholders. Absent when none was used.
	SecretsUsed []SecretUse `json:"secrets_used,omitempty"`
	Violations  []Violation `json:"violations"`
	// Findings are what the output-channel guard saw in stdout, stderr
	// and the diff's files that looks like data on its way out (canaries,
	// known secret formats, blobs, real secret values it redacted) and
	// file names with terminal escapes: kind, where and offset, never the
	// content. Absent when there is none.
	Findings []Finding `json:"findings,omitempty"`
	// Withheld is true when the run was flagged (a canary seen) and the
	// manifest asked for output.withhold_flagged: stdout and stderr hold a
	// notice instead of the program's output, files is empty and nothing
	// was copied out.
	Withheld bool `json:"withheld,omitempty"`
	// Incident is the id of the evidence bundle Moat kept because the
	// run was flagged (`moat incident show ID`); absent when none was
	// kept.
	Incident string `json:"incident,omitempty"`
	// Degradations lists protections that were asked for but could not be
	// applied on this host, and were accepted by the manifest. Empty means
	// the full protection of the tier applied.
	Degradations []string `json:"degradations"`
	// CopyOut reports what --output copied out of the workspace, when asked.
	CopyOut *CopyOut `json:"copy_out,omitempty"`
	// Error is set when Termination is infra-error.
	Error string `json:"error,omitempty"`
	// Runtime names the runtime and version that ran the program, for
	// tiers that use one (gvisor: runsc's module version and platform).
	Runtime string `json:"runtime,omitempty"`
}

// Image identifies the immutable root image a run used.
type Image struct {
	Name string `json:"name"`
	// Digest is Moat's content digest of the root tree, the same for
	// the same files however the image was made.
	Digest string `json:"digest"`
	// Source and SourceDigest are set for an imported image only: the
	// import SOURCE (e.g. "oci-archive:app.tar") and the source's own
	// identity (the OCI manifest digest, a docker-archive's image ID, or
	// the sha256 of a rootfs tar), so a run can be traced to the image a
	// registry or `docker images` names.
	Source       string `json:"source,omitempty"`
	SourceDigest string `json:"source_digest,omitempty"`
}

// Stream is one captured output stream. Data holds at most the manifest's cap.
type Stream struct {
	// Data is the captured bytes: the text itself when Encoding is "utf-8",
	// standard base64 when Encoding is "base64" (the bytes were not valid UTF-8).
	Data     string `json:"data"`
	Encoding string `json:"encoding"`
	// Bytes is the total number of bytes the program wrote, captured or not.
	Bytes     int64 `json:"bytes"`
	Truncated bool  `json:"truncated"`
}

// Change is how a workspace path differs from the inputs.
type Change string

// The kinds of change.
const (
	Added    Change = "added"
	Modified Change = "modified"
	Deleted  Change = "deleted"
)

// FileChange is one entry of the workspace diff. Paths are relative to
// /workspace and use forward slashes.
//
// Path and Target hold a name's bytes as the kernel has them, which need
// not be UTF-8. JSON strings cannot carry such bytes (encoding/json
// writes U+FFFD for each invalid byte, so "a\xff" and "a\xfe" would both
// read "a\ufffd"): in JSON, an entry whose path or target is not valid
// UTF-8 has "encoding": "base64" and both path and target written as
// standard base64 of their bytes, as a Stream does; otherwise "encoding"
// is absent and they are the text itself. MarshalJSON and UnmarshalJSON
// do this; the Go value always holds the bytes (and no Encoding).
type FileChange struct {
	Path   string `json:"path"`
	Change Change `json:"change"`
	// Type is "file", "dir", "symlink" or "other" (device, fifo, socket).
	Type   string `json:"type"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256,omitempty"`
	// Mode is the permission bits in octal, e.g. "0644".
	Mode string `json:"mode"`
	// Target is a symlink's target, recorded, never followed.
	Target string `json:"target,omitempty"`
	// Encoding is "base64" in the JSON form of an entry whose Path or
	// Target is not valid UTF-8, absent otherwise. In Go it is empty:
	// MarshalJSON sets it, UnmarshalJSON decodes the names and clears it.
	Encoding string `json:"encoding,omitempty"`
}

// EncodingBase64 is the "encoding" of a diff entry or a copy-out skip
// whose names are not valid UTF-8, and of such a Stream.
const EncodingBase64 = "base64"

// MarshalJSON writes c with its names in base64 when one is not UTF-8.
func (c FileChange) MarshalJSON() ([]byte, error) {
	type plain FileChange // without the methods
	v := plain(c)
	v.Encoding = ""
	if !utf8.ValidString(c.Path) || !utf8.ValidString(c.Target) {
		v.Encoding = EncodingBase64
		v.Path = base64.StdEncoding.EncodeToString([]byte(c.Path))
		if c.Target != "" {
			v.Target = base64.StdEncoding.EncodeToString([]byte(c.Target))
		}
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads c, decoding names written in base64.
func (c *FileChange) UnmarshalJSON(b []byte) error {
	type plain FileChange
	var v plain
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	var err error
	if v.Path, err = decodeName("path", v.Path, v.Encoding); err != nil {
		return err
	}
	if v.Target, err = decodeName("target", v.Target, v.Encoding); err != nil {
		return err
	}
	v.Encoding = ""
	*c = FileChange(v)
	return nil
}

// decodeName reads a name written with encoding ("" and "utf-8": as is).
func decodeName(field, s, encoding string) (string, error) {
	switch encoding {
	case "", "utf-8":
		return s, nil
	case EncodingBase64:
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return "", fmt.Errorf("%s %q: encoding is base64 but it is not standard base64: %w", field, s, err)
		}
		return string(b), nil
	}
	return "", fmt.Errorf("encoding %q: want utf-8 or base64", encoding)
}

// SecretUse says that the egress proxy put a secret's value into
// requests to one host, in place of its placeholder.
type SecretUse struct {
	Name     string `json:"name"`
	Host     string `json:"host"`
	Requests int    `json:"requests"`
}

// ViolationSecretExfiltration is the Violation.Kind of requests refused
// for carrying a secret's placeholder to a host the secret is not bound
// to (network[].reason secret-exfiltration).
const ViolationSecretExfiltration = "secret-exfiltration"

// Violation records a limit or policy the run ran into.
type Violation struct {
	// Kind is one of: timeout, cpu-time, memory, pids, output, disk, files,
	// file-size, syscall, diff, cancelled, package (a typosquat, a package
	// not allowed or a file failing its hash at the guarded index),
	// secret-exfiltration, canary, filename.
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
	Limit  string `json:"limit,omitempty"`
}

// ViolationCanary is the Violation.Kind of a run in which one of its
// planted decoy credentials was seen outside the sandbox: in stdout,
// stderr, a file of the diff, or a request through the egress proxy.
const ViolationCanary = "canary"

// ViolationFilename is the Violation.Kind of a run whose diff holds a file
// name with characters a terminal acts on (controls, escapes, bidi
// overrides).
const ViolationFilename = "filename"

// Finding is one thing the output-channel guard saw. It never holds the
// matched bytes beyond Preview (their first few characters and length).
type Finding struct {
	// Kind is one of: canary, aws-access-key, github-token, private-key,
	// jwt, slack-token, hex-blob, base64-blob, high-entropy, secret-value
	// (a real secret's value, redacted), filename-escape, canary-egress.
	Kind string `json:"kind"`
	// Where is "stdout", "stderr", "file:PATH" (a file of the diff),
	// "files" (a diff entry's name) or "egress".
	Where string `json:"where"`
	// Offset and Length locate the match: for secret-value, in the
	// stream as the program wrote it; for the others, in the stream as
	// the result holds it (after redaction) or in the file.
	Offset int64 `json:"offset"`
	Length int   `json:"length"`
	// Preview is a redacted hint: the first characters, escaped, and
	// the length.
	Preview string `json:"preview,omitempty"`
}

// CopyOut reports a copy of the workspace changes to a host directory.
type CopyOut struct {
	Dir   string `json:"dir"`
	Files int    `json:"files"`
	Bytes int64  `json:"bytes"`
	// Skipped lists what was not copied and why (symlinks, devices, files
	// over a cap, entries that changed during the copy).
	Skipped []Skip `json:"skipped"`
}

// Skip is one entry CopyOut did not copy. Path is written in JSON as a
// FileChange's is: base64, with "encoding": "base64", when it is not UTF-8.
type Skip struct {
	Path   string `json:"path"`
	Reason string `json:"reason"`
	// Encoding is as a FileChange's: "base64" in JSON for a path that is
	// not UTF-8, empty in Go.
	Encoding string `json:"encoding,omitempty"`
}

// MarshalJSON writes s with its path in base64 when it is not UTF-8.
func (s Skip) MarshalJSON() ([]byte, error) {
	type plain Skip
	v := plain(s)
	v.Encoding = ""
	if !utf8.ValidString(s.Path) {
		v.Encoding = EncodingBase64
		v.Path = base64.StdEncoding.EncodeToString([]byte(s.Path))
	}
	return json.Marshal(v)
}

// UnmarshalJSON reads s, decoding a path written in base64.
func (s *Skip) UnmarshalJSON(b []byte) error {
	type plain Skip
	var v plain
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	var err error
	if v.Path, err = decodeName("path", v.Path, v.Encoding); err != nil {
		return err
	}
	v.Encoding = ""
	*s = Skip(v)
	return nil
}

// NetworkAttempt is one destination the run's program asked the egress
// proxy for.
type NetworkAttempt struct {
	Time   time.Time `json:"time"`
	Method string    `json:"method"`
	Host   string    `json:"host"`
	Port   int       `json:"port"`
	// Address is the resolved address the proxy pinned and dialled.
	Address string `json:"address,omitempty"`
	Allowed bool   `json:"allowed"`
	// Reason is one of: allowed, not-allowlisted, private-address,
	// ip-literal, dns-failure, sni-mismatch, ech-refused, limit-conns,
	// limit-bytes, limit-rate, limit-names, limit-log, bad-request,
	// upstream-error; from the guarded package index also typosquat,
	// package-not-allowed, hash-mismatch.
	Reason   string `json:"reason"`
	BytesOut int64  `json:"bytes_out"`
	BytesIn  int64  `json:"bytes_in"`
	// Package is the package (name==version when known) a decision of
	// the guarded index was about; Resembles the allowed or popular name
	// a typosquat resembles.
	Package   string `json:"package,omitempty"`
	Resembles string `json:"resembles,omitempty"`
}

// NetworkSummary accounts for every attempt a run made through the egress
// proxy. Network lists every attempt let through and the first refused
// ones (10000 by default); the refused attempts past those are counted
// here, by reason and by destination, so a flood of refusals can neither
// hide an allowed attempt nor go unreported.
type NetworkSummary struct {
	// Attempts is every attempt, listed in Network or not; Allowed those
	// let through to their destination (all of them are listed), Denied
	// the rest.
	Attempts int `json:"attempts"`
	Allowed  int `json:"allowed"`
	Denied   int `json:"denied"`
	// BytesOut and BytesIn are the bytes forwarded each way over every
	// attempt.
	BytesOut int64 `json:"bytes_out"`
	BytesIn  int64 `json:"bytes_in"`
	// Lookups is the host names the proxy resolved that only a wildcard
	// rule allows, each counted once, and LookupBytes their length: they
	// left the host as DNS queries and were charged to
	// network.max_bytes_out.
	Lookups     int   `json:"lookups"`
	LookupBytes int64 `json:"lookup_bytes"`
	// Omitted is the denied attempts Network does not list.
	// OmittedReasons counts them by reason; OmittedDestinations by host,
	// port and reason (host "" for attempts refused before they named
	// one, e.g. limit-rate), most first, at most 256 of them;
	// OmittedElsewhere counts those to destinations not itemised.
	Omitted             int                  `json:"omitted"`
	OmittedReasons      map[string]int       `json:"omitted_reasons"`
	OmittedDestinations []NetworkDestination `json:"omitted_destinations"`
	OmittedElsewhere    int                  `json:"omitted_elsewhere"`
}

// NetworkDestination is where denied attempts went, why they were denied,
// and how many there were.
type NetworkDestination struct {
	Host   string `json:"host"`
	Port   int    `json:"port"`
	Reason string `json:"reason"`
	Count  int    `json:"count"`
}
