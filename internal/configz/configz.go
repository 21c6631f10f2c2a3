// SPDX-License-Identifier: Apache-2.0

// Package configz turns a kubelet's /configz answer into a KubeletConfiguration file that, when loaded,
// gives back exactly the running config — the seed's `curl …/configz | jq` recipe, done right. configz is
// the v1beta1 object marshalled with omitempty, so a field that runs with an empty value (e.g.
// enforceNodeAllocatable: [] or healthzBindAddress: "") is missing, and loading the file would default it
// to something else. Every field the v1beta1 defaults set but configz omits therefore ran empty, and is
// written out explicitly. The defaults are the kubelet's of the node's own minor: they differ between
// minors (fields come and go), so each supported minor's are embedded (defaults/<minor>.json).
package configz

//go:generate ./gen.sh

import (
	"embed"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"

	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
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

// defaultsFS holds, per kubelet minor, a defaulted, otherwise empty v1beta1 KubeletConfiguration generated
// from that minor's scheme (gen.sh): kubectl-dkc uses configz without linking the kubelet.
//
//go:embed defaults/*.json
var defaultsFS embed.FS

// Minors are the kubelet minors whose defaults are embedded, oldest first.
func Minors() []string {
	entries, _ := defaultsFS.ReadDir("defaults")
	var out []string
	for _, e := range entries {
		out = append(out, strings.TrimSuffix(e.Name(), ".json"))
	}
	slices.SortFunc(out, checkapi.CompareMinors)
	return out
}

// defaults are the kubelet's defaults of kubeletVersion's minor ("v1.34.4", as a Node's
// status.nodeInfo.kubeletVersion says).
func defaults(kubeletVersion string) (map[string]any, error) {
	minor := checkapi.Minor(kubeletVersion)
	data, err := defaultsFS.ReadFile(path.Join("defaults", minor+".json"))
	if minor == "" || err != nil {
		m := Minors()
		return nil, fmt.Errorf("kubelet %q is not supported by this dkc (kubelet minors %s–%s)", kubeletVersion, m[0],
			m[len(m)-1])
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("decode the defaults of kubelet %s: %w", minor, err)
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

// Config returns the running config of a kubelet of kubeletVersion as a complete KubeletConfiguration (kind
// and apiVersion included), with the fields that ran empty written out. set, if not nil, is applied on top
// (field → new value).
func Config(kubeletVersion string, running map[string]any, set map[string]any) (map[string]any, error) {
	def, err := defaults(kubeletVersion)
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
