// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// The self-signed overlay's secretGenerator reads its certificate files, which gen-certs.sh writes and git
// ignores: the in-memory copy of deploy/ gets these instead, and the chart puts template expressions where
// they land (the Secret, the CA ConfigMap, the webhook's caBundle).
var placeholderCerts = map[string]string{
	"ca.crt":  "helmchart-placeholder-ca.crt",
	"tls.crt": "helmchart-placeholder-tls.crt",
	"tls.key": "helmchart-placeholder-tls.key",
}

// object is one rendered Kubernetes object as kustomize's JSON-compatible map.
type object map[string]any

func (o object) kind() string { s, _ := o["kind"].(string); return s }

func (o object) meta() map[string]any { m, _ := o["metadata"].(map[string]any); return m }

func (o object) name() string { s, _ := o.meta()["name"].(string); return s }

func (o object) namespace() string { s, _ := o.meta()["namespace"].(string); return s }

// id is kind/namespace/name: unique within one render.
func (o object) id() string { return o.kind() + "/" + o.namespace() + "/" + o.name() }

// tree is deploy/ copied into kustomize's in-memory file system (without helm/, the chart itself), so that
// rendering writes nothing into the checkout and reads every overlay as `kubectl kustomize` would.
type tree struct {
	fs filesys.FileSystem
}

// root is where deploy/ sits in the in-memory file system.
const root = "/deploy"

func loadTree(deployDir string) (*tree, error) {
	mem := filesys.MakeFsInMemory()
	err := filepath.WalkDir(deployDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(deployDir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == "helm" {
				return filepath.SkipDir
			}
			return mem.MkdirAll(path.Join(root, filepath.ToSlash(rel)))
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return mem.WriteFile(path.Join(root, filepath.ToSlash(rel)), data)
	})
	if err != nil {
		return nil, fmt.Errorf("copy %s: %w", deployDir, err)
	}
	for name, content := range placeholderCerts {
		if err := mem.WriteFile(path.Join(root, "overlays/self-signed", name), []byte(content)); err != nil {
			return nil, err
		}
	}
	return &tree{fs: mem}, nil
}

// render runs kustomize on dir (relative to deploy/).
func (t *tree) render(dir string) ([]object, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(t.fs, path.Join(root, dir))
	if err != nil {
		return nil, fmt.Errorf("kustomize deploy/%s: %w", dir, err)
	}
	var objs []object
	for _, r := range m.Resources() {
		o, err := r.Map()
		if err != nil {
			return nil, fmt.Errorf("kustomize deploy/%s: %s: %w", dir, r.CurId(), err)
		}
		objs = append(objs, o)
	}
	return objs, nil
}

// renderWith renders base (relative to deploy/) with components, as a user's overlay would.
func (t *tree) renderWith(base string, components ...string) ([]object, error) {
	const dir = ".helmchart"
	k := "resources: [../" + base + "]\n"
	if len(components) > 0 {
		k += "components: [../" + strings.Join(components, ", ../") + "]\n"
	}
	if err := t.fs.MkdirAll(path.Join(root, dir)); err != nil {
		return nil, err
	}
	if err := t.fs.WriteFile(path.Join(root, dir, "kustomization.yaml"), []byte(k)); err != nil {
		return nil, err
	}
	return t.render(dir)
}

// Render renders the kustomize directory dir (relative to deployDir) as the chart generator sees it: the
// self-signed overlay's certificates are placeholders. Tests compare `helm template` with it.
func Render(deployDir, dir string) ([]map[string]any, error) {
	t, err := loadTree(deployDir)
	if err != nil {
		return nil, err
	}
	objs, err := t.render(dir)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]any, len(objs))
	for i, o := range objs {
		out[i] = o
	}
	return out, nil
}
