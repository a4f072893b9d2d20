package imagebuild

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/internal/strictjson"
	"github.com/moat-sandbox/moat/internal/suggest"
)

// MaxImageFileBytes bounds a declarative image file: a real one is a few
// hundred bytes.
const MaxImageFileBytes = 1 << 20

// maxRequirementsBytes and maxNpmLockBytes bound the files an image file
// names; a large package-lock.json is a few megabytes.
const (
	maxRequirementsBytes = 4 << 20
	maxNpmLockBytes      = 64 << 20
)

// maxListLen bounds every list of the image file (apt, files, run, env,
// entrypoint, cmd).
const maxListLen = 1000

// buildDir is where pip and npm inputs are copied for their install step,
// and removed afterwards.
const buildDir = "/opt/moat-build"

// defaultAptHosts serve Debian's archive and security archive: Moat's
// built images and Debian's own container images use deb.debian.org for
// both, older images security.debian.org.
var defaultAptHosts = []string{"deb.debian.org", "security.debian.org"}

// What an install step's base image lacks, and how to get it (Step.Needs).
// Moat's built-in images are bootstrapped without apt (mmdebstrap's
// essential variant plus their packages), so apt on an image base needs an
// image that has it.
const (
	aptNeedsFix = "apt on an image base runs apt-get in that image, and Moat's built-in images have none: " +
		"start from base: {debian: bookworm} (it has apt), or from an image with apt (e.g. one imported from debian:bookworm)"
	// A debian base with apt packages is bootstrapped with apt: missing,
	// it is Moat's bug, or an earlier step removed it.
	aptDebianNeedsFix = "a debian base with apt packages is bootstrapped with apt; if this happens, please report it"
	pipNeedsFix       = "pip runs python3 -m pip in the image: start from an image with Python and pip (python, base), " +
		"or add python3-pip with apt"
	npmNeedsFix = "npm runs npm ci in the image: start from an image with npm (node, base), or add npm with apt"
)

// debianSuites are the suites a debian base may name: mmdebstrap needs
// the suite's archive keyring, which Debian's keyring package carries for
// these.
var debianSuites = []string{"bullseye", "bookworm", "trixie", "forky", "sid", "unstable", "testing", "stable", "oldstable"}

// freshDirs are mounted fresh in every run (or are kernel file systems):
// what a build puts there is hidden at run time, so a destination under
// them is a mistake.
var freshDirs = []string{"/workspace", "/tmp", "/proc", "/dev", "/sys", "/run"}

