// Package manifest parses, validates and defaults Moat's capability manifest:
// the declaration of everything a run is granted. Everything not granted is
// denied.
//
// The package turns untrusted bytes (a YAML or JSON file, command-line flags,
// an HTTP API body) into one validated Manifest with a digest. It must never
// touch the host beyond stat-ing input paths, and never return a value that
// failed validation.
//
// Parse and Load are the entry points; Default, Validate and the Parse*Flag
// helpers serve the CLI's flag overrides. The accepted range of every limit
// is tabled in the documentation of Ranges.
package manifest

import "time"

// Manifest is a validated capability manifest. Obtain one from Parse or
// Default followed by Validate; treat it as immutable once validated.
type Manifest struct {
	// Image names the immutable root image (default "python").
	Image string `json:"image" yaml:"image"`
	// Tier names the isolation tier (default "native").
	Tier string `json:"tier,omitempty" yaml:"tier,omitempty"`
	// Inputs are host paths copied (never mounted) into /workspace.
	Inputs    []Input   `json:"inputs" yaml:"inputs"`
	Workspace Workspace `json:"workspace" yaml:"workspace"`
	Resources Resources `json:"resources" yaml:"resources"`
	Network   Network   `json:"network" yaml:"network"`
	// Packages grants installs through the guarded package index of the
	// egress proxy (needs network.mode allowlist). Empty: none.
	Packages Packages `json:"packages,omitzero" yaml:"packages,omitempty"`
	// Secrets are bound to hosts: the program sees only a per-run
	// placeholder; the egress proxy puts the real value, which lives on
	// the host and never in the manifest, into requests to those hosts.
	Secrets []Secret `json:"secrets,omitempty" yaml:"secrets,omitempty"`
	// Env are the only variables the program sees beyond the image's
	// defaults (PATH, HOME=/workspace, LANG). The host environment is never
	// inherited.
	Env map[string]string `json:"env" yaml:"env"`
	// Security lists explicit acceptances of a weaker sandbox.
	Security Security `json:"security" yaml:"security"`
	// Justifications say why each widening beyond Default is needed,
	// keyed by the widened field's path ("resources.memory",
	// "network.allow"; Widenings lists them). An operator policy can
	// require one per widening (package policy); they are recorded in
	// the audit log and the result.
	Justifications map[string]string `json:"justifications,omitempty" yaml:"justifications,omitempty"`
	// Output configures the output-channel guard beyond what it always
	// does (report findings, redact known secret values). Empty: no
	// canaries, nothing withheld.
	Output OutputGuard `json:"output,omitzero" yaml:"output,omitempty"`
}

// OutputGuard is the manifest's "output:" section (issue 21 §3).
type OutputGuard struct {
	// Canaries plants per-run decoy credentials in the sandbox (env
	// AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, GITHUB_TOKEN unless env
	// sets them; files .aws/credentials, .ssh/id_ed25519, .netrc,
	// .config/gh/hosts.yml in the workspace, which is HOME). Seeing one
	// in stdout, stderr, a file of the diff or a request through the
	// egress proxy is a "canary" violation. One-shot runs only.
	Canaries bool `json:"canaries,omitempty" yaml:"canaries,omitempty"`
	// WithholdFlagged replaces the output of a run with a canary
	// violation by a notice: stdout and stderr say so, files is empty,
	// nothing is copied out.
	WithholdFlagged bool `json:"withhold_flagged,omitempty" yaml:"withhold_flagged,omitempty"`
}

// Input is one host file or directory copied into the workspace.
type Input struct {
	// Src is the host path. A relative Src is relative to the manifest
	// file's directory (or the working directory for flags).
	Src string `json:"src" yaml:"src"`
	// Dst is the path under /workspace (relative, no ".."). Default: the
	// base name of Src.
	Dst string `json:"dst" yaml:"dst"`
}

