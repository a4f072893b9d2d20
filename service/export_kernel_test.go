package service

import "time"

// SetKernelGrace sets how long a cell has after SIGINT, for tests; it
// returns a function that restores the old value.
func SetKernelGrace(d time.Duration) (restore func()) {
	old := kernelGrace
	kernelGrace = d
	return func() { kernelGrace = old }
}
