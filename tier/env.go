package tier

import (
	"sort"
	"strings"
)

// Environment is a program's whole environment: a default PATH and LANG,
// the image's variables over them, HOME=/workspace and USER=sandbox, then
// each layer in order (the manifest's env, then e.g. the egress proxy's
// variables). Nothing comes from the host. Sorted by name.
//
// It is the one rule the engine applies to every command and the
// conformance suite reproduces, so it lives below both.
func Environment(imageEnv []string, layers ...map[string]string) []string {
	vars := map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
	for _, kv := range imageEnv {
		if k, v, ok := strings.Cut(kv, "="); ok {
			vars[k] = v
		}
	}
	vars["HOME"] = "/workspace"
	vars["USER"] = "sandbox"
	for _, env := range layers {
		for k, v := range env {
			vars[k] = v
		}
	}
	out := make([]string, 0, len(vars))
	for k, v := range vars {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
