package image

import (
	"archive/tar"
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"runtime"
	"strings"
	"sync/atomic"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
)

// SourceKind is the format of an import source.
type SourceKind string

// The source formats Import reads.
const (
	// SourceDockerArchive is what `docker save` writes: a tar with a
	// manifest.json naming the config and the layer files.
	SourceDockerArchive SourceKind = "docker-archive"
	// SourceOCIArchive is an OCI image layout packed in a tar.
	SourceOCIArchive SourceKind = "oci-archive"
	// SourceOCILayout is an OCI image layout directory.
	SourceOCILayout SourceKind = "oci"
	// SourceRootfs is a single root filesystem tar, optionally gzip or
	// zstd compressed.
	SourceRootfs SourceKind = "rootfs"
)

// Source is a parsed import SOURCE such as "oci:dir:latest".
type Source struct {
	Kind SourceKind
	// Path is the file or directory.
	Path string
	// Tag picks a manifest of an OCI layout by its
	// org.opencontainers.image.ref.name annotation; "" takes the only one.
	Tag string
}

// String returns the source as the user would write it.
func (s Source) String() string {
	if s.Tag != "" {
		return string(s.Kind) + ":" + s.Path + ":" + s.Tag
	}
	return string(s.Kind) + ":" + s.Path
}

// ParseSource parses "docker-archive:FILE", "oci-archive:FILE",
// "oci:DIR[:TAG]" or "rootfs:FILE".
func ParseSource(s string) (Source, error) {
	const fix = "; write docker-archive:FILE, oci-archive:FILE, oci:DIR[:TAG] or rootfs:FILE.tar[.gz|.zst]"
	kind, rest, ok := strings.Cut(s, ":")
	if !ok || rest == "" {
		return Source{}, fmt.Errorf("%w: source %q: no format prefix or no path%s", ErrBadImage, s, fix)
	}
	src := Source{Kind: SourceKind(kind), Path: rest}
	switch src.Kind {
	case SourceDockerArchive, SourceOCIArchive, SourceRootfs:
	case SourceOCILayout:
		// A tag cannot contain '/', a path's last component can contain
		// ':' only rarely; split on the last ':' after the last '/'.
		if i := strings.LastIndexByte(rest, ':'); i > strings.LastIndexByte(rest, '/') {
			src.Path, src.Tag = rest[:i], rest[i+1:]
			if src.Path == "" || src.Tag == "" {
				return Source{}, fmt.Errorf("%w: source %q: empty directory or tag%s", ErrBadImage, s, fix)
			}
		}
	default:
		return Source{}, fmt.Errorf("%w: source %q: unknown format %q%s", ErrBadImage, s, kind, fix)
	}
	return src, nil
}

// maxJSON caps every manifest, index and config we parse: real ones are a
// few kilobytes, and they come from the untrusted archive.
const maxJSON = 4 << 20

// imageConfig is the part of an OCI/Docker image config Moat honours (OCI
// image-spec config.md; Docker's image JSON has the same fields). Defined
// here rather than imported: five fields do not justify a dependency.
type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string   `json:"User"`
		Env        []string `json:"Env"`
		Entrypoint []string `json:"Entrypoint"`
		Cmd        []string `json:"Cmd"`
		WorkingDir string   `json:"WorkingDir"`
	} `json:"config"`
}

// descriptor is an OCI content descriptor.
type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations"`
	Platform    *struct {
		Architecture string `json:"architecture"`
		OS           string `json:"os"`
	} `json:"platform"`
}

// ociIndex is index.json or an image index blob; ociManifest an image
// manifest blob.
type ociIndex struct {
	Manifests []descriptor `json:"manifests"`
}
type ociManifest struct {
	Config descriptor   `json:"config"`
	Layers []descriptor `json:"layers"`
}

// dockerManifest is one entry of a docker-archive's manifest.json.
type dockerManifest struct {
	Config   string   `json:"Config"`
	RepoTags []string `json:"RepoTags"`
	Layers   []string `json:"Layers"`
}

