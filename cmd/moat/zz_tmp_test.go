package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/moat-sandbox/moat/engine"
)

func TestTmpLeftoverFires(t *testing.T) {
	p := filepath.Join(engine.DefaultHome(), "runs", "deadbeefdeadbeef")
	t.Cleanup(func() { os.Remove(p) })
	watchLeftovers(t)
	os.Mkdir(p, 0o700)
}
