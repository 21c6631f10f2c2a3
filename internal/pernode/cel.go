// SPDX-License-Identifier: Apache-2.0

package pernode

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	apiservercel "k8s.io/apiserver/pkg/cel"
	"k8s.io/apiserver/pkg/cel/environment"
)

// env is the CEL environment expressions compile in: Kubernetes' base environment at its default
// compatibility version, the NewExpressions one ValidatingAdmissionPolicy checks new expressions against.
// That version is the minor before the Kubernetes libraries dkc is built with, so an expression this dkc
// accepts still compiles in a dkc built against the previous minor: a downgrade does not turn a pool's
// values into ConfigInvalid.
var env = sync.OnceValues(func() (*cel.Env, error) {
	set, err := environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()).Extend(
		environment.VersionedOptions{
			IntroducedVersion: version.MajorMinor(1, 0),
			EnvOptions:        []cel.EnvOption{cel.Variable("node", cel.DynType)},
		})
	if err != nil {
		return nil, fmt.Errorf("build the CEL environment: %w", err)
	}
	return set.Env(environment.NewExpressions)
})

// compile compiles one expression into a program whose evaluation stops at VAP's per-call cost limit (the
// base environment sets it too; it is repeated here because the bound is what keeps Compute from stalling).
func compile(expression string) (cel.Program, error) {
	e, err := env()
	if err != nil {
		return nil, err
	}
	ast, issues := e.Compile(expression)
	if issues.Err() != nil {
		return nil, issues.Err()
	}
	prog, err := e.Program(ast, cel.CostLimit(celconfig.PerCallLimit))
	if err != nil {
		return nil, fmt.Errorf("program instantiation: %w", err)
	}
	return prog, nil
}

// eval is the value's expression over vars, as a JSON-able Go value.
func (v *value) eval(vars map[string]any) (any, error) {
	out, _, err := v.prog.Eval(vars)
	if err != nil {
		return nil, err
	}
	return fromCEL(out)
}

// nodeVariable is the variable node: the parts of the Node an expression may depend on, under the API's JSON
// names: metadata (name, labels, annotations), spec (providerID, taints) and status (capacity, allocatable,
// nodeInfo). Labels, annotations, capacity, allocatable and taints are always present (empty when the Node has
// none) so that `'x' in node.metadata.labels` works and `node.metadata.labels['x']` fails with CEL's own
// "no such key: x" rather than a confusing one about a missing map.
func nodeVariable(n *corev1.Node) map[string]any {
	type metadata struct {
		Name        string            `json:"name"`
		Labels      map[string]string `json:"labels"`
		Annotations map[string]string `json:"annotations"`
	}
	type spec struct {
		ProviderID string         `json:"providerID"`
		Taints     []corev1.Taint `json:"taints"`
	}
	type status struct {
		Capacity    corev1.ResourceList   `json:"capacity"`
		Allocatable corev1.ResourceList   `json:"allocatable"`
		NodeInfo    corev1.NodeSystemInfo `json:"nodeInfo"`
	}
	v := struct {
		Metadata metadata `json:"metadata"`
		Spec     spec     `json:"spec"`
		Status   status   `json:"status"`
	}{
		Metadata: metadata{Name: n.Name, Labels: orEmpty(n.Labels), Annotations: orEmpty(n.Annotations)},
		Spec:     spec{ProviderID: n.Spec.ProviderID, Taints: n.Spec.Taints},
		Status:   status{Capacity: n.Status.Capacity, Allocatable: n.Status.Allocatable, NodeInfo: n.Status.NodeInfo},
	}
	if v.Spec.Taints == nil {
		v.Spec.Taints = []corev1.Taint{}
	}
	if v.Status.Capacity == nil {
		v.Status.Capacity = corev1.ResourceList{}
	}
	if v.Status.Allocatable == nil {
		v.Status.Allocatable = corev1.ResourceList{}
	}
	// Through JSON so that names, quantities (as their strings) and times are the API's.
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshal the node variable of %s: %v", n.Name, err)) // plain API types always marshal
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		panic(fmt.Sprintf("unmarshal the node variable of %s: %v", n.Name, err))
	}
	return m
}

// canonical is a quantity as the API writes it ("1Gi" for 1024Mi), which is how the config's fields hold one.
func canonical(q apiservercel.Quantity) string {
	r := q.Quantity
	return r.String()
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// fromCEL converts an expression's result into the value its field takes in the KubeletConfiguration's JSON.
func fromCEL(v ref.Val) (any, error) {
	switch x := v.(type) {
	case types.Null:
		return nil, nil
	case types.Bool:
		return bool(x), nil
	case types.Int:
		return int64(x), nil
	case types.Uint:
		return uint64(x), nil
	case types.Double:
		f := float64(x)
		if math.IsNaN(f) || math.IsInf(f, 0) {
			return nil, fmt.Errorf("the result %v is not a JSON number", f)
		}
		// The kubelet's integer fields refuse 110.0, which is what a formula over quantities gives.
		if f == math.Trunc(f) && f >= math.MinInt64 && f < math.MaxInt64 {
			return int64(f), nil
		}
		return f, nil
	case types.String:
		return string(x), nil
	case types.Duration:
		// The form metav1.Duration reads ("1m30s"), for the config's duration fields: time.Duration's own, named
		// so that a String the CEL type may get one day does not change it.
		d := x.Duration
		return d.String(), nil
	case apiservercel.Quantity:
		return canonical(x), nil
	case *apiservercel.Quantity:
		return canonical(*x), nil
	case traits.Lister:
		out := []any{}
		for it := x.Iterator(); it.HasNext() == types.True; {
			e, err := fromCEL(it.Next())
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
		return out, nil
	case traits.Mapper:
		out := map[string]any{}
		for it := x.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			ks, ok := k.(types.String)
			if !ok {
				return nil, fmt.Errorf("the result is a map with a %s key, not a string", k.Type().TypeName())
			}
			e, err := fromCEL(x.Get(k))
			if err != nil {
				return nil, err
			}
			out[string(ks)] = e
		}
		return out, nil
	case *types.Err:
		return nil, x
	}
	if v == nil {
		return nil, errors.New("the expression has no result")
	}
	return nil, fmt.Errorf("the result is a %s, which no KubeletConfiguration field holds", v.Type().TypeName())
}
