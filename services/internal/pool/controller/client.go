package controller

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// Pools is what the controller calls on KubeletConfigPools, each method one request of the same name.
type Pools interface {
	List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.KubeletConfigPoolList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	// UpdateStatus is PUT .../kubeletconfigpools/NAME/status: it fails with a Conflict when the pool
	// changed since it was read.
	UpdateStatus(ctx context.Context, pool *v1alpha1.KubeletConfigPool) (*v1alpha1.KubeletConfigPool, error)
}

// restPools is Pools over a REST client of dkc.dev/v1alpha1: a few lines instead of a generated
// clientset (no code generator run for one resource).
type restPools struct{ rc rest.Interface }

// NewPools returns a Pools client for cfg's apiserver. CRDs speak JSON only, whatever content type cfg
// prefers (dkc-server's clients ask for protobuf).
func NewPools(cfg *rest.Config) (Pools, error) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("register %s: %w", v1alpha1.GroupVersion, err)
	}
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &v1alpha1.GroupVersion
	c.APIPath = "/apis"
	c.ContentType = runtime.ContentTypeJSON
	c.AcceptContentTypes = runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(scheme).WithoutConversion()
	rc, err := rest.RESTClientFor(c)
	if err != nil {
		return nil, fmt.Errorf("create %s client: %w", v1alpha1.GroupVersion, err)
	}
	return restPools{rc: rc}, nil
}

func (p restPools) List(ctx context.Context, opts metav1.ListOptions) (*v1alpha1.KubeletConfigPoolList, error) {
	out := &v1alpha1.KubeletConfigPoolList{}
	err := p.rc.Get().Resource(v1alpha1.PoolResource).VersionedParams(&opts, metav1.ParameterCodec).Do(ctx).Into(out)
	return out, err
}

func (p restPools) Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
	opts.Watch = true
	return p.rc.Get().Resource(v1alpha1.PoolResource).VersionedParams(&opts, metav1.ParameterCodec).Watch(ctx)
}

func (p restPools) UpdateStatus(ctx context.Context, pool *v1alpha1.KubeletConfigPool) (*v1alpha1.KubeletConfigPool, error) {
	out := &v1alpha1.KubeletConfigPool{}
	err := p.rc.Put().Resource(v1alpha1.PoolResource).Name(pool.Name).SubResource("status").
		VersionedParams(&metav1.UpdateOptions{FieldManager: FieldManager}, metav1.ParameterCodec).Body(pool).Do(ctx).Into(out)
	return out, err
}
