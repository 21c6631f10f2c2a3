// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/test/devcluster"
)

// standInCertManagerCRDs declares cert-manager's Issuer, ClusterIssuer and Certificate and trust-manager's
// Bundle without schema, plus trust-manager's trust namespace, so that the cert-manager overlay's objects can
// be dry-run against a cluster without them (they cannot be fetched here). Everything else in the overlay is
// checked by the real apiserver.
var standInCertManagerCRDs = "apiVersion: v1\nkind: Namespace\nmetadata: {name: cert-manager}\n" +
	standInCRD("cert-manager.io", "v1", "Issuer", "issuers", "Namespaced") +
	standInCRD("cert-manager.io", "v1", "ClusterIssuer", "clusterissuers", "Cluster") +
	standInCRD("cert-manager.io", "v1", "Certificate", "certificates", "Namespaced") +
	standInCRD("trust.cert-manager.io", "v1alpha1", "Bundle", "bundles", "Cluster")

// standInCRD is a CustomResourceDefinition of kind that accepts any object.
func standInCRD(group, version, kind, plural, scope string) string {
	return fmt.Sprintf(`---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[4]s.%[1]s
spec:
  group: %[1]s
  names: {kind: %[3]s, listKind: %[3]sList, plural: %[4]s, singular: %[5]s}
  scope: %[6]s
  versions:
    - name: %[2]s
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, group, version, kind, plural, strings.ToLower(kind), scope)
}

func kubectl(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	bin, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is needed for the manifest test: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, append([]string{"--kubeconfig=" + cluster.KubeconfigPath()}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func TestDeployOverlaysDryRunOnTheRealAPIServer(t *testing.T) {
	root, err := devcluster.RepoRoot(".")
	if err != nil {
		wd, _ := os.Getwd()
		root, err = devcluster.RepoRoot(wd)
		if err != nil {
			t.Fatal(err)
		}
	}
	// A copy, so that generated certificates never land in the checkout.
	tmp := t.TempDir()
	if out, err := exec.Command("cp", "-r", filepath.Join(root, "deploy"), tmp).CombinedOutput(); err != nil {
		t.Fatalf("copy deploy/: %v\n%s", err, out)
	}
	if out, err := exec.Command(filepath.Join(tmp, "deploy/overlays/self-signed/gen-certs.sh")).CombinedOutput(); err != nil {
		t.Fatalf("gen-certs.sh: %v\n%s", err, out)
	}
	out := kubectl(t, "", "apply", "--dry-run=server", "-k", filepath.Join(tmp, "deploy/overlays/self-signed"))
	for _, want := range []string{"deployment.apps/dkc-server created (server dry run)", "daemonset.apps/dkc-sidecar created (server dry run)",
		"validatingwebhookconfiguration.admissionregistration.k8s.io/dkc-validate-nodes", "poddisruptionbudget.policy/dkc-server created (server dry run)",
		"secret/dkc-server-tls created (server dry run)", "configmap/dkc-server-ca created (server dry run)"} {
		if !strings.Contains(out, want) {
			t.Errorf("self-signed overlay: %q missing from\n%s", want, out)
		}
	}

	kubectl(t, standInCertManagerCRDs, "apply", "-f", "-")
	kubectl(t, "", "wait", "--for=condition=Established", "crd/issuers.cert-manager.io", "crd/clusterissuers.cert-manager.io",
		"crd/certificates.cert-manager.io", "crd/bundles.trust.cert-manager.io", "--timeout=60s")
	out = kubectl(t, "", "apply", "--dry-run=server", "-k", filepath.Join(tmp, "deploy/overlays/cert-manager"))
	for _, want := range []string{"certificate.cert-manager.io/dkc-server created (server dry run)", "issuer.cert-manager.io/dkc-ca created (server dry run)",
		"certificate.cert-manager.io/dkc-ca created (server dry run)", "bundle.trust.cert-manager.io/dkc-server-ca created (server dry run)",
		"daemonset.apps/dkc-sidecar created (server dry run)"} {
		if !strings.Contains(out, want) {
			t.Errorf("cert-manager overlay: %q missing from\n%s", want, out)
		}
	}
}
