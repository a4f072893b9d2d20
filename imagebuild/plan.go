// Package imagebuild builds images from a build file: a Dockerfile or
// Moat's declarative image file. Both are read into one Plan (a base and
// ordered steps); the builder runs a Plan's untrusted steps (RUN, package
// installs) in native-tier sandboxes through a StepRunner, never on the
// host, and publishes the resulting tree in the image store.
package imagebuild

import (
	"context"
	"io"
)

// Plan is one build, whichever file it was read from.
type Plan struct {
	// File is the build file's path as given, for messages.
	File string
	// Context is the directory COPY/ADD sources are relative to.
	Context string
	// Base is what the first step starts from.
	Base Base
	// Steps run in order on a tree that starts as Base.
	Steps []Step
	// Pins are the packages the build file pins (pip requirements with
	// hashes, npm lockfile entries), recorded in the lockfile beside the
	// Debian packages found in the tree after the build.
	Pins []Pin
	// Notes are things the reader accepted but does not carry out
	// (a Dockerfile's LABEL, EXPOSE, ...); the builder prints them.
	Notes []string
}

// Base is where a build starts: exactly one of Image and Debian is set.
type Base struct {
	// Image names an image in the store (built or imported): the build
	// starts from a copy of its tree and its config (Env, WorkingDir,
	// Entrypoint, Cmd, User).
	Image string
	// Debian is a suite ("bookworm") bootstrapped with mmdebstrap: the
	// essential set, and apt when Download is not empty. Download are
	// fetched from Debian's signed archive into the tree's apt cache but
	// not installed (image.Pending.Bootstrap): a RUN step installs them
	// in a sandbox with no network, so no maintainer script of theirs
	// runs on the host.
	Debian   string
	Download []string
	// Line is the build file line that names the base (1-based; 0 when
	// unknown), and Text how it reads there ("FROM python",
	// "base.image: python"): both go into errors about the base.
	Line int
	Text string
}

// Op is what a Step does.
type Op string

const (
	OpRun        Op = "RUN"        // Argv in a sandbox on the tree
	OpCopy       Op = "COPY"       // Sources (relative to Context) to Dest
	OpEnv        Op = "ENV"        // Key=Value into the image's Env
	OpWorkdir    Op = "WORKDIR"    // Dir: created, becomes the working dir
	OpUser       Op = "USER"       // User for later RUN steps and the config
	OpEntrypoint Op = "ENTRYPOINT" // Argv
	OpCmd        Op = "CMD"        // Argv
)

// Step is one instruction of a Plan. Which fields matter depends on Op.
type Step struct {
	Op Op
	// Line is the build file line the step came from (1-based), and Text
	// the instruction as written: both go into progress and errors.
	Line int
	Text string

	// RUN, ENTRYPOINT, CMD: the argv (a shell form is already
	// ["/bin/sh", "-c", text]).
	Argv []string
	// RUN: hosts the step may reach through the egress proxy (the
	// indexes the build file names); empty: no network.
	Hosts []string
	// COPY (and ADD of local files): sources relative to Context, the
	// destination inside the tree, and an optional owner ("0", "1000",
	// "root", "sandbox").
	Sources []string
	Dest    string
	Chown   string
	// ENV: one variable.
	Key, Value string
	// WORKDIR: an absolute path inside the tree.
	Dir string
	// USER: the user name or id as written.
	User string
	// RUN: build-time variables (a Dockerfile's ARG, "K=V") set in the
	// step's environment but not recorded in the image.
	BuildEnv []string
	// RUN: programs the step calls by name (apt-get, python3, npm),
	// looked for on the step's PATH in the tree before it runs, and what
	// to do when one is missing: a base image without them then fails
	// naming the program and the fix, instead of the step failing with
	// "sh: apt-get: not found" from inside the sandbox. Declarative
	// image files set them for their install steps; a Dockerfile's RUN
	// has none.
	Needs    []string
	NeedsFix string
	// ENV, WORKDIR: Value or Dir still holds ${NAME} references to
	// variables the build file does not define (the base image's, as in
	// ENV PATH=/app/bin:$PATH); the builder expands them against the
	// image's environment at that step (Expand).
	Expand bool
}

// Pin is one package version a build file fixes, for the lockfile.
type Pin struct {
	// Manager is "pip" or "npm".
	Manager string
	Name    string
	Version string
	// Hash is the integrity the build file gives (pip's
	// "sha256:<hex>", npm's "sha512-<base64>").
	Hash string
}

// StepRunner runs one RUN step in a sandbox whose root is the host
// directory root, read-write (the engine's RunBuildStep, native tier).
// It returns the step's exit status; the error is for failures to run it.
type StepRunner interface {
	RunStep(ctx context.Context, root string, s RunStep) (exitCode int, err error)
}

// RunStep is what the builder asks a StepRunner to run.
type RunStep struct {
	Argv  []string
	Env   []string // complete environment
	Dir   string   // absolute, exists in the tree
	UID   int      // 0 or 1000
	Hosts []string // egress allowlist; empty: no network
	// AllowAddresses grants reserved addresses to Hosts (Options).
	AllowAddresses []string
	Stdout, Stderr io.Writer
}
