// SPDX-License-Identifier: Apache-2.0

//go:build helm

// The tests here run the pinned Helm (hack/tools/helm/go.mod): building it takes minutes on a cold cache,
// so they sit behind the `helm` build tag: go test -tags helm ./hack/helmchart/...

package chart

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// helm runs the pinned Helm in the repository root: $HELM when set (make builds it once, into
// _output/bin/helm, for these tests and the installed suite's), else through go tool.
func helm(t *testing.T, args ...string) ([]byte, error) {
	t.Helper()
	name, pre := "go", []string{"tool", "-modfile=hack/tools/helm/go.mod", "helm"}
	if h := os.Getenv("HELM"); h != "" {
		name, pre = h, nil
	}
	cmd := exec.Command(name, append(pre, args...)...)
	cmd.Dir = repoRoot
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.New(err.Error() + ": " + stderr.String())
	}
	return out, nil
}

// helmTemplate renders the committed chart as `helm install dkc deploy/helm/dkc -n kube-system -f values`.
func helmTemplate(t *testing.T, namespace, values string) ([]object, error) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := helm(t, "template", "dkc", "deploy/helm/dkc", "--namespace", namespace, "-f", f)
	if err != nil {
		return nil, err
	}
	return parseObjects(t, out), nil
}

func parseObjects(t *testing.T, out []byte) []object {
	t.Helper()
	var objs []object
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(out)))
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatal(err)
		}
		var o object
		if err := sigsyaml.Unmarshal(raw, &o); err != nil {
			t.Fatalf("%v\n%s", err, raw)
		}
		if o != nil {
			objs = append(objs, o)
		}
	}
}

