package manifest

import (
	"strings"
)

// ParseInputFlag parses an --input value, SRC[:DST]. It splits at the last
// colon, so a SRC containing ':' needs an explicit DST ("a:b:b") and a DST
// cannot contain ':'. DST defaults to the base name of SRC. SRC is left
// relative; ResolveInputs anchors it (the CLI passes the working directory).
// Errors are *FieldError with Field "--input".
func ParseInputFlag(s string) (Input, error) {
	const fix = "; write SRC or SRC:DST, e.g. ./task:task"
	src, dst := s, ""
	if i := strings.LastIndexByte(s, ':'); i >= 0 {
		src, dst = s[:i], s[i+1:]
		if dst == "" {
			return Input{}, newFieldError("--input", s, "has an empty DST after ':'"+fix)
		}
	}
	if src == "" {
		return Input{}, newFieldError("--input", s, "has an empty SRC"+fix)
	}
	if dst == "" {
		dst = defaultDst(src)
	}
	if problem := dstProblem(dst); problem != "" {
		return Input{}, newFieldError("--input", s, "DST "+problem)
	}
	return Input{Src: src, Dst: dst}, nil
}

// ParseEnvFlag parses an --env value, K=V, splitting at the first '='.
// A bare K is refused: the host environment is never inherited, not even
// one variable at a time by accident. Errors are *FieldError with Field
// "--env".
func ParseEnvFlag(s string) (k, v string, err error) {
	k, v, ok := strings.Cut(s, "=")
	switch {
	case !ok:
		return "", "", newFieldError("--env", s, "has no '='; write NAME=VALUE (NAME= for an empty value)")
	case !isEnvName(k):
		return "", "", newFieldError("--env", s, "has an invalid name; names match [A-Za-z_][A-Za-z0-9_]*")
	case strings.IndexByte(v, 0) >= 0:
		return "", "", newFieldError("--env", s, "contains a NUL byte")
	}
	return k, v, nil
}

// SetTimeout sets the wall-clock timeout and, when the CPU-time limit
// equals the old timeout (its default), moves it along, so that
// `--timeout 5m` on a manifest without cpu_time behaves as if the file
// had said timeout: 5m. A CPU-time limit that differs from the timeout
// was chosen on purpose and is kept.
func (r *Resources) SetTimeout(d Duration) {
	if r.CPUTime == r.Timeout {
		r.CPUTime = d
	}
	r.Timeout = d
}
