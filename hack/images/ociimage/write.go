// SPDX-License-Identifier: Apache-2.0

package ociimage

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Built is one image of a build, every platform of it, with the reference it is published under.
type Built struct {
	Name  string
	Ref   name.Tag
	Index v1.ImageIndex
	// Local is the image of the build host's platform, written as a docker archive for a local cluster to
	// import; nil when the build did not include that platform.
	Local v1.Image
}

// Written says where an image went.
type Written struct {
	Built
	// Digest is the index's: what a registry serves for Ref and what a digest-pinned manifest names.
	Digest v1.Hash
	// Layout is the image's own OCI layout, holding the index alone (crane push <Layout> pushes it).
	Layout string
	// Tarball is the docker archive of Local, "" without one; Size its size in bytes.
	Tarball string
	Size    int64
}

// LayoutDir is the directory below the output directory that holds one OCI image layout per image.
const LayoutDir = "oci"

// Write writes each image's index into the OCI image layout dir/oci/<name> and, where the build has the
// host's platform, that platform's image as dir/<name>.tar.
//
// One layout per image, not one for the build: `crane push <layout> <ref>` pushes a layout's only entry
// as it is (here the index) and needs --index, which would wrap every entry into one new index, when
// there are several. Each entry carries its reference as ref.name and io.containerd.image.name, the
// names `ctr import` and skopeo look for. The layouts are rewritten from scratch, because appending to
// old ones would keep images of earlier builds.
//
// The tarball is the docker-archive format (manifest.json with RepoTags), which holds one platform:
// `ctr -n k8s.io images import`, `docker load` and `kind load image-archive` read it and tag the image
// with the reference inside. A tarball left by an earlier build is removed when this build has none, so
// that a local cluster never imports an image of another build.
func Write(dir string, images []Built) ([]Written, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create image output directory: %w", err)
	}
	layouts := filepath.Join(dir, LayoutDir)
	if err := os.RemoveAll(layouts); err != nil {
		return nil, fmt.Errorf("remove old OCI layouts %s: %w", layouts, err)
	}
	var out []Written
	// Layer blobs already written into an earlier image's layout: a later layout gets a hard link, not a
	// copy, of the layers images share (the base, the helpers), which the layout writer then skips.
	written := map[v1.Hash]string{}
	for _, b := range images {
		digest, err := b.Index.Digest()
		if err != nil {
			return nil, fmt.Errorf("image %s: index digest: %w", b.Name, err)
		}
		w := Written{Built: b, Digest: digest, Layout: filepath.Join(layouts, b.Name)}
		lp, err := layout.Write(w.Layout, empty.Index)
		if err != nil {
			return nil, fmt.Errorf("image %s: create OCI layout %s: %w", b.Name, w.Layout, err)
		}
		layers, err := indexLayers(b.Index)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", b.Name, err)
		}
		for _, d := range layers {
			blob := filepath.Join(w.Layout, "blobs", d.Algorithm, d.Hex)
			if src, ok := written[d]; ok {
				if err := os.MkdirAll(filepath.Dir(blob), 0o755); err != nil {
					return nil, fmt.Errorf("image %s: %w", b.Name, err)
				}
				if err := os.Link(src, blob); err != nil {
					return nil, fmt.Errorf("image %s: link shared layer %s: %w", b.Name, d, err)
				}
				continue
			}
			written[d] = blob
		}
		err = lp.AppendIndex(b.Index, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": b.Ref.String(),
			"io.containerd.image.name":          b.Ref.String(),
		}))
		if err != nil {
			return nil, fmt.Errorf("image %s: write OCI layout %s: %w", b.Name, w.Layout, err)
		}
		file := filepath.Join(dir, b.Name+".tar")
		if b.Local == nil {
			if err := os.Remove(file); err != nil && !os.IsNotExist(err) {
				return nil, fmt.Errorf("image %s: remove the tarball of an earlier build: %w", b.Name, err)
			}
			out = append(out, w)
			continue
		}
		if err := tarball.WriteToFile(file, b.Ref, b.Local); err != nil {
			return nil, fmt.Errorf("image %s: write %s: %w", b.Name, file, err)
		}
		st, err := os.Stat(file)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", b.Name, err)
		}
		w.Tarball, w.Size = file, st.Size()
		out = append(out, w)
	}
	return out, nil
}

// indexLayers lists the (compressed) layer digests of the images in idx, each once: a layer can be in
// several of them (the base, in every platform's).
func indexLayers(idx v1.ImageIndex) ([]v1.Hash, error) {
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("read index: %w", err)
	}
	var out []v1.Hash
	for _, desc := range im.Manifests {
		img, err := idx.Image(desc.Digest)
		if err != nil {
			return nil, fmt.Errorf("image %s of the index: %w", desc.Digest, err)
		}
		m, err := img.Manifest()
		if err != nil {
			return nil, fmt.Errorf("image %s of the index: %w", desc.Digest, err)
		}
		for _, l := range m.Layers {
			if !slices.Contains(out, l.Digest) {
				out = append(out, l.Digest)
			}
		}
	}
	return out, nil
}
