package e2b

import (
	"fmt"
	"net/http"
)

// The E2B JS SDK names itself on every control-plane call (headers lang:
// js, package_version: 2.50.0). Moat uses it for one thing only: telling
// a value a release sends by default from one its caller chose.

// jsSDKBefore reports whether r comes from the E2B JS SDK at a release
// before major.minor; false when it does not say (another client, the
// Python SDK, curl).
func jsSDKBefore(r *http.Request, major, minor int) bool {
	if r.Header.Get("lang") != "js" {
		return false
	}
	var ma, mi, pa int
	if n, _ := fmt.Sscanf(r.Header.Get("package_version"), "%d.%d.%d", &ma, &mi, &pa); n < 2 {
		return false
	}
	return ma < major || ma == major && mi < minor
}

// pauseMemoryByDefault reports whether a pause's memory: true is the
// SDK's default rather than its caller's choice: e2b JS before 2.51 sends
// memory: keepMemory ?? true on every pause; 2.51 sends it only when the
// caller passes keepMemory.
func pauseMemoryByDefault(r *http.Request) bool {
	return jsSDKBefore(r, 2, 51)
}

// pauseNotice is what a pause answers (NoticeHeader) when it drops the
// memory an older SDK asked for by default.
const pauseNotice = "memory: this SDK release asks for a memory snapshot on every pause (keepMemory defaults to true before e2b 2.51); Moat pauses filesystem-only: the files are kept, the processes and memory are not, and connect resumes the sandbox with its files"
