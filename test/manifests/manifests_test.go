// SPDX-License-Identifier: Apache-2.0

// Package manifests checks deploy/ as kustomize renders it, without a cluster: what the hardening of
// issue 30 put into the manifests must stay there. (test/integration applies the overlays to a real
// apiserver with --dry-run=server.)
package manifests

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// object is one rendered object: its kind, name, namespace and YAML.
type object struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
	raw []byte
}

// render runs `kubectl kustomize` on dir (relative to the repository root) and splits its output.
func render(t *testing.T, dir string) []object {
	t.Helper()
	if _, err := exec.LookPath("kubectl"); err != nil {
		// make test needs kubectl anyway (the installed form applies deploy/ with it): a skip here would let
		// a machine without it pass these checks silently.
		t.Fatalf("kubectl not on PATH: it renders deploy/ (kubectl kustomize); install it (docs/development.md)")
	}
	out, err := exec.Command("kubectl", "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
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
			t.Fatal(err)
		}
		o.raw = raw
		objs = append(objs, o)
	}
}

func find(t *testing.T, objs []object, kind, name string, into any) {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Metadata.Name == name {
			if err := sigsyaml.UnmarshalStrict(o.raw, into); err != nil {
				t.Fatalf("%s/%s: %v", kind, name, err)
			}
			return
		}
	}
	t.Fatalf("no %s/%s rendered", kind, name)
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// TestSidecarDaemonSet: Linux nodes only, the opt-out label honoured, the runtime's seccomp profile, the
// metrics port the probes use is the one it listens on, liveness never depends on dkc-server, and --server
// names the Service in the pod's own namespace.
func TestSidecarDaemonSet(t *testing.T) {
	objs := render(t, filepath.Join(repoRoot(t), "deploy/base"))
	var ds appsv1.DaemonSet
	find(t, objs, "DaemonSet", "dkc-sidecar", &ds)
	spec := ds.Spec.Template.Spec
	if spec.NodeSelector["kubernetes.io/os"] != "linux" {
		t.Errorf("nodeSelector %v, want kubernetes.io/os: linux", spec.NodeSelector)
	}
	optOut := false
	if a := spec.Affinity; a != nil && a.NodeAffinity != nil && a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution != nil {
		for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
			for _, e := range term.MatchExpressions {
				if e.Key == "dkc.dev/sidecar" && e.Operator == corev1.NodeSelectorOpNotIn && slices.Equal(e.Values, []string{"disabled"}) {
					optOut = true
				}
			}
		}
	}
	if !optOut {
		t.Error("no required node affinity dkc.dev/sidecar NotIn [disabled]: nodes cannot opt out")
	}
	if spec.SecurityContext == nil || spec.SecurityContext.SeccompProfile == nil || spec.SecurityContext.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Error("pod seccompProfile is not RuntimeDefault")
	}
	c := spec.Containers[0]
	var metricsAddr, server string
	for _, a := range c.Args {
		if v, ok := strings.CutPrefix(a, "--metrics-address="); ok {
			metricsAddr = v
		}
		if v, ok := strings.CutPrefix(a, "--server="); ok {
			server = v
		}
	}
	host, port, err := net.SplitHostPort(metricsAddr)
	if err != nil {
		t.Fatalf("--metrics-address=%q: %v", metricsAddr, err)
	}
	if host != "" {
		t.Errorf("--metrics-address binds %q only: the kubelet probes, and Prometheus scrapes, the node's IP", host)
	}
	if port == "9091" {
		t.Error("--metrics-address on 9091, Calico Felix's metrics port")
	}
	var metricsPort int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			metricsPort = p.ContainerPort
		}
	}
	if metricsPort == 0 || strconv.Itoa(int(metricsPort)) != port {
		t.Errorf("container port metrics = %d, want the --metrics-address port %s", metricsPort, port)
	}
	for name, tc := range map[string]struct {
		p    *corev1.Probe
		path string
	}{"startup": {c.StartupProbe, "/healthz"}, "liveness": {c.LivenessProbe, "/healthz"}, "readiness": {c.ReadinessProbe, "/readyz"}} {
		if tc.p == nil || tc.p.HTTPGet == nil {
			t.Errorf("no %s probe over HTTP", name)
			continue
		}
		if tc.p.HTTPGet.Path != tc.path || tc.p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe GET %s on port %s, want %s on metrics", name, tc.p.HTTPGet.Path, tc.p.HTTPGet.Port.String(), tc.path)
		}
	}
	if server != "dkc-server.$(POD_NAMESPACE).svc:9443" || !hasFieldEnv(c.Env, "POD_NAMESPACE", "metadata.namespace") {
		t.Errorf("--server=%s, want the Service in the pod's own namespace through POD_NAMESPACE from the downward API", server)
	}
}