// blobStore opens the files of a source by their path inside it.
type blobStore interface {
	open(name string) (io.ReadCloser, error)
	Close() error
}

// layerRef is one layer to apply, in order.
type layerRef struct {
	file   string // path inside the blob store
	digest string // expected sha256 of the stored bytes, "" if unknown
	size   int64  // stored size, -1 if unknown
}

// resolvedSource is what Import needs from any source format.
type resolvedSource struct {
	blobs  blobStore
	layers []layerRef
	config imageConfig
	// digest is the source's own identity: the manifest digest of an OCI
	// image, the config digest (image ID) of a docker-archive, the file's
	// sha256 for a rootfs tar (filled in while it is read).
	digest string
}

// resolve opens src and reads its manifest and config.
func resolve(src Source) (*resolvedSource, error) {
	switch src.Kind {
	case SourceRootfs:
		dir, file := path.Split(src.Path)
		if dir == "" {
			dir = "."
		}
		blobs, err := openDirBlobs(dir)
		if err != nil {
			return nil, err
		}
		// Fail before the store is touched if the file is not there.
		rc, err := blobs.open(file)
		if err != nil {
			blobs.Close()
			return nil, fmt.Errorf("open source: %w", err)
		}
		rc.Close()
		return &resolvedSource{blobs: blobs, layers: []layerRef{{file: file, size: -1}}}, nil
	case SourceOCILayout:
		blobs, err := openDirBlobs(src.Path)
		if err != nil {
			return nil, err
		}
		return resolveOCI(blobs, src.Tag)
	case SourceOCIArchive, SourceDockerArchive:
		blobs, err := openTarBlobs(src.Path)
		if err != nil {
			return nil, err
		}
		if src.Kind == SourceOCIArchive {
			return resolveOCI(blobs, "")
		}
		return resolveDocker(blobs)
	}
	return nil, fmt.Errorf("%w: unknown source format %q", ErrBadImage, src.Kind)
}

// readJSON reads and decodes one small JSON file of the source, checking
// its digest when one is expected.
func readJSON(blobs blobStore, name, wantDigest string, v any) (string, error) {
	rc, err := blobs.open(name)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxJSON+1))
	if err != nil {
		return "", fmt.Errorf("%w: read %s: %v", ErrBadImage, name, err)
	}
	if len(data) > maxJSON {
		return "", fmt.Errorf("%w: %s is larger than %d bytes; not an image manifest or config", ErrBadImage, name, maxJSON)
	}
	sum := sha256.Sum256(data)
	got := digestPrefix + hex.EncodeToString(sum[:])
	if wantDigest != "" && got != wantDigest {
		return "", fmt.Errorf("%w: %s has digest %s, but its descriptor says %s; the source is corrupt", ErrBadImage, name, got, wantDigest)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return "", fmt.Errorf("%w: parse %s: %v", ErrBadImage, name, err)
	}
	return got, nil
}

// requireFile refuses a source that lacks the file its format starts
// from, saying which format the user named and which prefixes the other
// kinds of tar take: the usual mistake is the wrong prefix.
func requireFile(blobs blobStore, name, format string) error {
	rc, err := blobs.open(name)
	if err != nil {
		return fmt.Errorf("%w: no %s at its top level, so this is not %s (%v); a tar from docker save is docker-archive:FILE, "+
			"an OCI layout is oci:DIR or oci-archive:FILE, a plain root filesystem tar is rootfs:FILE",
			ErrBadImage, name, format, strings.TrimPrefix(err.Error(), ErrBadImage.Error()+": "))
	}
	rc.Close()
	return nil
}

