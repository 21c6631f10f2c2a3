// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/poll"
)

// helmValues installs the chart with the images the suite built (already in the nodes' containerd), one
// dkc-server replica instead of deploy/'s two, and configs read from dkc-configs only (not kube-system), so
// that both values show in what runs.
const helmValues = `
server:
  image: {repository: dkc.local/dkc-server, tag: dev}
  replicas: 1
sidecar:
  image: {repository: dkc.local/dkc-sidecar, tag: dev}
configNamespaces: [dkc-configs]
`

// runHelm runs Helm against the suite's cluster from the repository root: $HELM when set (a prebuilt
// binary, e.g. go build -modfile=hack/tools/helm/go.mod -o _output/bin/helm helm.sh/helm/v4/cmd/helm),
// else the pinned tool through go tool, which builds it on a cold cache (minutes).
func runHelm(ctx context.Context, t *testing.T, args ...string) (string, error) {
	t.Helper()
	name, pre := "go", []string{"tool", "-modfile=hack/tools/helm/go.mod", "helm"}
	if h := os.Getenv("HELM"); h != "" {
		name, pre = h, nil
	}
	cmd := exec.CommandContext(ctx, name, append(append(pre, "--kubeconfig", cluster.KubeconfigPath()), args...)...)
	cmd.Dir = filepath.Join(mustWd(t), "../..")
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestHelmInstall is docs/helm.md on the installed form: the suite's kustomize install is uninstalled as
// docs/install.md says (kubectl dkc uninstall --yes, kubectl delete -k), the chart deploy/helm/dkc is
// installed with helm (its default TLS mode: a CA Helm generates), every pod becomes ready and node-1 runs
// a config assigned from dkc-configs, then it is uninstalled as docs/helm.md says (kubectl dkc uninstall
// --yes, helm uninstall) and the suite's install (deploy/overlays/dev) is applied again, as found.
//
// Like TestUninstall it takes dkc away and installs it again (it swaps the install), so its file, swap_*,
// sorts after the tests that only need dkc installed (a failed reinstall would break them) and before
// uninstall_test.go; it leaves dkc installed as found.
func TestHelmInstall(t *testing.T) {
	diagnoseOnFailure(t)
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	waitServerSettled(t)
	if out, err := runHelm(ctx, t, "version", "--short"); err != nil {
		t.Fatalf("helm version: %v\n%s", err, out)
	}

	// The suite's install away, as TestUninstall takes it.
	if out, err := kubectlDKC(ctx, "uninstall", "--yes", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl dkc uninstall (kustomize install): %v\n%s", err, out)
	}
	if out, err := runKubectl(ctx, "delete", "-k", cluster.InstallDir(), "--wait=true", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl delete -k: %v\n%s", err, out)
	}
	// Whatever happens below, the suite gets its install back (after a helm release, if one is left).
	reinstalled := false
	t.Cleanup(func() {
		if !reinstalled {
			reinstallKustomize(t, true)
		}
	})

	before := map[string]int{}
	for _, n := range nodes {
		before[n] = kubeletStarts(t, n)
	}
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(helmValues), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := runHelm(ctx, t, "install", "dkc", "deploy/helm/dkc", "--namespace", "kube-system", "-f", values, "--timeout=5m")
	t.Logf("helm install:\n%s", out)
	if err != nil {
		t.Fatalf("helm install: %v", err)
	}
	waitRolledOut(t, "deployment/dkc-server")
	waitRolledOut(t, "daemonset/dkc-sidecar")
	if pods := serverPods(t); len(pods) != 1 || !ready(&pods[0]) {
		t.Fatalf("dkc-server: %d pods, want 1 ready (server.replicas: 1)", len(pods))
	}
	d, err := admin(t).AppsV1().Deployments("kube-system").Get(ctxFor(t), "dkc-server", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if args := strings.Join(d.Spec.Template.Spec.Containers[0].Args, " "); !strings.Contains(args, "--config-namespaces=dkc-configs ") && !strings.HasSuffix(args, "--config-namespaces=dkc-configs") {
		t.Errorf("dkc-server args %q: want --config-namespaces=dkc-configs", args)
	}
	for _, n := range nodes {
		waitRunning(t, n, nil, 2*time.Minute) // each sidecar reports its node, on its local config
		if d := kubeletStarts(t, n) - before[n]; d != 0 {
			t.Errorf("%s: kubelet started %d times for helm install, want 0", n, d)
		}
	}

	// One assignment active, from the namespace the chart created.
	cm := createConfigIn(t, "dkc-configs", "installed-helm", nodeConfig(t, "node-1", 63))
	assign(t, "node-1", cm)
	waitRunning(t, "node-1", cm, 2*time.Minute)
	if got := configzQPS(t, "node-1"); got != 63 {
		t.Errorf("node-1 configz eventRecordQPS = %v, want 63", got)
	}
	if d := kubeletStarts(t, "node-1") - before["node-1"]; d != 1 {
		t.Errorf("node-1: kubelet started %d times for one assignment, want 1", d)
	}

	// docs/helm.md's upgrade, with the values as they are: the serving certificate is signed anew from the
	// CA the install kept (Secret dkc-server-ca-key), the CA itself stays, and the nodes notice nothing;
	// dkc-server (which reloads the certificate) and the sidecars still talk: a new assignment goes through.
	tlsBefore := serverTLS(t)
	if out, err := runHelm(ctx, t, "upgrade", "dkc", "deploy/helm/dkc", "--namespace", "kube-system", "--reset-then-reuse-values", "--timeout=5m"); err != nil {
		t.Fatalf("helm upgrade: %v\n%s", err, out)
	}
	tlsAfter := serverTLS(t)
	if string(tlsAfter["ca.crt"]) != string(tlsBefore["ca.crt"]) {
		t.Errorf("helm upgrade changed the CA: every sidecar would lose dkc-server until its ConfigMap caught up")
	}
	if string(tlsAfter["tls.crt"]) == string(tlsBefore["tls.crt"]) {
		t.Errorf("helm upgrade kept the serving certificate: it is never renewed")
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(tlsAfter["ca.crt"]) {
		t.Fatal("dkc-server-tls ca.crt holds no certificate")
	}
	if block, _ := pem.Decode(tlsAfter["tls.crt"]); block == nil {
		t.Error("dkc-server-tls tls.crt holds no PEM after helm upgrade")
	} else if crt, err := x509.ParseCertificate(block.Bytes); err != nil {
		t.Error(err)
	} else if _, err := crt.Verify(x509.VerifyOptions{Roots: roots, DNSName: "dkc-server.kube-system.svc"}); err != nil {
		t.Errorf("the renewed serving certificate does not verify against the kept CA: %v", err)
	}
	cm2 := createConfigIn(t, "dkc-configs", "installed-helm-upgraded", nodeConfig(t, "node-1", 64))
	assign(t, "node-1", cm2)
	waitRunning(t, "node-1", cm2, 2*time.Minute)
	if d := kubeletStarts(t, "node-1") - before["node-1"]; d != 2 {
		t.Errorf("node-1: kubelet started %d times for two assignments around helm upgrade, want 2", d)
	}
	if d := kubeletStarts(t, "node-2") - before["node-2"]; d != 0 {
		t.Errorf("node-2: kubelet started %d times, want 0", d)
	}

	// docs/helm.md's uninstall: nodes back to their local configs first, then the release.
	if out, err := kubectlDKC(ctx, "uninstall", "--yes", "--timeout=5m"); err != nil {
		t.Fatalf("kubectl dkc uninstall (helm install): %v\n%s", err, out)
	}
	checkNoDKCFiles(t)
	checkNoDKCMarks(t)
	if out, err := runHelm(ctx, t, "uninstall", "dkc", "--namespace", "kube-system", "--wait", "--timeout=5m"); err != nil {
		t.Fatalf("helm uninstall: %v\n%s", err, out)
	}
	if _, err := admin(t).AppsV1().DaemonSets("kube-system").Get(ctxFor(t), "dkc-sidecar", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("daemonset dkc-sidecar after helm uninstall: %v, want NotFound", err)
	}
	reinstalled = true
	reinstallKustomize(t, false)
}

// reinstallKustomize applies the suite's install (deploy/overlays/dev, TestUninstall's way) once the chart's
// namespace dkc-configs is gone, and waits until dkc has settled with every node on its local config.
// afterFailure: a helm release may be left; it goes first, after kubectl dkc uninstall.
func reinstallKustomize(t *testing.T, afterFailure bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if afterFailure {
		if out, err := kubectlDKC(ctx, "uninstall", "--yes", "--timeout=5m"); err != nil {
			t.Errorf("cleanup: kubectl dkc uninstall: %v\n%s", err, out)
		}
		if out, err := runHelm(ctx, t, "uninstall", "dkc", "--namespace", "kube-system", "--ignore-not-found", "--wait", "--timeout=5m"); err != nil {
			t.Errorf("cleanup: helm uninstall: %v\n%s", err, out)
		}
	}
	poll.ForNil(t, 3*time.Minute, time.Second, "namespace dkc-configs to go after helm uninstall", func() error {
		_, err := admin(t).CoreV1().Namespaces().Get(ctx, "dkc-configs", metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err == nil:
			return errors.New("still there")
		}
		return err
	})
	if out, err := runKubectl(ctx, "apply", "-k", cluster.InstallDir()); err != nil {
		t.Fatalf("kubectl apply -k (reinstall): %v\n%s", err, out)
	}
	waitRolledOut(t, "deployment/dkc-server")
	waitRolledOut(t, "daemonset/dkc-sidecar")
	waitServerSettled(t)
	resetAll(t)
}

// serverTLS is the data of dkc-server's serving Secret.
func serverTLS(t *testing.T) map[string][]byte {
	t.Helper()
	sec, err := admin(t).CoreV1().Secrets("kube-system").Get(ctxFor(t), "dkc-server-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return sec.Data
}