// Workspace bounds the writable /workspace.
type Workspace struct {
	Size  Size `json:"size" yaml:"size"`   // default 256MiB
	Files int  `json:"files" yaml:"files"` // default 10000 inodes
}

// Resources bounds what the run may consume.
type Resources struct {
	CPUs        float64  `json:"cpus" yaml:"cpus"`                 // default 1
	Memory      Size     `json:"memory" yaml:"memory"`             // default 512MiB, no swap
	Pids        int      `json:"pids" yaml:"pids"`                 // default 128
	Timeout     Duration `json:"timeout" yaml:"timeout"`           // wall clock, default 30s
	CPUTime     Duration `json:"cpu_time" yaml:"cpu_time"`         // default = timeout (Parse fills it; see SetTimeout)
	OpenFiles   int      `json:"open_files" yaml:"open_files"`     // default 256
	FileSize    Size     `json:"file_size" yaml:"file_size"`       // default 64MiB
	StdoutBytes Size     `json:"stdout_bytes" yaml:"stdout_bytes"` // default 1MiB
	StderrBytes Size     `json:"stderr_bytes" yaml:"stderr_bytes"` // default 1MiB
}

// Network is the run's network grant.
type Network struct {
	// Mode is "none" (the default): a network namespace with loopback only;
	// or "allowlist": loopback only, plus Moat's egress proxy, which
	// reaches exactly the hosts in Allow.
	Mode string `json:"mode" yaml:"mode"`
	// Allow lists the destinations of mode allowlist: exact hosts
	// ("pypi.org"), subdomain wildcards ("*.pythonhosted.org"), each with
	// an optional port ("api.example.com:443"; default 80 and 443).
	Allow []string `json:"allow,omitempty" yaml:"allow,omitempty"`
	// AllowAddresses explicitly grants IP addresses or prefixes that the
	// proxy otherwise refuses (private, loopback, link-local: e.g. a test
	// server on 127.0.0.1). Each widens the sandbox: see docs/THREATS.md.
	AllowAddresses []string `json:"allow_addresses,omitempty" yaml:"allow_addresses,omitempty"`
	// Limits of the egress proxy for this run (mode allowlist): concurrent
	// connections, new connections per second, and the bytes it forwards
	// out (an exfiltration budget) and in. Reaching one closes the
	// connection and is recorded in the result's network log.
	MaxConnections       int  `json:"max_connections" yaml:"max_connections"`
	ConnectionsPerSecond int  `json:"connections_per_second" yaml:"connections_per_second"`
	MaxBytesOut          Size `json:"max_bytes_out" yaml:"max_bytes_out"`
	MaxBytesIn           Size `json:"max_bytes_in" yaml:"max_bytes_in"`
	// NamesPerSecond bounds the new host names per second the proxy
	// resolves for names only a wildcard rule ("*.example.com") allows:
	// the program chooses them, and each leaves the host as a DNS query
	// (which is why each also costs its length of MaxBytesOut). More are
	// refused with limit-names.
	NamesPerSecond int `json:"names_per_second" yaml:"names_per_second"`
	// Inbound lists the TCP ports inside the sandbox the host may connect
	// to on a client's behalf (the E2B API's getHost(port) URLs, through
	// Moat, with the sandbox's traffic token). Empty, the default: no
	// connection ever reaches into the sandbox. Each entry widens the
	// sandbox: see docs/THREATS.md.
	Inbound []PortRange `json:"inbound,omitempty" yaml:"inbound,omitempty"`
}

