package ociruntime

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/egress"
)

// DefaultPolicyFile is where the operator's runtime policy lives.
const DefaultPolicyFile = "/etc/moat/runtime.yaml"

// Policy is the operator's runtime policy: what a config.json may ask for
// beyond Moat's defaults. The zero value is the default: nothing more.
type Policy struct {
	// BindSources are host directories (absolute) whose files and
	// subdirectories any mount destination may bind from. Without them
	// only the engines' per-container files are bound (EngineStateDirs).
	BindSources []string `yaml:"bind_sources"`
	// EngineStateDirs are more directories where an engine keeps the
	// per-container files it binds into every container (/etc/hosts,
	// /etc/resolv.conf, /etc/hostname, /dev/shm): a containerd or Docker
	// with a root of its own (k3s: /var/lib/rancher/k3s/agent/containerd,
	// /run/k3s/containerd; dockerd --data-root). Added to
	// EngineStateDirs; binds from them go only to those destinations.
	EngineStateDirs []string `yaml:"engine_state_dirs"`
	// AcceptPrivileged makes the runtime run a spec that asks for more
	// than Moat gives (capabilities beyond an engine's defaults, host
	// namespaces, devices, sysctls, docker --privileged) instead of
	// refusing it. Nothing asked for is granted: the container runs with
	// Moat's isolation, and each thing not granted is logged.
	AcceptPrivileged bool `yaml:"accept_privileged"`
	// NamespacedCapabilities lets a uid-0 program keep those of CHOWN,
	// DAC_OVERRIDE, FOWNER, FSETID, SETUID, SETGID and KILL its spec
	// asks for, inside its own user namespace only (what package
	// managers run as root expect). Default false: a container's program
	// has no capability at all, as every Moat sandbox.
	NamespacedCapabilities bool `yaml:"namespaced_capabilities"`
	// Hooks: false refuses every spec with hooks. Absent or true, a
	// spec's hooks run as the engine asked: on the host, as root, never
	// in the container (Docker's network set-up is one, in every spec).
	// Hooks come from the engine and its configuration, never from its
	// users (neither the CRI nor docker run can set one).
	Hooks *bool `yaml:"hooks"`
	// RootBytes bounds a container's writable root (its tmpfs overlay),
	// and TmpBytes its /tmp, in bytes. 0: the defaults.
	RootBytes int64 `yaml:"root_bytes"`
	TmpBytes  int64 `yaml:"tmp_bytes"`
	// ResultDir is where delete writes the result (<id>.json) of a
	// container annotated moat.sandbox/result: "true". Default
	// DefaultResultDir.
	ResultDir string `yaml:"result_dir"`
	// AuditDB is the audit database (moat audit, moat serve's --db) to
	// which delete adds the record of a container annotated
	// moat.sandbox/result: "true". Default DefaultAuditDB; "off": none.
	AuditDB string `yaml:"audit_db"`
	// Egress is the operator's say over the moat.sandbox/egress
	// annotations: a default for containers without one, the ceiling
	// of what one may allow, the private addresses one may reach.
	Egress EgressPolicy `yaml:"egress"`
}

// Policy defaults.
const (
	DefaultRootBytes = 1 << 30
	DefaultTmpBytes  = 256 << 20
)

// hooksAllowed says whether a spec's hooks may run (see Hooks).
func (p *Policy) hooksAllowed() bool { return p == nil || p.Hooks == nil || *p.Hooks }

// engineDirs are the directories engines' per-container files may come
// from: EngineStateDirs and the policy's own.
func (p *Policy) engineDirs() []string {
	if p == nil {
		return EngineStateDirs
	}
	return slices.Concat(EngineStateDirs, p.EngineStateDirs)
}

// bindDirs are the directories a bind to dest may come from.
func (p *Policy) bindDirs(dest string) []string {
	var dirs []string
	if slices.Contains(engineFiles, dest) {
		dirs = p.engineDirs()
	}
	if p != nil {
		dirs = slices.Concat(dirs, p.BindSources)
	}
	return dirs
}

// ParsePolicy decodes a policy file, refusing unknown fields: a typo must
// not silently leave a default in place.
func ParsePolicy(b []byte) (*Policy, error) {
	p := &Policy{}
	d := yaml.NewDecoder(bytes.NewReader(b))
	d.KnownFields(true)
	if err := d.Decode(p); err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	for _, l := range []struct {
		name string
		dirs []string
	}{{"bind_sources", p.BindSources}, {"engine_state_dirs", p.EngineStateDirs}} {
		for _, s := range l.dirs {
			if !filepath.IsAbs(s) || filepath.Clean(s) != s || s == "/" {
				return nil, fmt.Errorf("%s: %q must be a clean absolute directory other than /", l.name, s)
			}
		}
	}
	if p.ResultDir != "" && (!filepath.IsAbs(p.ResultDir) || filepath.Clean(p.ResultDir) != p.ResultDir) {
		return nil, fmt.Errorf("result_dir: %q must be a clean absolute directory", p.ResultDir)
	}
	if p.AuditDB != "" && p.AuditDB != "off" && (!filepath.IsAbs(p.AuditDB) || filepath.Clean(p.AuditDB) != p.AuditDB) {
		return nil, fmt.Errorf("audit_db: %q must be a clean absolute file name, or off", p.AuditDB)
	}
	for _, r := range p.Egress.Ceiling {
		if _, err := egress.ParseRule(r); err != nil {
			return nil, fmt.Errorf("egress.ceiling: %w", err)
		}
	}
	for _, a := range p.Egress.Addresses {
		if _, err := egress.ParsePrefix(a); err != nil {
			return nil, fmt.Errorf("egress.addresses: %q %w", a, err)
		}
	}
	if d := p.Egress.Default; d != "" {
		// The default is checked as an annotation would be.
		if err := mapEgress(&Container{Join: map[string]string{}}, nil, p); err != nil {
			return nil, fmt.Errorf("egress.default: %w", err)
		}
	}
	if p.RootBytes < 0 || p.TmpBytes < 0 {
		return nil, errors.New("root_bytes and tmp_bytes must not be negative; 0 means the default")
	}
	return p, nil
}

// LoadPolicy reads the policy file at path. A missing file at the default
// path is the default policy; any other missing or bad file is an error:
// the runtime fails closed rather than run with a policy the operator did
// not write.
func LoadPolicy(path string) (*Policy, error) {
	explicit := path != ""
	if path == "" {
		path = DefaultPolicyFile
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) && !explicit {
		return &Policy{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runtime policy: %w (fix or remove the file, or point --policy/MOAT_RUNTIME_POLICY at another)", err)
	}
	p, err := ParsePolicy(b)
	if err != nil {
		return nil, fmt.Errorf("runtime policy %s: %w", path, err)
	}
	return p, nil
}