// TestServerKnowsItsNamespace: dkc-server gets POD_NAMESPACE, which its --namespace check reads.
func TestServerKnowsItsNamespace(t *testing.T) {
	objs := render(t, filepath.Join(repoRoot(t), "deploy/base"))
	var d appsv1.Deployment
	find(t, objs, "Deployment", "dkc-server", &d)
	if !hasFieldEnv(d.Spec.Template.Spec.Containers[0].Env, "POD_NAMESPACE", "metadata.namespace") {
		t.Error("dkc-server has no POD_NAMESPACE from metadata.namespace")
	}
}

// TestCertManagerIssuersAreNamespaced: no ClusterIssuer, so that no Certificate outside dkc-server's
// namespace can be signed by the CA the sidecars trust.
func TestCertManagerIssuersAreNamespaced(t *testing.T) {
	objs := render(t, filepath.Join(repoRoot(t), "deploy/overlays/cert-manager"))
	issuers := 0
	for _, o := range objs {
		switch o.Kind {
		case "ClusterIssuer":
			t.Errorf("ClusterIssuer %s: any namespace's Certificates may use it", o.Metadata.Name)
		case "Issuer", "Certificate":
			if o.Metadata.Namespace != "kube-system" {
				t.Errorf("%s %s in namespace %q, want dkc-server's, kube-system", o.Kind, o.Metadata.Name, o.Metadata.Namespace)
			}
			var ref struct {
				Spec struct {
					IssuerRef struct{ Kind string } `json:"issuerRef"`
				} `json:"spec"`
			}
			_ = sigsyaml.Unmarshal(o.raw, &ref)
			if o.Kind == "Issuer" {
				issuers++
			} else if ref.Spec.IssuerRef.Kind != "Issuer" {
				t.Errorf("Certificate %s: issuerRef kind %q, want Issuer", o.Metadata.Name, ref.Spec.IssuerRef.Kind)
			}
		}
	}
	if issuers == 0 {
		t.Error("no Issuer rendered")
	}
}

