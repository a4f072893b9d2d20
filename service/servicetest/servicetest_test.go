package servicetest

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoProductionImport: the fakes check no key and run no sandbox, so
// no package outside tests may import them.
func TestNoProductionImport(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}}: {{join .Imports " "}}`, "github.com/moat-sandbox/moat/...").CombinedOutput()
	if err != nil {
		t.Skipf("needs the go command: go list: %v: %s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.Contains(line, "/service/servicetest") && !strings.HasPrefix(line, "github.com/moat-sandbox/moat/service/servicetest:") {
			t.Errorf("a production package imports servicetest: %s", line)
		}
	}
}
