// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"fmt"
	"reflect"
	"strings"
)

// Where dkc-server runs: deploy/base requires control-plane nodes; components/server-dedicated-pool and
// components/server-anywhere are the alternatives. The chart's `placement` value chooses among the three,
// each rendered from its component, so that `helm template --set placement=X` equals kustomize's render of
// the overlay with X's component.
const (
	placementAnnotation = "dkc.dev/placement"
	poolLabelAnnotation = "dkc.dev/placement-pool-label"
	// poolKey is the label and taint key components/server-dedicated-pool names; the chart's
	// dedicatedPool.label and dedicatedPool.taint replace it.
	poolKey = "dkc.dev/server-pool"
)

// placements are the components of the non-default placements, by the value that selects them.
var placements = []struct{ value, component string }{
	{"dedicated", "components/server-dedicated-pool"},
	{"anywhere", "components/server-anywhere"},
}

// serverPod is dkc-server's pod spec in a render.
func serverPod(objs []object) (d object, pod map[string]any, err error) {
	d, err = find(objs, "Deployment", serverName)
	if err != nil {
		return nil, nil, err
	}
	pod, _ = get(d, "spec", "template", "spec").(map[string]any)
	if pod == nil {
		return nil, nil, fmt.Errorf("deployment %s: no pod spec", serverName)
	}
	return d, pod, nil
}

// templatePlacement puts the placement value into dkc-server's Deployment (already templated by
// templateWorkloads): its node affinity, its tolerations (server.tolerations, plus the pool's taint for
// dedicated) and the annotations naming the choice. variants holds the render of each placements component,
// baseTols the tolerations deploy/ renders (server.tolerations' default).
func (g *generator) templatePlacement(objs []object, variants map[string][]object, baseTols []any) error {
	d, pod, err := serverPod(objs)
	if err != nil {
		return err
	}
	if got := get(d, "metadata", "annotations", placementAnnotation); got != "controlPlane" {
		return fmt.Errorf("deployment %s: annotation %s %v, want controlPlane: teach hack/helmchart the new default",
			serverName, placementAnnotation, got)
	}
	affinity := map[string]string{}
	base, err := toYAML(get(pod, "affinity", "nodeAffinity"))
	if err != nil {
		return err
	}
	var poolToleration string
	for _, p := range placements {
		vd, vpod, err := serverPod(variants[p.value])
		if err != nil {
			return fmt.Errorf("deploy/%s: %w", p.component, err)
		}
		if got := get(vd, "metadata", "annotations", placementAnnotation); got != p.value {
			return fmt.Errorf("deploy/%s: annotation %s %v, want %s", p.component, placementAnnotation, got, p.value)
		}
		y, err := toYAML(get(vpod, "affinity", "nodeAffinity"))
		if err != nil {
			return err
		}
		affinity[p.value] = y
		// The chart's tolerations are server.tolerations' (base's by default); a component may add only.
		tols, _ := vpod["tolerations"].([]any)
		if len(tols) < len(baseTols) || !reflect.DeepEqual(tols[:len(baseTols)], baseTols) {
			return fmt.Errorf("deploy/%s changes dkc-server's tolerations beyond adding: the chart cannot follow", p.component)
		}
		switch extra := tols[len(baseTols):]; {
		case p.value == "dedicated" && len(extra) == 1:
			y, err := toYAML(extra)
			if err != nil {
				return err
			}
			poolToleration = y
		case len(extra) != 0:
			return fmt.Errorf("deploy/%s adds tolerations %v: the chart knows only the dedicated pool's", p.component, extra)
		}
	}
	if !strings.Contains(affinity["dedicated"], poolKey) || !strings.Contains(poolToleration, poolKey) {
		return fmt.Errorf("deploy/components/server-dedicated-pool names no %s in its affinity and "+
			"toleration: teach hack/helmchart its key", poolKey)
	}
	label, taint := `{{ .Values.dedicatedPool.label | quote }}`, `{{ .Values.dedicatedPool.taint | quote }}`
	na := get(pod, "affinity").(map[string]any)
	na["nodeAffinity"] = g.tpl.block("", `{{- if eq .Values.placement "dedicated" }}
`+strings.ReplaceAll(affinity["dedicated"], poolKey, label)+`
{{- else if eq .Values.placement "anywhere" }}
`+affinity["anywhere"]+`
{{- else }}
`+base+`
{{- end }}`)
	pod["tolerations"] = g.tpl.block(`or .Values.server.tolerations (eq .Values.placement "dedicated")`,
		`{{- with .Values.server.tolerations }}
{{- toYaml . | nindent `+indentMarker+` }}
{{- end }}
{{- if eq .Values.placement "dedicated" }}
`+strings.ReplaceAll(poolToleration, poolKey, taint)+`
{{- end }}`)
	for _, meta := range []map[string]any{d.meta(), get(d, "spec", "template", "metadata").(map[string]any)} {
		annotations, _ := meta["annotations"].(map[string]any)
		if annotations == nil {
			return fmt.Errorf("deployment %s: no annotations to template", serverName)
		}
		annotations[placementAnnotation] = g.tpl.scalar(`{{ .Values.placement }}`)
		annotations[poolLabelAnnotation] = g.tpl.block(`eq .Values.placement "dedicated"`, label)
	}
	return nil
}

