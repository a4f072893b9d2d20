package pkgguard

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	xhtml "golang.org/x/net/html"
)

// SimpleFile is one file of a PyPI project page, as the upstream lists it.
type SimpleFile struct {
	Filename       string
	URL            string // absolute, without the fragment
	SHA256         string // lower-case hex; empty if the upstream gave none
	RequiresPython string
	Yanked         bool
	YankedReason   string
	UploadTime     time.Time // zero when not given
}

const (
	simpleJSON = "application/vnd.pypi.simple.v1+json"
	simpleHTML = "application/vnd.pypi.simple.v1+html"
)

// ParseSimple parses a project page of the PyPI simple API: PEP 691 JSON
// when contentType says so, else PEP 503 HTML. Relative URLs are resolved
// against base. The bytes are the upstream's: bounded by the caller,
// parsed without trusting their structure.
func ParseSimple(body []byte, contentType string, base *url.URL) ([]SimpleFile, error) {
	if strings.Contains(contentType, "json") {
		return parseSimpleJSON(body, base)
	}
	return parseSimpleHTML(body, base)
}

func parseSimpleJSON(body []byte, base *url.URL) ([]SimpleFile, error) {
	var doc struct {
		Meta struct {
			APIVersion string `json:"api-version"`
		} `json:"meta"`
		Files []struct {
			Filename       string            `json:"filename"`
			URL            string            `json:"url"`
			Hashes         map[string]string `json:"hashes"`
			RequiresPython *string           `json:"requires-python"`
			Yanked         json.RawMessage   `json:"yanked"`
			UploadTime     string            `json:"upload-time"`
		} `json:"files"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		return nil, fmt.Errorf("project page (JSON): %w", err)
	}
	if !strings.HasPrefix(doc.Meta.APIVersion, "1.") {
		return nil, fmt.Errorf("project page (JSON): api-version %q is not 1.x", doc.Meta.APIVersion)
	}
	var out []SimpleFile
	for _, f := range doc.Files {
		sf := SimpleFile{Filename: f.Filename}
		u, err := resolve(base, f.URL)
		if err != nil {
			continue
		}
		sf.URL = u
		sf.SHA256 = strings.ToLower(f.Hashes["sha256"])
		if f.RequiresPython != nil {
			sf.RequiresPython = *f.RequiresPython
		}
		var yb bool
		var ys string
		if json.Unmarshal(f.Yanked, &yb) == nil {
			sf.Yanked = yb
		} else if json.Unmarshal(f.Yanked, &ys) == nil {
			sf.Yanked, sf.YankedReason = true, ys
		}
		if f.UploadTime != "" {
			sf.UploadTime, _ = time.Parse(time.RFC3339, f.UploadTime)
		}
		out = append(out, sf)
	}
	return out, nil
}

func parseSimpleHTML(body []byte, base *url.URL) ([]SimpleFile, error) {
	z := xhtml.NewTokenizer(bytes.NewReader(body))
	var out []SimpleFile
	var cur *SimpleFile
	for {
		switch z.Next() {
		case xhtml.ErrorToken:
			if cur != nil {
				out = append(out, *cur)
			}
			if errors.Is(z.Err(), io.EOF) {
				return out, nil
			}
			return nil, fmt.Errorf("project page (HTML): %w", z.Err())
		case xhtml.StartTagToken:
			tn, hasAttr := z.TagName()
			if string(tn) != "a" {
				continue
			}
			if cur != nil {
				out = append(out, *cur)
			}
			cur = &SimpleFile{}
			var href string
			for hasAttr {
				var k, v []byte
				k, v, hasAttr = z.TagAttr()
				switch string(k) {
				case "href":
					href = string(v)
				case "data-requires-python":
					cur.RequiresPython = string(v)
				case "data-yanked":
					cur.Yanked, cur.YankedReason = true, string(v)
				}
			}
			u, err := url.Parse(href)
			if err != nil || href == "" {
				cur = nil
				continue
			}
			if algo, hx, ok := strings.Cut(u.Fragment, "="); ok && algo == "sha256" {
				cur.SHA256 = strings.ToLower(hx)
			}
			u.Fragment = ""
			abs, err := resolve(base, u.String())
			if err != nil {
				cur = nil
				continue
			}
			cur.URL = abs
			cur.Filename = pathBase(u.Path)
		case xhtml.TextToken:
			if cur != nil && cur.Filename == "" {
				cur.Filename = strings.TrimSpace(string(z.Text()))
			}
		case xhtml.EndTagToken:
			if tn, _ := z.TagName(); string(tn) == "a" && cur != nil {
				out = append(out, *cur)
				cur = nil
			}
		}
	}
}

func pathBase(p string) string {
	if i := strings.LastIndexByte(p, '/'); i >= 0 {
		p = p[i+1:]
	}
	if s, err := url.PathUnescape(p); err == nil {
		return s
	}
	return p
}

func resolve(base *url.URL, ref string) (string, error) {
	u, err := url.Parse(ref)
	if err != nil {
		return "", err
	}
	if base != nil {
		u = base.ResolveReference(u)
	}
	if u.Scheme != "https" && u.Scheme != "http" {
		return "", fmt.Errorf("URL %q is not http(s)", ref)
	}
	u.Fragment = ""
	return u.String(), nil
}

// FileVersion returns the version in a distribution's file name for the
// (normalised) project: wheels (name-version-...whl), sdists
// (name-version.tar.gz, .zip) and eggs; ok is false for anything else.
func FileVersion(project, filename string) (string, bool) {
	if strings.ContainsAny(filename, "/\\") || strings.HasPrefix(filename, ".") {
		return "", false
	}
	if stem, ok := strings.CutSuffix(filename, ".whl"); ok {
		parts := strings.Split(stem, "-")
		if len(parts) < 5 || NormalizePyPI(parts[0]) != project {
			return "", false
		}
		return parts[1], parts[1] != ""
	}
	stem := ""
	for _, ext := range []string{".tar.gz", ".zip", ".tar.bz2", ".tgz"} {
		if s, ok := strings.CutSuffix(filename, ext); ok {
			stem = s
			break
		}
	}
	if stem == "" {
		return "", false
	}
	// The version is after the last hyphen (PEP 625; a version has none)
	// and starts with a digit.
	i := strings.LastIndexByte(stem, '-')
	if i > 0 && i+1 < len(stem) && stem[i+1] >= '0' && stem[i+1] <= '9' && NormalizePyPI(stem[:i]) == project {
		return stem[i+1:], true
	}
	return "", false
}

// servePyPI answers simple/, simple/<project>/ and files/<project>/<file>.
func (g *Guard) servePyPI(w http.ResponseWriter, r *http.Request, rest string) {
	ix := g.cfg.PyPI
	switch {
	case rest == "simple/" || rest == "simple":
		g.pypiRoot(w, r)
	case strings.HasPrefix(rest, "simple/"):
		p, err := url.PathUnescape(strings.TrimSuffix(strings.TrimPrefix(rest, "simple/"), "/"))
		if err != nil || strings.Contains(p, "/") || !pypiName.MatchString(p) {
			refuse(w, http.StatusNotFound, ReasonNotAllowed, fmt.Sprintf("%q is not a project name", p))
			return
		}
		name := NormalizePyPI(p)
		rq, ok := g.lookup(w, PyPI, ix, name)
		if !ok {
			return
		}
		files, ok := g.pypiFiles(w, r, ix, rq)
		if !ok {
			return
		}
		g.pypiPage(w, r, name, files)
	case strings.HasPrefix(rest, "files/"):
		proj, file, ok := strings.Cut(strings.TrimPrefix(rest, "files/"), "/")
		file, err := url.PathUnescape(file)
		if !ok || err != nil || !pypiName.MatchString(proj) {
			refuse(w, http.StatusNotFound, ReasonNotAllowed, "not a file of this index")
			return
		}
		name := NormalizePyPI(proj)
		rq, ok := g.lookup(w, PyPI, ix, name)
		if !ok {
			return
		}
		key := "pypi/" + name + "/" + file
		f, known := g.recall(key)
		if !known {
			// Not listed yet in this run (a cached URL, a hand-written
			// one): list the project, which records what is allowed.
			if _, ok := g.pypiFiles(w, r, ix, rq); !ok {
				return
			}
			if f, known = g.recall(key); !known {
				v, _ := FileVersion(name, file)
				g.deny(w, Event{Ecosystem: PyPI, Package: name, Version: v, File: file, Reason: ReasonNotAllowed,
					Detail: fmt.Sprintf("%s is not a file the manifest allows for %s (allowed: %s)", file, name, describe(rq))})
				return
			}
		}
		g.serveVerified(w, r, Event{Ecosystem: PyPI, Package: name, Version: f.version, File: file}, f, "application/octet-stream")
	default:
		refuse(w, http.StatusNotFound, ReasonNotAllowed, "the PyPI index of the guard is at "+PathPrefix+"pypi/simple/")
	}
}

func describe(rq Requirement) string {
	s := rq.Name
	if c := rq.Constraint.String(); c != "" {
		s += " " + c
	}
	if len(rq.Hashes) > 0 {
		s += fmt.Sprintf(" with %d pinned hash(es)", len(rq.Hashes))
	}
	return s
}

// pypiFiles fetches the project's page upstream and keeps the files the
// policy allows, recording them for download.
func (g *Guard) pypiFiles(w http.ResponseWriter, r *http.Request, ix *Index, rq Requirement) ([]SimpleFile, bool) {
	pageURL := strings.TrimSuffix(ix.URL, "/") + "/" + url.PathEscape(rq.Name) + "/"
	body, ctype, err := g.fetch(r.Context(), pageURL, simpleJSON+", "+simpleHTML+";q=0.2, text/html;q=0.1", g.opts.MaxPageBytes)
	if err != nil {
		g.deny(w, Event{Ecosystem: PyPI, Package: rq.Name, Reason: ReasonUpstreamError, Detail: fmt.Sprintf("listing %s upstream: %v", rq.Name, err)})
		return nil, false
	}
	base, _ := url.Parse(pageURL)
	files, err := ParseSimple(body, ctype, base)
	if err != nil {
		g.deny(w, Event{Ecosystem: PyPI, Package: rq.Name, Reason: ReasonUpstreamError, Detail: err.Error()})
		return nil, false
	}
	var keep []SimpleFile
	for _, f := range files {
		v, ok := FileVersion(rq.Name, f.Filename)
		digest, err := hex.DecodeString(f.SHA256)
		switch {
		case !ok, err != nil, len(digest) != 32:
			// Without a sha256 the guard could not verify the bytes.
			continue
		case !rq.Allows(v, "sha256:"+f.SHA256):
			continue
		case f.Yanked && g.cfg.Yanked != "allow":
			continue
		case g.tooNew(f.UploadTime):
			continue
		}
		g.remember("pypi/"+rq.Name+"/"+f.Filename, fileRec{upstream: f.URL, algo: "sha256", digest: digest, version: v})
		keep = append(keep, f)
	}
	return keep, true
}

// pypiRoot lists the allowed projects (the guard's own index, not the
// upstream's: nothing else is there).
func (g *Guard) pypiRoot(w http.ResponseWriter, r *http.Request) {
	var names []string
	for _, rq := range g.cfg.PyPI.Allow {
		names = append(names, rq.Name)
	}
	if strings.Contains(r.Header.Get("Accept"), simpleJSON) {
		type proj struct {
			Name string `json:"name"`
		}
		doc := struct {
			Meta     map[string]string `json:"meta"`
			Projects []proj            `json:"projects"`
		}{Meta: map[string]string{"api-version": "1.1"}, Projects: []proj{}}
		for _, n := range names {
			doc.Projects = append(doc.Projects, proj{n})
		}
		w.Header().Set("Content-Type", simpleJSON)
		json.NewEncoder(w).Encode(doc)
		return
	}
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html><body>\n")
	for _, n := range names {
		fmt.Fprintf(&b, "<a href=\"%s/\">%s</a>\n", url.PathEscape(n), html.EscapeString(n))
	}
	b.WriteString("</body></html>\n")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write([]byte(b.String()))
}

// pypiPage renders the kept files with the guard's own URLs, in the
// format the client asked for.
func (g *Guard) pypiPage(w http.ResponseWriter, r *http.Request, name string, files []SimpleFile) {
	fileURL := func(f SimpleFile) string {
		return g.opts.BaseURL + "/pypi/files/" + url.PathEscape(name) + "/" + url.PathEscape(f.Filename)
	}
	if strings.Contains(r.Header.Get("Accept"), simpleJSON) {
		type jf struct {
			Filename       string            `json:"filename"`
			URL            string            `json:"url"`
			Hashes         map[string]string `json:"hashes"`
			RequiresPython string            `json:"requires-python,omitempty"`
			Yanked         any               `json:"yanked,omitempty"`
			UploadTime     string            `json:"upload-time,omitempty"`
		}
		doc := struct {
			Meta  map[string]string `json:"meta"`
			Name  string            `json:"name"`
			Files []jf              `json:"files"`
		}{Meta: map[string]string{"api-version": "1.1"}, Name: name, Files: []jf{}}
		for _, f := range files {
			j := jf{Filename: f.Filename, URL: fileURL(f), Hashes: map[string]string{"sha256": f.SHA256}, RequiresPython: f.RequiresPython}
			if f.Yanked {
				j.Yanked = true
				if f.YankedReason != "" {
					j.Yanked = f.YankedReason
				}
			}
			if !f.UploadTime.IsZero() {
				j.UploadTime = f.UploadTime.UTC().Format(time.RFC3339)
			}
			doc.Files = append(doc.Files, j)
		}
		w.Header().Set("Content-Type", simpleJSON)
		json.NewEncoder(w).Encode(doc)
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "<!DOCTYPE html>\n<html><head><meta name=\"pypi:repository-version\" content=\"1.1\"></head><body>\n")
	for _, f := range files {
		attrs := ""
		if f.RequiresPython != "" {
			attrs += fmt.Sprintf(" data-requires-python=\"%s\"", html.EscapeString(f.RequiresPython))
		}
		if f.Yanked {
			attrs += fmt.Sprintf(" data-yanked=\"%s\"", html.EscapeString(f.YankedReason))
		}
		fmt.Fprintf(&b, "<a href=\"%s#sha256=%s\"%s>%s</a>\n", html.EscapeString(fileURL(f)), f.SHA256, attrs, html.EscapeString(f.Filename))
	}
	b.WriteString("</body></html>\n")
	w.Header().Set("Content-Type", simpleHTML)
	w.Write([]byte(b.String()))
}
