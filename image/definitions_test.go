package image

import (
	"path/filepath"
	"testing"
)

// TestDefinitionsLocked: every built-in image has a committed lockfile
// (images/NAME.lock) for its suite that records every package the
// definition names, so `moat image build --locked NAME` can pass and a
// package added to a definition without regenerating the lock fails here.
func TestDefinitionsLocked(t *testing.T) {
	want := []string{"python", "node", "base", "code-interpreter"}
	defs := Definitions()
	if len(defs) != len(want) {
		t.Fatalf("%d definitions, want %v", len(defs), want)
	}
	for i, d := range defs {
		t.Run(d.Name, func(t *testing.T) {
			if d.Name != want[i] {
				t.Errorf("definition %d is %q, want %q", i, d.Name, want[i])
			}
			if err := validName(d.Name); err != nil {
				t.Error(err)
			}
			lf, err := ReadLockfile(filepath.Join("..", "images"), d.Name)
			if err != nil {
				t.Fatalf("%v (make it with `moat image build --lockfile-dir images %s`)", err, d.Name)
			}
			if lf.Suite != d.Suite {
				t.Errorf("lockfile suite %q, definition %q", lf.Suite, d.Suite)
			}
			for _, p := range d.Packages {
				if lf.Packages[p] == "" {
					t.Errorf("package %s of the definition is not in images/%s.lock: regenerate the lock", p, d.Name)
				}
			}
		})
	}
}