// blobPath turns a descriptor digest into its path in an OCI layout.
func blobPath(d descriptor) (string, error) {
	hexDigest, ok := strings.CutPrefix(d.Digest, digestPrefix)
	if !ok || !validHex(hexDigest) {
		return "", fmt.Errorf("%w: descriptor digest %q is not sha256:<64 lowercase hex>", ErrBadImage, d.Digest)
	}
	return "blobs/sha256/" + hexDigest, nil
}

// resolveOCI reads an OCI image layout (image-layout.md).
func resolveOCI(blobs blobStore, tag string) (*resolvedSource, error) {
	if err := requireFile(blobs, "index.json", "an OCI image layout"); err != nil {
		blobs.Close()
		return nil, err
	}
	var idx ociIndex
	if _, err := readJSON(blobs, "index.json", "", &idx); err != nil {
		blobs.Close()
		return nil, err
	}
	rs, err := resolveOCIIndex(blobs, idx, tag, 0)
	if err != nil {
		blobs.Close()
		return nil, err
	}
	return rs, nil
}

const (
	mediaIndex        = "application/vnd.oci.image.index.v1+json"
	mediaDockerList   = "application/vnd.docker.distribution.manifest.list.v2+json"
	refNameAnnotation = "org.opencontainers.image.ref.name"
)

// resolveOCIIndex picks a manifest from idx: the one tagged tag, else the
// only one (or the one for this platform), descending into nested indexes.
func resolveOCIIndex(blobs blobStore, idx ociIndex, tag string, depth int) (*resolvedSource, error) {
	if depth > 4 {
		return nil, fmt.Errorf("%w: image indexes nested more than 4 deep", ErrBadImage)
	}
	cands := idx.Manifests
	if tag != "" {
		var tagged []descriptor
		var tags []string
		for _, d := range cands {
			if t := d.Annotations[refNameAnnotation]; t != "" {
				tags = append(tags, t)
				if t == tag {
					tagged = append(tagged, d)
				}
			}
		}
		if len(tagged) == 0 {
			return nil, fmt.Errorf("%w: tag %q not in the layout's index.json (it has %q); name one of those after the last ':'", ErrBadImage, tag, tags)
		}
		cands, tag = tagged, ""
	}
	if len(cands) > 1 {
		var mine []descriptor
		for _, d := range cands {
			if d.Platform != nil && d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH {
				mine = append(mine, d)
			}
		}
		cands = mine
	}
	if len(cands) != 1 {
		return nil, fmt.Errorf("%w: index has %d candidate manifests for linux/%s; pick one with oci:DIR:TAG", ErrBadImage, len(cands), runtime.GOARCH)
	}
	d := cands[0]
	p, err := blobPath(d)
	if err != nil {
		return nil, err
	}
	if d.MediaType == mediaIndex || d.MediaType == mediaDockerList {
		var sub ociIndex
		if _, err := readJSON(blobs, p, d.Digest, &sub); err != nil {
			return nil, err
		}
		return resolveOCIIndex(blobs, sub, tag, depth+1)
	}
	var m ociManifest
	if _, err := readJSON(blobs, p, d.Digest, &m); err != nil {
		return nil, err
	}
	rs := &resolvedSource{blobs: blobs, digest: d.Digest}
	cp, err := blobPath(m.Config)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if _, err := readJSON(blobs, cp, m.Config.Digest, &rs.config); err != nil {
		return nil, err
	}
	for i, l := range m.Layers {
		lp, err := blobPath(l)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		rs.layers = append(rs.layers, layerRef{file: lp, digest: l.Digest, size: l.Size})
	}
	return rs, nil
}

