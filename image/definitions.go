package image

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
)

// Definition says how to build one image: which Debian suite, which packages
// on top of the Essential set, and which apt sources to fetch them from.
type Definition struct {
	// Name is the image name used on the command line and in manifests.
	Name string
	// Suite is the Debian suite (codename) to bootstrap, e.g. "bookworm".
	Suite string
	// Packages are installed on top of mmdebstrap's "essential" variant:
	// a built-in image's in a sandbox (Store.Build), a bootstrap's
	// (Pending.Bootstrap, Definition.bootstrap) by mmdebstrap itself.
	Packages []string
	// Download are fetched into the tree's apt cache (ArchivesDir), with
	// their dependencies, but not installed: nothing of theirs runs on
	// the host: the built-in images' packages (Store.Build) and an image
	// file's (Pending.Bootstrap), installed in a sandbox after the
	// bootstrap. Not part of the Fingerprint.
	Download []string
	// Description is one line for `moat image list`.
	Description string
	// Env is the default environment of processes started in the image.
	// HOME is deliberately absent: the caller sets it.
	Env []string
	// Sources are apt sources lines passed to mmdebstrap, in order.
	Sources []string
	// SourceDateEpoch is exported as SOURCE_DATE_EPOCH so dpkg, mmdebstrap
	// and py_compile write the same timestamps on every build. It is fixed
	// per definition (not "now") because a moving epoch would change
	// file contents such as .pyc headers and break reproducibility.
	SourceDateEpoch int64
}

// bookwormSources mirror what this machine's apt already uses
// (/etc/apt/sources.list.d/debian.sources): the main archive, its updates
// and the security archive. Security updates must be included, or images
// would ship known-vulnerable packages.
var bookwormSources = []string{
	"deb http://deb.debian.org/debian bookworm main",
	"deb http://deb.debian.org/debian bookworm-updates main",
	"deb http://deb.debian.org/debian-security bookworm-security main",
}

// bookwormRelease is Debian 12's release date (2023-06-10T00:00:00Z).
const bookwormRelease = 1686355200

// definitions is the built-in catalogue. Keep images small: they are built on
// first use and every red-team run starts from one.
var definitions = []Definition{
	{
		Name:        "python",
		Suite:       "bookworm",
		Description: "Debian 12 with Python 3.11, pip, NumPy, PyYAML, curl and git",
		Packages: []string{
			"bash",
			"coreutils",
			// curl: the common way generated code fetches a URL; with
			// network mode allowlist it goes through the egress proxy.
			"curl",
			// git: agents clone, diff and commit in the workspace. It
			// brings perl (git's scripts need it), about 40 MB.
			"git",
			"python3",
			// pip: agents install packages; with network mode allowlist
			// it reaches an index only through the egress proxy.
			"python3-pip",
			"python3-numpy",
			"python3-yaml",
		},
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"LANG=C.UTF-8",
			// The root is read-only and /workspace is diffed after the run:
			// without this, every script that imports a local module would
			// leave a __pycache__ directory in the workspace diff.
			"PYTHONDONTWRITEBYTECODE=1",
		},
		Sources:         bookwormSources,
		SourceDateEpoch: bookwormRelease,
	},
	{
		Name:        "node",
		Suite:       "bookworm",
		Description: "Debian 12 with Node.js 18, npm, curl and git",
		Packages: []string{
			"bash",
			"coreutils",
			"curl",
			"git",
			// Debian's own Node.js and npm, not a NodeSource or nvm
			// download: the same archive, signatures, security updates
			// and lockfile as every other package in the image.
			"nodejs",
			"npm",
		},
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"LANG=C.UTF-8",
			// npm checks the registry for a newer npm on every command;
			// with the network closed that is a slow failure per call.
			"NPM_CONFIG_UPDATE_NOTIFIER=false",
		},
		Sources:         bookwormSources,
		SourceDateEpoch: bookwormRelease,
	},
	{
		// base is what agents written for E2B's "base" template expect:
		// Python and Node with their package managers, git, curl and a C
		// toolchain for packages that compile native code on install.
		Name:        "base",
		Suite:       "bookworm",
		Description: "Debian 12 with Python 3.11, pip, Node.js 18, npm, git, curl and build-essential",
		Packages: []string{
			"bash",
			"coreutils",
			"curl",
			"git",
			"python3",
			"python3-pip",
			// python3-venv: E2B's base has it; without it `python3 -m
			// venv` fails, the usual first step of an agent's setup.
			"python3-venv",
			"nodejs",
			"npm",
			// build-essential: gcc, g++, make and libc headers, for
			// pip and npm packages that build C extensions.
			"build-essential",
		},
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"LANG=C.UTF-8",
			"PYTHONDONTWRITEBYTECODE=1",
			"NPM_CONFIG_UPDATE_NOTIFIER=false",
		},
		Sources:         bookwormSources,
		SourceDateEpoch: bookwormRelease,
	},
	{
		// code-interpreter is what the code kernel (service/kernel.py) and
		// E2B's "code-interpreter-v1" template expect: IPython for magics,
		// display() and rich reprs, and the data stack agents reach for
		// first (NumPy, pandas, matplotlib for charts as PNG). A separate
		// image, not packages added to python: matplotlib and pandas
		// more than double python's size, and every plain run and
		// red-team case starts from python.
		Name:        "code-interpreter",
		Suite:       "bookworm",
		Description: "Debian 12 with Python 3.11, IPython, NumPy, pandas, matplotlib and pip (the code kernel's image)",
		Packages: []string{
			"bash",
			"coreutils",
			"python3",
			// python3-ipython, not python3-ipykernel: the kernel driver
			// runs IPython's InteractiveShell behind Moat's own framed
			// protocol, so ipykernel's Jupyter wire protocol (ZeroMQ,
			// tornado, debugpy, jupyter-client) would be dead weight.
			"python3-ipython",
			"python3-matplotlib",
			// munkres satisfies fonttools' (a matplotlib dependency)
			// "python3-scipy | python3-munkres": without it apt takes
			// the first alternative, and scipy brings pythran, gcc, g++
			// and Boost's headers, about 600 MB, for no chart.
			"python3-munkres",
			"python3-numpy",
			"python3-pandas",
			// pip: `%pip install` / `!pip install`, through the egress
			// proxy when the network is an allowlist.
			"python3-pip",
		},
		Env: []string{
			"PATH=/usr/local/bin:/usr/bin:/bin",
			"LANG=C.UTF-8",
			"PYTHONDONTWRITEBYTECODE=1",
			// Agg: no display in a sandbox; figures are rendered to PNG.
			"MPLBACKEND=Agg",
			// The root is read-only and HOME (/workspace) is diffed after
			// the run: matplotlib's font cache and IPython's profile and
			// history go to /tmp, the sandbox's scratch tmpfs, instead of
			// failing (matplotlib warns on every import) or showing up as
			// files the program made.
			"MPLCONFIGDIR=/tmp/matplotlib",
			"IPYTHONDIR=/tmp/ipython",
		},
		Sources:         bookwormSources,
		SourceDateEpoch: bookwormRelease,
	},
}

