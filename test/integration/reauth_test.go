// SPDX-License-Identifier: Apache-2.0

//go:build integration

package integration

import (
	"context"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
)

// apiserverTokenCache is how long the kube-apiserver itself keeps answering for a token it authenticated
// (its built-in token authentication cache, 10s, no flag): a revoked token can pass a TokenReview that long
// after its pod is gone, on top of dkc's own cache.
const apiserverTokenCache = 10 * time.Second

// TestRevokedTokenLosesItsStream: a sidecar's WatchConfig stream lives for up to the connection's max age,
// but its token is checked again once per --token-cache-ttl (5s on this dkc-server). Its token bound to a
// pod, as a DaemonSet pod's is: when the pod is deleted (the token revoked), the stream ends with
// Unauthenticated within the TTL plus the apiserver's own token cache, the server logs the node and the
// reason, and counts it. With tokens reviewed by the apiserver (--verify-tokens-locally=false), an apiserver
// that cannot be reached meanwhile (frozen longer than the TTL plus dkc's review timeout) ends no stream: it
// is strict on refusal, lenient on unavailability. Verified in dkc-server (the default), the tokens need no
// TokenReview until the pod is deleted, and the streams are checked again as usual while the apiserver is
// frozen.
func TestRevokedTokenLosesItsStream(t *testing.T) {
	for _, local := range []bool{false, true} {
		t.Run(fmt.Sprintf("verify-tokens-locally=%v", local), func(t *testing.T) { revokedTokenLosesItsStream(t, local) })
	}
}

