// Package configz turns a kubelet's /configz answer into a KubeletConfiguration file that, when loaded,
// gives back exactly the running config — the seed's `curl …/configz | jq` recipe, done right. configz is
// the v1beta1 object marshalled with omitempty, so a field that runs with an empty value (e.g.
// enforceNodeAllocatable: [] or healthzBindAddress: "") is missing, and loading the file would default it
// to something else. Every field the v1beta1 defaults set but configz omits therefore ran empty, and is
// written out explicitly.
package configz

//go:generate go run ./gen defaults.json

import (
	_ "embed"
	"encoding/json"
	"fmt"

	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"
)

// Decode extracts the "kubeletconfig" object of a /configz response.
func Decode(body []byte) (map[string]any, error) {
	var resp struct {
		KubeletConfig map[string]any `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("decode configz: %w", err)
	}
	if resp.KubeletConfig == nil {
		return nil, fmt.Errorf("configz has no kubeletconfig object")
	}
	return resp.KubeletConfig, nil
}

// defaultsJSON is a defaulted, otherwise empty v1beta1 KubeletConfiguration, generated from the kubelet's
// scheme (gen): kubectl-dkc uses configz without linking the kubelet.
//
//go:embed defaults.json
var defaultsJSON []byte

// defaults is defaultsJSON decoded.
func defaults() (map[string]any, error) {
	var m map[string]any
	if err := json.Unmarshal(defaultsJSON, &m); err != nil {
		return nil, fmt.Errorf("decode the kubelet's defaults: %w", err)
	}
	return m, nil
}

func zeroLike(v any) any {
	switch v.(type) {
	case []any:
		return []any{}
	case map[string]any:
		return map[string]any{}
	case string:
		return ""
	case bool:
		return false
	case float64:
		return 0
	default:
		return nil
	}
}

// Config returns the running config as a complete KubeletConfiguration (kind and apiVersion included),
// with the fields that ran empty written out. set, if not nil, is applied on top (field → new value).
func Config(running map[string]any, set map[string]any) (map[string]any, error) {
	def, err := defaults()
	if err != nil {
		return nil, err
	}
	out := map[string]any{}
	for k, v := range running {
		out[k] = v
	}
	for k, v := range def {
		if _, ok := out[k]; !ok {
			if z := zeroLike(v); z != nil {
				out[k] = z
			}
		}
	}
	for k, v := range set {
		out[k] = v
	}
	out["apiVersion"] = kubeletv1beta1.SchemeGroupVersion.String()
	out["kind"] = "KubeletConfiguration"
	return out, nil
}

// YAML renders a config map as YAML.
func YAML(cfg map[string]any) ([]byte, error) { return yaml.Marshal(cfg) }