// resolveDocker reads a docker-archive's manifest.json. Layers are named
// by path; their digest is not recorded there, so only the config digest
// (the image ID) is checked.
func resolveDocker(blobs blobStore) (*resolvedSource, error) {
	if err := requireFile(blobs, "manifest.json", "an archive written by docker save"); err != nil {
		blobs.Close()
		return nil, err
	}
	var ms []dockerManifest
	if _, err := readJSON(blobs, "manifest.json", "", &ms); err != nil {
		blobs.Close()
		return nil, err
	}
	if len(ms) != 1 {
		blobs.Close()
		return nil, fmt.Errorf("%w: manifest.json lists %d images; save exactly one (docker save IMAGE)", ErrBadImage, len(ms))
	}
	m := ms[0]
	rs := &resolvedSource{blobs: blobs}
	// The config's file name is its digest in every docker save format
	// ("<hex>.json" before Docker 25, "blobs/sha256/<hex>" since).
	var want string
	if h := strings.TrimSuffix(path.Base(m.Config), ".json"); validHex(h) {
		want = digestPrefix + h
	}
	got, err := readJSON(blobs, m.Config, want, &rs.config)
	if err != nil {
		blobs.Close()
		return nil, err
	}
	rs.digest = got
	for _, l := range m.Layers {
		ref := layerRef{file: l, size: -1}
		if h, ok := strings.CutPrefix(l, "blobs/sha256/"); ok && validHex(h) {
			ref.digest = digestPrefix + h
		}
		rs.layers = append(rs.layers, ref)
	}
	return rs, nil
}

// checkPlatform refuses an image built for another machine: it would not
// run, and the error would come much later and much less clearly.
func (c *imageConfig) checkPlatform() error {
	if c.OS != "" && c.OS != "linux" {
		return fmt.Errorf("%w: image is for os %q; Moat runs linux images", ErrBadImage, c.OS)
	}
	if c.Architecture != "" && c.Architecture != runtime.GOARCH {
		return fmt.Errorf("%w: image is for architecture %q but this host is %q; import the %s variant", ErrBadImage, c.Architecture, runtime.GOARCH, runtime.GOARCH)
	}
	return nil
}

// dirBlobs serves files of a directory through an os.Root, so a manifest
// naming "../../etc/shadow" or a symlinked blob pointing out cannot make
// us read outside it.
type dirBlobs struct{ root *os.Root }

func openDirBlobs(dir string) (*dirBlobs, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: open source: %v", ErrBadImage, err)
	}
	return &dirBlobs{root: r}, nil
}

func (d *dirBlobs) open(name string) (io.ReadCloser, error) {
	f, err := d.root.Open(name)
	if err != nil {
		return nil, fmt.Errorf("%w: open %s: %v", ErrBadImage, name, err)
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%w: %s is not a regular file", ErrBadImage, name)
	}
	return f, nil
}

func (d *dirBlobs) Close() error { return d.root.Close() }

// tarBlobs serves the regular files of a tar archive by name, reading each
// straight from its place in the file: the archive is indexed once, and no
// member is unpacked to disk.
type tarBlobs struct {
	f     *os.File
	index map[string]*io.SectionReader
}

// maxArchiveMembers caps the outer archive's index: an image has a few
// dozen files at its top level, not millions.
const maxArchiveMembers = 100000

func openTarBlobs(file string) (*tarBlobs, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("%w: open source: %v", ErrBadImage, err)
	}
	// archive/tar reads headers in whole 512-byte blocks from the reader it
	// is given and nothing beyond, so the count after Next is the offset of
	// the member's data.
	cr := &countingReader{r: f}
	tr := tar.NewReader(cr)
	t := &tarBlobs{f: f, index: map[string]*io.SectionReader{}}
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return t, nil
		}
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("%w: read archive %s: %v", ErrBadImage, file, err)
		}
		if len(t.index) >= maxArchiveMembers {
			f.Close()
			return nil, fmt.Errorf("%w: archive %s has more than %d members; not an image archive", ErrBadImage, file, maxArchiveMembers)
		}
		if hdr.Typeflag != tar.TypeReg {
			continue // directories; links are not followed
		}
		t.index[path.Clean(hdr.Name)] = io.NewSectionReader(f, cr.n.Load(), hdr.Size)
	}
}

