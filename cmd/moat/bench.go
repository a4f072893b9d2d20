package main

import (
	"fmt"
	"os"
)

func cmdBench(args []string) int {
	fmt.Fprintln(os.Stderr, "moat bench: not built yet")
	return exitMoat
}
