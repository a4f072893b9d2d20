package pkgguard

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strings"
	"time"
)

// NPMVersion is one version of a packument, as the guard needs it.
type NPMVersion struct {
	Version   string
	Tarball   string // absolute upstream URL
	Integrity string // "sha512-B64" (SRI), may be empty
	Shasum    string // hex sha1, may be empty
	Time      time.Time
	raw       map[string]json.RawMessage
}

// Packument is an npm registry document, parsed far enough to filter it.
type Packument struct {
	Name     string
	Versions map[string]*NPMVersion
	top      map[string]json.RawMessage
	time     map[string]string
}

// ParsePackument parses an npm registry document (full or the abbreviated
// install form). The bytes are the upstream's.
func ParsePackument(body []byte) (*Packument, error) {
	p := &Packument{Versions: map[string]*NPMVersion{}}
	if err := json.Unmarshal(body, &p.top); err != nil {
		return nil, fmt.Errorf("packument: %w", err)
	}
	if raw, ok := p.top["name"]; ok {
		if err := json.Unmarshal(raw, &p.Name); err != nil {
			return nil, fmt.Errorf("packument name: %w", err)
		}
	}
	if raw, ok := p.top["time"]; ok {
		// Optional and loosely typed upstream; a bad one only loses
		// the new-package check's dates.
		var t map[string]any
		if json.Unmarshal(raw, &t) == nil {
			p.time = map[string]string{}
			for k, v := range t {
				if s, ok := v.(string); ok {
					p.time[k] = s
				}
			}
		}
	}
	var versions map[string]map[string]json.RawMessage
	if raw, ok := p.top["versions"]; ok {
		if err := json.Unmarshal(raw, &versions); err != nil {
			return nil, fmt.Errorf("packument versions: %w", err)
		}
	}
	for v, doc := range versions {
		var dist struct {
			Tarball   string `json:"tarball"`
			Integrity string `json:"integrity"`
			Shasum    string `json:"shasum"`
		}
		if raw, ok := doc["dist"]; ok {
			if json.Unmarshal(raw, &dist) != nil {
				continue
			}
		}
		nv := &NPMVersion{Version: v, Tarball: dist.Tarball, Integrity: dist.Integrity, Shasum: strings.ToLower(dist.Shasum), raw: doc}
		if s, ok := p.time[v]; ok {
			nv.Time, _ = time.Parse(time.RFC3339, s)
		}
		p.Versions[v] = nv
	}
	return p, nil
}

// npmNameFromPath reads a package name from a registry path: "lodash",
// "@scope%2fname" (npm's form) or "@scope/name".
func npmNameFromPath(p string) (string, bool) {
	n, err := url.PathUnescape(p)
	if err != nil {
		return "", false
	}
	n = strings.ToLower(n)
	return n, npmName.MatchString(n) && len(n) <= 214
}

// registryTarball parses the public registry's tarball path,
// <name>/-/<basename>-<version>.tgz (@scope/name/-/name-1.0.0.tgz for a
// scoped package). npm asks for it when it installs from a package-lock
// written against registry.npmjs.org: it keeps the lock's path and
// replaces only the registry's host with the one it was given
// (replace-registry-host), so the guard must answer it like its own.
func registryTarball(rest string) (name, ver string, ok bool) {
	namePath, file, ok := strings.Cut(rest, "/-/")
	if !ok {
		return "", "", false
	}
	name, ok = npmNameFromPath(namePath)
	if !ok {
		return "", "", false
	}
	base := name[strings.LastIndexByte(name, '/')+1:]
	ver, ok = strings.CutPrefix(strings.ToLower(file), base+"-")
	if !ok {
		return "", "", false
	}
	ver, ok = strings.CutSuffix(ver, ".tgz")
	if !ok || ver == "" || strings.ContainsAny(ver, "/\\") {
		return "", "", false
	}
	return name, ver, true
}

