// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"fmt"
	"strings"

	sigsyaml "sigs.k8s.io/yaml"
)

// helpers is templates/_helpers.tpl.
//
//nolint:lll // the template's lines are the chart's: a break would change the chart's files
const helpers = `{{- /* ` + Header + ` */ -}}

{{- /* dkc.image: an image reference from {repository, tag, digest}; the digest wins (make images pins by it). */}}
{{- define "dkc.image" -}}
{{- if .digest }}{{ .repository }}@{{ .digest }}{{ else }}{{ .repository }}:{{ required "an image needs a tag or a digest" .tag }}{{ end }}
{{- end }}

{{- /* dkc.tlsSecretName: the Secret dkc-server serves from. */}}
{{- define "dkc.tlsSecretName" -}}
{{- if eq .Values.tls.mode "existingSecret" }}{{ required "tls.existingSecret.name: the kubernetes.io/tls Secret (tls.crt, tls.key) in the release namespace" .Values.tls.existingSecret.name }}{{ else }}dkc-server-tls{{ end }}
{{- end }}

{{- /* dkc.validate fails the render on values the chart cannot install. */}}
{{- define "dkc.validate" -}}
{{- if ne .Release.Namespace "` + installNS + `" }}
{{- fail (printf "dkc installs into ` + installNS + ` only (helm install -n ` + installNS + `), not %q: deploy/ names its namespace in RBAC subjects, the webhook and --allowed-service-accounts; use kustomize for another (docs/helm.md)" .Release.Namespace) }}
{{- end }}
{{- if not (has .Values.tls.mode (list "selfSigned" "existingSecret" "certManager")) }}
{{- fail (printf "tls.mode %q: want selfSigned, existingSecret or certManager" .Values.tls.mode) }}
{{- end }}
{{- if not (has .Values.placement (list "controlPlane" "dedicated" "anywhere")) }}
{{- fail (printf "placement %q: want controlPlane, dedicated or anywhere" .Values.placement) }}
{{- end }}
{{- if and (eq .Values.placement "dedicated") (not (and .Values.dedicatedPool.label .Values.dedicatedPool.taint)) }}
{{- fail "placement dedicated: set dedicatedPool.label and dedicatedPool.taint, the label and taint keys of the pool's nodes" }}
{{- end }}
{{- if not .Values.configNamespaces }}
{{- fail "configNamespaces: list at least one namespace dkc-server reads configs from" }}
{{- end }}
{{- end }}
`

// notes is templates/NOTES.txt, printed after install and upgrade.
//
//nolint:lll // the template's lines are the chart's: a break would change the chart's files
const notes = `{{- /* ` + Header + ` */ -}}
dkc (chart {{ .Chart.Version }}; images {{ .Values.server.image.repository }}:{{ .Values.server.image.tag }}, {{ .Values.sidecar.image.repository }}:{{ .Values.sidecar.image.tag }}) is installed in {{ .Release.Namespace }} (TLS: {{ .Values.tls.mode }}; configs read from {{ join ", " .Values.configNamespaces }}).

  kubectl -n {{ .Release.Namespace }} rollout status deployment/dkc-server
  kubectl -n {{ .Release.Namespace }} rollout status daemonset/dkc-sidecar
  kubectl dkc status

{{ if eq .Values.placement "controlPlane" -}}
dkc-server runs on control-plane nodes only (placement: controlPlane). Where none accepts pods, its pods stay
Pending: choose placement=dedicated (a node pool of its own) or, accepting the risk, placement=anywhere.
{{- else if eq .Values.placement "dedicated" -}}
dkc-server runs only on nodes labelled {{ .Values.dedicatedPool.label }} that may carry the taint
{{ .Values.dedicatedPool.taint }}:NoSchedule (placement: dedicated). Whoever is root on one of them is root on
every node: guard that pool as a control plane.
{{- else -}}
WARNING: dkc-server may run on any node (placement: anywhere). Root on a worker hosting a replica reaches
every node: that worker holds dkc-server's serving key and the ServiceAccount that assigns configs to Nodes.
{{- end }}
{{- if eq .Values.tls.mode "certManager" }}
cert-manager's controller reads dkc's CA key (the Secret dkc-ca): root on the node hosting it can mint a
certificate every sidecar trusts. Run it where dkc-server runs (its chart's nodeSelector and tolerations).
{{- end }}
(docs/security.md, "Where dkc-server runs" and "cert-manager".)

Uninstall in two steps: first ` + "`kubectl dkc uninstall --yes`" + ` (nodes back to their local kubelet config),
then ` + "`helm uninstall {{ .Release.Name }} -n {{ .Release.Namespace }}`" + `. docs/helm.md says why.
`

