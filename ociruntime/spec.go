package ociruntime

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Spec is the part of an OCI runtime-spec config.json (1.0-1.2) that Moat
// reads. Fields Moat does not know are ignored by the decoder, but every
// field that could ask for more than Moat gives (hooks, devices, sysctls,
// namespaces, capabilities) is here so that Map can refuse it.
type Spec struct {
	OCIVersion  string            `json:"ociVersion"`
	Process     *Process          `json:"process"`
	Root        *Root             `json:"root"`
	Hostname    string            `json:"hostname"`
	Mounts      []Mount           `json:"mounts"`
	Hooks       *Hooks            `json:"hooks"`
	Annotations map[string]string `json:"annotations"`
	Linux       *Linux            `json:"linux"`
}

// Process is the container's program.
type Process struct {
	Terminal        bool          `json:"terminal"`
	ConsoleSize     *ConsoleSize  `json:"consoleSize"`
	User            User          `json:"user"`
	Args            []string      `json:"args"`
	Env             []string      `json:"env"`
	Cwd             string        `json:"cwd"`
	Capabilities    *Capabilities `json:"capabilities"`
	Rlimits         []Rlimit      `json:"rlimits"`
	NoNewPrivileges bool          `json:"noNewPrivileges"`
	ApparmorProfile string        `json:"apparmorProfile"`
	SelinuxLabel    string        `json:"selinuxLabel"`
	OOMScoreAdj     *int          `json:"oomScoreAdj"`
}

// ConsoleSize is a terminal's size.
type ConsoleSize struct {
	Height uint16 `json:"height"`
	Width  uint16 `json:"width"`
}

// User is the program's identity inside the container.
type User struct {
	UID            uint32   `json:"uid"`
	GID            uint32   `json:"gid"`
	AdditionalGids []uint32 `json:"additionalGids"`
	Username       string   `json:"username"`
}

// Capabilities are the capability sets asked for, by name (CAP_CHOWN).
type Capabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
	Ambient     []string `json:"ambient"`
}

// Rlimit is one process.rlimits entry.
type Rlimit struct {
	Type string `json:"type"`
	Hard uint64 `json:"hard"`
	Soft uint64 `json:"soft"`
}

// Root is the container's root filesystem.
type Root struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

// Mount is one mounts entry.
type Mount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options"`
}

// Hooks are programs the runtime would run on the host.
type Hooks struct {
	Prestart        []Hook `json:"prestart"`
	CreateRuntime   []Hook `json:"createRuntime"`
	CreateContainer []Hook `json:"createContainer"`
	StartContainer  []Hook `json:"startContainer"`
	Poststart       []Hook `json:"poststart"`
	Poststop        []Hook `json:"poststop"`
}

// Hook is one hook.
type Hook struct {
	Path    string   `json:"path"`
	Args    []string `json:"args"`
	Env     []string `json:"env"`
	Timeout *int     `json:"timeout"`
}

// Linux is the linux section.
type Linux struct {
	UIDMappings   []IDMapping       `json:"uidMappings"`
	GIDMappings   []IDMapping       `json:"gidMappings"`
	Sysctl        map[string]string `json:"sysctl"`
	Resources     *Resources        `json:"resources"`
	CgroupsPath   string            `json:"cgroupsPath"`
	Namespaces    []Namespace       `json:"namespaces"`
	Devices       []Device          `json:"devices"`
	Seccomp       json.RawMessage   `json:"seccomp"`
	MaskedPaths   []string          `json:"maskedPaths"`
	ReadonlyPaths []string          `json:"readonlyPaths"`
	MountLabel    string            `json:"mountLabel"`
}

// IDMapping is a user namespace mapping asked for.
type IDMapping struct {
	ContainerID uint32 `json:"containerID"`
	HostID      uint32 `json:"hostID"`
	Size        uint32 `json:"size"`
}

// Namespace is one linux.namespaces entry; an empty Path asks for a new one.
type Namespace struct {
	Type string `json:"type"`
	Path string `json:"path"`
}

// Device is a device node asked for.
type Device struct {
	Path  string `json:"path"`
	Type  string `json:"type"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

// Resources are the cgroup limits asked for.
type Resources struct {
	Memory *Memory `json:"memory"`
	CPU    *CPU    `json:"cpu"`
	Pids   *Pids   `json:"pids"`
}

// Memory limits.
type Memory struct {
	Limit *int64 `json:"limit"`
	Swap  *int64 `json:"swap"`
}

// CPU limits.
type CPU struct {
	Shares *uint64 `json:"shares"`
	Quota  *int64  `json:"quota"`
	Period *uint64 `json:"period"`
	Cpus   string  `json:"cpus"`
	Mems   string  `json:"mems"`
}

// Pids limits.
type Pids struct {
	Limit int64 `json:"limit"`
}

// MaxSpecBytes bounds a config.json (or an exec's process.json).
const MaxSpecBytes = 4 << 20

// ParseSpec decodes config.json bytes.
func ParseSpec(b []byte) (*Spec, error) {
	if len(b) > MaxSpecBytes {
		return nil, fmt.Errorf("config.json: %d bytes, more than the %d allowed", len(b), MaxSpecBytes)
	}
	var s Spec
	d := json.NewDecoder(bytes.NewReader(b))
	if err := d.Decode(&s); err != nil {
		return nil, fmt.Errorf("config.json: %w", err)
	}
	return &s, nil
}
