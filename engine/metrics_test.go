package engine

import (
	"os"
	"path/filepath"
	"testing"
)

func TestDiskBytes(t *testing.T) {
	dir := t.TempDir()
	ws := filepath.Join(dir, "ws")
	os.MkdirAll(filepath.Join(ws, "sub"), 0o755)
	os.WriteFile(filepath.Join(ws, "a"), make([]byte, 100), 0o644)
	os.WriteFile(filepath.Join(ws, "sub", "b"), make([]byte, 20), 0o644)
	outside := filepath.Join(dir, "outside")
	os.WriteFile(outside, make([]byte, 5000), 0o644)
	os.Symlink(outside, filepath.Join(ws, "out"))  // not followed
	os.Symlink("/", filepath.Join(ws, "rootlink")) // not descended
	link := filepath.Join(dir, "link")
	os.Symlink(ws, link)
	tests := []struct {
		name string
		dir  string
		max  int
		want int64
	}{
		{"files below, links not followed", ws, 100, 120},
		{"through a link to the workspace", link, 100, 120},
		{"bounded by the entry limit", ws, 2, 100}, // ".", then "a"
		{"missing", filepath.Join(dir, "nope"), 100, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := diskBytes(tc.dir, tc.max); got != tc.want {
				t.Errorf("diskBytes = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestProcsRSS(t *testing.T) {
	tests := []struct {
		name string
		pids []int
		some bool
	}{
		{"this process", []int{os.Getpid()}, true},
		{"gone", []int{1 << 30}, false},
		{"none", nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := ProcsRSS(tc.pids); (got > 0) != tc.some {
				t.Errorf("ProcsRSS(%v) = %d", tc.pids, got)
			}
		})
	}
}
