// SPDX-License-Identifier: Apache-2.0

// Package pernode computes a pool's kubelet config for one node: the fields its spec.perNode.values compute
// from the Node, then the node's unexpired exceptions merged over them.
//
// Expressions are CEL, in the environment Kubernetes gives ValidatingAdmissionPolicy, because that is the
// language cluster operators already write node-dependent rules in, with the same quantity, regex, list and
// string libraries and the same per-call cost limit: an expression cannot loop, and one too costly fails
// instead of stalling the controller. They set single fields, not whole configs, so that the pool's ConfigMap
// stays the one config every node shares and reviews read: a node differs from it only where a value or an
// exception says so, and nodes whose values come out equal get byte-identical content, hence the same
// revision, rather than one revision per node.
package pernode

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/google/cel-go/cel"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	corev1 "k8s.io/api/core/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
)

// Program is a pool's spec.perNode, compiled. It is safe for concurrent use.
type Program struct {
	values     []value
	exceptions []exception
}

// value is one spec.perNode.values item, compiled.
type value struct {
	name  string // spec.perNode.values[i] (field), as errors name it
	path  []string
	field string
	prog  cel.Program
}

// exception is one spec.perNode.exceptions item, its patch checked to be a JSON object.
type exception struct {
	name    string // spec.perNode.exceptions[i] (name), as errors name it
	label   string // the exception's own name, as Result.Values lists it
	node    string
	patch   []byte
	expires time.Time // zero: never
}

// Compile compiles spec's expressions (nil spec or no values and no exceptions: nil Program, nil error).
// The error names the value (`spec.perNode.values[0] (systemReserved.memory): <CEL issues>`) or the exception
// whose patch is not a JSON object (`spec.perNode.exceptions[1] (incident-4711): patch ...`).
func Compile(spec *v1alpha1.PerNode) (*Program, error) {
	if spec == nil || len(spec.Values) == 0 && len(spec.Exceptions) == 0 {
		return nil, nil
	}
	p := &Program{}
	for i, v := range spec.Values {
		name := fmt.Sprintf("spec.perNode.values[%d] (%s)", i, v.Field)
		path := strings.Split(v.Field, ".")
		for _, s := range path {
			if s == "" {
				return nil, fmt.Errorf("%s: field has an empty segment", name)
			}
		}
		prog, err := compile(v.Expression)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		p.values = append(p.values, value{name: name, path: path, field: v.Field, prog: prog})
	}
	for i, e := range spec.Exceptions {
		name := fmt.Sprintf("spec.perNode.exceptions[%d] (%s)", i, e.Name)
		var obj map[string]json.RawMessage
		if err := json.Unmarshal(e.Patch.Raw, &obj); err != nil || obj == nil {
			return nil, fmt.Errorf("%s: patch is not a JSON object: %s", name, abbreviate(e.Patch.Raw))
		}
		x := exception{name: name, label: e.Name, node: e.Node, patch: e.Patch.Raw}
		if e.Expires != nil {
			x.expires = e.Expires.Time
		}
		p.exceptions = append(p.exceptions, x)
	}
	return p, nil
}

// Result is one node's config.
type Result struct {
	// Data is the ConfigMap data with the key's document computed for the node.
	Data map[string]string
	// Values are "field=<value as compact JSON>" per value in spec order, then "exception NAME" per exception
	// applied.
	Values []string
	// NextChange is the soonest Expires of an exception of this node still in the future (it applies now, and
	// stops then); zero: none.
	NextChange time.Time
}

// MaxValueSize bounds one value's result, as JSON: a field of a kubelet config is a quantity, a number, a
// short list or map; an expression that builds more (a string repeated) is a mistake, and its result would
// be copied into the snapshot and the pool's status.
const MaxValueSize = 4096

// Compute returns node's config: data with key's KubeletConfiguration document having each value's field set
// to its expression's value over node (in spec order), then the node's unexpired exceptions (Expires unset or
// after now) merged over it as JSON merge patches (RFC 7386), in spec order. When no value exists and no
// exception applies to the node, Data is a copy of data, not re-serialised, so that such a node's revision is
// the pool's own; otherwise the document is written back as YAML with sorted keys and its numbers as they
// were. Other data keys are kept as they are. A nil Program returns a copy of data.
func (p *Program) Compute(node *corev1.Node, key string, data map[string]string, now time.Time) (Result, error) {
	res := Result{Data: maps.Clone(data)}
	if res.Data == nil {
		res.Data = map[string]string{}
	}
	if p == nil {
		return res, nil
	}
	var applied []*exception
	for i := range p.exceptions {
		e := &p.exceptions[i]
		if e.node != node.Name || !e.expires.IsZero() && !e.expires.After(now) {
			continue
		}
		applied = append(applied, e)
		if !e.expires.IsZero() && (res.NextChange.IsZero() || e.expires.Before(res.NextChange)) {
			res.NextChange = e.expires
		}
	}
	if len(p.values) == 0 && len(applied) == 0 {
		return res, nil
	}
	text, ok := data[key]
	if !ok {
		return Result{}, fmt.Errorf("node %s: the data has no key %q", node.Name, key)
	}
	doc, err := decode([]byte(text))
	if err != nil {
		return Result{}, fmt.Errorf("node %s: key %s: %w", node.Name, key, err)
	}
	if len(p.values) > 0 {
		vars := map[string]any{"node": nodeVariable(node)}
		for _, v := range p.values {
			val, err := v.eval(vars)
			if err != nil {
				return Result{}, fmt.Errorf("%s on node %s: %w", v.name, node.Name, err)
			}
			shown := compact(val)
			if len(shown) > MaxValueSize {
				return Result{}, fmt.Errorf("%s on node %s: its value is %d bytes of JSON, more than %d", v.name,
					node.Name, len(shown), MaxValueSize)
			}
			if err := set(doc, v.path, val); err != nil {
				return Result{}, fmt.Errorf("%s on node %s: %w", v.name, node.Name, err)
			}
			res.Values = append(res.Values, v.field+"="+shown)
		}
	}
	for _, e := range applied {
		if doc, err = mergePatch(doc, e.patch); err != nil {
			return Result{}, fmt.Errorf("%s on node %s: %w", e.name, node.Name, err)
		}
		res.Values = append(res.Values, "exception "+e.label)
	}
	out, err := encode(doc)
	if err != nil {
		return Result{}, fmt.Errorf("node %s: key %s: %w", node.Name, key, err)
	}
	res.Data[key] = string(out)
	return res, nil
}

// mergePatch merges the JSON merge patch over doc. It goes through JSON, whose numbers json-patch keeps as
// written, so that the patch's and the document's numbers stay exact.
func mergePatch(doc map[string]any, patch []byte) (map[string]any, error) {
	in, err := json.Marshal(doc)
	if err != nil {
		return nil, err
	}
	out, err := jsonpatch.MergePatch(in, patch)
	if err != nil {
		return nil, fmt.Errorf("merge patch: %w", err)
	}
	return decodeJSON(out)
}

// compact is v as compact JSON, as Result.Values lists it; HTML characters are kept as they are, since it is
// read by people, not embedded in a page.
func compact(v any) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		// Unreachable: v came out of fromCEL, which only returns JSON-able values.
		return fmt.Sprintf("%v", v)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// abbreviate keeps an error about a patch to one line of reasonable length.
func abbreviate(raw []byte) string {
	const limit = 80
	s := strings.Join(strings.Fields(string(raw)), " ")
	if s == "" {
		return "(empty)"
	}
	if r := []rune(s); len(r) > limit {
		return string(r[:limit]) + "…"
	}
	return s
}