// Packages is the grant of the guarded package index (package pkgguard):
// the sandbox's pip and npm are pointed at the egress proxy, which fetches
// from the named upstream itself and serves only what Allow names.
type Packages struct {
	PyPI PackageIndex `json:"pypi,omitzero" yaml:"pypi,omitempty"`
	NPM  PackageIndex `json:"npm,omitzero" yaml:"npm,omitempty"`
	// Typosquat is "refuse" (the default, also when empty) or "warn":
	// whether an allowed name that resembles a popular package is refused
	// too. A requested name that is not allowed is always refused.
	Typosquat string `json:"typosquat,omitempty" yaml:"typosquat,omitempty"`
	// NewPackagesDays holds back releases uploaded less than this many
	// days ago, where the upstream says when (0: no hold).
	NewPackagesDays int `json:"new_packages_days,omitempty" yaml:"new_packages_days,omitempty"`
	// Yanked is "refuse" (the default, also when empty: yanked PyPI files
	// are not listed) or "allow".
	Yanked string `json:"yanked,omitempty" yaml:"yanked,omitempty"`
}

// PackageIndex is one granted index. It is granted when Allow is not
// empty.
type PackageIndex struct {
	// Index is the upstream: the simple index root for PyPI (default
	// https://pypi.org/simple), the registry for npm (default
	// https://registry.npmjs.org).
	Index string `json:"index,omitempty" yaml:"index,omitempty"`
	// Allow lists the packages: "requests==2.31.0", "idna",
	// "requests==2.31.0 --hash=sha256:HEX"; for npm "is-number@7.0.0",
	// "is-number@7.0.0 --hash=sha512-B64" (see pkgguard.ParseRequirement).
	Allow []string `json:"allow,omitempty" yaml:"allow,omitempty"`
}

// Granted reports whether any index is granted.
func (p Packages) Granted() bool { return len(p.PyPI.Allow) > 0 || len(p.NPM.Allow) > 0 }

// Secret binds one secret of the host to the hosts it may be sent to.
// The manifest names the secret; its value comes from the host's secret
// store (`moat secrets add`), which may itself refer to a file or an
// environment variable of moat's process. A manifest never holds a value
// and never names a host path or variable.
type Secret struct {
	// Name is the secret's name in the host's store: 1 to 64 of
	// a-z 0-9 _ -, starting with a letter or digit; unique.
	Name string `json:"name" yaml:"name"`
	// Hosts are where the secret may be sent, written as network.allow
	// entries; each must also be granted by network.allow.
	Hosts []string `json:"hosts" yaml:"hosts"`
	// Header, when set, is the only request header the placeholder is
	// replaced in (e.g. Authorization); empty: any header.
	Header string `json:"header,omitempty" yaml:"header,omitempty"`
	// PathPrefix, when set, limits the replacement to requests whose URL
	// path starts with it (e.g. /v1/).
	PathPrefix string `json:"path_prefix,omitempty" yaml:"path_prefix,omitempty"`
	// Query and Body also replace the placeholder in the query string and
	// the body of requests to the bound hosts (default: headers only).
	Query bool `json:"query,omitempty" yaml:"query,omitempty"`
	Body  bool `json:"body,omitempty" yaml:"body,omitempty"`
	// Env is the environment variable that holds the placeholder.
	// Default: the name upper-cased, '-' turned into '_' (github-token:
	// GITHUB_TOKEN).
	Env string `json:"env" yaml:"env"`
	// File, when set, is a path under /workspace (relative, like
	// inputs[].dst) where the placeholder is also written (0600, the
	// program's own, no newline), for programs that read a token from a
	// file. It is part of the workspace's baseline: the diff shows it
	// only if the program changes it.
	File string `json:"file,omitempty" yaml:"file,omitempty"`
}

// Security holds explicit, audited acceptances of a weaker sandbox. The
// default is empty: a protection that cannot be applied refuses the run.
type Security struct {
	// AllowMissing names protections the run may go without when the host
	// lacks them. Accepted values: "landlock".
	AllowMissing []string `json:"allow_missing,omitempty" yaml:"allow_missing,omitempty"`
}

// Size is a byte count. In YAML and JSON it is written as an integer number
// of bytes or a string with a unit: "512MiB", "64KiB", "1GiB", "10MB".
type Size int64

// Duration is a time span. In YAML and JSON it is written as a Go duration
// string ("30s", "1m30s", "500ms").
type Duration time.Duration

// D returns d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
