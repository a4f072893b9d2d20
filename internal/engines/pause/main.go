// Command pause is the first process of a pod sandbox in the container
// engine tests (internal/engines): it holds the pod's namespaces open and
// exits on SIGTERM or SIGINT. No registry is reachable from the test
// machines, so the tests build this instead of pulling registry.k8s.io/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// As PID 1 a signal without a handler is ignored, so the engine's stop
	// (SIGTERM) needs one to end the pod without waiting for SIGKILL.
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// Orphans re-parented to the pause process (a shared PID namespace)
	// are reaped by the kernel once SIGCHLD is ignored.
	signal.Ignore(syscall.SIGCHLD)
	<-sig
}
