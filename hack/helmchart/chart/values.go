package chart

import (
	"fmt"
	"strings"

	sigsyaml "sigs.k8s.io/yaml"
)

// helpers is templates/_helpers.tpl.
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
{{- if not .Values.configNamespaces }}
{{- fail "configNamespaces: list at least one namespace dkc-server reads configs from" }}
{{- end }}
{{- end }}
`

// notes is templates/NOTES.txt, printed after install and upgrade.
const notes = `{{- /* ` + Header + ` */ -}}
dkc (chart {{ .Chart.Version }}; images {{ .Values.server.image.repository }}:{{ .Values.server.image.tag }}, {{ .Values.sidecar.image.repository }}:{{ .Values.sidecar.image.tag }}) is installed in {{ .Release.Namespace }} (TLS: {{ .Values.tls.mode }}; configs read from {{ join ", " .Values.configNamespaces }}).

  kubectl -n {{ .Release.Namespace }} rollout status deployment/dkc-server
  kubectl -n {{ .Release.Namespace }} rollout status daemonset/dkc-sidecar
  kubectl dkc status

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
func valuesYAML(images map[string]image, p placement) (string, error) {
	f := func(v any, indent int) (string, error) {
		y, err := toYAML(v)
		if err != nil {
			return "", err
		}
		if !strings.Contains(y, "\n") && !strings.HasPrefix(y, "- ") && (strings.HasPrefix(y, "{") || strings.HasPrefix(y, "[") || !strings.Contains(y, ": ")) {
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
	} {
		indent := 4
		if key == "configNamespaces" {
			indent = 2
		}
		y, err := f(v, indent)
		if err != nil {
			return "", err
		}
		vals[key] = y
	}
	img := func(im image) string {
		return fmt.Sprintf("    repository: %s\n    tag: %q\n    digest: %q", im.repository, im.tag, im.digest)
	}
	return fmt.Sprintf(`# %s
# The defaults install what deploy/overlays/self-signed installs (with a CA the chart generates).

server:
  # dkc-server's image; a digest (sha256:...), when set, wins over the tag.
  image:
%s
  # dkc-server replicas: every replica serves the sidecars connected to it (a node whose replica goes moves to
  # another); one, elected, also runs the pool controller. 1 leaves nodes unserved while its pod restarts.
  replicas:%s
  # Where dkc-server may run, beside deploy/base's preference for control-plane nodes (affinity, kept).
  nodeSelector:%s
  tolerations:%s

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
`, Header, img(images["server"]), vals["replicas"], vals["server.ns"], vals["server.tol"],
		img(images["sidecar"]), vals["sidecar.ns"], vals["sidecar.tol"], vals["configNamespaces"]), nil
}

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
