// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	sigsyaml "sigs.k8s.io/yaml"
)

// tlsPrelude computes the TLS material once per render into $ca, $crt and $key (base64), which the Secret,
// the CA ConfigMap and the webhook's caBundle below share: Helm renders each template file on its own, so
// they must sit in one file to see the same generated CA.
//
//nolint:lll // the template's lines are the chart's: a break would change the chart's files
const tlsPrelude = `{{- include "dkc.validate" . }}
{{- $ca := "" }}
{{- $caKey := "" }}
{{- $crt := "" }}
{{- $key := "" }}
{{- if eq .Values.tls.mode "selfSigned" }}
{{- $ns := .Release.Namespace }}
{{- /* The names gen-certs.sh gives: the Service's, and 127.0.0.1 for kubectl port-forward. */}}
{{- $names := list "dkc-server" (printf "dkc-server.%s" $ns) (printf "dkc-server.%s.svc" $ns) (printf "dkc-server.%s.svc.cluster.local" $ns) }}
{{- /* The CA is kept across upgrades (lookup; empty under helm template): a new CA would cut every sidecar
off until its ConfigMap volume caught up, as deploy/overlays/self-signed/gen-certs.sh warns. Its key is kept
too (` + "`" + caKeySecret + "`" + `, mounted nowhere), so that every install and upgrade signs a fresh 1-year serving
certificate from it: helm upgrade renews it, and dkc-server reloads it without a restart. */}}
{{- $kept := lookup "v1" "Secret" $ns "` + caKeySecret + `" }}
{{- $old := lookup "v1" "Secret" $ns "dkc-server-tls" }}
{{- if and $kept (hasKey ($kept.data | default dict) "tls.key") }}
{{- $caPair := buildCustomCert (index $kept.data "tls.crt") (index $kept.data "tls.key") }}
{{- $pair := genSignedCert "dkc-server" (list "127.0.0.1") $names 365 $caPair }}
{{- $ca = index $kept.data "tls.crt" }}
{{- $caKey = index $kept.data "tls.key" }}
{{- $crt = $pair.Cert | b64enc }}
{{- $key = $pair.Key | b64enc }}
{{- else if and $old (hasKey ($old.data | default dict) "ca.crt") }}
{{- /* Installed by a chart that did not keep the CA's key: kept as it is (docs/helm.md, renewing). */}}
{{- $ca = index $old.data "ca.crt" }}
{{- $crt = index $old.data "tls.crt" }}
{{- $key = index $old.data "tls.key" }}
{{- else }}
{{- $caPair := genCA "dkc-ca" 3650 }}
{{- $pair := genSignedCert "dkc-server" (list "127.0.0.1") $names 365 $caPair }}
{{- $ca = $caPair.Cert | b64enc }}
{{- $caKey = $caPair.Key | b64enc }}
{{- $crt = $pair.Cert | b64enc }}
{{- $key = $pair.Key | b64enc }}
{{- end }}
{{- else if eq .Values.tls.mode "existingSecret" }}
{{- $ca = required "tls.existingSecret.caCert: the PEM CA certificate that signed the Secret's tls.crt" .Values.tls.existingSecret.caCert | b64enc }}
{{- end }}`