func chartYAML(c Config) string {
	return fmt.Sprintf(`# %s
apiVersion: v2
name: dkc
description: >-
  dkc: kubelet configuration from ConfigMaps, rolled out per node and per pool by dkc-server (Deployment)
  and dkc-sidecar (DaemonSet). Generated from the kustomize manifests in deploy/.
type: application
version: %s
appVersion: %q
`, Header, c.Version, c.AppVersion)
}

// readme is the chart's README.md.
const readme = `<!-- ` + Header + ` -->
# dkc Helm chart

This chart is generated from ` + "`deploy/`" + ` (the kustomize manifests, which stay the source of truth) by
` + "`hack/helmchart`" + `: ` + "`make chart`" + ` regenerates it, and a unit test fails when it is stale. Do not
edit it by hand: change ` + "`deploy/`" + ` or the generator.
The templates hold the objects as kustomize renders them, without the manifests' comments: why each
setting is what it is, is said in ` + "`deploy/`" + `.

    helm install dkc deploy/helm/dkc -n kube-system

The values are documented in values.yaml; install, upgrade, the TLS modes, uninstall and what the chart
cannot express that kustomize can are in docs/helm.md.
`

func toYAML(v any) (string, error) {
	b, err := sigsyaml.Marshal(v)
	if err != nil {
		return "", err
	}
	return strings.TrimRight(string(b), "\n"), nil
}

// valuesYAML writes values.yaml: the defaults are what deploy/ renders, so the default install is the
// self-signed overlay's.
func valuesYAML(images map[string]image, p placement, np networkPolicy) (string, error) {
	vals, err := valueBlocks(p, np)
	if err != nil {
		return "", err
	}
	img := func(im image) string {
		return fmt.Sprintf("    repository: %s\n    tag: %q\n    digest: %q", im.repository, im.tag, im.digest)
	}
	return fmt.Sprintf(valuesTemplate, Header,
		img(images["server"]), vals["replicas"], vals["server.ns"], vals["server.tol"], poolKey, poolKey,
		img(images["sidecar"]), vals["sidecar.ns"], vals["sidecar.tol"], vals["configNamespaces"],
		vals["np.ipv4"], vals["np.ipv6"], np.prometheusNamespace), nil
}

// valueBlocks renders the values that come from deploy/'s placement and network policy, keyed as
// valuesYAML uses them, each ready to follow its key in valuesTemplate: a scalar or a flow value on the
// key's line, a block indented beneath it.
func valueBlocks(p placement, np networkPolicy) (map[string]string, error) {
	f := func(v any, indent int) (string, error) {
		y, err := toYAML(v)
		if err != nil {
			return "", err
		}
		if !strings.Contains(y, "\n") && !strings.HasPrefix(y, "- ") &&
			(strings.HasPrefix(y, "{") || strings.HasPrefix(y, "[") || !strings.Contains(y, ": ")) {
			return " " + y, nil
		}
		return "\n" + indentLines(y, indent), nil
	}
	vals := map[string]string{}
	for key, v := range map[string]any{
		"replicas":         p.replicas,
		"configNamespaces": p.configNamespaces,
		"server.ns":        orEmptyMap(p.nodeSelector["server"]),
		"server.tol":       orEmptyList(p.tolerations["server"]),
		"sidecar.ns":       orEmptyMap(p.nodeSelector["sidecar"]),
		"sidecar.tol":      orEmptyList(p.tolerations["sidecar"]),
		"np.ipv4":          orEmptyList(np.ipv4PodCIDRs),
		"np.ipv6":          orEmptyList(np.ipv6PodCIDRs),
	} {
		indent := 4
		if key == "configNamespaces" || strings.HasPrefix(key, "np.") {
			indent = 2
		}
		y, err := f(v, indent)
		if err != nil {
			return nil, err
		}
		vals[key] = y
	}
	return vals, nil
}

