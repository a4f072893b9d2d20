package engine

import (
	"errors"
	"fmt"
	"os"
	"path"
	"strings"

	"github.com/moat-sandbox/moat/image"
)

// workspaceDir is where every run's files are, inside the sandbox.
const workspaceDir = "/workspace"

// usageHint is how to give a command, for errors about a missing one.
const usageHint = "usage: moat run [flags] -- COMMAND [ARG...]"

// imageCommand is the argv a run executes: the caller's when it gave one
// (alone: an imported image's Entrypoint is not put in front of it, see
// RATIONALE "Image config at run time"), else the image config's
// Entrypoint followed by its Cmd, as `docker run IMAGE` runs them.
func imageCommand(img *image.Image, argv []string) ([]string, error) {
	if len(argv) > 0 {
		if argv[0] == "" {
			return nil, fmt.Errorf("%w: no command given: the command name is empty (%s)", ErrUsage, usageHint)
		}
		return argv, nil
	}
	cmd := append(append([]string{}, img.Entrypoint...), img.Cmd...)
	if len(cmd) == 0 {
		return nil, fmt.Errorf("%w: no command given, and image %q has no Entrypoint or Cmd to run instead: give a command (%s)", ErrUsage, img.Name, usageHint)
	}
	if cmd[0] == "" {
		return nil, fmt.Errorf("%w: no command given, and image %q's Entrypoint/Cmd %q starts with an empty name: give a command (%s)", ErrUsage, img.Name, cmd, usageHint)
	}
	return cmd, nil
}

// workDir is the directory a run starts in inside the sandbox: the image
// config's WorkingDir when it has one, else /workspace. The directory
// must already exist, since nothing below / but the workspace and /tmp is
// writable: a WorkingDir under /workspace must exist in wsDir (the host
// path of the workspace, after the inputs were copied in), any other one
// in the image's root. Both are checked through os.Root, so a symlink in
// either cannot make the host look outside them; the sandbox itself
// resolves the path again within its own root, where nothing of the host
// is visible.
func workDir(img *image.Image, wsDir string) (string, error) {
	wd := img.WorkingDir
	if wd == "" {
		return workspaceDir, nil
	}
	if !path.IsAbs(wd) || strings.IndexByte(wd, 0) >= 0 {
		return "", fmt.Errorf("%w: image %q: its config's WorkingDir %q is not an absolute path; import the image again from a config whose WorkingDir is absolute (or empty for %s)", ErrUsage, img.Name, wd, workspaceDir)
	}
	clean := path.Clean(wd)
	base, rel, where := img.Root, strings.TrimPrefix(clean, "/"), "the image"
	if clean == workspaceDir || strings.HasPrefix(clean, workspaceDir+"/") {
		base, rel, where = wsDir, strings.TrimPrefix(strings.TrimPrefix(clean, workspaceDir), "/"), "the workspace after the inputs were copied in"
	}
	if rel == "" {
		return clean, nil
	}
	r, err := os.OpenRoot(base)
	if err != nil {
		return "", fmt.Errorf("image %q: check WorkingDir %s: %w", img.Name, clean, err)
	}
	defer r.Close()
	fi, err := r.Stat(rel)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return "", fmt.Errorf("%w: image %q: its config's WorkingDir %s does not exist in %s; add an input that makes it, or import an image whose WorkingDir exists", ErrUsage, img.Name, clean, where)
	case err != nil:
		return "", fmt.Errorf("%w: image %q: its config's WorkingDir %s cannot be used: %v", ErrUsage, img.Name, clean, err)
	case !fi.IsDir():
		return "", fmt.Errorf("%w: image %q: its config's WorkingDir %s is not a directory in %s", ErrUsage, img.Name, clean, where)
	}
	return clean, nil
}
