package workspace

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// File metadata (E2B's files.write with metadata) is kept as the file's
// user extended attributes, one "user.<key>" each, on the workspace file
// itself: it moves with the file (rename), goes with it (remove), and the
// program in the sandbox reads and sets the same attributes (getfattr,
// setfattr), as in E2B's sandboxes. There is no side table to fall out of
// step. A workspace filesystem without user xattrs (ENOTSUP) refuses
// metadata with ErrNoMetadata rather than drop it.

// MetadataPrefix is the xattr namespace metadata lives in.
const MetadataPrefix = "user."

// Bounds of one file's metadata: what is set through the API, and what is
// read back from a file the sandbox may have decorated (hostile input).
const (
	MaxMetadataKeys  = 64
	MaxMetadataKey   = 200 // bytes, without the prefix (XATTR_NAME_MAX is 255)
	MaxMetadataValue = 4096
)

// ErrNoMetadata says the workspace's filesystem keeps no user xattrs.
var ErrNoMetadata = errors.New("the workspace filesystem does not support user extended attributes, where Moat keeps file metadata")

// metadataKeyByte is an HTTP token character: metadata travels as
// X-Metadata-<key> headers, so a key is what a header name may be.
func metadataKeyByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// CheckMetadata says why md cannot be a file's metadata, or nil: keys are
// non-empty HTTP tokens of at most MaxMetadataKey bytes, values printable
// US-ASCII of at most MaxMetadataValue bytes (the E2B SDK's own rules),
// at most MaxMetadataKeys of them.
func CheckMetadata(md map[string]string) error {
	if len(md) > MaxMetadataKeys {
		return fmt.Errorf("%w: metadata has %d keys; at most %d are kept per file", ErrBadPath, len(md), MaxMetadataKeys)
	}
	for k, v := range md {
		if k == "" || len(k) > MaxMetadataKey {
			return fmt.Errorf("%w: metadata key %q: give 1 to %d letters, digits or !#$%%&'*+-.^_`|~", ErrBadPath, trunc(k), MaxMetadataKey)
		}
		for i := 0; i < len(k); i++ {
			if !metadataKeyByte(k[i]) {
				return fmt.Errorf("%w: metadata key %q: only letters, digits and !#$%%&'*+-.^_`|~ are allowed", ErrBadPath, trunc(k))
			}
		}
		if len(v) > MaxMetadataValue {
			return fmt.Errorf("%w: metadata value of %q is %d bytes; at most %d", ErrBadPath, trunc(k), len(v), MaxMetadataValue)
		}
		for i := 0; i < len(v); i++ {
			if v[i] < 0x20 || v[i] > 0x7e {
				return fmt.Errorf("%w: metadata value of %q: only printable US-ASCII is allowed", ErrBadPath, trunc(k))
			}
		}
	}
	return nil
}

func trunc(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// WriteMetadata sets md as user xattrs of the open file fh (keys not in
// md are kept).
func WriteMetadata(fh *os.File, md map[string]string) error {
	if err := CheckMetadata(md); err != nil {
		return err
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if err := unix.Fsetxattr(int(fh.Fd()), MetadataPrefix+k, []byte(md[k]), 0); err != nil {
			if errors.Is(err, unix.ENOTSUP) {
				return ErrNoMetadata
			}
			return fmt.Errorf("set metadata %q: %w", k, err)
		}
	}
	return nil
}

// ReadMetadata reads the metadata of the open file fh: its user xattrs
// whose names and values CheckMetadata accepts (the sandbox may have set
// others; they are not metadata and are skipped), at most
// MaxMetadataKeys of them. A filesystem without xattrs has none.
func ReadMetadata(fh *os.File) (map[string]string, error) {
	fd := int(fh.Fd())
	buf := make([]byte, 64<<10) // XATTR_LIST_MAX
	n, err := unix.Flistxattr(fd, buf)
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list metadata: %w", err)
	}
	var md map[string]string
	val := make([]byte, MaxMetadataValue+1)
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		k, ok := strings.CutPrefix(name, MetadataPrefix)
		if !ok || k == "" {
			continue
		}
		if len(md) >= MaxMetadataKeys {
			break
		}
		m, err := unix.Fgetxattr(fd, name, val)
		if err != nil {
			// Removed since the listing, or larger than any value the
			// API sets (ERANGE): not metadata.
			continue
		}
		one := map[string]string{k: string(val[:m])}
		if CheckMetadata(one) != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[k] = one[k]
	}
	return md, nil
}

// openMeta opens p (cleaned) for its xattrs without following a final
// symlink; only a regular file or a directory carries metadata (a FIFO
// is opened non-blocking and refused). os.Root resolves a final symlink
// itself (inside the root) whatever O_NOFOLLOW says, so p is looked at
// first, and what was opened must be what was looked at: a swap in
// between (the sandbox runs meanwhile) is refused.
func (f *Files) openMeta(p string) (*os.File, error) {
	kind := func(fi os.FileInfo) error {
		if !fi.Mode().IsRegular() && !fi.IsDir() {
			return fmt.Errorf("%w: %s is a %s; only files and directories carry metadata", ErrBadPath, p, info(p, fi, "").Type)
		}
		return nil
	}
	before, err := f.root.Lstat(p)
	if err != nil {
		return nil, err
	}
	if err := kind(before); err != nil {
		return nil, err
	}
	fh, err := f.root.OpenFile(p, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY, 0)
	if err != nil {
		return nil, err
	}
	fi, err := fh.Stat()
	if err == nil {
		err = kind(fi)
	}
	if err == nil && !os.SameFile(before, fi) {
		err = fmt.Errorf("%w: %s changed while it was opened", ErrBadPath, p)
	}
	if err != nil {
		fh.Close()
		return nil, err
	}
	return fh, nil
}

// SetMetadata sets md as the metadata of file or directory p.
func (f *Files) SetMetadata(p string, md map[string]string) error {
	cp, err := CleanPath(p, true)
	if err != nil {
		return err
	}
	if err := CheckMetadata(md); err != nil {
		return err
	}
	fh, err := f.openMeta(cp)
	if err != nil {
		return rootErr(p, err)
	}
	defer fh.Close()
	return WriteMetadata(fh, md)
}

// metadata is the metadata of in, a regular file or directory just
// described; nil for anything else, or when it cannot be read (the entry
// was removed meanwhile: the listing stays as it was seen).
func (f *Files) metadata(in Info) map[string]string {
	if in.Type != "file" && in.Type != "dir" {
		return nil
	}
	fh, err := f.openMeta(in.Path)
	if err != nil {
		return nil
	}
	defer fh.Close()
	md, _ := ReadMetadata(fh)
	return md
}
