// Package engines starts private instances of the container engines a
// cluster runs Moat under: containerd with its CRI plugin (driven by
// crictl, the kubelet's stand-in) and dockerd, each with its own root,
// state and socket in a directory of its own, and checks the host for
// what they leave behind. It backs the tests and benchmarks that run
// Moat's OCI runtime (moat-runtime) through those engines.
//
// It must never touch the host's own engine instances (/run/containerd,
// /var/lib/docker) or enable their services, and every instance it starts
// must be stoppable to zero residue: no process, mount, cgroup or network
// namespace left.
package engines