// TestServerPlacement: every install path requires control-plane nodes for dkc-server by default (base, each
// overlay, the chart's default value), tolerating their taint; the two alternatives render as
// docs/security.md says (a dedicated pool: its label required, its taint tolerated; anywhere: control-plane
// nodes only preferred); each names its choice in the dkc.dev/placement annotation, on the Deployment and its
// pods, and passes it to dkc-server; dkc-server runs on Linux nodes only.
func TestServerPlacement(t *testing.T) {
	const controlPlane, pool = "node-role.kubernetes.io/control-plane", "dkc.dev/server-pool"
	has := func(terms []corev1.NodeSelectorTerm, key string) bool {
		for _, term := range terms {
			for _, e := range term.MatchExpressions {
				if e.Key == key && e.Operator == corev1.NodeSelectorOpExists {
					return true
				}
			}
		}
		return false
	}
	tolerates := func(tols []corev1.Toleration, key string) bool {
		for _, tol := range tols {
			if tol.Key == key && tol.Operator == corev1.TolerationOpExists && tol.Effect == corev1.TaintEffectNoSchedule {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		name          string
		objs          func(t *testing.T) []object
		placement     string // the annotation
		required      string // the label key required of the node
		preferred     string // the label key only preferred ("" none)
		toleratedKeys []string
	}{
		{"base", func(t *testing.T) []object { return renderWith(t, "deploy/base") },
			"controlPlane", controlPlane, "", []string{controlPlane}},
		{"overlays/self-signed", func(t *testing.T) []object { return renderOverlay(t, "self-signed") },
			"controlPlane", controlPlane, "", []string{controlPlane}},
		{"overlays/dev", func(t *testing.T) []object { return renderOverlay(t, "dev") },
			"controlPlane", controlPlane, "", []string{controlPlane}},
		{"overlays/cert-manager", func(t *testing.T) []object {
			return render(t, filepath.Join(repoRoot(t), "deploy/overlays/cert-manager"))
		},
			"controlPlane", controlPlane, "", []string{controlPlane}},
		// Overlays written before control-plane nodes were the default list it: it must still build.
		{"server-on-control-plane (kept, changes nothing)", func(t *testing.T) []object {
			return renderWith(t, "deploy/base", "deploy/components/server-on-control-plane")
		}, "controlPlane", controlPlane, "", []string{controlPlane}},
		{"server-dedicated-pool", func(t *testing.T) []object {
			return renderWith(t, "deploy/base", "deploy/components/server-dedicated-pool")
		}, "dedicated", pool, "", []string{pool, controlPlane}},
		{"server-anywhere", func(t *testing.T) []object { return renderWith(t, "deploy/base", "deploy/components/server-anywhere") },
			"anywhere", "", controlPlane, []string{controlPlane}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var d appsv1.Deployment
			find(t, tc.objs(t), "Deployment", "dkc-server", &d)
			spec := d.Spec.Template.Spec
			if got := d.Annotations["dkc.dev/placement"]; got != tc.placement {
				t.Errorf("Deployment annotation dkc.dev/placement %q, want %q", got, tc.placement)
			}
			if got := d.Spec.Template.Annotations["dkc.dev/placement"]; got != tc.placement {
				t.Errorf("pod annotation dkc.dev/placement %q, want %q (dkc-server logs it)", got, tc.placement)
			}
			if spec.Affinity == nil || spec.Affinity.NodeAffinity == nil {
				t.Fatal("no node affinity")
			}
			na := spec.Affinity.NodeAffinity
			var required, preferred []corev1.NodeSelectorTerm
			if r := na.RequiredDuringSchedulingIgnoredDuringExecution; r != nil {
				required = r.NodeSelectorTerms
			}
			for _, p := range na.PreferredDuringSchedulingIgnoredDuringExecution {
				preferred = append(preferred, p.Preference)
			}
			switch {
			case tc.required != "" && (len(required) != 1 || !has(required, tc.required)):
				t.Errorf("required node terms %+v: want the one term %s exists", required, tc.required)
			case tc.required == "" && len(required) != 0:
				t.Errorf("required node terms %+v: want none", required)
			}
			if (tc.preferred != "") != has(preferred, tc.preferred) || (tc.preferred == "" && len(preferred) != 0) {
				t.Errorf("preferred node terms %+v: want %q", preferred, tc.preferred)
			}
			for _, key := range tc.toleratedKeys {
				if !tolerates(spec.Tolerations, key) {
					t.Errorf("tolerations %+v: does not tolerate %s:NoSchedule, so it could never run there", spec.Tolerations, key)
				}
			}
			if got := spec.NodeSelector["kubernetes.io/os"]; got != "linux" || len(spec.NodeSelector) != 1 {
				t.Errorf("nodeSelector %v, want kubernetes.io/os: linux", spec.NodeSelector)
			}
			// One control-plane node must run both replicas: spreading them is a preference only.
			if aa := spec.Affinity.PodAntiAffinity; aa != nil && len(aa.RequiredDuringSchedulingIgnoredDuringExecution) > 0 {
				t.Errorf("required pod anti-affinity %+v: one control-plane node could not run both replicas", aa)
			}
			for _, c := range spec.TopologySpreadConstraints {
				if c.WhenUnsatisfiable != corev1.ScheduleAnyway {
					t.Errorf("topology spread %+v: one control-plane node could not run both replicas", c)
				}
			}
			env := map[string]string{}
			for _, e := range spec.Containers[0].Env {
				if e.ValueFrom != nil && e.ValueFrom.FieldRef != nil {
					env[e.Name] = e.ValueFrom.FieldRef.FieldPath
				}
			}
			for name, path := range map[string]string{"NODE_NAME": "spec.nodeName", "DKC_PLACEMENT": "metadata.annotations['dkc.dev/placement']"} {
				if env[name] != path {
					t.Errorf("dkc-server env %s from %q, want %q", name, env[name], path)
				}
			}
			if tc.placement == "dedicated" {
				if got := d.Spec.Template.Annotations["dkc.dev/placement-pool-label"]; got != pool {
					t.Errorf("pod annotation dkc.dev/placement-pool-label %q, want %q", got, pool)
				}
			}
		})
	}

	// The chart installs what base does unless told otherwise (hack/helmchart's tests compare its renders).
	values, err := os.ReadFile(filepath.Join(repoRoot(t), "deploy/helm/dkc/values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Placement string `json:"placement"`
	}
	if err := sigsyaml.Unmarshal(values, &v); err != nil {
		t.Fatal(err)
	}
	if v.Placement != "controlPlane" {
		t.Errorf("deploy/helm/dkc/values.yaml: placement %q, want controlPlane by default", v.Placement)
	}
}

// renderWith renders base (relative to the repository root) with the given components, as an overlay of a
// user's would.
func renderWith(t *testing.T, base string, components ...string) []object {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	k := "resources: [" + rel(base) + "]\n"
	if len(components) > 0 {
		var cs []string
		for _, c := range components {
			cs = append(cs, rel(c))
		}
		k += "components: [" + strings.Join(cs, ", ") + "]\n"
	}
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o600); err != nil {
		t.Fatal(err)
	}
	return render(t, dir)
}

// TestNetworkPolicyComponent: the optional component renders with base, in dkc-server's namespace, selects
// its pods, and names only ports its container has.
func TestNetworkPolicyComponent(t *testing.T) {
	objs := renderWith(t, "deploy/base", "deploy/components/network-policy")
	var np networkingv1.NetworkPolicy
	find(t, objs, "NetworkPolicy", "dkc-server", &np)
	var d appsv1.Deployment
	find(t, objs, "Deployment", "dkc-server", &d)
	if np.Namespace != d.Namespace {
		t.Errorf("NetworkPolicy in %q, dkc-server in %q", np.Namespace, d.Namespace)
	}
	for k, v := range np.Spec.PodSelector.MatchLabels {
		if d.Spec.Template.Labels[k] != v {
			t.Errorf("podSelector %s=%s does not select dkc-server's pods", k, v)
		}
	}
	ports := map[string]bool{}
	for _, p := range d.Spec.Template.Spec.Containers[0].Ports {
		ports[p.Name] = true
	}
	seen := map[string]bool{}
	for _, rule := range np.Spec.Ingress {
		for _, p := range rule.Ports {
			if !ports[p.Port.String()] {
				t.Errorf("ingress port %s is none of dkc-server's container ports", p.Port.String())
			}
			seen[p.Port.String()] = true
		}
	}
	for name := range ports {
		if !seen[name] {
			t.Errorf("container port %s has no ingress rule: nothing could reach it", name)
		}
	}
}

func hasFieldEnv(env []corev1.EnvVar, name, fieldPath string) bool {
	for _, e := range env {
		if e.Name == name && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == fieldPath {
			return true
		}
	}
	return false
}
