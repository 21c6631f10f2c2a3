// SPDX-License-Identifier: Apache-2.0

package manifests

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	sigsyaml "sigs.k8s.io/yaml"
)

const (
	configNamespaceComponent = "deploy/components/config-namespace"
	withoutKubeSystem        = "deploy/components/config-namespace/without-kube-system"
	dedicatedNamespace       = "dkc-configs"
)

// TestConfigNamespaceComponent: with the component, dkc-server reads configs in dkc-configs as well as
// kube-system (without-kube-system: in dkc-configs alone) and holds in each namespace of --config-namespaces
// exactly the ConfigMap rights base/ grants it in kube-system, and nowhere else; the namespace says what it
// is for, and dkc-config-editor grants ConfigMap writes there and nothing more. It composes with either TLS
// overlay and the other components, and the dev overlay (the installed form's) includes it.
func TestConfigNamespaceComponent(t *testing.T) {
	// What base/ grants dkc-server on configs in kube-system: the component must grant the same, no more.
	baseObjs := render(t, filepath.Join(repoRoot(t), "deploy/base"))
	var want rbacv1.Role
	findIn(t, baseObjs, "Role", "kube-system", "dkc-server-configs", &want)
	if !slices.ContainsFunc(want.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "configmaps") }) {
		t.Fatalf("base/'s Role kube-system/dkc-server-configs has no configmaps rule: %+v", want.Rules)
	}

	for _, tc := range []struct {
		name       string
		render     func(t *testing.T) []object
		namespaces []string // --config-namespaces
	}{
		{"base", func(t *testing.T) []object { return renderWith(t, "deploy/base", configNamespaceComponent) },
			[]string{"kube-system", dedicatedNamespace}},
		{"cert-manager overlay", func(t *testing.T) []object {
			return renderWith(t, "deploy/overlays/cert-manager", configNamespaceComponent)
		}, []string{"kube-system", dedicatedNamespace}},
		{"with the other components", func(t *testing.T) []object {
			return renderWith(t, "deploy/base", "deploy/components/network-policy", "deploy/components/server-on-control-plane", configNamespaceComponent)
		}, []string{"kube-system", dedicatedNamespace}},
		{"dev overlay (the installed form)", renderDev, []string{"kube-system", dedicatedNamespace}},
		{"without-kube-system", func(t *testing.T) []object {
			return renderWith(t, "deploy/base", configNamespaceComponent, withoutKubeSystem)
		}, []string{dedicatedNamespace}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			objs := tc.render(t)
			var d appsv1.Deployment
			find(t, objs, "Deployment", "dkc-server", &d)
			if got := configNamespaces(t, d); !slices.Equal(got, tc.namespaces) {
				t.Errorf("--config-namespaces %v, want %v", got, tc.namespaces)
			}
			checkConfigRoles(t, objs, d, want.Rules, tc.namespaces)

			var ns corev1.Namespace
			findIn(t, objs, "Namespace", "", dedicatedNamespace, &ns)
			if ns.Labels["dkc.dev/config-namespace"] != "true" || !strings.Contains(ns.Annotations["dkc.dev/purpose"], "controls the kubelets") {
				t.Errorf("namespace %s does not say what it is for: labels %v, annotations %v", ns.Name, ns.Labels, ns.Annotations)
			}
			if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
				t.Errorf("namespace %s: pod-security.kubernetes.io/enforce=%q, want restricted (no workload runs there)", ns.Name, ns.Labels["pod-security.kubernetes.io/enforce"])
			}

			var editor rbacv1.Role
			findIn(t, objs, "Role", dedicatedNamespace, "dkc-config-editor", &editor)
			wantEditor := []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"configmaps"},
				Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}}}
			if !rulesEqual(editor.Rules, wantEditor) {
				t.Errorf("Role %s/dkc-config-editor: %+v, want %+v", dedicatedNamespace, editor.Rules, wantEditor)
			}
			for _, o := range objs {
				if o.Kind == "RoleBinding" && roleRefOf(t, o) == "dkc-config-editor" {
					t.Errorf("RoleBinding %s/%s binds dkc-config-editor: who may change kubelets is the operator's choice, not the install's", o.Metadata.Namespace, o.Metadata.Name)
				}
			}
		})
	}

	// The base alone stays as it was: configs in kube-system only, the seed workflow's namespace.
	t.Run("base alone", func(t *testing.T) {
		var d appsv1.Deployment
		find(t, baseObjs, "Deployment", "dkc-server", &d)
		if got := configNamespaces(t, d); !slices.Equal(got, []string{"kube-system"}) {
			t.Errorf("--config-namespaces %v, want [kube-system]", got)
		}
		checkConfigRoles(t, baseObjs, d, want.Rules, []string{"kube-system"})
		for _, o := range baseObjs {
			if o.Metadata.Name == dedicatedNamespace || o.Metadata.Namespace == dedicatedNamespace {
				t.Errorf("base/ renders %s %s/%s: the dedicated namespace is the component's", o.Kind, o.Metadata.Namespace, o.Metadata.Name)
			}
		}
	})
}

