package pkgguard

import (
	"net/url"
	"testing"
)

// FuzzParseSimple: upstream project pages (HTML and JSON) never panic,
// and every file parsed has an absolute http(s) URL.
func FuzzParseSimple(f *testing.F) {
	f.Add([]byte(`<html><body><a href="/files/requests-2.31.0-py3-none-any.whl#sha256=00" data-requires-python="&gt;=3.7">requests-2.31.0-py3-none-any.whl</a></body></html>`), "text/html")
	f.Add([]byte(`{"meta":{"api-version":"1.1"},"name":"x","files":[{"filename":"x-1.0.tar.gz","url":"https://h/x-1.0.tar.gz","hashes":{"sha256":"ab"},"yanked":"bad","upload-time":"2024-01-01T00:00:00Z"}]}`), simpleJSON)
	f.Add([]byte(`<a href="javascript:alert(1)">x</a><a href=`), "text/html")
	base, _ := url.Parse("https://index.example/simple/x/")
	f.Fuzz(func(t *testing.T, body []byte, ctype string) {
		files, err := ParseSimple(body, ctype, base)
		if err != nil {
			return
		}
		for _, sf := range files {
			u, err := url.Parse(sf.URL)
			if err != nil || (u.Scheme != "http" && u.Scheme != "https") {
				t.Fatalf("file URL %q is not absolute http(s)", sf.URL)
			}
		}
	})
}

// FuzzParsePackument: upstream packuments never panic, and rendering a
// parsed one yields only tarball URLs on the guard.
func FuzzParsePackument(f *testing.F) {
	f.Add([]byte(`{"name":"is-number","dist-tags":{"latest":"7.0.0"},"versions":{"7.0.0":{"name":"is-number","version":"7.0.0","dist":{"tarball":"https://r/is-number/-/is-number-7.0.0.tgz","integrity":"sha512-AAAA","shasum":"00"}}},"time":{"7.0.0":"2019-01-01T00:00:00Z"}}`))
	f.Add([]byte(`{"versions":{"1":{"dist":"x"}},"time":{"modified":1}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		p, err := ParsePackument(body)
		if err != nil {
			return
		}
		if _, err := p.render("http://127.0.0.1:3128/moat-index"); err != nil {
			return
		}
	})
}

// FuzzParseRequirement: manifest allow entries never panic.
func FuzzParseRequirement(f *testing.F) {
	for _, s := range []string{"requests==2.31.0", "numpy>=1.26,<2", "is-number@7.0.0", "@types/node@>=20", "x==1 --hash=sha256:00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, eco := range []Ecosystem{PyPI, NPM} {
			r, err := ParseRequirement(eco, s)
			if err == nil {
				r.Allows("1.0", "")
			}
		}
	})
}