// templateNetworkPolicy writes components/network-policy's objects as one template rendered when
// networkPolicy.enabled, with its two cluster facts as values: the Pod CIDRs refused on the gRPC port and
// Prometheus's namespace.
func (g *generator) templateNetworkPolicy(objs, withPolicy []object) (networkPolicy, error) {
	var np networkPolicy
	have := byID(objs)
	var docs []string
	for _, o := range withPolicy {
		if prev, ok := have[o.id()]; ok {
			if !reflect.DeepEqual(prev, o) {
				return np, fmt.Errorf("deploy/components/network-policy changes %s: the chart cannot follow", o.id())
			}
			continue
		}
		if o.kind() != "NetworkPolicy" {
			return np, fmt.Errorf("deploy/components/network-policy adds %s: the chart knows only NetworkPolicies", o.id())
		}
		for _, rule := range items(o, "spec", "ingress") {
			for _, from := range items(rule, "from") {
				if block, ok := from["ipBlock"].(map[string]any); ok {
					key := "ipv4PodCIDRs"
					if strings.Contains(fmt.Sprint(block["cidr"]), ":") {
						key = "ipv6PodCIDRs"
					}
					np.set(key, block["except"])
					block["except"] = g.tpl.block(".Values.networkPolicy."+key, "yaml")
				}
				if ns, ok := get(from, "namespaceSelector", "matchLabels", "kubernetes.io/metadata.name").(string); ok {
					np.prometheusNamespace = ns
					set(from, g.tpl.scalar(`{{ .Values.networkPolicy.prometheusNamespace | quote }}`),
						"namespaceSelector", "matchLabels", "kubernetes.io/metadata.name")
				}
			}
		}
		y, err := g.tpl.yaml(o)
		if err != nil {
			return np, err
		}
		docs = append(docs, y)
	}
	if len(docs) == 0 || np.prometheusNamespace == "" || np.ipv4PodCIDRs == nil {
		return np, fmt.Errorf("deploy/components/network-policy: no NetworkPolicy with a Pod CIDR and Prometheus's namespace")
	}
	g.add("networkpolicy-dkc-server.yaml",
		"{{- if .Values.networkPolicy.enabled }}\n"+strings.Join(docs, "\n---\n")+"\n{{- end }}")
	return np, nil
}

// networkPolicy holds what components/network-policy renders for its values' defaults.
type networkPolicy struct {
	ipv4PodCIDRs, ipv6PodCIDRs any
	prometheusNamespace        string
}

func (np *networkPolicy) set(key string, v any) {
	if key == "ipv6PodCIDRs" {
		np.ipv6PodCIDRs = v
	} else {
		np.ipv4PodCIDRs = v
	}
}
