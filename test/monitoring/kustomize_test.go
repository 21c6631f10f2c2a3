// SPDX-License-Identifier: Apache-2.0

package monitoring

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// object is one rendered object, as generic YAML.
type object map[string]any

func (o object) field(path ...string) any {
	var v any = map[string]any(o)
	for _, p := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[p]
	}
	return v
}

func (o object) str(path ...string) string {
	s, _ := o.field(path...).(string)
	return s
}

// render runs `kubectl kustomize` on a kustomization of deploy/base with the component, as an operator's
// overlay would use it. A missing kubectl fails the test: without it nothing here says the component
// renders.
func render(t *testing.T, root string) []object {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil {
		t.Fatalf("kubectl is needed to render %s with `kubectl kustomize`: %v", componentDir, err)
	}
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "resources: [" + rel("deploy/base") + "]\ncomponents: [" + rel(componentDir) + "]\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("kubectl", "kustomize", dir).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("kubectl kustomize: %v\n%s", err, exit.Stderr)
		}
		t.Fatalf("kubectl kustomize: %v", err)
	}
	var objs []object
	dec := yaml.NewDecoder(bytes.NewReader(out))
	for {
		// Into a plain map: yaml.v3 decodes nested mappings into the type of the outer one.
		var o map[string]any
		err := dec.Decode(&o)
		if errors.Is(err, io.EOF) {
			return objs
		}
		if err != nil {
			t.Fatalf("kubectl kustomize output: %v", err)
		}
		objs = append(objs, o)
	}
}

// setsNodeLabel says whether a podMetricsEndpoint copies the pod's node name into the label node, which
// the rules join kube-state-metrics' Node series on and the dashboard filters by.
func setsNodeLabel(endpoint object) bool {
	relabelings, _ := endpoint.field("relabelings").([]any)
	for _, r := range relabelings {
		rl, ok := r.(map[string]any)
		if !ok {
			continue
		}
		rel := object(rl)
		sources, _ := rel.field("sourceLabels").([]any)
		action := strings.ToLower(rel.str("action"))
		if len(sources) == 1 && sources[0] == "__meta_kubernetes_pod_node_name" && rel.str("targetLabel") == "node" &&
			(action == "" || action == "replace") && rel.field("regex") == nil && rel.field("replacement") == nil {
			return true
		}
	}
	return false
}