func (t *tarBlobs) open(name string) (io.ReadCloser, error) {
	sr, ok := t.index[path.Clean(name)]
	if !ok {
		return nil, fmt.Errorf("%w: archive has no file %q", ErrBadImage, name)
	}
	return io.NopCloser(io.NewSectionReader(sr, 0, sr.Size())), nil
}

func (t *tarBlobs) Close() error { return t.f.Close() }

type countingReader struct {
	r io.Reader
	n atomic.Int64 // read by the progress meter while a readAhead reads
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// layerReader opens one layer: it hashes the stored bytes as they are read
// (for the digest check at the end) and undoes gzip or zstd compression,
// recognised by magic number rather than by media type, which the source
// could get wrong.
type layerReader struct {
	io.Reader
	stored  io.ReadCloser
	hash    hash.Hash
	counted *countingReader
	closers []func()
}

func openLayer(blobs blobStore, ref layerRef) (*layerReader, error) {
	rc, err := blobs.open(ref.file)
	if err != nil {
		return nil, err
	}
	h := sha256.New()
	counted := &countingReader{r: io.TeeReader(rc, h)}
	br := bufio.NewReaderSize(counted, 64<<10)
	lr := &layerReader{stored: rc, hash: h, counted: counted}
	magic, _ := br.Peek(4)
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		// klauspost's inflate (the zstd decoder's module) is a drop-in
		// for compress/gzip that takes about a fifth less CPU, on the
		// core beside the extractor's.
		zr, err := gzip.NewReader(br)
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("%w: gzip: %v", ErrBadImage, err)
		}
		lr.Reader = zr
		lr.closers = append(lr.closers, func() { zr.Close() })
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		// The decoder's window is capped at 64 MiB (zstd -19 uses 8 MiB)
		// so a frame header cannot make it allocate gigabytes up front.
		zr, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxWindow(64<<20))
		if err != nil {
			rc.Close()
			return nil, fmt.Errorf("%w: zstd: %v", ErrBadImage, err)
		}
		lr.Reader = zr
		lr.closers = append(lr.closers, zr.Close)
	default:
		lr.Reader = br
	}
	return lr, nil
}

// maxTrailer bounds what a compressed layer may hold after the end of its
// tar archive: the archive's end is two zero blocks, and tar pads to a
// record of 10 KiB (20 blocks); a stream that goes on for more hides
// something, or is a bomb that would be inflated for nothing.
const maxTrailer = 1 << 20

// finish drains what the tar reader left unread and checks the stored
// bytes against ref's digest. For a compressed layer the rest goes through
// the decompressor, at most maxTrailer bytes of it, so that gzip's CRC-32
// and length trailer and zstd's checksum are checked: a rootfs tar.gz has
// no digest to check, and its corruption past the last entry would
// otherwise pass. The stored file's rest is then drained for the digest,
// bounded by the file.
func (lr *layerReader) finish(ref layerRef) (string, error) {
	if len(lr.closers) > 0 { // a decompressor
		n, err := io.Copy(io.Discard, io.LimitReader(lr.Reader, maxTrailer+1))
		if err != nil {
			return "", fmt.Errorf("%w: after the tar archive's end: %v", ErrBadImage, err)
		}
		if n > maxTrailer {
			return "", fmt.Errorf("%w: the compressed stream goes on for more than %d bytes after the tar archive's end", ErrBadImage, maxTrailer)
		}
	}
	if _, err := io.Copy(io.Discard, lr.counted); err != nil {
		return "", fmt.Errorf("%w: read: %v", ErrBadImage, err)
	}
	got := digestPrefix + hex.EncodeToString(lr.hash.Sum(nil))
	if ref.digest != "" && got != ref.digest {
		return "", fmt.Errorf("%w: stored bytes have digest %s, but the manifest says %s; the source is corrupt or tampered with", ErrBadImage, got, ref.digest)
	}
	return got, nil
}

func (lr *layerReader) Close() {
	for _, c := range lr.closers {
		c()
	}
	lr.stored.Close()
}