// Definitions returns the known image definitions. The result is a copy:
// callers may modify it without changing what Build uses.
func Definitions() []Definition {
	out := make([]Definition, len(definitions))
	for i, d := range definitions {
		d.Packages = append([]string(nil), d.Packages...)
		d.Env = append([]string(nil), d.Env...)
		d.Sources = append([]string(nil), d.Sources...)
		out[i] = d
	}
	return out
}

// definition returns the named definition or an error listing known names.
func definition(name string) (Definition, error) {
	if err := validName(name); err != nil {
		return Definition{}, err
	}
	for _, d := range Definitions() {
		if d.Name == name {
			return d, nil
		}
	}
	return Definition{}, fmt.Errorf("image %q: %w (known images: %s)", name, ErrUnknown, knownNames())
}

func knownNames() string {
	s := ""
	for i, d := range definitions {
		if i > 0 {
			s += ", "
		}
		s += d.Name
	}
	return s
}

// validName keeps image names usable as a single path component: the name
// is joined onto the store directory, so "../x" or "a/b" must never get
// there. Accepted: ^[a-z0-9][a-z0-9._-]{0,63}$ (checked by hand: a regexp
// compiled at package init costs every moat start, the sandbox's init too).
func validName(name string) error {
	ok := len(name) >= 1 && len(name) <= 64
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case i > 0 && (c == '.' || c == '_' || c == '-'):
		default:
			ok = false
		}
	}
	if !ok {
		return fmt.Errorf("image name %q: must match ^[a-z0-9][a-z0-9._-]{0,63}$", name)
	}
	return nil
}

// installMethod names how a built-in image's packages are installed; a
// part of the Fingerprint, so that images built another way (by
// mmdebstrap on the host, before) are stale and rebuilt.
const installMethod = "bootstrap essential+apt on the host, download only; apt-get install in a sandbox"

// Fingerprint identifies what the definition asks for: a stored image
// built from a different fingerprint is stale.
func (d Definition) Fingerprint() string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n%q\n%q\n%q\n%d\n%s\n", d.Name, d.Suite, d.Packages, d.Env, d.Sources, d.SourceDateEpoch, installMethod)
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// bootstrap is what mmdebstrap makes on the host for d: the essential
// set and apt, with d's packages downloaded (not installed) for the
// sandboxed install.
func (d Definition) bootstrap() Definition {
	d.Download = d.Packages
	d.Packages = []string{"apt"}
	return d
}

// installEnv is the sandboxed install's environment: reproducible
// timestamps (dpkg, py_compile) as the bootstrap had them.
func (d Definition) installEnv() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LC_ALL=C.UTF-8",
		"DEBIAN_FRONTEND=noninteractive",
		"SOURCE_DATE_EPOCH=" + strconv.FormatInt(d.SourceDateEpoch, 10),
	}
}

// ValidName reports whether name can name an image in the store, for
// callers that check a name before they open the store (the image-file
// reader of imagebuild): the rule stays defined once, here.
func ValidName(name string) error { return validName(name) }
