package seccomp

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

// renderTable is the golden file's format: one line per syscall number, so
// a policy change shows up in review as a diff of decisions.
func renderTable(p *Policy, filter []unix.SockFilter) []byte {
	var b bytes.Buffer
	x32, x32Errno := p.x32Decision()
	fmt.Fprintf(&b, "# Moat native tier seccomp policy (seccomp.Default), arch %s.\n", p.Arch)
	fmt.Fprintf(&b, "# Regenerate: go test ./seccomp/ -run TestGolden -update\n")
	fmt.Fprintf(&b, "# compiled: %d BPF instructions\n", len(filter))
	fmt.Fprintf(&b, "# default: %s; x32 ABI (nr|0x40000000): %s; other arch (i386 int 0x80): kill-process\n",
		decisionString(p.Default, p.DefaultErrno), decisionString(x32, x32Errno))
	t := Table(p)
	fmt.Fprintf(&b, "# %v\n", Summarize(t))
	for _, e := range t {
		name := e.Name
		if name == "" {
			name = "-"
		}
		fmt.Fprintf(&b, "%3d %-24s %s\n", e.Nr, name, e.Decision())
	}
	return b.Bytes()
}

func TestGolden(t *testing.T) {
	p := Default()
	filter := mustCompile(t, p)
	got := renderTable(p, filter)
	path := filepath.Join("testdata", "policy_amd64.golden")
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./seccomp/ -run TestGolden -update)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s is stale: review the policy change, then run go test ./seccomp/ -run TestGolden -update\n%s", path, lineDiff(want, got))
	}
}

// TestTableMatchesFilter checks each unconditional table row against the
// compiled program, so the golden file describes what the kernel will do.
func TestTableMatchesFilter(t *testing.T) {
	p := Default()
	filter := mustCompile(t, p)
	for _, e := range Table(p) {
		if e.Conditional() {
			continue
		}
		got, errno, err := Evaluate(filter, unix.AUDIT_ARCH_X86_64, e.Nr, [6]uint64{})
		if err != nil {
			t.Fatal(err)
		}
		if got != e.Action || errno != e.Errno {
			t.Errorf("%d %s: table says %s, filter says %s", e.Nr, e.Name, e.Decision(), decisionString(got, errno))
		}
	}
}

func lineDiff(want, got []byte) string {
	w, g := bytes.Split(want, []byte("\n")), bytes.Split(got, []byte("\n"))
	var b bytes.Buffer
	for i := 0; i < max(len(w), len(g)); i++ {
		var wl, gl []byte
		if i < len(w) {
			wl = w[i]
		}
		if i < len(g) {
			gl = g[i]
		}
		if !bytes.Equal(wl, gl) {
			fmt.Fprintf(&b, "-%s\n+%s\n", wl, gl)
		}
	}
	return b.String()
}
