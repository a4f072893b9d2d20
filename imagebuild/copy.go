package imagebuild

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// copyTree copies the stored image tree src to dst (which must not
// exist): directories, regular files and symlinks with their modes and
// owners; hard links become copies and device nodes, FIFOs and sockets
// are skipped (a stored image has none). Symlinks are copied, never
// followed: both sides are opened through an os.Root.
func copyTree(src, dst string) error {
	if err := os.Mkdir(dst, 0o755); err != nil {
		return err
	}
	from, err := os.OpenRoot(src)
	if err != nil {
		return err
	}
	defer from.Close()
	to, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer to.Close()
	return fs.WalkDir(from.FS(), ".", func(rel string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := from.Lstat(rel)
		if err != nil {
			return err
		}
		return copyEntry(from, rel, fi, to, rel, owner(fi))
	})
}

// owner returns a file's uid and gid.
func owner(fi fs.FileInfo) [2]int {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return [2]int{int(st.Uid), int(st.Gid)}
	}
	return [2]int{0, 0}
}

// copyEntry copies one entry (not a directory's contents) from
// from/srcRel to to/dstRel, owned by own. An existing non-directory at
// the destination is replaced (the link itself, never what it points
// at); an existing directory is kept and given the source's mode.
func copyEntry(from *os.Root, srcRel string, fi fs.FileInfo, to *os.Root, dstRel string, own [2]int) error {
	mode := fi.Mode()
	perm := mode.Perm() | mode&(os.ModeSticky|os.ModeSetuid|os.ModeSetgid)
	if dstRel == "." {
		if err := to.Chmod(".", perm); err != nil {
			return err
		}
		return to.Lchown(".", own[0], own[1])
	}
	existing, err := to.Lstat(dstRel)
	switch {
	case err == nil && existing.IsDir() && mode.IsDir():
		// merge into it
	case err == nil:
		if err := to.RemoveAll(dstRel); err != nil {
			return fmt.Errorf("replace %s: %w", dstRel, err)
		}
	case !errors.Is(err, fs.ErrNotExist):
		return err
	}
	switch {
	case mode.IsDir():
		if err := to.Mkdir(dstRel, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	case mode.IsRegular():
		in, err := from.Open(srcRel)
		if err != nil {
			return err
		}
		defer in.Close()
		// O_EXCL after the removal above: the name is ours, not a link
		// an earlier step left to redirect the write.
		out, err := to.OpenFile(dstRel, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return fmt.Errorf("copy %s: %w", srcRel, err)
		}
		if err := out.Close(); err != nil {
			return err
		}
	case mode&fs.ModeSymlink != 0:
		target, err := from.Readlink(srcRel)
		if err != nil {
			return err
		}
		if err := to.Symlink(target, dstRel); err != nil {
			return err
		}
		return to.Lchown(dstRel, own[0], own[1])
	default:
		return nil // device, FIFO, socket: no place in an image
	}
	// Owner before mode: chown clears setuid bits (which finalize strips
	// anyway; the order keeps the copy faithful until then).
	if err := to.Lchown(dstRel, own[0], own[1]); err != nil {
		return err
	}
	return to.Chmod(dstRel, perm)
}

// copyIn carries out one COPY: every source (a path or pattern relative
// to contextDir; sources must stay inside it, symlinks included) to dest
// (absolute, in the tree at treeDir) owned by uid (0 or 1000, and the
// same gid). As in Docker: a directory source copies its contents; a
// file goes to dest itself unless dest ends in / or is a directory, or
// there are several sources, when it goes into dest under its own name.
func copyIn(contextDir string, sources []string, treeDir, dest string, uid int, skip map[string]bool) error {
	ctxRoot, err := os.OpenRoot(contextDir)
	if err != nil {
		return fmt.Errorf("build context: %w", err)
	}
	defer ctxRoot.Close()
	tree, err := os.OpenRoot(treeDir)
	if err != nil {
		return err
	}
	defer tree.Close()
	var rels []string
	for _, src := range sources {
		pattern := strings.TrimPrefix(path.Clean("/"+filepath.ToSlash(src)), "/")
		if pattern == "" {
			pattern = "."
		}
		if strings.ContainsAny(pattern, "*?[") {
			m, err := fs.Glob(ctxRoot.FS(), pattern)
			if err != nil {
				return fmt.Errorf("%s: %w", src, err)
			}
			if len(m) == 0 {
				return fmt.Errorf("%s: no file in the build context %s matches", src, contextDir)
			}
			for _, rel := range m {
				if !skipped(contextDir, rel, skip) {
					rels = append(rels, rel)
				}
			}
			continue
		}
		rels = append(rels, pattern)
	}
	own := [2]int{uid, uid}
	destRel := strings.TrimPrefix(path.Clean(dest), "/")
	if destRel == "" {
		destRel = "."
	}
	intoDir := strings.HasSuffix(dest, "/") || len(rels) > 1
	if fi, err := tree.Stat(destRel); err == nil && fi.IsDir() {
		intoDir = true
	}
	for _, rel := range rels {
		// Stat follows a symlink named as a source, as Docker does, but
		// the context root refuses one that leads outside the context.
		fi, err := ctxRoot.Stat(rel)
		if err != nil {
			return fmt.Errorf("source %s: %w (sources are paths inside the build context %s)", rel, err, contextDir)
		}
		if fi.IsDir() {
			if err := mkdirAllIn(tree, destRel); err != nil {
				return err
			}
			err := fs.WalkDir(ctxRoot.FS(), rel, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				sub, _ := filepath.Rel(rel, p)
				target := path.Join(destRel, filepath.ToSlash(sub))
				if sub == "." {
					return nil // dest itself: an existing dir keeps its mode
				}
				if skipped(contextDir, p, skip) {
					return nil
				}
				fi, err := ctxRoot.Lstat(p)
				if err != nil {
					return err
				}
				return copyEntry(ctxRoot, p, fi, tree, target, own)
			})
			if err != nil {
				return fmt.Errorf("copy %s to %s: %w", rel, dest, err)
			}
			continue
		}
		target := destRel
		if intoDir {
			if err := mkdirAllIn(tree, destRel); err != nil {
				return err
			}
			target = path.Join(destRel, path.Base(rel))
		} else if err := mkdirAllIn(tree, path.Dir(destRel)); err != nil {
			return err
		}
		if err := copyEntry(ctxRoot, rel, fi, tree, target, own); err != nil {
			return fmt.Errorf("copy %s to %s: %w", rel, dest, err)
		}
	}
	return nil
}