// configNamespaces is the value of dkc-server's one --config-namespaces flag.
func configNamespaces(t *testing.T, d appsv1.Deployment) []string {
	t.Helper()
	var values []string
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if v, ok := strings.CutPrefix(a, "--config-namespaces="); ok {
			values = append(values, v)
		}
	}
	if len(values) != 1 {
		t.Fatalf("dkc-server has %d --config-namespaces flags %v, want one (the last would win silently)", len(values), values)
	}
	return strings.Split(values[0], ",")
}

// checkConfigRoles: every namespace in namespaces has a Role dkc-server-configs with exactly rules, bound to
// dkc-server's ServiceAccount in its own namespace; no other namespace has one (dkc-server reads none).
func checkConfigRoles(t *testing.T, objs []object, d appsv1.Deployment, rules []rbacv1.PolicyRule, namespaces []string) {
	t.Helper()
	for _, ns := range namespaces {
		var r rbacv1.Role
		findIn(t, objs, "Role", ns, "dkc-server-configs", &r)
		if !rulesEqual(r.Rules, rules) {
			t.Errorf("Role %s/dkc-server-configs: %+v, want base/'s kube-system rules %+v", ns, r.Rules, rules)
		}
		var b rbacv1.RoleBinding
		findIn(t, objs, "RoleBinding", ns, "dkc-server-configs", &b)
		if b.RoleRef != (rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "dkc-server-configs"}) {
			t.Errorf("RoleBinding %s/dkc-server-configs refers to %+v", ns, b.RoleRef)
		}
		wantSubject := rbacv1.Subject{Kind: rbacv1.ServiceAccountKind, Name: d.Spec.Template.Spec.ServiceAccountName, Namespace: d.Namespace}
		if !slices.Equal(b.Subjects, []rbacv1.Subject{wantSubject}) {
			t.Errorf("RoleBinding %s/dkc-server-configs binds %+v, want dkc-server's ServiceAccount %+v alone", ns, b.Subjects, wantSubject)
		}
	}
	for _, o := range objs {
		if (o.Kind == "Role" || o.Kind == "RoleBinding") && o.Metadata.Name == "dkc-server-configs" && !slices.Contains(namespaces, o.Metadata.Namespace) {
			t.Errorf("%s %s/dkc-server-configs: a namespace not in --config-namespaces %v", o.Kind, o.Metadata.Namespace, namespaces)
		}
	}
}

// findIn is find for an object of one namespace ("" for cluster-scoped ones), as Roles of one name live in
// several.
func findIn(t *testing.T, objs []object, kind, namespace, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Namespace == namespace && o.Metadata.Name == name {
			if err := sigsyaml.UnmarshalStrict(o.raw, into); err != nil {
				t.Fatalf("%s %s/%s: %v", kind, namespace, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s %s/%s rendered", kind, namespace, name)
}

func roleRefOf(t *testing.T, o object) string {
	t.Helper()
	var b rbacv1.RoleBinding
	if err := sigsyaml.Unmarshal(o.raw, &b); err != nil {
		t.Fatal(err)
	}
	return b.RoleRef.Name
}

// rulesEqual compares rules as RBAC reads them: the order of rules and of the values in each does not matter.
func rulesEqual(a, b []rbacv1.PolicyRule) bool {
	key := func(rules []rbacv1.PolicyRule) []string {
		var ks []string
		for _, r := range rules {
			parts := []string{}
			for _, l := range [][]string{r.APIGroups, r.Resources, r.ResourceNames, r.Verbs, r.NonResourceURLs} {
				s := slices.Clone(l)
				slices.Sort(s)
				parts = append(parts, strings.Join(s, ","))
			}
			ks = append(ks, strings.Join(parts, ";"))
		}
		slices.Sort(ks)
		return ks
	}
	return slices.Equal(key(a), key(b))
}

// renderDev renders deploy/overlays/dev as the installed form applies it: a copy of deploy/ with the
// self-signed overlay's certificates from its gen-certs.sh (openssl), so that nothing lands in the checkout.
func renderDev(t *testing.T) []object {
	t.Helper()
	return renderOverlay(t, "dev")
}

// renderOverlay renders deploy/overlays/<name> from a copy of deploy/ whose self-signed overlay has its
// certificates (gen-certs.sh), as renderDev does.
func renderOverlay(t *testing.T, name string) []object {
	t.Helper()
	tmp := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join(repoRoot(t), "deploy"), tmp).CombinedOutput(); err != nil {
		t.Fatalf("copy deploy/: %v\n%s", err, out)
	}
	if out, err := exec.Command("bash", filepath.Join(tmp, "deploy/overlays/self-signed/gen-certs.sh")).CombinedOutput(); err != nil {
		t.Fatalf("gen-certs.sh (openssl): %v\n%s", err, out)
	}
	if _, err := os.Stat(filepath.Join(tmp, "deploy/overlays/self-signed/tls.crt")); err != nil {
		t.Fatal(err)
	}
	return render(t, filepath.Join(tmp, "deploy/overlays", name))
}