func find(t *testing.T, objs []object, kind, name string) object {
	t.Helper()
	for _, o := range objs {
		if o.str("kind") == kind && o.str("metadata", "name") == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

// TestComponentRenders: the component renders onto deploy/base; each PodMonitor selects the pods of its
// workload, in their namespace, by a port they have, and gives them the job the rules and the dashboard
// select and the node label the rules join on; the PrometheusRule is the file's; the dashboard's ConfigMap carries the file, with the label
// Grafana's sidecar looks for.
func TestComponentRenders(t *testing.T) {
	root := repoRoot(t)
	objs := render(t, root)
	for job, workload := range jobs {
		pm := find(t, objs, "PodMonitor", job)
		if pm.str("apiVersion") != "monitoring.coreos.com/v1" {
			t.Errorf("PodMonitor %s: apiVersion %s", job, pm.str("apiVersion"))
		}
		w := find(t, objs, workload, job)
		if pm.str("metadata", "namespace") != w.str("metadata", "namespace") {
			t.Errorf("PodMonitor %s in namespace %q, its pods in %q: a PodMonitor without namespaceSelector selects its own namespace",
				job, pm.str("metadata", "namespace"), w.str("metadata", "namespace"))
		}
		podLabels, _ := w.field("spec", "template", "metadata", "labels").(map[string]any)
		selector, _ := pm.field("spec", "selector", "matchLabels").(map[string]any)
		if len(selector) == 0 {
			t.Errorf("PodMonitor %s selects by no label", job)
		}
		for k, v := range selector {
			if podLabels[k] != v {
				t.Errorf("PodMonitor %s selects %s=%v, which %s %s's pods do not carry (%v)", job, k, v, workload, job, podLabels)
			}
		}
		if jl := pm.str("spec", "jobLabel"); podLabels[jl] != job {
			t.Errorf("PodMonitor %s: jobLabel %q gives the job %v, the rules select job %q", job, jl, podLabels[jl], job)
		}
		ports := map[string]bool{}
		containers, _ := w.field("spec", "template", "spec", "containers").([]any)
		for _, c := range containers {
			cps, _ := object(c.(map[string]any)).field("ports").([]any)
			for _, p := range cps {
				if name, ok := p.(map[string]any)["name"].(string); ok {
					ports[name] = true
				}
			}
		}
		endpoints, _ := pm.field("spec", "podMetricsEndpoints").([]any)
		if len(endpoints) == 0 {
			t.Errorf("PodMonitor %s has no podMetricsEndpoints", job)
		}
		for _, ep := range endpoints {
			e := object(ep.(map[string]any))
			if !ports[e.str("port")] {
				t.Errorf("PodMonitor %s scrapes port %q, which %s %s's containers do not name (%v)", job, e.str("port"), workload, job, ports)
			}
			if e.str("path") != "/metrics" {
				t.Errorf("PodMonitor %s scrapes path %q, want /metrics", job, e.str("path"))
			}
			checkScrapesWithAToken(t, objs, pm, e)
			if !setsNodeLabel(e) {
				t.Errorf("PodMonitor %s, port %s: no relabeling sets node from __meta_kubernetes_pod_node_name; the rules join on it (%v)",
					job, e.str("port"), e.field("relabelings"))
			}
		}
	}

	var file map[string]any
	raw, err := os.ReadFile(filepath.Join(root, componentDir, "prometheus-rule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(raw, &file); err != nil {
		t.Fatal(err)
	}
	if pr := find(t, objs, "PrometheusRule", object(file).str("metadata", "name")); !reflect.DeepEqual(pr.field("spec"), file["spec"]) {
		t.Error("the rendered PrometheusRule's spec differs from prometheus-rule.yaml's")
	}

	cm := find(t, objs, "ConfigMap", "dkc-grafana-dashboard")
	if cm.str("metadata", "labels", "grafana_dashboard") != "1" {
		t.Errorf("ConfigMap dkc-grafana-dashboard: labels %v, want grafana_dashboard: \"1\"", cm.field("metadata", "labels"))
	}
	want, err := os.ReadFile(filepath.Join(root, componentDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	data, _ := cm.field("data").(map[string]any)
	if len(data) != 1 {
		t.Errorf("ConfigMap dkc-grafana-dashboard: %d keys, want the dashboard alone", len(data))
	}
	if data["dkc.json"] != string(want) {
		t.Error("ConfigMap dkc-grafana-dashboard: data dkc.json is not dashboard.json")
	}
}

// checkScrapesWithAToken: dkc serves /metrics over HTTPS to callers allowed get on it (--metrics-auth), so
// the endpoint scrapes https, accepts the self-signed certificate or names a CA, and sends the token of a
// ServiceAccount-token Secret in the PodMonitor's namespace whose ServiceAccount is bound to a ClusterRole
// granting get on /metrics.
func checkScrapesWithAToken(t *testing.T, objs []object, pm, e object) {
	t.Helper()
	name, ns := pm.str("metadata", "name"), pm.str("metadata", "namespace")
	if e.str("scheme") != "https" {
		t.Errorf("PodMonitor %s scrapes %q, want https: dkc serves its metrics over HTTPS", name, e.str("scheme"))
	}
	if skip, _ := e.field("tlsConfig", "insecureSkipVerify").(bool); !skip && e.field("tlsConfig", "ca") == nil {
		t.Errorf("PodMonitor %s: tlsConfig %v neither skips verification nor names a CA; the certificate is self-signed", name, e.field("tlsConfig"))
	}
	if e.str("authorization", "type") != "Bearer" {
		t.Errorf("PodMonitor %s: authorization %v, want a Bearer token", name, e.field("authorization"))
		return
	}
	secretName, key := e.str("authorization", "credentials", "name"), e.str("authorization", "credentials", "key")
	var secret object
	for _, o := range objs {
		if o.str("kind") == "Secret" && o.str("metadata", "name") == secretName && o.str("metadata", "namespace") == ns {
			secret = o
		}
	}
	if secret == nil {
		t.Errorf("PodMonitor %s sends the token of Secret %s/%s, which is not rendered", name, ns, secretName)
		return
	}
	sa := secret.str("metadata", "annotations", "kubernetes.io/service-account.name")
	if secret.str("type") != "kubernetes.io/service-account-token" || sa == "" || key != "token" {
		t.Errorf("Secret %s/%s (key %q): type %q, ServiceAccount %q; want a ServiceAccount token, key token", ns, secretName, key,
			secret.str("type"), sa)
		return
	}
	find(t, objs, "ServiceAccount", sa)
	for _, b := range objs {
		if b.str("kind") != "ClusterRoleBinding" {
			continue
		}
		subjects, _ := b.field("subjects").([]any)
		for _, sub := range subjects {
			s := object(sub.(map[string]any))
			if s.str("kind") != "ServiceAccount" || s.str("name") != sa || s.str("namespace") != ns || b.str("roleRef", "kind") != "ClusterRole" {
				continue
			}
			role := find(t, objs, "ClusterRole", b.str("roleRef", "name"))
			rules, _ := role.field("rules").([]any)
			for _, r := range rules {
				urls, _ := r.(map[string]any)["nonResourceURLs"].([]any)
				verbs, _ := r.(map[string]any)["verbs"].([]any)
				if slices.Contains(urls, any("/metrics")) && slices.Contains(verbs, any("get")) {
					return
				}
			}
		}
	}
	t.Errorf("ServiceAccount %s/%s, whose token PodMonitor %s sends, is bound to no ClusterRole granting get on /metrics", ns, sa, name)
}
