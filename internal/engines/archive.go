package engines

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"
)

// ImageConfig is the part of an image's configuration the tests set.
type ImageConfig struct {
	Entrypoint []string `json:"Entrypoint,omitempty"`
	Cmd        []string `json:"Cmd,omitempty"`
	Env        []string `json:"Env,omitempty"`
}

// WriteDockerArchive writes a one-layer image named ref in the format of
// `docker save` (manifest.json, the config and the layer), which both
// `ctr images import` and `docker load` read. layer is an uncompressed tar
// of the image's root file system. No registry is reachable from the test
// machines, so images are made locally.
func WriteDockerArchive(w io.Writer, ref, layer string, cfg ImageConfig) error {
	lf, err := os.Open(layer)
	if err != nil {
		return fmt.Errorf("image %s: open layer: %w", ref, err)
	}
	defer lf.Close()
	h := sha256.New()
	size, err := io.Copy(h, lf)
	if err != nil {
		return fmt.Errorf("image %s: hash layer %s: %w", ref, layer, err)
	}
	diffID := hex.EncodeToString(h.Sum(nil))
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64",
		"os":           "linux",
		"created":      time.Unix(0, 0).UTC(),
		"config":       cfg,
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + diffID}},
	})
	if err != nil {
		return err
	}
	cs := sha256.Sum256(config)
	configName := hex.EncodeToString(cs[:]) + ".json"
	layerName := diffID + "/layer.tar"
	manifest, err := json.Marshal([]map[string]any{{
		"Config": configName, "RepoTags": []string{ref}, "Layers": []string{layerName},
	}})
	if err != nil {
		return err
	}
	tw := tar.NewWriter(w)
	file := func(name string, b []byte) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := file(configName, config); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if err := tw.WriteHeader(&tar.Header{Name: layerName, Mode: 0o644, Size: size, Typeflag: tar.TypeReg}); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	if _, err := lf.Seek(0, io.SeekStart); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, lf, size); err != nil {
		return fmt.Errorf("image %s: copy layer: %w", ref, err)
	}
	if err := file("manifest.json", manifest); err != nil {
		return fmt.Errorf("image %s: %w", ref, err)
	}
	return tw.Close()
}

// LayerEntry is one entry of a layer WriteLayer writes: a file (mode
// 0755) with Content, or a symlink to Link.
type LayerEntry struct {
	Name    string // no leading slash
	Content []byte
	Link    string
}

// WriteLayer writes a layer tar of entries, in order.
func WriteLayer(w io.Writer, entries []LayerEntry) error {
	tw := tar.NewWriter(w)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Mode: 0o755, Size: int64(len(e.Content)), Typeflag: tar.TypeReg}
		if e.Link != "" {
			h = &tar.Header{Name: e.Name, Mode: 0o777, Linkname: e.Link, Typeflag: tar.TypeSymlink}
		}
		if err := tw.WriteHeader(h); err != nil {
			return fmt.Errorf("layer entry %s: %w", e.Name, err)
		}
		if e.Link == "" {
			if _, err := tw.Write(e.Content); err != nil {
				return err
			}
		}
	}
	return tw.Close()
}
