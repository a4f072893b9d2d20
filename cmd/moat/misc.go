package main

import (
	"context"
	"fmt"
	"sort"
	"strings"

	"github.com/moat-sandbox/moat/bench"
	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/tier/gvisor"
	"github.com/moat-sandbox/moat/tier/microvm"
	"github.com/moat-sandbox/moat/tier/native"
	"github.com/moat-sandbox/moat/tier/wasm"
)

func cmdDoctor(args []string) int {
	fs := newFlags("doctor", "Usage: moat doctor\n\nExplains what this host supports, which tiers can run here and why not,\nand which images are built. Exit status 0 when the native tier is usable.\n")
	if c := parse(fs, args); c >= 0 {
		return c
	}
	cmdVersion(nil)
	fmt.Println("tiers:")
	code := 0
	if _, err := native.New(native.Options{}); err != nil {
		fmt.Printf("  native  unavailable: %v\n", err)
		code = 1
	} else {
		fmt.Println("  native  ready")
		if ms, err := bench.MigrationCost(); err == nil && ms > 0 {
			fmt.Printf("  native  cgroup v1: each run's init moves its main thread into the run's cgroup itself, which\n")
			fmt.Printf("          skips the RCU grace period (%.2f ms here) that a move by pid waits for when cold\n", ms)
		}
	}
	if g, err := gvisor.New(gvisor.Options{}); err != nil {
		fmt.Printf("  gvisor  unavailable: %v\n", err)
	} else {
		fmt.Printf("  gvisor  ready: %s, %s\n", g.Runsc(), g.Version())
	}
	if v, err := microvm.New(microvm.Options{Home: engine.DefaultHome(), Agent: "/proc/self/exe"}); err != nil {
		fmt.Printf("  microvm unavailable: %v\n", err)
	} else if acc, err := v.Accel(context.Background()); err != nil {
		fmt.Printf("  microvm unavailable: accelerator check: %v\n", err)
	} else {
		fmt.Printf("  microvm ready: %s, guest kernel %s, accelerator %s\n", v.VMM(), v.KernelVersion(), acc.Accel)
		fmt.Printf("          %s\n", strings.ReplaceAll(acc.Reason, "\n", " "))
		fmt.Printf("          %s\n", v.Jail())
	}
	if w, err := wasm.New(wasm.Options{}); err != nil {
		fmt.Printf("  wasm    unavailable: %v\n", err)
	} else {
		g := w.Guests()
		fmt.Printf("  wasm    ready: %s, guests python sha256:%.12s, js sha256:%.12s\n", w.Version(), g["python"], g["js"])
		w.Close()
	}
	e, err := engine.New(engine.Options{})
	if err != nil {
		return fail(err)
	}
	fmt.Printf("state: %s\n", e.Home())
	fmt.Printf("inside sandboxes: %s\n", e.Guest())
	imgs, _ := e.Images().List()
	var names []string
	for _, img := range imgs {
		if img.Current {
			names = append(names, img.Name+" "+img.Digest)
		}
	}
	sort.Strings(names)
	if len(names) == 0 {
		fmt.Println("images: none built (moat run builds python on first use, or: moat image build python)")
	} else {
		fmt.Printf("images: %s\n", strings.Join(names, ", "))
	}
	return code
}
