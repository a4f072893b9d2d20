package egress

import "runtime"

func numGoroutine() int { return runtime.NumGoroutine() }
