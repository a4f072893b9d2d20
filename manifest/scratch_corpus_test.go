package manifest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestScratchCorpus(t *testing.T) {
	dir := os.Getenv("CORPUS")
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	type r struct {
		name string
		d    time.Duration
		n    int
	}
	var worst r
	for _, f := range files {
		b, _ := os.ReadFile(f)
		lines := strings.SplitN(string(b), "\n", 3)
		if len(lines) < 3 {
			continue
		}
		s := strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")")
		data, err := strconv.Unquote(s)
		if err != nil {
			t.Logf("%s: %v", f, err)
			continue
		}
		start := time.Now()
		for _, name := range []string{"m.yaml", "m.json", ""} {
			m, err := Parse([]byte(data), name)
			if err == nil {
				m.Canonical()
			}
		}
		if d := time.Since(start); d > worst.d {
			worst = r{f, d, len(data)}
		}
	}
	t.Logf("%d files, worst %v", len(files), worst)
}
