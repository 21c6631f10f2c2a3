// SPDX-License-Identifier: Apache-2.0

//go:build integration

package installed

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Where Prometheus scrapes dkc: each dkc-server pod's IP on the Deployment's metrics port, and each node's
// address on the sidecar's (deploy/base).
const (
	serverMetricsPort  = 9090
	sidecarMetricsPort = 10395
)

// TestMetricsNeedAToken: dkc-server's metrics (each pod's IP, as a PodMonitor scrapes them) and every sidecar's
// (each node's address) are served over HTTPS to callers the apiserver allows get on /metrics, as the Kubernetes
// components serve theirs: no token is refused (401), a ServiceAccount token without the role too (403), one
// bound to the ClusterRole dkc-metrics-reader gets the metrics; the kubelet's probe paths answer without one.
func TestMetricsNeedAToken(t *testing.T) {
	diagnoseOnFailure(t)
	ctx := ctxFor(t)
	reader := serviceAccountToken(t, ctx, "metrics-test-reader", "dkc-metrics-reader")
	nobody := serviceAccountToken(t, ctx, "metrics-test-nobody", "")

	var targets []string
	for _, p := range waitServerSettled(t) {
		targets = append(targets, net.JoinHostPort(p.Status.PodIP, strconv.Itoa(serverMetricsPort)))
	}
	for _, n := range cluster.State().Nodes {
		targets = append(targets, net.JoinHostPort(n.IP, strconv.Itoa(sidecarMetricsPort)))
	}
	for _, target := range targets {
		checkMetricsGuarded(t, ctx, target, reader, nobody)
	}
}

// checkMetricsGuarded scrapes target (host:port) as nobody, with the token nobody (no role) and with reader
// (dkc-metrics-reader), and its probe paths without a token.
func checkMetricsGuarded(t *testing.T, ctx context.Context, target, reader, nobody string) {
	t.Helper()
	if code, _, err := scrape(ctx, "https://"+target+"/metrics", ""); err != nil || code != http.StatusUnauthorized {
		if code, _, herr := scrape(ctx, "http://"+target+"/metrics", ""); herr == nil {
			t.Errorf("%s serves /metrics over plain HTTP, without a token: %d", target, code)
		} else {
			t.Errorf("GET https://%s/metrics without a token: %d, %v; want 401", target, code, err)
		}
		return
	}
	if code, body, err := scrape(ctx, "https://"+target+"/healthz", ""); err != nil || code != http.StatusOK {
		t.Errorf("GET https://%s/healthz without a token (the kubelet's probe): %d %q, %v; want 200", target, code, body, err)
	}
	// /readyz is 503 while a sidecar has no config stream open, as after an earlier test restarted dkc-server
	// or took the apiserver away: it must become 200 without a token once the sidecar reconnects. Not
	// poll.For, which would end the test: the other targets are checked all the same.
	var code int
	var body string
	var err error
	if wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		code, body, err = scrape(ctx, "https://"+target+"/readyz", "")
		if code == http.StatusUnauthorized || code == http.StatusForbidden {
			return false, errors.New("refused")
		}
		return err == nil && code == http.StatusOK, nil
	}) != nil {
		t.Errorf("GET https://%s/readyz without a token (the kubelet's probe): %d %q, %v; want 200", target, code, body, err)
	}
	if code, body, err := scrape(ctx, "https://"+target+"/metrics", nobody); err != nil || code != http.StatusForbidden {
		t.Errorf("GET https://%s/metrics with a token not allowed get /metrics: %d %q, %v; want 403", target, code, body, err)
	}
	// The binding was just made: until the apiserver's RBAC cache has it, and then for the deny cache's
	// 30 s, a scrape can still be refused.
	if wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(context.Context) (bool, error) {
		code, body, err = scrape(ctx, "https://"+target+"/metrics", reader)
		return err == nil && code == http.StatusOK, nil
	}) != nil {
		t.Errorf("GET https://%s/metrics with a token bound to dkc-metrics-reader: %d %q, %v; want 200", target, code, body, err)
		return
	}
	if !strings.Contains(body, "dkc_build_info") {
		t.Errorf("GET https://%s/metrics as dkc-metrics-reader: no dkc_build_info in\n%s", target, body)
	}
}

// scrape GETs url with token as a bearer token (none if empty), accepting the self-signed certificate as a
// PodMonitor with insecureSkipVerify does: the status code and the body.
func scrape(ctx context.Context, url, token string) (int, string, error) {
	c := &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body), err
}

// serviceAccountToken creates the ServiceAccount default/name, bound to clusterRole unless it is empty, and
// returns a token of it (the apiserver's default audience, as a Prometheus pod's); all removed when t ends.
func serviceAccountToken(t *testing.T, ctx context.Context, name, clusterRole string) string {
	t.Helper()
	c := admin(t)
	const ns = "default"
	if _, err := c.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.CoreV1().ServiceAccounts(ns).Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if clusterRole != "" {
		b := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: clusterRole},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}
		if _, err := c.RbacV1().ClusterRoleBindings().Create(ctx, b, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = c.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	expiry := int64(600)
	tr, err := c.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &expiry}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Status.Token == "" {
		t.Fatal(errors.New("TokenRequest returned no token"))
	}
	return tr.Status.Token
}
