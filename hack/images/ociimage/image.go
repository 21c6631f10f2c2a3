// SPDX-License-Identifier: Apache-2.0

package ociimage

import (
	"fmt"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// OCI annotation keys (image-spec annotations.md), used both as config labels and manifest annotations.
const (
	AnnotationSource   = "org.opencontainers.image.source"
	AnnotationRevision = "org.opencontainers.image.revision"
	AnnotationVersion  = "org.opencontainers.image.version"
	AnnotationCreated  = "org.opencontainers.image.created"
	// AnnotationDirty is set to "true" when the image was built from a work tree with uncommitted changes:
	// the revision then names the commit the changes sit on, not what is in the image.
	AnnotationDirty = "dev.dkc.image.source-dirty"
)

// DefaultPath is the PATH of every image: there is no shell, but exec.LookPath and `kubectl exec <binary>`
// still search it.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Source says where an image comes from; every image of one build shares it.
type Source struct {
	Repository string // e.g. https://github.com/dkc-dev/dkc
	Revision   string // the commit
	Dirty      bool
	Version    string
	// Created is the time of every layer entry, the config and the labels: SOURCE_DATE_EPOCH or the commit
	// time, never the wall clock, so a rebuild of the same commit gives the same digest.
	Created time.Time
}

// Spec is one image.
type Spec struct {
	Name       string
	Entrypoint []string
	// User is "uid:gid", numeric so the kubelet can enforce runAsNonRoot without reading /etc/passwd.
	User string
	// Base adds BaseFiles as the first layer.
	Base bool
	// Shared are layers built once (SharedLayer) and placed, in order, between the base and Files in every
	// image that lists them. Such images store the layer once in a registry and, because containerd keys
	// a node's unpacked layers by the chain of layers below them, once on a node too: the same base under
	// the same shared layers gives the same chain.
	Shared []SharedLayer
	// Files form the image's own layer on top of the base and the shared layers.
	Files []File
	// Arch is a GOARCH; the OS is always linux.
	Arch string
}

// SharedLayer is a layer several images carry byte for byte.
type SharedLayer struct {
	Layer v1.Layer
	// What says what it holds, for the image's history.
	What string
}

// Build assembles spec into an image: the base layer if asked for, the shared layers, one layer with
// spec.Files, and a config
// with the entrypoint, user and OCI labels. The manifest carries the same labels as annotations, because
// registries and `crane manifest` show those without fetching the config.
func Build(spec Spec, src Source) (v1.Image, error) {
	created := src.Created.UTC().Truncate(time.Second)
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)

	var layers []SharedLayer
	if spec.Base {
		base, err := Layer(BaseFiles(), created)
		if err != nil {
			return nil, fmt.Errorf("image %s base layer: %w", spec.Name, err)
		}
		layers = append(layers, SharedLayer{Layer: base, What: "base: passwd, group, nsswitch.conf, /tmp"})
	}
	layers = append(layers, spec.Shared...)
	own, err := Layer(spec.Files, created)
	if err != nil {
		return nil, fmt.Errorf("image %s layer of its own files: %w", spec.Name, err)
	}
	layers = append(layers, SharedLayer{Layer: own, What: "files of " + spec.Name})
	for i, l := range layers {
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:   l.Layer,
			History: v1.History{Created: v1.Time{Time: created}, CreatedBy: "hack/images: " + l.What},
		})
		if err != nil {
			return nil, fmt.Errorf("image %s: append layer %d: %w", spec.Name, i, err)
		}
	}

	labels := src.labels(created)
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("image %s: read config: %w", spec.Name, err)
	}
	cf = cf.DeepCopy()
	cf.OS = "linux"
	cf.Architecture = spec.Arch
	cf.Created = v1.Time{Time: created}
	cf.Config = v1.Config{
		Entrypoint: spec.Entrypoint,
		User:       spec.User,
		WorkingDir: "/",
		Env:        []string{DefaultPath},
		Labels:     labels,
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return nil, fmt.Errorf("image %s: set config: %w", spec.Name, err)
	}
	return mutate.Annotations(img, labels).(v1.Image), nil
}

// Index puts images, one per platform (each image's config says which), into an OCI image index that
// carries the build's labels as annotations. A runtime pulling the index picks its own platform's image.
func Index(images []v1.Image, src Source) (v1.ImageIndex, error) {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	for i, img := range images {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("index entry %d: read config: %w", i, err)
		}
		idx = mutate.AppendManifests(idx, mutate.IndexAddendum{
			Add: img,
			Descriptor: v1.Descriptor{
				MediaType: types.OCIManifestSchema1,
				Platform:  &v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant},
			},
		})
	}
	return mutate.Annotations(idx, src.labels(src.Created.UTC().Truncate(time.Second))).(v1.ImageIndex), nil
}

func (s Source) labels(created time.Time) map[string]string {
	l := map[string]string{
		AnnotationSource:   s.Repository,
		AnnotationRevision: s.Revision,
		AnnotationVersion:  s.Version,
		AnnotationCreated:  created.Format(time.RFC3339),
	}
	if s.Dirty {
		l[AnnotationDirty] = "true"
	}
	return l
}