// serveNPM answers <name> (the packument), -/tarball/<version>/<name>
// (the tarball URLs of the guard's packuments) and the registry's own
// <name>/-/<name>-<version>.tgz (registryTarball).
func (g *Guard) serveNPM(w http.ResponseWriter, r *http.Request, rest string) {
	ix := g.cfg.NPM
	if t, ok := strings.CutPrefix(rest, "-/tarball/"); ok {
		ver, namePath, ok := strings.Cut(t, "/")
		name, okName := npmNameFromPath(namePath)
		if !ok || !okName {
			refuse(w, http.StatusNotFound, ReasonNotAllowed, "not a tarball of this registry")
			return
		}
		g.serveNPMTarball(w, r, ix, name, ver)
		return
	}
	if name, ver, ok := registryTarball(rest); ok {
		g.serveNPMTarball(w, r, ix, name, ver)
		return
	}
	name, ok := npmNameFromPath(strings.TrimSuffix(rest, "/"))
	if !ok {
		refuse(w, http.StatusNotFound, ReasonNotAllowed, fmt.Sprintf("%q is not an npm package name (the guard serves packuments and tarballs only)", rest))
		return
	}
	rq, ok := g.lookup(w, NPM, ix, name)
	if !ok {
		return
	}
	p, ok := g.npmPackument(w, r, ix, rq)
	if !ok {
		return
	}
	body, err := p.render(g.opts.BaseURL)
	if err != nil {
		g.deny(w, Event{Ecosystem: NPM, Package: name, Reason: ReasonUpstreamError, Detail: err.Error()})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

// serveNPMTarball serves name@ver if the policy lets it through: the
// version must be in the filtered packument, and the bytes must match its
// digest (and the manifest's pin).
func (g *Guard) serveNPMTarball(w http.ResponseWriter, r *http.Request, ix *Index, name, ver string) {
	rq, ok := g.lookup(w, NPM, ix, name)
	if !ok {
		return
	}
	key := "npm/" + name + "/" + ver
	f, known := g.recall(key)
	if !known {
		if _, ok := g.npmPackument(w, r, ix, rq); !ok {
			return
		}
		if f, known = g.recall(key); !known {
			g.deny(w, Event{Ecosystem: NPM, Package: name, Version: ver, Reason: ReasonNotAllowed,
				Detail: fmt.Sprintf("%s@%s is not a version the manifest allows (allowed: %s)", name, ver, describe(rq))})
			return
		}
	}
	g.serveVerified(w, r, Event{Ecosystem: NPM, Package: name, Version: ver, File: name + "-" + ver + ".tgz"}, f, "application/octet-stream")
}

// npmPackument fetches the packument upstream and keeps the versions the
// policy allows, recording their tarballs for download.
func (g *Guard) npmPackument(w http.ResponseWriter, r *http.Request, ix *Index, rq Requirement) (*Packument, bool) {
	u := strings.TrimSuffix(ix.URL, "/") + "/" + strings.Replace(url.PathEscape(rq.Name), "%40", "@", 1)
	// The full document: the abbreviated one has no publish times, which
	// the new-package hold needs.
	body, _, err := g.fetch(r.Context(), u, "application/json", g.opts.MaxPageBytes)
	if err != nil {
		g.deny(w, Event{Ecosystem: NPM, Package: rq.Name, Reason: ReasonUpstreamError, Detail: fmt.Sprintf("fetching %s upstream: %v", rq.Name, err)})
		return nil, false
	}
	p, err := ParsePackument(body)
	if err != nil {
		g.deny(w, Event{Ecosystem: NPM, Package: rq.Name, Reason: ReasonUpstreamError, Detail: err.Error()})
		return nil, false
	}
	base, _ := url.Parse(u)
	for v, nv := range p.Versions {
		keep := false
		tarball, err := resolve(base, nv.Tarball)
		algo, digest, sri := decodeSRI(nv.Integrity)
		if !sri {
			if d, err := hex.DecodeString(nv.Shasum); err == nil && len(d) == 20 {
				algo, digest = "sha1", d
			}
		}
		switch {
		case err != nil, digest == nil:
		case !rq.Allows(v, ""):
		case len(rq.Hashes) > 0 && !(sri && rq.Allows(v, nv.Integrity) || sri && rq.Allows(v, "sha512-"+b64(digest))):
		case g.tooNew(nv.Time):
		default:
			keep = true
		}
		if !keep {
			delete(p.Versions, v)
			continue
		}
		nv.Tarball = tarball
		g.remember("npm/"+rq.Name+"/"+v, fileRec{upstream: tarball, algo: algo, digest: digest, version: v})
	}
	return p, true
}

// render writes the filtered packument with tarball URLs on the guard,
// dist-tags pointing only at kept versions (latest: the highest kept).
func (p *Packument) render(base string) ([]byte, error) {
	out := map[string]json.RawMessage{}
	for k, v := range p.top {
		switch k {
		case "versions", "dist-tags", "time", "_attachments", "users":
		default:
			out[k] = v
		}
	}
	var kept []string
	versions := map[string]map[string]json.RawMessage{}
	for v, nv := range p.Versions {
		doc := map[string]json.RawMessage{}
		for k, raw := range nv.raw {
			doc[k] = raw
		}
		var dist map[string]json.RawMessage
		if raw, ok := doc["dist"]; ok && json.Unmarshal(raw, &dist) == nil {
			t, _ := json.Marshal(base + "/npm/-/tarball/" + url.PathEscape(v) + "/" + url.PathEscape(p.Name))
			dist["tarball"] = t
			d, _ := json.Marshal(dist)
			doc["dist"] = d
		}
		versions[v] = doc
		kept = append(kept, v)
	}
	sort.Slice(kept, func(i, j int) bool {
		a, _ := parseVersion(kept[i])
		b, _ := parseVersion(kept[j])
		return compareVersions(a, b) < 0
	})
	tags := map[string]string{}
	if len(kept) > 0 {
		tags["latest"] = kept[len(kept)-1]
	}
	times := map[string]string{}
	for _, v := range kept {
		if t, ok := p.time[v]; ok {
			times[v] = t
		}
	}
	var err error
	if out["versions"], err = json.Marshal(versions); err != nil {
		return nil, err
	}
	out["dist-tags"], _ = json.Marshal(tags)
	out["time"], _ = json.Marshal(times)
	return json.Marshal(out)
}
