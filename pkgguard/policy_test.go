package pkgguard

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestPolicies: the yanked policy (refuse by default, allow) and the
// new-package hold (new_packages_days), on PyPI pages of both formats,
// on direct file requests, and on npm packuments and tarballs. A file or
// version the policy holds back is not listed, and asked for by URL it is
// refused as not allowed.
func TestPolicies(t *testing.T) {
	now := time.Date(2026, 6, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	old, fresh := now.Add(-100*24*time.Hour), now.Add(-24*time.Hour)

	const (
		whl10 = "oldpkg-1.0-py3-none-any.whl" // old, current
		whl11 = "oldpkg-1.1-py3-none-any.whl" // old, yanked
		whl20 = "oldpkg-2.0-py3-none-any.whl" // uploaded yesterday
	)
	newUp := func(t *testing.T, upJSON bool) *upstream {
		u := newUpstream(t)
		u.json = upJSON
		u.addWheel(t, "oldpkg", "1.0")
		u.addWheel(t, "oldpkg", "1.1")
		u.addWheel(t, "oldpkg", "2.0")
		u.meta[whl10] = fileMeta{uploaded: old}
		u.meta[whl11] = fileMeta{uploaded: old, yanked: true, reason: "broken build"}
		u.meta[whl20] = fileMeta{uploaded: fresh}
		u.addTarball(t, "fresh-pkg", "1.0.0")
		u.addTarball(t, "fresh-pkg", "2.0.0")
		u.meta["fresh-pkg@1.0.0"] = fileMeta{uploaded: old}
		u.meta["fresh-pkg@2.0.0"] = fileMeta{uploaded: fresh}
		return u
	}
	// The upload time is in PEP 691 JSON only; an HTML upstream gives
	// none, so the hold cannot apply there (README, RATIONALE).
	tests := []struct {
		name   string
		upJSON bool
		days   int
		yanked string
		listed []string // PyPI files on the guard's page
		held   []string // PyPI files neither listed nor served
		npm    []string // npm versions in the packument
		npmOff []string // npm versions neither listed nor served
	}{
		{name: "defaults: yanked refused, no hold", upJSON: true, listed: []string{whl10, whl20}, held: []string{whl11},
			npm: []string{"1.0.0", "2.0.0"}},
		{name: "yanked allowed", upJSON: true, yanked: "allow", listed: []string{whl10, whl11, whl20},
			npm: []string{"1.0.0", "2.0.0"}},
		{name: "7-day hold", upJSON: true, days: 7, listed: []string{whl10}, held: []string{whl11, whl20},
			npm: []string{"1.0.0"}, npmOff: []string{"2.0.0"}},
		{name: "hold longer than every upload", upJSON: true, days: 365, held: []string{whl10, whl11, whl20},
			npmOff: []string{"1.0.0", "2.0.0"}},
		{name: "HTML upstream: yanked refused, no upload time to hold on", days: 7, listed: []string{whl10, whl20}, held: []string{whl11},
			npm: []string{"1.0.0"}, npmOff: []string{"2.0.0"}},
		{name: "HTML upstream, yanked allowed", yanked: "allow", listed: []string{whl10, whl11, whl20},
			npm: []string{"1.0.0", "2.0.0"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := newUp(t, tc.upJSON)
			cfg := Config{
				PyPI:            &Index{URL: u.srv.URL + "/simple", Allow: []Requirement{mustReq(t, PyPI, "oldpkg")}},
				NPM:             &Index{URL: u.srv.URL + "/npm", Allow: []Requirement{mustReq(t, NPM, "fresh-pkg")}},
				NewPackagesDays: tc.days,
				Yanked:          tc.yanked,
			}
			srv, events := guardFor(t, u, cfg, clock)
			base := srv.URL + "/moat-index/"

			for _, accept := range []string{"", simpleJSON} {
				status, body, _ := get(t, base+"pypi/simple/oldpkg/", accept)
				if status != 200 {
					t.Fatalf("page (Accept %q): %d %s", accept, status, body)
				}
				for _, f := range tc.listed {
					if !strings.Contains(body, f) {
						t.Errorf("page (Accept %q) does not list %s:\n%s", accept, f, body)
					}
				}
				for _, f := range tc.held {
					if strings.Contains(body, f) {
						t.Errorf("page (Accept %q) lists %s, which the policy holds back:\n%s", accept, f, body)
					}
				}
				// A yanked file the policy lets through stays marked
				// yanked, as the upstream marks it, so pip still
				// prefers another.
				if tc.yanked == "allow" && !strings.Contains(body, "broken build") {
					t.Errorf("page (Accept %q) lists the yanked file without its mark:\n%s", accept, body)
				}
			}
			for _, f := range tc.listed {
				if status, body, _ := get(t, base+"pypi/files/oldpkg/"+f, ""); status != 200 {
					t.Errorf("%s: %d %s, want it served", f, status, body)
				}
			}
			for _, f := range tc.held {
				n := len(events())
				status, body, _ := get(t, base+"pypi/files/oldpkg/"+f, "")
				ev := events()[n:]
				if status != 403 || len(ev) == 0 || ev[len(ev)-1].Reason != ReasonNotAllowed {
					t.Errorf("%s asked for by URL: %d %s, events %+v; want 403 %s", f, status, body, ev, ReasonNotAllowed)
				}
				if u.hit("/files/"+f) != 0 {
					t.Errorf("the upstream was asked for %s, which the policy holds back", f)
				}
			}

			status, body, _ := get(t, base+"npm/fresh-pkg", "")
			if status != 200 {
				t.Fatalf("packument: %d %s", status, body)
			}
			var doc struct {
				Versions map[string]json.RawMessage `json:"versions"`
				DistTags map[string]string          `json:"dist-tags"`
			}
			if err := json.Unmarshal([]byte(body), &doc); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, v := range []string{"1.0.0", "2.0.0"} {
				if _, ok := doc.Versions[v]; ok {
					got = append(got, v)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.npm) {
				t.Errorf("packument versions %v, want %v", got, tc.npm)
			}
			if len(tc.npm) > 0 && doc.DistTags["latest"] != tc.npm[len(tc.npm)-1] {
				t.Errorf("dist-tags %v, want latest %s", doc.DistTags, tc.npm[len(tc.npm)-1])
			}
			for _, v := range tc.npmOff {
				n := len(events())
				status, body, _ := get(t, base+"npm/-/tarball/"+v+"/fresh-pkg", "")
				ev := events()[n:]
				if status != 403 || len(ev) == 0 || ev[len(ev)-1].Reason != ReasonNotAllowed {
					t.Errorf("fresh-pkg@%s by URL: %d %s, events %+v; want 403 %s", v, status, body, ev, ReasonNotAllowed)
				}
				if u.hit("/tarballs/fresh-pkg-"+v+".tgz") != 0 {
					t.Errorf("the upstream was asked for fresh-pkg@%s, which the hold keeps back", v)
				}
			}
		})
	}
}
