package imagebuild

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// NpmPackage is one installed package of a package-lock.json.
type NpmPackage struct {
	// Path is the key in the lockfile's "packages" ("node_modules/a").
	Path    string
	Name    string
	Version string
	// Integrity is the Subresource Integrity string ("sha512-<base64>").
	Integrity string
	// Dev is true for a package only development dependencies need.
	Dev bool
}

// npmIntegrity is a Subresource Integrity value npm accepts as strong.
var npmIntegrity = regexp.MustCompile(`^sha(256|384|512)-[A-Za-z0-9+/]+={0,2}$`)

// maxNpmPackages bounds a lockfile; a large application has a few
// thousand packages.
const maxNpmPackages = 100000

// ParseNpmLock reads a package-lock.json of lockfileVersion 2 or 3 (npm 7
// and later) and returns its packages sorted by path. Every package npm
// ci would fetch must have a version and an integrity hash: one without
// is refused with its path, because npm would then install whatever the
// registry serves. Bundled packages (inBundle) come inside their parent's
// tarball and are covered by its integrity; links (workspaces, file:
// dependencies) are refused, since they install code from outside the
// lockfile. file names the lockfile in errors.
func ParseNpmLock(data []byte, file string) ([]NpmPackage, error) {
	var doc struct {
		LockfileVersion *int                       `json:"lockfileVersion"`
		Packages        map[string]json.RawMessage `json:"packages"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%s: is not a package-lock.json: %w", file, err)
	}
	switch {
	case doc.LockfileVersion == nil:
		return nil, fmt.Errorf("%s: has no lockfileVersion; regenerate it with npm 7 or later (npm install --package-lock-only)", file)
	case *doc.LockfileVersion != 2 && *doc.LockfileVersion != 3:
		return nil, fmt.Errorf("%s: lockfileVersion %d is not accepted (2 or 3 are); regenerate it with npm 7 or later (npm install --package-lock-only)", file, *doc.LockfileVersion)
	}
	if len(doc.Packages) > maxNpmPackages {
		return nil, fmt.Errorf("%s: has %d packages, more than %d", file, len(doc.Packages), maxNpmPackages)
	}
	var pkgs []NpmPackage
	for path, raw := range doc.Packages {
		if path == "" {
			continue // the project itself, installed from package.json
		}
		var e struct {
			Name      string `json:"name"`
			Version   string `json:"version"`
			Resolved  string `json:"resolved"`
			Integrity string `json:"integrity"`
			Link      bool   `json:"link"`
			Dev       bool   `json:"dev"`
			InBundle  bool   `json:"inBundle"`
		}
		if err := json.Unmarshal(raw, &e); err != nil {
			return nil, fmt.Errorf("%s: package %s: %w", file, quoteShort(path), err)
		}
		i := strings.LastIndex(path, "node_modules/")
		if i < 0 {
			return nil, fmt.Errorf("%s: package %s is not under node_modules (a workspace); workspaces are not supported, install a published package instead", file, quoteShort(path))
		}
		name := path[i+len("node_modules/"):]
		if e.Name != "" {
			name = e.Name // an alias ("a": "npm:b@1") installs b
		}
		switch {
		case e.Link:
			return nil, fmt.Errorf("%s: package %s is a link to local files; only registry packages with an integrity hash are accepted", file, quoteShort(path))
		case e.InBundle:
			continue
		case e.Version == "":
			return nil, fmt.Errorf("%s: package %s has no version; regenerate the lockfile with npm install --package-lock-only", file, quoteShort(path))
		case e.Integrity == "":
			return nil, fmt.Errorf("%s: package %s@%s has no integrity hash; only registry packages with an integrity hash are accepted (git and URL dependencies have none)", file, quoteShort(name), quoteShort(e.Version))
		}
		first, _, _ := strings.Cut(e.Integrity, " ")
		if !npmIntegrity.MatchString(first) {
			return nil, fmt.Errorf("%s: package %s@%s: integrity %s is not sha512-<base64> (or sha256/sha384)", file, quoteShort(name), quoteShort(e.Version), quoteShort(e.Integrity))
		}
		pkgs = append(pkgs, NpmPackage{Path: path, Name: name, Version: e.Version, Integrity: first, Dev: e.Dev})
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].Path < pkgs[j].Path })
	return pkgs, nil
}
