// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	sigsyaml "sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// CRDDir, relative to the repository root, holds dkc's CRDs as controller-gen writes them (make generate);
// deploy/base includes it. The process form applies these very files, so that tests use pools as users
// install them.
const CRDDir = "deploy/crds"

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1",
	Resource: "customresourcedefinitions"}

// applyCRDs creates or updates every CustomResourceDefinition of CRDDir and waits until the apiserver
// serves each (Established), so that dkc-server's pool controller finds its API at start.
func (c *Cluster) applyCRDs(ctx context.Context) error {
	rc, err := c.RESTConfig()
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("create dynamic client: %w", err)
	}
	objs, err := crdObjects(c.cfg.RepoRoot)
	if err != nil {
		return err
	}
	crds := dyn.Resource(crdResource)
	for _, obj := range objs {
		// One err for the create and the update that replaces it: a failed create or update stops here.
		_, err := crds.Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			cur, gerr := crds.Get(ctx, obj.GetName(), metav1.GetOptions{})
			if gerr != nil {
				return fmt.Errorf("get CRD %s: %w", obj.GetName(), gerr)
			}
			cur.Object["spec"] = obj.Object["spec"]
			_, err = crds.Update(ctx, cur, metav1.UpdateOptions{})
		}
		if err != nil {
			return fmt.Errorf("apply CRD %s: %w", obj.GetName(), err)
		}
		if err := waitEstablished(ctx, dyn, obj.GetName()); err != nil {
			return err
		}
	}
	return nil
}

// crdObjects decodes every CRD of CRDDir under root (kustomization.yaml aside).
func crdObjects(root string) ([]*unstructured.Unstructured, error) {
	files, err := filepath.Glob(filepath.Join(root, CRDDir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	var out []*unstructured.Unstructured
	for _, file := range files {
		if filepath.Base(file) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("read CRD: %w", err)
		}
		docs, err := splitManifest(data)
		if err != nil {
			return nil, fmt.Errorf("decode %s: %w", file, err)
		}
		for _, doc := range docs {
			if doc.APIVersion != crdResource.GroupVersion().String() || doc.Kind != "CustomResourceDefinition" {
				return nil, fmt.Errorf("%s: unexpected %s %s", file, doc.APIVersion, doc.Kind)
			}
			obj := &unstructured.Unstructured{}
			if err := sigsyaml.Unmarshal(doc.raw, &obj.Object); err != nil {
				return nil, fmt.Errorf("decode %s: %w", file, err)
			}
			out = append(out, obj)
		}
	}
	return out, nil
}

func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true,
		func(ctx context.Context) (bool, error) {
			cur, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, nil
			}
			conds, _, _ := unstructured.NestedSlice(cur.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return true, nil
				}
			}
			return false, nil
		})
	if err != nil {
		return fmt.Errorf("CRD %s not established: %w", name, err)
	}
	return nil
}

// PoolResource is the REST resource of KubeletConfigPools.
var PoolResource = schema.GroupVersionResource{Group: v1alpha1.GroupVersion.Group,
	Version: v1alpha1.GroupVersion.Version, Resource: v1alpha1.PoolResource}

// Pools is a client of the cluster's KubeletConfigPools, for tests and the benchmark that write and follow
// pools (a dynamic client: a generated clientset for one resource is not worth its code generator).
func (c *Cluster) Pools() (dynamic.ResourceInterface, error) {
	rc, err := c.RESTConfig()
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("create dynamic client: %w", err)
	}
	return dyn.Resource(PoolResource), nil
}

// KubeletConfigPool reads the pool name.
func (c *Cluster) KubeletConfigPool(ctx context.Context, name string) (*v1alpha1.KubeletConfigPool, error) {
	pools, err := c.Pools()
	if err != nil {
		return nil, err
	}
	u, err := pools.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get kubeletconfigpool %s: %w", name, err)
	}
	var p v1alpha1.KubeletConfigPool
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &p); err != nil {
		return nil, fmt.Errorf("decode kubeletconfigpool %s: %w", name, err)
	}
	return &p, nil
}
