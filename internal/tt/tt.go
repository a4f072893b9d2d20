package tt

import (
	"fmt"
	"os"
	"time"
)

var last = time.Now()
var on = os.Getenv("MOAT_TIMING") != ""

func Mark(s string) {
	if on {
		fmt.Fprintf(os.Stderr, "%d %7.2fms %s\n", os.Getpid(), float64(time.Since(last).Microseconds())/1000, s)
		last = time.Now()
	}
}