func revokedTokenLosesItsStream(t *testing.T, local bool) {
	const ttl = 5 * time.Second
	ctx := testContext(t)
	client := adminClient(t)
	name := map[bool]string{false: "reauth", true: "reauth-local"}[local]
	server, err := cluster.StartServiceReplica(ctx, name, "--token-cache-ttl="+ttl.String(),
		fmt.Sprintf("--verify-tokens-locally=%v", local))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := server.Stop(); err != nil {
			t.Error(err)
		}
	})
	svc := replicaClient(t, server)

	// The revoked node's token is bound to a pod on it (kube-system/dkc-sidecar, audience dkc), which
	// carries the node claim; the other node's, bound to its Node, stays valid throughout.
	simNode(t, "sim-revoked")
	keptToken := simNode(t, "sim-kept")
	pod, err := client.CoreV1().Pods("kube-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "dkc-sidecar-revoked-" + name, Namespace: "kube-system"},
		Spec: corev1.PodSpec{NodeName: "sim-revoked", ServiceAccountName: "dkc-sidecar", AutomountServiceAccountToken: new(bool),
			Containers: []corev1.Container{{Name: "sidecar", Image: "dkc.local/pause"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	deletePod := func() error {
		return client.CoreV1().Pods("kube-system").Delete(context.Background(), pod.Name, *metav1.NewDeleteOptions(0))
	}
	t.Cleanup(func() { _ = deletePod() })
	expiry := int64(3600)
	tr, err := client.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "dkc-sidecar", &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{"dkc"}, ExpirationSeconds: &expiry,
		BoundObjectRef: &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID},
	}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	revoked := watchAt(t, svc, tr.Status.Token, &dkcv1.WatchConfigRequest{NodeName: "sim-revoked"})
	kept := watchAt(t, svc, keptToken, &dkcv1.WatchConfigRequest{NodeName: "sim-kept"})
	revoked.next("first state", func(*dkcv1.WatchConfigResponse) bool { return true })
	kept.next("first state", func(*dkcv1.WatchConfigResponse) bool { return true })

	// The apiserver unreachable for longer than a TTL and a review's timeout: both streams stay.
	reauths := func(result string) float64 {
		return metricAt(t, server.MetricsAddress(), `dkc_server_stream_reauth_total{result="`+result+`"}`)
	}
	reviews := func() float64 {
		return metricAt(t, server.MetricsAddress(), `dkc_server_token_reviews_total{result="authenticated"}`)
	}
	if local {
		// Both tokens, the node-bound and the pod-bound one, verified with the apiserver's published keys
		// against the cached ServiceAccount, pod and Node: not one TokenReview.
		accepted := metricAt(t, server.MetricsAddress(), `dkc_server_token_local_verifications_total{result="accepted"}`)
		if accepted < 2 || reviews() != 0 {
			t.Errorf("%v tokens verified locally and %v reviewed, want 2 or more and none (log %s)", accepted, reviews(),
				server.LogFile())
		}
	}
	if err := cluster.Signal("kube-apiserver", syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := true
	thaw := func() {
		if frozen {
			if err := cluster.Signal("kube-apiserver", syscall.SIGCONT); err != nil {
				t.Error(err)
			}
			frozen = false
		}
	}
	t.Cleanup(thaw)
	revoked.quiet(ttl + 12*time.Second) // dkc's review timeout is 10s
	thaw()
	switch n := reauths("unavailable"); {
	case !local && n < 1:
		t.Errorf("stream_reauth_total{result=unavailable} = %v after the apiserver was frozen for %v, want at least 1", n, ttl+12*time.Second)
	case local && (n != 0 || reviews() != 0 || reauths("ok") < 2):
		t.Errorf("streams checked again while the apiserver was frozen: %v ok, %v unavailable, %v TokenReviews; want ok, "+
			"with neither", reauths("ok"), n, reviews())
	}
	select {
	case err := <-kept.errs:
		t.Fatalf("the kept stream ended while the apiserver was unreachable: %v", err)
	default:
	}
	// Both streams checked successfully again before the revocation, so the next check is a TTL away.
	okBefore := reauths("ok")
	// Not poll.For, which would end the test: the revocation below is checked all the same.
	if wait.PollUntilContextTimeout(context.Background(), 200*time.Millisecond, 3*ttl, true, func(context.Context) (bool, error) {
		return reauths("ok") >= okBefore+2, nil
	}) != nil {
		t.Errorf("streams not checked again within %v of the apiserver's return (ok %v → %v)", 3*ttl, okBefore, reauths("ok"))
	}

	// Revoked: the pod its token is bound to is deleted.
	if err := deletePod(); err != nil {
		t.Fatal(err)
	}
	revokedAt := time.Now()
	limit := ttl + apiserverTokenCache + 3*time.Second
	select {
	case err := <-revoked.errs:
		took := time.Since(revokedAt)
		if status.Code(err) != codes.Unauthenticated {
			t.Fatalf("revoked token's stream ended with %v, want Unauthenticated", err)
		}
		t.Logf("revoked token's stream ended %v after its pod was deleted: %v", took.Round(100*time.Millisecond), err)
	case <-time.After(limit):
		t.Fatalf("revoked token's stream still served %v after its pod was deleted (token cache TTL %v)", limit, ttl)
	}
	if n := reauths("refused"); n != 1 {
		t.Errorf("stream_reauth_total{result=refused} = %v, want 1", n)
	}
	log, _ := os.ReadFile(server.LogFile())
	var line string
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, "node's token refused when checked again; ending its stream") {
			line = l
		}
	}
	if !strings.Contains(line, `"node":"sim-revoked"`) || !strings.Contains(line, "service account token has been invalidated") {
		t.Errorf("server log line for the refusal should name the node and the apiserver's reason; got %q (log %s)", line, server.LogFile())
	}
	// The other stream is untouched, and a new stream with the revoked token is refused.
	kept.quiet(ttl + time.Second)
	stream, err := svc.WatchConfig(withToken(ctx, tr.Status.Token), &dkcv1.WatchConfigRequest{NodeName: "sim-revoked"})
	if err == nil {
		_, err = stream.Recv()
	}
	if status.Code(err) != codes.Unauthenticated {
		t.Errorf("new stream with the revoked token: %v, want Unauthenticated", err)
	}
}

// watchAt opens a WatchConfig stream with req against the dkc-server of svc and collects what it receives.
func watchAt(t *testing.T, svc dkcv1.ConfigServiceClient, token string, req *dkcv1.WatchConfigRequest) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(withToken(context.Background(), token))
	t.Cleanup(cancel)
	stream, err := svc.WatchConfig(ctx, req)
	if err != nil {
		t.Fatalf("WatchConfig(%s): %v", req.GetNodeName(), err)
	}
	w := &watcher{t: t, msgs: make(chan *dkcv1.WatchConfigResponse, 100), errs: make(chan error, 1)}
	go func() {
		for {
			m, err := stream.Recv()
			if err != nil {
				w.errs <- err
				return
			}
			w.msgs <- m
		}
	}()
	return w
}