// kustomize renders dir (relative to deploy/) with components, as a user's overlay listing them would.
func kustomize(t *testing.T, dir string, components ...string) []object {
	t.Helper()
	tree, err := loadTree(deployDir)
	if err != nil {
		t.Fatal(err)
	}
	objs, err := tree.renderWith(dir, components...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// certs is the TLS material of a self-signed render: the Secret's ca.crt, tls.crt, tls.key, the CA
// ConfigMap's ca.crt and the webhook's caBundle.
type certs struct{ secretCA, crt, key, configMapCA, caBundle, keptCA, keptKey string }

// withoutCerts blanks the TLS material (after recording it), which differs between any two renders.
func withoutCerts(t *testing.T, objs []object) certs {
	t.Helper()
	var c certs
	for _, o := range objs {
		switch o.id() {
		case "Secret/kube-system/" + tlsSecret:
			d := o["data"].(map[string]any)
			c.secretCA, c.crt, c.key = d["ca.crt"].(string), d["tls.crt"].(string), d["tls.key"].(string)
			o["data"] = nil
		case "ConfigMap/kube-system/" + caConfigMap:
			c.configMapCA, _ = get(o, "data", "ca.crt").(string)
			o["data"] = nil
		case "Secret/kube-system/" + caKeySecret:
			d := o["data"].(map[string]any)
			c.keptCA, c.keptKey = d["tls.crt"].(string), d["tls.key"].(string)
			o["data"] = nil
		case "ValidatingWebhookConfiguration//" + webhookName:
			cc := items(o, "webhooks")[0]["clientConfig"].(map[string]any)
			c.caBundle, _ = cc["caBundle"].(string)
			delete(cc, "caBundle")
		}
	}
	return c
}

// sameObjects fails unless helm's and kustomize's renders hold the same objects, compared as JSON.
func sameObjects(t *testing.T, helmObjs, kustomizeObjs []object) {
	t.Helper()
	h, k := map[string]string{}, map[string]string{}
	for m, objs := range map[*map[string]string][]object{&h: helmObjs, &k: kustomizeObjs} {
		for _, o := range objs {
			b, err := json.Marshal(o)
			if err != nil {
				t.Fatal(err)
			}
			if _, dup := (*m)[o.id()]; dup {
				t.Errorf("%s rendered twice", o.id())
			}
			(*m)[o.id()] = string(b)
		}
	}
	var ids []string
	for id := range h {
		ids = append(ids, id)
	}
	for id := range k {
		if _, ok := h[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		switch {
		case h[id] == "":
			t.Errorf("%s: kustomize renders it, the chart does not", id)
		case k[id] == "":
			t.Errorf("%s: the chart renders it, kustomize does not", id)
		case h[id] != k[id]:
			t.Errorf("%s differs, first at:\n%s", id, firstDifference(h[id], k[id]))
		}
	}
}

// checkSelfSigned: the generated CA signed a serving certificate for dkc-server's Service, and the sidecars'
// ConfigMap and the webhook trust that CA.
func checkSelfSigned(t *testing.T, c certs) {
	t.Helper()
	caPEM, err := base64.StdEncoding.DecodeString(c.secretCA)
	if err != nil {
		t.Fatal(err)
	}
	if c.configMapCA != string(caPEM) || c.caBundle != c.secretCA {
		t.Errorf("ConfigMap %s and the webhook's caBundle are not the Secret's ca.crt", caConfigMap)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("ca.crt holds no certificate: %q", caPEM)
	}
	crtPEM, _ := base64.StdEncoding.DecodeString(c.crt)
	block, _ := pem.Decode(crtPEM)
	if block == nil {
		t.Fatalf("tls.crt holds no PEM: %q", crtPEM)
	}
	crt, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crt.Verify(x509.VerifyOptions{Roots: pool, DNSName: "dkc-server.kube-system.svc", KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("tls.crt does not verify for dkc-server.kube-system.svc: %v", err)
	}
	if c.key == "" {
		t.Error("no tls.key")
	}
	// The CA kept for renewals: the same certificate, with its key.
	if c.keptCA != c.secretCA {
		t.Errorf("Secret %s holds another CA than %s's ca.crt", caKeySecret, tlsSecret)
	}
	keyPEM, _ := base64.StdEncoding.DecodeString(c.keptKey)
	if _, err := tls.X509KeyPair(caPEM, keyPEM); err != nil {
		t.Errorf("Secret %s: the CA's certificate and key do not pair: %v", caKeySecret, err)
	}
}

// TestHelmTemplateEqualsKustomize: with the values an overlay stands for, the chart renders exactly what
// kustomize renders of it, but for the certificates (generated by Helm, placeholders in kustomize's).
func TestHelmTemplateEqualsKustomize(t *testing.T) {
	for _, tc := range []struct {
		overlay, values string
		selfSigned      bool
		components      []string
	}{
		// Each placement value is the self-signed overlay with that placement's component.
		{"overlays/self-signed", "placement: dedicated\n", true, []string{"components/server-dedicated-pool"}},
		{"overlays/self-signed", "placement: anywhere\n", true, []string{"components/server-anywhere"}},
		// The NetworkPolicy, its facts at the component's values.
		{"overlays/self-signed", "networkPolicy: {enabled: true}\n", true, []string{"components/network-policy"}},
		{"overlays/self-signed", "", true, nil},
		{"overlays/dev", `
server: {image: {repository: dkc.local/dkc-server, tag: dev}}
sidecar: {image: {repository: dkc.local/dkc-sidecar, tag: dev}}
configNamespaces: [kube-system, dkc-configs]
`, true, nil},
		{"overlays/cert-manager", "tls: {mode: certManager}\n", false, nil},
	} {
		t.Run(strings.Join(append([]string{tc.overlay}, tc.components...), "+"), func(t *testing.T) {
			got, err := helmTemplate(t, "kube-system", tc.values)
			if err != nil {
				t.Fatal(err)
			}
			want := kustomize(t, tc.overlay, tc.components...)
			if tc.selfSigned {
				checkSelfSigned(t, withoutCerts(t, got))
				withoutCerts(t, want)
				// The CA's key Secret is the chart's own (the kustomize overlay keeps the key in gen-certs.sh's files).
				got = slices.DeleteFunc(got, func(o object) bool { return o.id() == "Secret/kube-system/"+caKeySecret })
			}
			sameObjects(t, got, want)
		})
	}
}

// TestHelmTemplateValues: each value lands where it belongs.
func TestHelmTemplateValues(t *testing.T) {
	const caCert = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
	objs, err := helmTemplate(t, "kube-system", `
server:
  image: {repository: registry.example/dkc-server, tag: v9, digest: "sha256:0123"}
  replicas: 3
  nodeSelector: {pool: system}
  tolerations: [{key: dedicated, operator: Equal, value: system, effect: NoSchedule}]
sidecar:
  image: {repository: registry.example/dkc-sidecar, tag: v9}
  nodeSelector: {kubernetes.io/os: linux, dkc: "on"}
  tolerations: []
configNamespaces: [team-a, team-b]
createConfigNamespaces: false
tls:
  mode: existingSecret
  existingSecret: {name: my-tls, caCert: "`+strings.ReplaceAll(caCert, "\n", `\n`)+`"}
`)
	if err != nil {
		t.Fatal(err)
	}
	byid := byID(objs)
	d := byid["Deployment/kube-system/"+serverName]
	ds := byid["DaemonSet/kube-system/"+sidecarName]
	if d == nil || ds == nil {
		t.Fatalf("no Deployment or DaemonSet in %v", slices.Collect(func(yield func(string) bool) {
			for id := range byid {
				yield(id)
			}
		}))
	}
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	for _, c := range []struct{ what, got, want string }{
		{"replicas", js(get(d, "spec", "replicas")), "3"},
		{"server image", js(items(d, "spec", "template", "spec", "containers")[0]["image"]), `"registry.example/dkc-server@sha256:0123"`},
		{"sidecar image", js(items(ds, "spec", "template", "spec", "containers")[0]["image"]), `"registry.example/dkc-sidecar:v9"`},
		{"sidecar init image", js(items(ds, "spec", "template", "spec", "initContainers")[0]["image"]), `"registry.example/dkc-sidecar:v9"`},
		// Helm merges maps: the default's kubernetes.io/os stays.
		{"server nodeSelector", js(get(d, "spec", "template", "spec", "nodeSelector")), `{"kubernetes.io/os":"linux","pool":"system"}`},
		{"server tolerations", js(get(d, "spec", "template", "spec", "tolerations")), `[{"effect":"NoSchedule","key":"dedicated","operator":"Equal","value":"system"}]`},
		{"sidecar nodeSelector", js(get(ds, "spec", "template", "spec", "nodeSelector")), `{"dkc":"on","kubernetes.io/os":"linux"}`},
		{"sidecar tolerations", js(get(ds, "spec", "template", "spec", "tolerations")), `null`},
		{"tls volume", js(items(d, "spec", "template", "spec", "volumes")[0]["secret"]), `{"secretName":"my-tls"}`},
		{"CA ConfigMap", js(get(byid["ConfigMap/kube-system/"+caConfigMap], "data", "ca.crt")), js(caCert)},
		{"caBundle", js(items(byid["ValidatingWebhookConfiguration//"+webhookName], "webhooks")[0]["clientConfig"].(map[string]any)["caBundle"]), js(b64(caCert))},
	} {
		if c.got != c.want {
			t.Errorf("%s: %s, want %s", c.what, c.got, c.want)
		}
	}
	args := js(items(d, "spec", "template", "spec", "containers")[0]["args"])
	if !strings.Contains(args, `"--config-namespaces=team-a,team-b"`) {
		t.Errorf("dkc-server args %s: want --config-namespaces=team-a,team-b", args)
	}
	for _, id := range []string{
		"Role/team-a/dkc-server-configs", "RoleBinding/team-a/dkc-server-configs", "Role/team-a/dkc-config-editor",
		"Role/team-b/dkc-server-configs", "RoleBinding/team-b/dkc-server-configs", "Role/team-b/dkc-config-editor",
	} {
		if byid[id] == nil {
			t.Errorf("no %s", id)
		}
	}
	for _, id := range []string{
		"Role/kube-system/dkc-server-configs", "Namespace//team-a", "Secret/kube-system/" + tlsSecret, "Certificate/kube-system/dkc-server",
	} {
		if byid[id] != nil {
			t.Errorf("%s rendered", id)
		}
	}
}

// TestHelmTemplatePlacement: the default requires control-plane nodes; dedicated requires the label the
// values name and tolerates their taint beside server.tolerations; each names its choice on the Deployment.
func TestHelmTemplatePlacement(t *testing.T) {
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	for _, tc := range []struct {
		name, values, placement, affinity, tolerations string
	}{
		{"default", "", "controlPlane",
			`{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"node-role.kubernetes.io/control-plane","operator":"Exists"}]}]}}`,
			`[{"effect":"NoSchedule","key":"node-role.kubernetes.io/control-plane","operator":"Exists"}]`},
		{"dedicated-own-keys", "placement: dedicated\ndedicatedPool: {label: example.com/dkc, taint: example.com/dkc-only}\nserver: {tolerations: []}\n",
			"dedicated",
			`{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"example.com/dkc","operator":"Exists"}]}]}}`,
			`[{"effect":"NoSchedule","key":"example.com/dkc-only","operator":"Exists"}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := helmTemplate(t, "kube-system", tc.values)
			if err != nil {
				t.Fatal(err)
			}
			d := byID(objs)["Deployment/kube-system/"+serverName]
			if d == nil {
				t.Fatal("no Deployment")
			}
			pod := get(d, "spec", "template", "spec").(map[string]any)
			for _, c := range []struct{ what, got, want string }{
				{"annotation", js(get(d, "metadata", "annotations", placementAnnotation)), js(tc.placement)},
				{"pod annotation", js(get(d, "spec", "template", "metadata", "annotations", placementAnnotation)), js(tc.placement)},
				{"node affinity", js(get(pod, "affinity", "nodeAffinity")), tc.affinity},
				{"tolerations", js(pod["tolerations"]), tc.tolerations},
				{"nodeSelector", js(pod["nodeSelector"]), `{"kubernetes.io/os":"linux"}`},
			} {
				if c.got != c.want {
					t.Errorf("%s: %s, want %s", c.what, c.got, c.want)
				}
			}
		})
	}
}

// TestHelmTemplateRefuses: values the chart cannot install fail the render with a message that says why.
func TestHelmTemplateRefuses(t *testing.T) {
	for _, tc := range []struct{ name, namespace, values, want string }{
		{"another namespace", "dkc", "", "installs into kube-system only"},
		{"unknown TLS mode", "kube-system", "tls: {mode: acme}\n", `tls.mode "acme"`},
		{"existingSecret without a name", "kube-system", "tls: {mode: existingSecret, existingSecret: {caCert: x}}\n", "tls.existingSecret.name"},
		{"existingSecret without a CA", "kube-system", "tls: {mode: existingSecret, existingSecret: {name: x}}\n", "tls.existingSecret.caCert"},
		{"no config namespace", "kube-system", "configNamespaces: []\n", "configNamespaces"},
		{"unknown placement", "kube-system", "placement: workers\n", `placement "workers"`},
		{"dedicated without a label", "kube-system", "placement: dedicated\ndedicatedPool: {label: \"\"}\n", "dedicatedPool.label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := helmTemplate(t, tc.namespace, tc.values)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("helm template: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestHelmLint: the chart passes Helm's own checks.
func TestHelmLint(t *testing.T) {
	out, err := helm(t, "lint", "deploy/helm/dkc", "--namespace", "kube-system", "--strict")
	if err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
}

// firstDifference shows where two JSON objects first differ, indented, with a line of context before.
func firstDifference(chart, kust string) string {
	indent := func(s string) []string {
		var b bytes.Buffer
		if err := json.Indent(&b, []byte(s), "", "  "); err != nil {
			return []string{s}
		}
		return strings.Split(b.String(), "\n")
	}
	c, k := indent(chart), indent(kust)
	for i := 0; i < max(len(c), len(k)); i++ {
		if i >= len(c) || i >= len(k) || c[i] != k[i] {
			line := func(l []string) string {
				if i < len(l) {
					return l[i]
				}
				return "(end)"
			}
			return "  " + c[max(i-1, 0)] + "\n  chart:     " + line(c) + "\n  kustomize: " + line(k)
		}
	}
	return "(equal when indented)"
}