// caKeyDoc is the Secret holding the selfSigned CA (certificate and key): chart-only, read back by
// tlsPrelude's lookup on upgrades; no pod mounts it.
const caKeyDoc = `{{- if and (eq .Values.tls.mode "selfSigned") $caKey }}
---
apiVersion: v1
kind: Secret
metadata:
  name: ` + caKeySecret + `
  namespace: {{ .Release.Namespace }}
  labels:
    app.kubernetes.io/part-of: dkc
type: kubernetes.io/tls
data:
  tls.crt: {{ $ca }}
  tls.key: {{ $caKey }}
{{- end }}`

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// compareOverlays checks that the cert-manager overlay differs from the self-signed one only where the chart
// expects (the TLS objects, the webhook's caBundle and annotation), before anything is templated, and
// returns the objects only cert-manager's has and the webhook annotations it adds.
func compareOverlays(selfSigned, certManager []object) (extra []object, annotations any, err error) {
	ss, cm := byID(selfSigned), byID(certManager)
	var onlySS []string
	for id := range ss {
		if _, ok := cm[id]; !ok {
			onlySS = append(onlySS, id)
		}
	}
	slices.Sort(onlySS)
	want := []string{"ConfigMap/" + installNS + "/" + caConfigMap, "Secret/" + installNS + "/" + tlsSecret}
	if !slices.Equal(onlySS, want) {
		return nil, nil, fmt.Errorf("only the self-signed overlay renders %v, want %v: teach hack/helmchart", onlySS, want)
	}
	webhookID := "ValidatingWebhookConfiguration//" + webhookName
	for _, o := range certManager {
		s, ok := ss[o.id()]
		switch {
		case !ok:
			extra = append(extra, o)
		case o.id() == webhookID:
			annotations = get(o, "metadata", "annotations")
			if get(s, "metadata", "annotations") != nil {
				return nil, nil, fmt.Errorf("%s: the self-signed overlay annotates it too: teach hack/helmchart", webhookID)
			}
			s2, err := deepCopy(s)
			if err != nil {
				return nil, nil, err
			}
			delete(items(s2, "webhooks")[0]["clientConfig"].(map[string]any), "caBundle")
			set(s2, annotations, "metadata", "annotations")
			if !sameJSON(s2, o) {
				return nil, nil, fmt.Errorf("%s: the overlays differ beyond caBundle and annotations: teach hack/helmchart",
					webhookID)
			}
		case !sameJSON(s, o):
			return nil, nil, fmt.Errorf("%s differs between the self-signed and cert-manager overlays: teach hack/helmchart",
				o.id())
		}
	}
	if annotations == nil {
		return nil, nil, fmt.Errorf("the cert-manager overlay adds no annotation to %s", webhookID)
	}
	return extra, annotations, nil
}

// sameJSON compares as JSON: kustomize's maps hold ints where a YAML round trip holds float64s.
func sameJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}

func deepCopy(o object) (object, error) {
	b, err := sigsyaml.Marshal(o)
	if err != nil {
		return nil, err
	}
	var c object
	return c, sigsyaml.Unmarshal(b, &c)
}

