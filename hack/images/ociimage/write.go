package ociimage

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Built is an image with the reference it is published under.
type Built struct {
	Name  string
	Ref   name.Tag
	Image v1.Image
}

// Written says where an image went.
type Written struct {
	Built
	Digest  v1.Hash
	Tarball string
	// Size is the tarball's size in bytes.
	Size int64
}

// LayoutDir is the OCI image layout below the output directory that holds every image of a build.
const LayoutDir = "oci"

// Write writes each image as dir/<name>.tar and all of them into the OCI image layout dir/oci.
//
// The tarball is the docker-archive format (manifest.json with RepoTags), not an OCI layout in a tar:
// `ctr -n k8s.io images import`, `docker load`, `kind load image-archive` and `crane push` all read it and
// tag the image with the reference inside. The layout is rewritten from scratch, because appending to an
// old one would keep images of earlier builds; each entry carries its reference as ref.name and as
// io.containerd.image.name, the names `ctr import` and skopeo look for.
func Write(dir string, images []Built) ([]Written, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create image output directory: %w", err)
	}
	layoutPath := filepath.Join(dir, LayoutDir)
	if err := os.RemoveAll(layoutPath); err != nil {
		return nil, fmt.Errorf("remove old OCI layout %s: %w", layoutPath, err)
	}
	lp, err := layout.Write(layoutPath, empty.Index)
	if err != nil {
		return nil, fmt.Errorf("create OCI layout %s: %w", layoutPath, err)
	}
	var out []Written
	for _, b := range images {
		digest, err := b.Image.Digest()
		if err != nil {
			return nil, fmt.Errorf("image %s: digest: %w", b.Name, err)
		}
		file := filepath.Join(dir, b.Name+".tar")
		if err := tarball.WriteToFile(file, b.Ref, b.Image); err != nil {
			return nil, fmt.Errorf("image %s: write %s: %w", b.Name, file, err)
		}
		st, err := os.Stat(file)
		if err != nil {
			return nil, fmt.Errorf("image %s: %w", b.Name, err)
		}
		err = lp.AppendImage(b.Image, layout.WithAnnotations(map[string]string{
			"org.opencontainers.image.ref.name": b.Ref.String(),
			"io.containerd.image.name":          b.Ref.String(),
		}))
		if err != nil {
			return nil, fmt.Errorf("image %s: append to OCI layout %s: %w", b.Name, layoutPath, err)
		}
		out = append(out, Written{Built: b, Digest: digest, Tarball: file, Size: st.Size()})
	}
	return out, nil
}
