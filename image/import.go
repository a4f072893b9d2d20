package image

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"time"
)

// ImportOptions configure Import. The zero value uses the default caps and
// discards progress.
type ImportOptions struct {
	// Progress receives one line per layer (index, digest, bytes) and the
	// phases. nil discards it.
	Progress io.Writer
	// Terminal says Progress is a terminal: while a layer is read, one
	// line with the bytes read so far is redrawn in place. Otherwise a
	// plain line is written every ten seconds of a long layer.
	Terminal bool
	// MaxBytes caps the bytes extracted from all layers together, counted
	// as written. 0 means DefaultImportMaxBytes.
	MaxBytes int64
	// MaxFiles caps the entries extracted from all layers together. 0
	// means DefaultImportMaxFiles.
	MaxFiles int64
}

// The default import caps: larger than any image a sandbox should run on,
// small enough that a hostile archive cannot fill the host's disk.
const (
	DefaultImportMaxBytes = 8 << 30
	DefaultImportMaxFiles = 1_000_000
)

// defaultImportPath is the PATH an imported image gets when its config
// sets none: Debian's and the OCI convention's default.
const defaultImportPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Import unpacks an existing image from src into the store under name,
// makes it current and returns it. The source is untrusted: see extract.go
// for what is refused or neutralised. The tree then gets the same
// finalisation as a built image (own passwd and group, the sandbox user,
// no host files, no setuid bits or device nodes) and is stored by its
// content digest. A refused or failed import leaves the store as it was.
func (s *Store) Import(ctx context.Context, name string, src Source, opts ImportOptions) (*Image, error) {
	progress := opts.Progress
	if progress == nil {
		progress = io.Discard
	}
	if opts.MaxBytes <= 0 {
		opts.MaxBytes = DefaultImportMaxBytes
	}
	if opts.MaxFiles <= 0 {
		opts.MaxFiles = DefaultImportMaxFiles
	}
	if err := validName(name); err != nil {
		return nil, fmt.Errorf("import image: %w: %w", ErrBadImage, err)
	}
	if _, err := definition(name); err == nil {
		// Lookup checks a built-in name against its definition; an
		// imported tree under that name would read as a stale build.
		return nil, fmt.Errorf("import image %s: %w: %q is a built-in image definition; import under another name", name, ErrBadImage, name)
	}
	// Read the source's manifest and config before touching the store, so
	// a bad source costs nothing.
	rs, err := resolve(src)
	if err != nil {
		return nil, fmt.Errorf("import image %s from %s: %w", name, src, err)
	}
	defer rs.blobs.Close()
	if err := rs.config.checkPlatform(); err != nil {
		return nil, fmt.Errorf("import image %s from %s: %w", name, src, err)
	}
	env, err := importEnv(rs.config.Config.Env)
	if err != nil {
		return nil, fmt.Errorf("import image %s from %s: %w", name, src, err)
	}

	pend, err := s.Begin(ctx, name, progress)
	if err != nil {
		return nil, fmt.Errorf("import image %s: %w", name, err)
	}
	defer pend.Close()
	rootfs := pend.Root()
	if err := os.Mkdir(rootfs, 0o755); err != nil {
		return nil, fmt.Errorf("import image %s: %w", name, err)
	}
	// The extractor hashes each file as it writes it; Publish's digest
	// uses those sums instead of reading the files back (filesums.go).
	pend.sums = newFileSums()
	if err := extractLayers(ctx, rootfs, rs, opts, pend.Phase, pend.sums); err != nil {
		return nil, fmt.Errorf("import image %s from %s: %w", name, src, err)
	}
	cfg := rs.config.Config
	img, err := pend.Publish(ctx, &Image{
		Env:          env,
		Built:        time.Now().UTC().Truncate(time.Second),
		BuiltWith:    "moat image import",
		Source:       src.String(),
		SourceDigest: rs.digest,
		Entrypoint:   cfg.Entrypoint,
		Cmd:          cfg.Cmd,
		WorkingDir:   cfg.WorkingDir,
		User:         cfg.User,
	})
	if err != nil {
		return nil, fmt.Errorf("import image %s: %w", name, err)
	}
	return img, nil
}

// extractLayers applies every layer of rs to rootfs, in order, and
// remembers the regular files' hashes in sums.
func extractLayers(ctx context.Context, rootfs string, rs *resolvedSource, opts ImportOptions, phase func(string, ...any), sums *fileSums) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	budget := &extractBudget{bytesLeft: opts.MaxBytes, filesLeft: opts.MaxFiles, maxBytes: opts.MaxBytes, maxFiles: opts.MaxFiles}
	dirModes := map[string]fs.FileMode{}
	for i, ref := range rs.layers {
		if err := ctx.Err(); err != nil {
			return err
		}
		label := fmt.Sprintf("layer %d of %d (%s)", i+1, len(rs.layers), ref.file)
		if ref.digest != "" {
			label = fmt.Sprintf("layer %d of %d (%s)", i+1, len(rs.layers), ref.digest)
		}
		lr, err := openLayer(rs.blobs, ref)
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
		before := budget.bytesLeft
		m := newMeter(opts.Progress, opts.Terminal, label, ref.size, lr.counted.n.Load)
		ra := newReadAhead(lr)
		dropped, err := extractLayer(root, meteredReader{ctxReader{ctx, ra}, m}, label, budget, dirModes, sums)
		// Stop the read-ahead before the layer is closed or drained.
		ra.Close()
		m.finish()
		if err != nil {
			lr.Close()
			return err
		}
		sum, err := lr.finish(ref)
		lr.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
		if len(rs.layers) == 1 && rs.digest == "" {
			rs.digest = sum // a rootfs tar is known by its own bytes
		}
		msg := fmt.Sprintf("%s: %d bytes stored, %d bytes extracted", label, lr.counted.n.Load(), before-budget.bytesLeft)
		if dropped > 0 {
			msg += fmt.Sprintf(", %d device nodes/FIFOs dropped", dropped)
		}
		phase("%s", msg)
	}
	return applyDirModes(root, dirModes)
}

// ctxReader stops a long extraction when ctx is cancelled.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// importEnv checks the config's Env and adds a PATH when it has none.
func importEnv(env []string) ([]string, error) {
	var out []string
	hasPath := false
	for i, kv := range env {
		k, _, ok := strings.Cut(kv, "=")
		if !ok || k == "" || strings.ContainsAny(kv, "\x00") {
			return nil, fmt.Errorf("%w: config Env[%d] %q is not NAME=VALUE", ErrBadImage, i, kv)
		}
		hasPath = hasPath || k == "PATH"
		out = append(out, kv)
	}
	if !hasPath {
		out = append([]string{defaultImportPath}, out...)
	}
	return out, nil
}

// ensureEtc makes /etc a real directory before finalize writes the
// image's own passwd and group into it: a minimal image (one static binary)
// may have none, and a hostile one may have made it a symlink, which
// finalize must not write through even inside the tree.
func ensureEtc(rootfs string) error {
	root, err := os.OpenRoot(rootfs)
	if err != nil {
		return err
	}
	defer root.Close()
	if fi, err := root.Lstat("etc"); err == nil && !fi.IsDir() {
		if err := root.Remove("etc"); err != nil {
			return fmt.Errorf("replace /etc: %w", err)
		}
	}
	if err := root.Mkdir("etc", 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("create /etc: %w", err)
	}
	return nil
}

func exists(p string) bool {
	_, err := os.Lstat(p)
	return err == nil
}
