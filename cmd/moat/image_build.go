package main

// moat image build NAME -f FILE: an image from a Dockerfile or a
// declarative image file (package imagebuild), its RUN steps in native
// sandboxes through the engine.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/moat-sandbox/moat/engine"
	"github.com/moat-sandbox/moat/image"
	"github.com/moat-sandbox/moat/imagebuild"
)

// buildArgs is the repeatable --build-arg K=V flag.
type buildArgs map[string]string

func (b buildArgs) String() string {
	keys := make([]string, 0, len(b))
	for k := range b {
		keys = append(keys, k+"="+b[k])
	}
	sort.Strings(keys)
	return strings.Join(keys, ",")
}

func (b buildArgs) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("--build-arg %q: want NAME=value", s)
	}
	b[k] = v
	return nil
}

// buildFileOptions are the flags of `moat image build NAME -f FILE`.
type buildFileOptions struct {
	file, context string
	args          map[string]string
	locked        bool
	lockfile      string
	// allowAddresses and caFile are the operator's network settings
	// for RUN steps (imagebuild.Options).
	allowAddresses []string
	caFile         string
}

// imageBuildFile builds name from the build file in o.
func imageBuildFile(ctx context.Context, e *engine.Engine, name string, o buildFileOptions) int {
	if _, err := os.Stat(o.file); err != nil {
		return fail(usageError{fmt.Errorf("image build -f %s: %w", o.file, err)})
	}
	contextDir := o.context
	if contextDir == "" {
		contextDir = filepath.Dir(o.file)
	}
	if fi, err := os.Stat(contextDir); err != nil || !fi.IsDir() {
		return fail(usageError{fmt.Errorf("image build --context %s: not a directory (%v)", contextDir, err)})
	}
	kind, err := buildFileKind(o.file)
	if err != nil {
		return fail(usageError{err})
	}
	var plan *imagebuild.Plan
	switch kind {
	case "dockerfile":
		plan, err = imagebuild.ReadDockerfile(o.file, contextDir, o.args)
	default:
		plan, err = imagebuild.ReadImageFile(o.file, o.args)
		if err == nil && o.context != "" {
			plan.Context = contextDir
		}
	}
	if err != nil {
		return fail(usageError{err})
	}
	// The lockfile lives beside the build file unless --lockfile says
	// where; --locked compares the build with it instead of writing it.
	lockPath := o.lockfile
	if lockPath == "" {
		lockPath = imagebuild.LockPath(o.file)
	}
	var locked *imagebuild.Lock
	if o.locked {
		if locked, err = imagebuild.ReadLock(lockPath); err != nil {
			return fail(usageError{fmt.Errorf("image build --locked: %w", err)})
		}
	}
	progress := liveWriter(os.Stderr)
	defer progress.Flush()
	img, err := imagebuild.Build(ctx, e.Images(), name, plan, imagebuild.Options{
		Runner:   stepRunner{e},
		Progress: progress,
		Terminal: isTerminal(os.Stderr),
		Source:   kind + ":" + o.file,
		LockFile: lockPath,
		Locked:   locked,
		// The operator's network settings for RUN steps.
		AllowAddresses: o.allowAddresses,
		CAFile:         o.caFile,
	})
	// The build file's own failures (a bad or unknown base, a RUN step
	// that exited non-zero) are the user's to fix: exit 2, as for an
	// invalid manifest; 125 stays for Moat's own failures.
	var lockDiff *imagebuild.LockDiffError
	if errors.As(err, &lockDiff) {
		// --locked: the build differs from its lockfile, a verdict (as
		// diff's exit 1), neither the file's fault nor Moat's.
		fail(err)
		return exitDiffers
	}
	var stepErr *imagebuild.StepError
	if errors.Is(err, image.ErrBadImage) || errors.Is(err, image.ErrUnknown) || errors.Is(err, image.ErrNotBuilt) || errors.As(err, &stepErr) {
		return fail(usageError{err})
	}
	if err != nil {
		return fail(err)
	}
	fmt.Printf("%s %s (from %s) at %s\n", img.Name, img.Digest, img.Source, img.Root)
	return 0
}

// buildFileKind tells a Dockerfile from a declarative image file: by
// name (Dockerfile, Containerfile, *.Dockerfile; *.yaml, *.yml), else by
// the first instruction (FROM, or ARG before it).
func buildFileKind(path string) (string, error) {
	base := filepath.Base(path)
	lower := strings.ToLower(base)
	switch {
	case lower == "dockerfile" || lower == "containerfile" ||
		strings.HasSuffix(lower, ".dockerfile") || strings.HasSuffix(lower, ".containerfile") ||
		strings.HasPrefix(lower, "dockerfile.") || strings.HasPrefix(lower, "containerfile."):
		return "dockerfile", nil
	case strings.HasSuffix(lower, ".yaml") || strings.HasSuffix(lower, ".yml"):
		return "imagefile", nil
	}
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("image build -f %s: %w", path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 64<<10))
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		kw, _, _ := strings.Cut(l, " ")
		if kw = strings.ToUpper(kw); kw == "FROM" || kw == "ARG" {
			return "dockerfile", nil
		}
		break
	}
	return "", fmt.Errorf("image build -f %s: not a Dockerfile (it does not start with FROM) nor a declarative image file; name it Dockerfile, NAME.Dockerfile or NAME.yaml", path)
}

// stepRunner runs a build's RUN steps through the engine: each in a
// native-tier sandbox whose root is the tree being built.
type stepRunner struct{ e *engine.Engine }

func (r stepRunner) RunStep(ctx context.Context, root string, s imagebuild.RunStep) (int, error) {
	return r.e.RunBuildStep(ctx, root, engine.BuildStep{
		Argv:           s.Argv,
		Env:            s.Env,
		Dir:            s.Dir,
		UID:            s.UID,
		Hosts:          s.Hosts,
		AllowAddresses: s.AllowAddresses,
		Stdout:         s.Stdout,
		Stderr:         s.Stderr,
	})
}
