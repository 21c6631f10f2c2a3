// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// signToken makes a bound ServiceAccount token for kube-system/dkc-sidecar on node, signed with the
// cluster's real service-account key, valid from issued to expires: TokenRequest will not mint an expired
// token, so the test signs one exactly as the apiserver would.
func signToken(t *testing.T, node string, issued, expires time.Time) string {
	t.Helper()
	ctx := testContext(t)
	client := adminClient(t)
	sa, err := client.CoreV1().ServiceAccounts("kube-system").Get(ctx, "dkc-sidecar", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(cluster.Dir(), "pki", "sa.key"))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(keyPEM)
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	enc := func(v any) string {
		b, _ := json.Marshal(v)
		return base64.RawURLEncoding.EncodeToString(b)
	}
	header := enc(map[string]string{"alg": "RS256", "typ": "JWT"})
	claims := enc(map[string]any{
		"iss": "https://kubernetes.default.svc.cluster.local", "aud": []string{"dkc"},
		"sub": "system:serviceaccount:kube-system:dkc-sidecar",
		"iat": issued.Unix(), "nbf": issued.Unix(), "exp": expires.Unix(), "jti": "dkc-test-" + node,
		"kubernetes.io": map[string]any{
			"namespace":      "kube-system",
			"serviceaccount": map[string]string{"name": "dkc-sidecar", "uid": string(sa.UID)},
			"node":           map[string]string{"name": node, "uid": string(n.UID)},
		},
	})
	digest := sha256.Sum256([]byte(header + "." + claims))
	sig, err := rsa.SignPKCS1v15(rand.Reader, k.(*rsa.PrivateKey), crypto.SHA256, digest[:])
	if err != nil {
		t.Fatal(err)
	}
	return header + "." + claims + "." + base64.RawURLEncoding.EncodeToString(sig)
}

func TestExpiredTokenIsRefused(t *testing.T) {
	ctx := testContext(t)
	simNode(t, "sim-expiry")
	svc := serviceClient(t)
	report := func(token string) error {
		_, err := svc.ReportStatus(withToken(ctx, token), &dkcv1.ReportStatusRequest{NodeName: "sim-expiry", Status: &dkcv1.NodeConfigStatus{}})
		return err
	}
	// The same construction, still valid, is accepted: the refusal below is for the expiry alone.
	if err := report(signToken(t, "sim-expiry", time.Now().Add(-time.Minute), time.Now().Add(time.Hour))); err != nil {
		t.Fatalf("a valid hand-signed token was refused: %v", err)
	}
	err := report(signToken(t, "sim-expiry", time.Now().Add(-2*time.Hour), time.Now().Add(-time.Hour)))
	if status.Code(err) != codes.Unauthenticated {
		t.Fatalf("expired token: %v, want Unauthenticated", err)
	}
}
