// Package workspace copies inputs into a run's /workspace, diffs it against
// the state right after copy-in, and copies changed files back out to the
// host. It also gives the API's file calls safe access to a live sandbox's
// workspace (Files), and reads a manifest's inputs as files for a run on a
// server (InputFiles), under the rules of copy-in.
//
// After the program has run, everything in the workspace is hostile: file
// names, types, sizes and symlinks were chosen by the sandboxed code, and a
// live sandbox may swap a directory for a symlink between two of our system
// calls (runc CVE-2024-45310 is the classic copy-out race). So this package
// must never follow a symlink inside the workspace, never open a path in the
// workspace by string concatenation with a host path, never write outside
// the output directory, never copy a device, FIFO or socket, and never read
// more than its limits allow.
//
// Reading the workspace goes component by component with openat(2) and
// O_NOFOLLOW (os.Root would still follow symlinks that stay inside the root,
// which is enough for containment but not for "the diff describes exactly
// what was copied"). Writing goes through os.Root with O_CREAT|O_EXCL.
package workspace

import (
	"errors"
	"fmt"

	"github.com/moat-sandbox/moat/result"
)

// Owner is the host uid/gid that files in the workspace get (the sandbox
// user's host id).
type Owner struct{ UID, GID int }

// Limits bounds a copy into or out of the workspace. A zero field means the
// manifest default (256 MiB, 10000 entries, 64 MiB per file), never
// "unlimited": pass math.MaxInt64 / math.MaxInt to lift a bound on purpose.
type Limits struct {
	// Bytes caps the total bytes of regular files copied (workspace.size).
	Bytes int64
	// Files caps the number of entries created: files, directories and
	// symlinks (workspace.files).
	Files int
	// FileBytes caps one regular file (resources.file_size). CopyOut only:
	// inputs are bounded by Bytes.
	FileBytes int64
}

// The defaults mirror the manifest's.
const (
	DefaultBytes     int64 = 256 << 20
	DefaultFiles           = 10000
	DefaultFileBytes int64 = 64 << 20
)

func (l Limits) withDefaults() Limits {
	if l.Bytes <= 0 {
		l.Bytes = DefaultBytes
	}
	if l.Files <= 0 {
		l.Files = DefaultFiles
	}
	if l.FileBytes <= 0 {
		l.FileBytes = DefaultFileBytes
	}
	return l
}

// LimitError reports that a limit was hit. CopyIn returns it as the error;
// Diff returns it (possibly several, joined) next to the partial diff.
// Callers branch with errors.As and record Violation in the Result.
type LimitError struct {
	// Field is the manifest field or limit name, e.g. "workspace.size" or
	// "DiffLimits.MaxEntries".
	Field string
	// Limit is the value of the limit that was hit.
	Limit int64
	// Kind is the result.Violation kind: "disk", "files", "file-size", "diff".
	Kind string
	// Detail says what happened and how to fix it.
	Detail string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("%s (limit %s=%d)", e.Detail, e.Field, e.Limit)
}

// Violation returns e in the Result's form.
func (e *LimitError) Violation() result.Violation {
	return result.Violation{Kind: e.Kind, Detail: e.Detail, Limit: fmt.Sprintf("%s=%d", e.Field, e.Limit)}
}

// Violations returns the Violation of every LimitError in err's tree (it
// walks errors.Join and %w wrapping), so the engine can record all of them.
func Violations(err error) []result.Violation {
	var out []result.Violation
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		if le, ok := err.(*LimitError); ok {
			out = append(out, le.Violation())
			return
		}
		switch u := err.(type) {
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// ErrOutDirNotEmpty is returned by CopyOut when outDir already has entries:
// copy-out never merges into, or overwrites, existing host files.
var ErrOutDirNotEmpty = errors.New("output directory is not empty")

// ErrWorkspaceNotEmpty is returned by CopyIn when the workspace already has
// entries: the snapshot must describe every entry, and a reused workspace
// could hold files planted by an earlier run.
var ErrWorkspaceNotEmpty = errors.New("workspace is not empty")