// debName is a Debian package name (Debian policy §5.6.1).
var debName = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]+$`)

// envName is a portable environment variable name.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ImageFileError is one problem with a declarative image file, rendered
// as
//
//	build.yaml:7: files[0].dest: "tmp/x" is not an absolute path; write /opt/app
//
// Field is the dotted path of the key, Value what was given (may be
// empty) and Problem what is wrong and how to fix it.
type ImageFileError struct {
	File    string
	Line    int
	Field   string
	Value   string
	Problem string
}

func (e *ImageFileError) Error() string {
	s := e.File
	if e.Line > 0 {
		s += ":" + strconv.Itoa(e.Line)
	}
	s += ": "
	if e.Field != "" {
		s += e.Field + ": "
	}
	if e.Value != "" {
		s += quoteShort(e.Value) + " "
	}
	return s + e.Problem
}

// imageFile is the schema, for key names and suggestions.
var (
	topKeys  = []string{"version", "base", "apt", "pip", "npm", "files", "env", "workdir", "run", "entrypoint", "cmd"}
	baseKeys = []string{"debian", "image"}
	pipKeys  = []string{"requirements", "index", "find_links"}
	npmKeys  = []string{"lockfile", "dir", "registry", "dev", "scripts"}
	fileKeys = []string{"src", "dest", "owner"}
)

// ReadImageFile reads the declarative image file at path (YAML; the schema
// is docs/IMAGEFILE.md) and lowers it to a Plan. Paths in it are relative
// to the file's directory, which becomes the Plan's Context; the pip
// requirements file and the npm package-lock.json are read and checked
// here (every package pinned and hashed), and become the Plan's Pins.
//
// args are --build-arg values: an image file has no variables, so a
// non-empty args is an error (they are a Dockerfile's ARG).
//
// Errors name the file, the line, the field, the value and the fix; as
// many problems as are found (up to a bound) are joined into one error.
func ReadImageFile(path string, args map[string]string) (p *Plan, err error) {
	defer func() {
		// Reading a file must not take a server down; a panic is a bug
		// (the fuzz test looks for this message).
		if r := recover(); r != nil {
			p, err = nil, fmt.Errorf("%s: internal error while reading the image file (a bug in moat, please report): %v", path, r)
		}
	}()
	if len(args) > 0 {
		names := make([]string, 0, len(args))
		for k := range args {
			names = append(names, k)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("%s: --build-arg %s: a declarative image file has no variables (build args are for Dockerfiles); write the value into the file", path, strings.Join(names, ", "))
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read image file: %w", err)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxImageFileBytes+1))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("read image file %s: %w", path, err)
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return parseImageFile(data, path, dir)
}

// imageFileParser holds the state of one parse.
type imageFileParser struct {
	file string
	dir  string // absolute, the Context
	errs []error
	drop int
	plan *Plan
}

const maxImageFileErrors = 20

func (p *imageFileParser) fail(n *yaml.Node, field, value, problem string) {
	if len(p.errs) >= maxImageFileErrors {
		p.drop++
		return
	}
	line := 0
	if n != nil {
		line = n.Line
	}
	p.errs = append(p.errs, &ImageFileError{File: p.file, Line: line, Field: field, Value: value, Problem: problem})
}

func (p *imageFileParser) err() error {
	if len(p.errs) == 0 && p.drop == 0 {
		return nil
	}
	errs := p.errs
	if p.drop > 0 {
		errs = append(errs, fmt.Errorf("%s: and %d more problems", p.file, p.drop))
	}
	return errors.Join(errs...)
}

func parseImageFile(data []byte, file, dir string) (*Plan, error) {
	if len(data) > MaxImageFileBytes {
		return nil, fmt.Errorf("%s: is larger than %d bytes; an image file is a short document", file, MaxImageFileBytes)
	}
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("%s: is not valid UTF-8", file)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%s: is empty; an image file needs at least version: 1 and a base", file)
		}
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%s: holds more than one YAML document (a line with ---); an image file is one document", file)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s: is not a mapping; an image file has keys such as version, base, apt, files", file)
	}
	p := &imageFileParser{file: file, dir: dir, plan: &Plan{File: file, Context: dir}}
	p.document(doc.Content[0])
	if err := p.err(); err != nil {
		return nil, err
	}
	return p.plan, nil
}

// mapping returns the values of a mapping node by key, reporting unknown
// and repeated keys and anchors.
func (p *imageFileParser) mapping(n *yaml.Node, field string, known []string) map[string]*yaml.Node {
	if !p.plain(n, field) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		p.fail(n, field, scalarValue(n), "is "+describe(n)+"; expected a mapping")
		return nil
	}
	out := map[string]*yaml.Node{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !p.plain(k, field) {
			continue
		}
		if k.Kind != yaml.ScalarNode {
			p.fail(k, field, "", "has a key that is "+describe(k)+"; keys are plain names")
			continue
		}
		kf := strictjson.JoinField(field, k.Value)
		if prev, dup := out[k.Value]; dup {
			p.fail(k, kf, "", fmt.Sprintf("is given twice (lines %d and %d); give each key once", prev.Line, k.Line))
			continue
		}
		if known != nil && !contains(known, k.Value) {
			p.fail(k, kf, "", unknownKey(k.Value, field, known))
			continue
		}
		out[k.Value] = v
	}
	return out
}

// plain refuses anchors, aliases and merge keys: an image file says what
// it means in full.
func (p *imageFileParser) plain(n *yaml.Node, field string) bool {
	if n.Kind == yaml.AliasNode || n.Anchor != "" {
		p.fail(n, field, "", "uses a YAML anchor or alias; write the value out in full")
		return false
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!merge" {
		p.fail(n, field, "", "uses a YAML merge key (<<); write the keys out in full")
		return false
	}
	return true
}

func unknownKey(key, field string, known []string) string {
	where := "at the top level"
	if field != "" {
		where = "under " + field
	}
	problem := "is not a known key"
	if len(key) <= 64 {
		if best, ok := suggest.Closest(strings.ToLower(key), known); ok {
			problem += fmt.Sprintf(" (did you mean %q?)", best)
		}
	}
	sorted := append([]string(nil), known...)
	sort.Strings(sorted)
	return problem + "; accepted " + where + ": " + strings.Join(sorted, ", ")
}

func (p *imageFileParser) str(n *yaml.Node, field string) (string, bool) {
	if !p.plain(n, field) {
		return "", false
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		p.fail(n, field, "", "has no value; write \"\" for an empty one, or remove the key")
		return "", false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		hint := ""
		if n.Kind == yaml.ScalarNode {
			hint = " (put it in quotes)"
		}
		p.fail(n, field, scalarValue(n), "is "+describe(n)+"; expected a string"+hint)
		return "", false
	}
	if n.Value == "" {
		p.fail(n, field, "", "is empty")
		return "", false
	}
	if strings.IndexByte(n.Value, 0) >= 0 {
		p.fail(n, field, n.Value, "contains a NUL byte")
		return "", false
	}
	return n.Value, true
}

func (p *imageFileParser) boolean(n *yaml.Node, field string) (bool, bool) {
	if !p.plain(n, field) {
		return false, false
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || (n.Value != "true" && n.Value != "false") {
		p.fail(n, field, scalarValue(n), "is "+describe(n)+"; expected true or false")
		return false, false
	}
	return n.Value == "true", true
}

// strList decodes a non-empty list of strings.
func (p *imageFileParser) strList(n *yaml.Node, field string) ([]string, []*yaml.Node, bool) {
	if !p.plain(n, field) {
		return nil, nil, false
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, field, scalarValue(n), "is "+describe(n)+"; expected a list of strings")
		return nil, nil, false
	}
	if len(n.Content) == 0 {
		p.fail(n, field, "", "is an empty list; remove the key or list at least one item")
		return nil, nil, false
	}
	if len(n.Content) > maxListLen {
		p.fail(n, field, "", fmt.Sprintf("has %d items; at most %d", len(n.Content), maxListLen))
		return nil, nil, false
	}
	ok := true
	var out []string
	for i, item := range n.Content {
		s, good := p.str(item, fmt.Sprintf("%s[%d]", field, i))
		ok = ok && good
		out = append(out, s)
	}
	return out, n.Content, ok
}

func (p *imageFileParser) document(root *yaml.Node) {
	m := p.mapping(root, "", topKeys)
	if m == nil {
		return
	}
	if v, ok := m["version"]; !ok {
		p.fail(root, "version", "", "is missing; write version: 1 at the top")
	} else if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" || v.Value != "1" {
		p.fail(v, "version", scalarValue(v), "is not a version this Moat reads; write version: 1")
	}
	if v, ok := m["base"]; ok {
		p.base(v)
	} else {
		p.fail(root, "base", "", "is missing; write base: {debian: bookworm} or base: {image: NAME}")
	}
	// The order of the steps below is the order of the schema: system
	// packages, then language packages (which may need them), then the
	// application's files, its environment and working directory, then
	// the file's own commands, which see all of that.
	if v, ok := m["apt"]; ok {
		p.apt(v)
	}
	var cleanup bool
	if v, ok := m["pip"]; ok {
		p.pip(v)
		cleanup = true
	}
	if v, ok := m["npm"]; ok {
		p.npm(v)
		cleanup = true
	}
	if cleanup {
		p.plan.Steps = append(p.plan.Steps, Step{Op: OpRun, Line: root.Line, Text: "remove " + buildDir,
			Argv: []string{"rm", "-rf", buildDir}})
	}
	if v, ok := m["files"]; ok {
		p.files(v)
	}
	if v, ok := m["env"]; ok {
		p.env(v)
	}
	if v, ok := m["workdir"]; ok {
		if s, ok := p.str(v, "workdir"); ok && p.treePath(v, "workdir", s, false) {
			p.plan.Steps = append(p.plan.Steps, Step{Op: OpWorkdir, Line: v.Line, Text: "workdir: " + s, Dir: path.Clean(s)})
		}
	}
	if v, ok := m["run"]; ok {
		if cmds, nodes, ok := p.strList(v, "run"); ok {
			for i, c := range cmds {
				p.plan.Steps = append(p.plan.Steps, Step{Op: OpRun, Line: nodes[i].Line, Text: "run: " + c,
					Argv: []string{"/bin/sh", "-c", c}})
			}
		}
	}
	for _, k := range []struct {
		key string
		op  Op
	}{{"entrypoint", OpEntrypoint}, {"cmd", OpCmd}} {
		if v, ok := m[k.key]; ok {
			if argv, _, ok := p.strList(v, k.key); ok {
				p.plan.Steps = append(p.plan.Steps, Step{Op: k.op, Line: v.Line, Text: k.key + ": " + strings.Join(argv, " "), Argv: argv})
			}
		}
	}
}

func (p *imageFileParser) base(n *yaml.Node) {
	m := p.mapping(n, "base", baseKeys)
	if m == nil {
		return
	}
	deb, hasDeb := m["debian"]
	img, hasImg := m["image"]
	switch {
	case hasDeb && hasImg:
		p.fail(n, "base", "", "names both debian and image; a build starts from one of them")
	case hasDeb:
		if s, ok := p.str(deb, "base.debian"); ok {
			if !contains(debianSuites, s) {
				p.fail(deb, "base.debian", s, "is not a Debian suite Moat can bootstrap; accepted: "+strings.Join(debianSuites, ", "))
			} else {
				p.plan.Base.Debian = s
			}
		}
	case hasImg:
		if s, ok := p.str(img, "base.image"); ok {
			if err := image.ValidName(s); err != nil {
				p.fail(img, "base.image", s, "is not an image name: "+err.Error()+"; `moat image list` shows the images you have")
			} else {
				p.plan.Base.Image = s
				p.plan.Base.Line, p.plan.Base.Text = img.Line, "base.image: "+s
			}
		}
	default:
		p.fail(n, "base", "", "names neither debian nor image; write base: {debian: bookworm} or base: {image: NAME}")
	}
}

func (p *imageFileParser) apt(n *yaml.Node) {
	pkgs, nodes, ok := p.strList(n, "apt")
	if !ok {
		return
	}
	seen := map[string]bool{}
	for i, s := range pkgs {
		field := fmt.Sprintf("apt[%d]", i)
		switch {
		case strings.Contains(s, "="):
			p.fail(nodes[i], field, s, "names a version; list package names only (the suite decides the version and the lockfile records it)")
			ok = false
		case !debName.MatchString(s):
			p.fail(nodes[i], field, s, "is not a Debian package name (lower-case letters, digits, + - .)")
			ok = false
		case seen[s]:
			p.fail(nodes[i], field, s, "is listed twice; list each package once")
			ok = false
		}
		seen[s] = true
	}
	if !ok {
		return
	}
	// The .debs stay in /var/cache/apt/archives: the builder hashes them
	// for the lockfile and then removes them (removeCaches).
	apt := image.AptGet
	if p.plan.Base.Image == "" {
		// A debian base downloads them while bootstrapping, on the host,
		// from the signed archive (data only: apt checks it, nothing of
		// the packages runs), and installs them here, in a sandbox with
		// no network: their maintainer scripts are untrusted code like
		// any other step's. (With an invalid base an error is already
		// reported.)
		// The same install as the built-in images'.
		p.plan.Base.Download = append(p.plan.Base.Download, pkgs...)
		p.plan.Steps = append(p.plan.Steps, Step{Op: OpRun, Line: n.Line, Text: "apt: " + strings.Join(pkgs, " "),
			Argv: image.AptInstallOffline(pkgs), Needs: []string{"apt-get"}, NeedsFix: aptDebianNeedsFix})
		return
	}
	script := "set -e; " + apt + " update; DEBIAN_FRONTEND=noninteractive " + apt +
		" install -y --no-install-recommends " + strings.Join(pkgs, " ") +
		"; rm -rf /var/lib/apt/lists/*"
	p.plan.Steps = append(p.plan.Steps, Step{Op: OpRun, Line: n.Line, Text: "apt: " + strings.Join(pkgs, " "),
		Argv: []string{"/bin/sh", "-c", script}, Hosts: append([]string(nil), defaultAptHosts...),
		Needs: []string{"apt-get"}, NeedsFix: aptNeedsFix})
}

func (p *imageFileParser) pip(n *yaml.Node) {
	m := p.mapping(n, "pip", pipKeys)
	if m == nil {
		return
	}
	reqNode, ok := m["requirements"]
	if !ok {
		p.fail(n, "pip.requirements", "", "is missing; name a requirements file with every package pinned and hashed (pip-compile --generate-hashes)")
		return
	}
	reqPath, ok := p.str(reqNode, "pip.requirements")
	if !ok || !p.contextPath(reqNode, "pip.requirements", reqPath) {
		return
	}
	data, ok := p.readContextFile(reqNode, "pip.requirements", reqPath, maxRequirementsBytes)
	if !ok {
		return
	}
	reqs, err := ParseRequirements(data, filepath.Join(p.dir, reqPath))
	if err != nil {
		p.fail(reqNode, "pip.requirements", reqPath, err.Error())
		return
	}
	var index, links string
	if v, ok := m["index"]; ok {
		if index, ok = p.str(v, "pip.index"); !ok || !p.httpsURL(v, "pip.index", index) {
			return
		}
	}
	if v, ok := m["find_links"]; ok {
		if links, ok = p.str(v, "pip.find_links"); !ok || !p.contextPath(v, "pip.find_links", links) {
			return
		}
		if fi, err := p.statContext(links); err != nil {
			p.fail(v, "pip.find_links", links, err.Error())
			return
		} else if !fi.IsDir() {
			p.fail(v, "pip.find_links", links, "is not a directory; name the directory that holds the wheels")
			return
		}
	}
	if index == "" && links == "" {
		index = "https://pypi.org/simple"
	}
	dest := buildDir + "/pip/"
	p.plan.Steps = append(p.plan.Steps, Step{Op: OpCopy, Line: reqNode.Line, Text: "pip: copy " + reqPath,
		Sources: []string{reqPath}, Dest: dest + "requirements.txt"})
	argv := []string{"python3", "-m", "pip", "install",
		"--require-hashes", "--only-binary", ":all:", "--no-cache-dir", "--no-input",
		"--disable-pip-version-check", "--break-system-packages"}
	var hosts []string
	if index != "" {
		argv = append(argv, "--index-url", index)
		hosts = indexHosts(index)
	} else {
		argv = append(argv, "--no-index")
	}
	if links != "" {
		p.plan.Steps = append(p.plan.Steps, Step{Op: OpCopy, Line: m["find_links"].Line, Text: "pip: copy " + links,
			Sources: []string{links}, Dest: dest + "wheels/"})
		argv = append(argv, "--find-links", dest+"wheels/")
	}
	argv = append(argv, "-r", dest+"requirements.txt")
	p.plan.Steps = append(p.plan.Steps, Step{Op: OpRun, Line: n.Line, Text: "pip: install " + reqPath,
		Argv: argv, Hosts: hosts, Needs: []string{"python3"}, NeedsFix: pipNeedsFix})
	for _, r := range reqs {
		p.plan.Pins = append(p.plan.Pins, Pin{Manager: "pip", Name: r.Name, Version: r.Version, Hash: r.Hashes[0]})
	}
}

// indexHosts is the egress allowlist for a package index: its host, and
// for PyPI also files.pythonhosted.org, where PyPI's files are served.
func indexHosts(index string) []string {
	u, err := url.Parse(index)
	if err != nil {
		return nil
	}
	hosts := []string{strings.ToLower(u.Host)}
	if strings.EqualFold(u.Hostname(), "pypi.org") {
		hosts = append(hosts, "files.pythonhosted.org")
	}
	return hosts
}

func (p *imageFileParser) npm(n *yaml.Node) {
	m := p.mapping(n, "npm", npmKeys)
	if m == nil {
		return
	}
	lockNode, ok := m["lockfile"]
	if !ok {
		p.fail(n, "npm.lockfile", "", "is missing; name a package-lock.json (npm install --package-lock-only writes one)")
		return
	}
	lockPath, ok := p.str(lockNode, "npm.lockfile")
	if !ok || !p.contextPath(lockNode, "npm.lockfile", lockPath) {
		return
	}
	if path.Base(filepath.ToSlash(lockPath)) != "package-lock.json" {
		p.fail(lockNode, "npm.lockfile", lockPath, "is not named package-lock.json; npm ci reads only that name, beside package.json")
		return
	}
	data, ok := p.readContextFile(lockNode, "npm.lockfile", lockPath, maxNpmLockBytes)
	if !ok {
		return
	}
	pkgJSON := filepath.Join(filepath.Dir(lockPath), "package.json")
	if _, err := p.statContext(pkgJSON); err != nil {
		p.fail(lockNode, "npm.lockfile", lockPath, "has no package.json beside it ("+err.Error()+"); npm ci needs both")
		return
	}
	pkgs, err := ParseNpmLock(data, filepath.Join(p.dir, lockPath))
	if err != nil {
		p.fail(lockNode, "npm.lockfile", lockPath, err.Error())
		return
	}
	dirNode, ok := m["dir"]
	if !ok {
		p.fail(n, "npm.dir", "", "is missing; name the absolute directory node_modules goes into, e.g. dir: /opt/app")
		return
	}
	dir, ok := p.str(dirNode, "npm.dir")
	if !ok || !p.treePath(dirNode, "npm.dir", dir, true) {
		return
	}
	dir = path.Clean(dir)
	registry := "https://registry.npmjs.org/"
	if v, ok := m["registry"]; ok {
		if registry, ok = p.str(v, "npm.registry"); !ok || !p.httpsURL(v, "npm.registry", registry) {
			return
		}
	}
	dev, scripts := false, false
	if v, ok := m["dev"]; ok {
		if dev, ok = p.boolean(v, "npm.dev"); !ok {
			return
		}
	}
	if v, ok := m["scripts"]; ok {
		if scripts, ok = p.boolean(v, "npm.scripts"); !ok {
			return
		}
	}
	p.plan.Steps = append(p.plan.Steps, Step{Op: OpCopy, Line: lockNode.Line, Text: "npm: copy " + lockPath,
		Sources: []string{pkgJSON, lockPath}, Dest: dir + "/"})
	argv := []string{"npm", "ci", "--prefix", dir, "--registry", registry,
		"--cache", buildDir + "/npm-cache", "--no-audit", "--no-fund", "--no-update-notifier"}
	if !dev {
		argv = append(argv, "--omit=dev")
	}
	if !scripts {
		argv = append(argv, "--ignore-scripts")
	}
	p.plan.Steps = append(p.plan.Steps, Step{Op: OpRun, Line: n.Line, Text: "npm: ci in " + dir,
		Argv: argv, Hosts: indexHosts(registry), Needs: []string{"npm"}, NeedsFix: npmNeedsFix})
	for _, pkg := range pkgs {
		if pkg.Dev && !dev {
			continue // not installed, so not in the image
		}
		p.plan.Pins = append(p.plan.Pins, Pin{Manager: "npm", Name: pkg.Name, Version: pkg.Version, Hash: pkg.Integrity})
	}
}

func (p *imageFileParser) files(n *yaml.Node) {
	if !p.plain(n, "files") {
		return
	}
	if n.Kind != yaml.SequenceNode {
		p.fail(n, "files", scalarValue(n), "is "+describe(n)+"; expected a list of {src, dest}")
		return
	}
	if len(n.Content) == 0 || len(n.Content) > maxListLen {
		p.fail(n, "files", "", fmt.Sprintf("has %d entries; list 1 to %d, or remove the key", len(n.Content), maxListLen))
		return
	}
	for i, item := range n.Content {
		field := fmt.Sprintf("files[%d]", i)
		m := p.mapping(item, field, fileKeys)
		if m == nil {
			continue
		}
		src, dest, owner := "", "", "root"
		ok := true
		if v, has := m["src"]; !has {
			p.fail(item, field+".src", "", "is missing; name a file or directory relative to the image file")
			ok = false
		} else if src, ok = p.str(v, field+".src"); ok && p.contextPath(v, field+".src", src) {
			if _, err := p.statContext(src); err != nil {
				p.fail(v, field+".src", src, err.Error())
				ok = false
			}
		} else {
			ok = false
		}
		if v, has := m["dest"]; !has {
			p.fail(item, field+".dest", "", "is missing; name an absolute path in the image, e.g. /opt/app/")
			ok = false
		} else if d, good := p.str(v, field+".dest"); !good || !p.treePath(v, field+".dest", d, true) {
			ok = false
		} else {
			dest = d
		}
		if v, has := m["owner"]; has {
			if o, good := p.str(v, field+".owner"); !good {
				ok = false
			} else if o != "root" && o != "sandbox" {
				p.fail(v, field+".owner", o, "is not an owner; accepted: root (the default, read-only at run time), sandbox (the run's user may write)")
				ok = false
			} else {
				owner = o
			}
		}
		if ok {
			p.plan.Steps = append(p.plan.Steps, Step{Op: OpCopy, Line: item.Line, Text: "files: " + src + " -> " + dest,
				Sources: []string{filepath.Clean(src)}, Dest: dest, Chown: owner})
		}
	}
}

func (p *imageFileParser) env(n *yaml.Node) {
	m := p.mapping(n, "env", nil)
	if m == nil {
		return
	}
	if len(m) > maxListLen {
		p.fail(n, "env", "", fmt.Sprintf("has %d variables; at most %d", len(m), maxListLen))
		return
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// Sorted: a mapping has no order, and the steps (so the digest) must
	// not depend on how the file lists them.
	sort.Strings(keys)
	for _, k := range keys {
		v := m[k]
		field := strictjson.JoinField("env", k)
		if !envName.MatchString(k) {
			p.fail(v, field, "", "is not a variable name (letters, digits and _, not starting with a digit)")
			continue
		}
		if v.Kind == yaml.ScalarNode && v.ShortTag() == "!!str" && v.Value == "" {
			p.plan.Steps = append(p.plan.Steps, Step{Op: OpEnv, Line: v.Line, Text: "env: " + k + "=", Key: k})
			continue
		}
		val, ok := p.str(v, field)
		if !ok {
			continue
		}
		p.plan.Steps = append(p.plan.Steps, Step{Op: OpEnv, Line: v.Line, Text: "env: " + k + "=" + val, Key: k, Value: val})
	}
}

// contextPath checks that rel names something inside the build file's
// directory: relative, and not climbing out with "..". (Symlinks are
// resolved inside the directory when the file is read: os.Root.)
func (p *imageFileParser) contextPath(n *yaml.Node, field, rel string) bool {
	switch {
	case filepath.IsAbs(rel):
		p.fail(n, field, rel, "is an absolute path; write it relative to the image file's directory "+p.dir)
		return false
	case !filepath.IsLocal(rel):
		p.fail(n, field, rel, "leaves the image file's directory "+p.dir+"; only files beside the image file can be copied in")
		return false
	}
	return true
}

// statContext stats rel inside the context directory without leaving it
// (a symlink pointing outside fails).
func (p *imageFileParser) statContext(rel string) (os.FileInfo, error) {
	root, err := os.OpenRoot(p.dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	fi, err := root.Stat(rel)
	if err != nil {
		return nil, fmt.Errorf("cannot be used: %w", err)
	}
	return fi, nil
}

func (p *imageFileParser) readContextFile(n *yaml.Node, field, rel string, limit int64) ([]byte, bool) {
	root, err := os.OpenRoot(p.dir)
	if err != nil {
		p.fail(n, field, rel, err.Error())
		return nil, false
	}
	defer root.Close()
	f, err := root.Open(rel)
	if err != nil {
		p.fail(n, field, rel, "cannot be read: "+err.Error())
		return nil, false
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		p.fail(n, field, rel, "cannot be read: "+err.Error())
		return nil, false
	}
	if int64(len(data)) > limit {
		p.fail(n, field, rel, fmt.Sprintf("is larger than %d bytes", limit))
		return nil, false
	}
	return data, true
}

// treePath checks an absolute path inside the image. dest: it receives
// files, so it may not be the root or under a directory a run mounts
// fresh.
func (p *imageFileParser) treePath(n *yaml.Node, field, s string, dest bool) bool {
	if !strings.HasPrefix(s, "/") {
		p.fail(n, field, s, "is not an absolute path; write it from the image's root, e.g. /opt/app")
		return false
	}
	for _, part := range strings.Split(s, "/") {
		if part == ".." {
			p.fail(n, field, s, "contains ..; write the path without it")
			return false
		}
	}
	c := path.Clean(s)
	if dest && c == "/" {
		p.fail(n, field, s, "is the image's root; name a directory such as /opt/app")
		return false
	}
	for _, d := range freshDirs {
		if c == d || strings.HasPrefix(c, d+"/") {
			if !dest && d == "/workspace" {
				continue // a working directory in the workspace is the usual one
			}
			p.fail(n, field, s, "is under "+d+", which every run mounts fresh, so what the build put there would be hidden; use a directory such as /opt/app")
			return false
		}
	}
	return true
}

// httpsURL checks an index or registry URL: https (the hashes protect the
// packages, TLS the metadata and the credentials of a proxy), with a host
// and no credentials (they would be copied into the image's build steps
// and the lockfile).
func (p *imageFileParser) httpsURL(n *yaml.Node, field, s string) bool {
	u, err := url.Parse(s)
	switch {
	case err != nil:
		p.fail(n, field, s, "is not a URL: "+err.Error())
	case u.Scheme != "https":
		p.fail(n, field, s, "is not an https:// URL; indexes are reached over TLS only")
	case u.Host == "" || u.Hostname() == "":
		p.fail(n, field, s, "has no host; write e.g. https://pypi.org/simple")
	case u.User != nil:
		p.fail(n, field, s, "carries credentials; remove user:password@ (they would be written into the image's build record)")
	case u.RawQuery != "" || u.Fragment != "":
		p.fail(n, field, s, "has a query or fragment; give the index's base URL")
	default:
		if port := u.Port(); port != "" {
			if _, err := strconv.ParseUint(port, 10, 16); err != nil {
				p.fail(n, field, s, "has an invalid port")
				return false
			}
		}
		if net.ParseIP(strings.Trim(u.Hostname(), "[]")) == nil && strings.ContainsAny(u.Hostname(), " _") {
			p.fail(n, field, s, "has an invalid host name")
			return false
		}
		return true
	}
	return false
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

func scalarValue(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return ""
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	}
	switch n.ShortTag() {
	case "!!str":
		return "a string"
	case "!!int":
		return "an integer"
	case "!!float":
		return "a number"
	case "!!bool":
		return "a boolean"
	case "!!null":
		return "null"
	}
	return "a value tagged " + n.Tag
}