// skipped reports whether the context entry rel is one of skip's host
// paths.
func skipped(contextDir, rel string, skip map[string]bool) bool {
	if len(skip) == 0 {
		return false
	}
	abs, err := filepath.Abs(filepath.Join(contextDir, filepath.FromSlash(rel)))
	return err == nil && skip[abs]
}

// mkdirAllIn creates rel and its parents in the tree (0755, root's).
// Resolution goes through the os.Root: a symlink an earlier RUN step
// planted (app -> /etc) is followed only inside the tree, and one that
// points out of it (absolute, or ../..) fails the step.
func mkdirAllIn(tree *os.Root, rel string) error {
	if rel == "." || rel == "" {
		return nil
	}
	if err := tree.MkdirAll(rel, 0o755); err != nil {
		return fmt.Errorf("create /%s in the image: %w", rel, err)
	}
	return nil
}

// mkdirIn creates the absolute directory dir in the tree at treeDir.
func mkdirIn(treeDir, dir string) error {
	tree, err := os.OpenRoot(treeDir)
	if err != nil {
		return err
	}
	defer tree.Close()
	return mkdirAllIn(tree, strings.TrimPrefix(path.Clean(dir), "/"))
}

// removeCaches removes the package managers' caches from the tree.
func removeCaches(treeDir string) error {
	tree, err := os.OpenRoot(treeDir)
	if err != nil {
		return err
	}
	defer tree.Close()
	for _, c := range caches {
		if err := tree.RemoveAll(c); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove /%s: %w", c, err)
		}
	}
	return nil
}
