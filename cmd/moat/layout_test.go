package main

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// TestReadmeLayout: the README's Layout table names every Go package of
// the module, and names no package that does not exist, so that "where
// does X happen?" stays answerable from it. A row whose name ends in
// "/..." covers the packages below it.
func TestReadmeLayout(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, table, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no '## Layout' section")
	}
	table, _, _ = strings.Cut(table, "\n## ")
	// The first column of each row: `pkg`.
	row := regexp.MustCompile("(?m)^\\| `([^`]+)` \\|")
	var listed []string
	for _, m := range row.FindAllStringSubmatch(table, -1) {
		listed = append(listed, m[1])
	}
	if len(listed) == 0 {
		t.Fatal("the Layout table has no rows of the form | `package` | job |")
	}

	pkgs := map[string]bool{}
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(p, ".go") && !strings.HasSuffix(p, "_test.go") {
			rel, _ := filepath.Rel(root, filepath.Dir(p))
			pkgs[filepath.ToSlash(rel)] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	covers := func(entry, pkg string) bool {
		if prefix, ok := strings.CutSuffix(entry, "/..."); ok {
			return pkg == prefix || strings.HasPrefix(pkg, prefix+"/")
		}
		return entry == pkg
	}

	var missing []string
	for pkg := range pkgs {
		found := false
		for _, e := range listed {
			found = found || covers(e, pkg)
		}
		if !found {
			missing = append(missing, pkg)
		}
	}
	sort.Strings(missing)
	for _, pkg := range missing {
		t.Errorf("package %s has no row in README.md's Layout table: add | `%s` | its one job |", pkg, pkg)
	}
	for _, e := range listed {
		found := false
		for pkg := range pkgs {
			found = found || covers(e, pkg)
		}
		if !found {
			t.Errorf("README.md's Layout table lists `%s`, which is no package of this module: remove the row or correct the name", e)
		}
	}
}