// templateTLS writes templates/tls.yaml (the selfSigned and existingSecret material and the webhook) and
// templates/cert-manager.yaml (the cert-manager overlay's own objects).
func (g *generator) templateTLS(ss map[string]object, certManagerOnly []object, annotations any) error {
	secret := ss["Secret/"+installNS+"/"+tlsSecret]
	data, _ := secret["data"].(map[string]any)
	for name, content := range placeholderCerts {
		if data[name] != b64(content) {
			return fmt.Errorf("secret %s: %s is not the file the overlay's secretGenerator reads", tlsSecret, name)
		}
	}
	if len(data) != len(placeholderCerts) {
		return fmt.Errorf("secret %s: keys %v, want those of %v", tlsSecret, data, placeholderCerts)
	}
	data["ca.crt"] = g.tpl.scalar("{{ $ca }}")
	data["tls.crt"] = g.tpl.scalar("{{ $crt }}")
	data["tls.key"] = g.tpl.scalar("{{ $key }}")

	cm := ss["ConfigMap/"+installNS+"/"+caConfigMap]
	if get(cm, "data", "ca.crt") != placeholderCerts["ca.crt"] {
		return fmt.Errorf("ConfigMap %s: ca.crt is not the overlay's ca.crt", caConfigMap)
	}
	set(cm, g.tpl.scalar("{{ $ca | b64dec | toJson }}"), "data", "ca.crt")

	wh := ss["ValidatingWebhookConfiguration//"+webhookName]
	hooks := items(wh, "webhooks")
	if len(hooks) != 1 || get(hooks[0], "clientConfig", "caBundle") != b64(placeholderCerts["ca.crt"]) {
		return fmt.Errorf("%s: want one webhook whose caBundle is the overlay's ca.crt", webhookName)
	}
	set(hooks[0], g.tpl.block("$ca", "scalar"), "clientConfig", "caBundle")
	ann, err := sigsyaml.Marshal(annotations)
	if err != nil {
		return err
	}
	set(wh, g.tpl.block(`eq .Values.tls.mode "certManager"`, string(ann)), "metadata", "annotations")

	var docs []string
	for _, d := range []struct {
		cond string
		o    object
	}{
		{`eq .Values.tls.mode "selfSigned"`, secret},
		{`ne .Values.tls.mode "certManager"`, cm},
		{"", wh},
	} {
		y, err := g.tpl.yaml(d.o)
		if err != nil {
			return err
		}
		if d.cond == "" {
			docs = append(docs, "---\n"+y)
			continue
		}
		docs = append(docs, "{{- if "+d.cond+" }}\n---\n"+y+"\n{{- end }}")
	}
	g.add("tls.yaml", append(append([]string{tlsPrelude}, docs...), caKeyDoc)...)

	cmDocs := []string{`{{- if eq .Values.tls.mode "certManager" }}`}
	for _, o := range certManagerOnly {
		y, err := g.tpl.yaml(o)
		if err != nil {
			return err
		}
		cmDocs = append(cmDocs, "---\n"+y)
	}
	g.add("cert-manager.yaml", append(cmDocs, "{{- end }}")...)
	return nil
}

// templateConfigNamespaces writes templates/config-namespaces.yaml: per configNamespaces entry, dkc-server's
// Role and RoleBinding there (deploy/base's for kube-system, the config-namespace component's for any other),
// and for the others the component's Namespace (createConfigNamespaces) and dkc-config-editor Role.
func (g *generator) templateConfigNamespaces(ss map[string]object, configNS []object) error {
	var added []string
	cn := map[string]object{}
	for _, o := range configNS {
		if _, ok := ss[o.id()]; !ok {
			added = append(added, o.id())
			cn[o.id()] = o
		}
	}
	slices.Sort(added)
	want := []string{
		"Namespace//" + componentNS,
		"Role/" + componentNS + "/" + editorRole,
		"Role/" + componentNS + "/" + configsRole,
		"RoleBinding/" + componentNS + "/" + configsRole,
	}
	if !slices.Equal(added, want) {
		return fmt.Errorf("deploy/components/config-namespace adds %v, want %v: teach hack/helmchart", added, want)
	}
	ns := "{{ $ns }}"
	doc := func(o object) (string, error) {
		y, err := g.tpl.yaml(o)
		return "---\n" + y, err
	}
	var parts []string
	add := func(s ...string) { parts = append(parts, s...) }
	add("{{- include \"dkc.validate\" . }}", "{{- range $ns := .Values.configNamespaces }}",
		`{{- if eq $ns "`+installNS+`" }}`)
	for _, id := range []string{"Role/" + installNS + "/" + configsRole, "RoleBinding/" + installNS + "/" + configsRole} {
		d, err := doc(ss[id])
		if err != nil {
			return err
		}
		add(d)
	}
	add("{{- else }}", "{{- if $.Values.createConfigNamespaces }}")
	n := cn[want[0]]
	set(n, g.tpl.scalar(ns), "metadata", "name")
	d, err := doc(n)
	if err != nil {
		return err
	}
	add(d, "{{- end }}")
	for _, id := range want[1:] {
		o := cn[id]
		set(o, g.tpl.scalar(ns), "metadata", "namespace")
		d, err := doc(o)
		if err != nil {
			return err
		}
		add(d)
	}
	add("{{- end }}", "{{- end }}")
	g.add("config-namespaces.yaml", strings.Join(parts, "\n"))
	return nil
}