// valuesTemplate is values.yaml, filled in by valuesYAML. Its comments are the values' documentation, which
// helm users read in the file: they stay beside each value rather than in Go.
const valuesTemplate = `# %s
# The defaults install what deploy/overlays/self-signed installs (with a CA the chart generates).

server:
  # dkc-server's image; a digest (sha256:...), when set, wins over the tag.
  image:
%s
  # dkc-server replicas: every replica serves the sidecars connected to it (a node whose replica goes moves to
  # another); one, elected, also runs the pool controller. 1 leaves nodes unserved while its pod restarts.
  replicas:%s
  # Further constraints on dkc-server's nodes, beside its placement (below). The control-plane taint's
  # toleration lets it run there; dedicated adds the pool's taint's.
  nodeSelector:%s
  tolerations:%s

# Where dkc-server runs (docs/security.md, "Where dkc-server runs"). A replica holds the serving key and the
# ServiceAccount that creates revision snapshots and assigns Nodes: root on its node is root on every node.
# controlPlane: control-plane nodes only (node-role.kubernetes.io/control-plane), tolerating their taint;
#   where none accepts pods (most managed clusters) the pods stay Pending until you choose another.
# dedicated: only nodes labelled dedicatedPool.label, tolerating the taint dedicatedPool.taint (NoSchedule)
#   that only dkc-server should tolerate (deploy/components/server-dedicated-pool):
#     kubectl label node <node> dkc.dev/server-pool=true
#     kubectl taint node <node> dkc.dev/server-pool=true:NoSchedule
# anywhere: any Linux node, control-plane nodes preferred (deploy/components/server-anywhere). ACCEPTS THE
#   RISK that root on a worker hosting a replica reaches every node.
placement: controlPlane
dedicatedPool:
  # The label key the pool's nodes carry (any value).
  label: %s
  # The key of the NoSchedule taint the pool's nodes carry (any value).
  taint: %s

sidecar:
  # dkc-sidecar's image, for its init container too.
  image:
%s
  # Which nodes run a sidecar, i.e. which nodes dkc manages. Nodes labelled dkc.dev/sidecar=disabled never do
  # (affinity, kept). The default tolerates every taint: a node without its sidecar cannot be reconfigured.
  nodeSelector:%s
  tolerations:%s

# Namespaces dkc-server reads kubelet configs from (--config-namespaces). Each gets dkc-server's Role
# dkc-server-configs; each but kube-system also gets the Role dkc-config-editor to bind to the people who
# may change kubelet configs (deploy/components/config-namespace, docs/install.md).
configNamespaces:%s
# Create each config namespace other than kube-system (restricted Pod Security, as the component does).
# They are the release's: helm uninstall, or an upgrade that drops one from configNamespaces or sets this
# false, deletes it with every config in it. false: the namespaces exist already and stay yours.
createConfigNamespaces: true

tls:
  # selfSigned: the chart generates a CA (10 years) and dkc-server's certificate (1 year) at install and
  #   keeps them on upgrade (lookup); docs/helm.md says how to renew.
  # existingSecret: a kubernetes.io/tls Secret you made (e.g. with deploy/overlays/self-signed/gen-certs.sh)
  #   in the release namespace, and the CA that signed it.
  # certManager: cert-manager's namespaced Issuers and trust-manager's Bundle, as deploy/overlays/cert-manager
  #   (trust-manager must run with trust namespace kube-system).
  mode: selfSigned
  existingSecret:
    # Name of the Secret holding tls.crt and tls.key.
    name: ""
    # PEM CA certificate (bundle) that signed tls.crt: the sidecars and the webhook trust it.
    caCert: ""

# deploy/components/network-policy's NetworkPolicy, which admits to dkc-server's pods only what must reach
# them (docs/security.md, "NetworkPolicy"). It needs a network plugin that enforces NetworkPolicy, and two
# facts about your cluster: set them when you enable it.
networkPolicy:
  enabled: false
  # Your Pod CIDRs (--cluster-cidr), refused on the gRPC port: the sidecars run in the host's network,
  # so pods are told from them by address.
  ipv4PodCIDRs:%s
  # On dual-stack clusters.
  ipv6PodCIDRs:%s
  # The namespace Prometheus runs in, admitted to the metrics port.
  prometheusNamespace: %s
`

func orEmptyMap(v any) any {
	if v == nil {
		return map[string]any{}
	}
	return v
}

func orEmptyList(v any) any {
	if v == nil {
		return []any{}
	}
	return v
}
