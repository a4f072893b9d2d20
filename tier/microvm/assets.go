package microvm

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/moat-sandbox/moat/internal/cpio"
	"github.com/moat-sandbox/moat/internal/guestkernel"
)

// DefaultKernelDir is where scripts/setup extracts Debian's
// linux-image-cloud-amd64: DIR/vmlinuz and DIR/lib/modules/VERSION/.
const DefaultKernelDir = guestkernel.DefaultDir

// kernel is a located guest kernel.
type kernel struct {
	vmlinuz string
	modDir  string // lib/modules/VERSION
	version string
}

func findKernel(dir string) (*kernel, error) {
	vmlinuz := filepath.Join(dir, "vmlinuz")
	if _, err := os.Stat(vmlinuz); err != nil {
		return nil, fmt.Errorf("%w: no guest kernel at %s (run scripts/setup, or set $MOAT_MICROVM_KERNEL to a directory holding vmlinuz and lib/modules)", errUnavailable, vmlinuz)
	}
	mods, err := guestkernel.ModuleDir(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errUnavailable, err)
	}
	k := &kernel{vmlinuz: vmlinuz, modDir: filepath.Dir(mods)}
	k.version = filepath.Base(k.modDir)
	for _, m := range guestkernel.Modules {
		if _, err := os.Stat(filepath.Join(k.modDir, "kernel", m)); err != nil {
			return nil, fmt.Errorf("%w: guest kernel module %s: %v", errUnavailable, m, err)
		}
	}
	return k, nil
}

var errUnavailable = errors.New("microvm tier unavailable")

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// buildInitramfs writes (once, cached by the digest of what goes in) a
// newc cpio holding the agent as /init and the virtio modules.
func buildInitramfs(cacheDir, agent string, k *kernel) (string, error) {
	h := sha256.New()
	ad, err := fileDigest(agent)
	if err != nil {
		return "", fmt.Errorf("guest agent %s: %w", agent, err)
	}
	fmt.Fprintf(h, "agent %s\nkernel %s\n", ad, k.version)
	for _, m := range guestkernel.Modules {
		d, err := fileDigest(filepath.Join(k.modDir, "kernel", m))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s %s\n", m, d)
	}
	out := filepath.Join(cacheDir, "initramfs-"+hex.EncodeToString(h.Sum(nil))[:32]+".cpio")
	if _, err := os.Stat(out); err == nil {
		// Used now: the pruning below keeps the most recently used.
		now := time.Now()
		os.Chtimes(out, now, now)
		return out, nil
	}
	// Every build of the agent is a new initramfs; keep the few most
	// recently used (another moat of another build may be booting one).
	defer pruneInitramfs(cacheDir, keepInitramfs)
	var buf bytes.Buffer
	w := cpio.NewWriter(&buf)
	for _, d := range []string{"dev", "proc", "sys", "mnt", "mnt/root", "lib", "lib/modules"} {
		w.Dir(d)
	}
	var order []string
	for _, m := range guestkernel.Modules {
		b, err := os.ReadFile(filepath.Join(k.modDir, "kernel", m))
		if err != nil {
			return "", err
		}
		name := "lib/modules/" + filepath.Base(m)
		w.File(name, 0o644, b)
		order = append(order, "/"+name)
	}
	w.File("modules.order", 0o644, []byte(strings.Join(order, "\n")+"\n"))
	ab, err := os.ReadFile(agent)
	if err != nil {
		return "", err
	}
	w.File("init", 0o755, ab)
	if err := w.Close(); err != nil {
		return "", err
	}
	return out, writeAtomic(out, buf.Bytes())
}

func writeAtomic(path string, b []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	os.Chmod(tmp.Name(), 0o644)
	return os.Rename(tmp.Name(), path)
}

// keepInitramfs is how many initramfs files the cache keeps.
const keepInitramfs = 4

// pruneInitramfs removes all but the keep most recently used initramfs
// files of dir (a VM booting from a removed one keeps its open file).
func pruneInitramfs(dir string, keep int) {
	for _, p := range beyondNewest(filepath.Join(dir, "initramfs-*.cpio"), keep) {
		os.Remove(p)
	}
}
