// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// Names of what the dev cluster sets up for dkc; deploy/ uses the same.
const (
	ServiceUser           = "dkc-server"
	SidecarNamespace      = "kube-system"
	SidecarServiceAccount = "dkc-sidecar"
	TokenAudience         = "dkc"
)

// ServiceState records the running config service.
type ServiceState struct {
	Port        int `json:"port"`
	MetricsPort int `json:"metricsPort"`
	WebhookPort int `json:"webhookPort"`
}

// ServiceAddress is host:port of the config service (DKC_SERVER), on the bridge so nodes reach it.
func (c *Cluster) ServiceAddress() string {
	return net.JoinHostPort(c.state.Network.GatewayIP, strconv.Itoa(c.state.Service.Port))
}

// MetricsAddress is host:port of the service's /metrics.
func (c *Cluster) MetricsAddress() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(c.state.Service.MetricsPort))
}

// ensureRBAC creates a ClusterRole and its binding unless they exist.
func ensureRBAC(ctx context.Context, client kubernetes.Interface,
	rbac func() (*rbacv1.ClusterRole, *rbacv1.ClusterRoleBinding)) error {
	role, binding := rbac()
	if _, err := client.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create clusterrole %s: %w", role.Name, err)
	}
	if _, err := client.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create clusterrolebinding %s: %w", binding.Name, err)
	}
	return nil
}

// startService runs the config service binary with its own identity and TLS, and waits until its gRPC
// health says SERVING (caches synced).
func (c *Cluster) startService(ctx context.Context, bin string) error {
	fmt.Fprintf(c.cfg.Progress, "starting dkc-server on %s\n", c.ServiceAddress())
	client, err := c.Client()
	if err != nil {
		return err
	}
	// Exactly what deploy/ grants (ServerRBACFile), to the dev cluster's dkc-server user.
	if err := c.applyServerRBAC(ctx, client); err != nil {
		return err
	}
	// deploy/crds, as deploy/base installs them: the pool controller then finds its API at start.
	if err := c.applyCRDs(ctx); err != nil {
		return err
	}
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: SidecarServiceAccount, Namespace: SidecarNamespace}}
	if _, err := client.CoreV1().ServiceAccounts(SidecarNamespace).Create(ctx, sa, metav1.CreateOptions{}); err != nil &&
		!apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create service account %s/%s: %w", SidecarNamespace, SidecarServiceAccount, err)
	}
	if err := c.pki.remove("dkc-server"); err != nil {
		return err
	}
	ips := []net.IP{net.ParseIP(c.state.Network.GatewayIP), net.IPv4(127, 0, 0, 1)}
	if err := c.pki.issue("dkc-server", "dkc-server", nil, x509.ExtKeyUsageServerAuth, ips,
		[]string{"localhost", "dkc-server"}); err != nil {
		return err
	}
	if err := c.pki.issue("dkc-server-client", ServiceUser, nil, x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
		return err
	}
	kubeconfig := filepath.Join(c.cfg.Dir, "dkc-server.kubeconfig")
	if err := writeKubeconfig(kubeconfig, c.apiServerURL(), c.pki.CAFile(), c.pki.path("dkc-server-client.crt"),
		c.pki.path("dkc-server-client.key")); err != nil {
		return err
	}
	for _, n := range c.state.Nodes {
		if _, err := c.NodeToken(ctx, n.Name); err != nil {
			return err
		}
	}
	args := append([]string{bin,
		"--kubeconfig=" + kubeconfig,
		"--listen-address=" + c.ServiceAddress(),
		"--metrics-address=" + c.MetricsAddress(),
		// Plain HTTP on loopback, which the tests and the benchmark scrape without a token; the installed
		// form serves metrics as deploy/ does, with --metrics-auth (test/installed checks who may read them).
		"--metrics-auth=false",
		"--tls-cert-file=" + c.pki.path("dkc-server.crt"),
		"--tls-key-file=" + c.pki.path("dkc-server.key"),
		"--allowed-service-accounts=" + SidecarNamespace + "/" + SidecarServiceAccount,
		// The namespace it serves as, whatever $POD_NAMESPACE this process inherits (a CI job that runs in a
		// pod has its own): the checks of a namespace override run against the sidecars' namespace.
		"--namespace=" + SidecarNamespace,
		"--webhook-address=" + net.JoinHostPort(c.state.Network.GatewayIP, strconv.Itoa(c.state.Service.WebhookPort)),
		// The simulated nodes and the tests' own clients all call from the host's addresses, as nodes behind
		// one NAT would: the per-address TokenReview limit is sized for that, not for one node, and the
		// per-address caps on connections and on new connections are off.
		"--token-review-per-peer-qps=50", "--token-review-per-peer-burst=500",
		"--max-unauthenticated-connections-per-address=0",
		"--max-connections-per-address=0", "--new-connections-per-address-qps=0",
	}, c.cfg.ServiceArgs...)
	p, err := startProcess("dkc-server", c.runDir(), c.logFile("dkc-server"), nil, args...)
	if err != nil {
		return err
	}
	c.procs = append(c.procs, p)
	if err := c.waitReady(ctx, p); err != nil {
		return err
	}
	// Admission: the policies decide who may change a source and who may write the status dkc acts on, the
	// webhook whether a source is well-formed.
	probe := []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"probe"}}}`, nodeconfig.SourceAnnotation))
	if err := c.installEnforcedPolicy(ctx, client, AdmissionPolicyFile, probe); err != nil {
		return err
	}
	probe = []byte(fmt.Sprintf(`{"metadata":{"annotations":{%q:"probe"}}}`, nodeconfig.StatusAnnotation))
	if err := c.installEnforcedPolicy(ctx, client, NodeStatusPolicyFile, probe); err != nil {
		return err
	}
	if err := installPolicy(ctx, client, filepath.Join(c.cfg.RepoRoot, ServerConfigMapPolicyFile)); err != nil {
		return err
	}
	return c.registerWebhook(ctx, client)
}

// AdmissionSkipLabel exempts a Node from the webhook's validation only: the ValidatingAdmissionPolicy of
// AdmissionPolicyFile has no such exemption, so the label never lets a node set its own config source (and
// nodes cannot set labels of this prefix on themselves anyway, NodeRestriction). Tests use it to set
// malformed sources on purpose.
const AdmissionSkipLabel = "node-restriction.kubernetes.io/dkc-admission"

// AdmissionPolicyFile, relative to the repository root, holds the ValidatingAdmissionPolicy and its binding
// that decide who may change a Node's dkc.dev/config-source. The dev cluster installs this very file, so that
// tests exercise what users install from deploy/.
const AdmissionPolicyFile = "deploy/base/config-source-policy.yaml"

// NodeStatusPolicyFile, relative to the repository root, holds the ValidatingAdmissionPolicy and its binding
// that keep the Node status dkc acts on (dkc.dev/config-status, dkc.dev/pool-assignment, the ConfigOK
// condition) to dkc's own identities. The dev cluster installs this very file, as it does AdmissionPolicyFile.
const NodeStatusPolicyFile = "deploy/base/node-status-policy.yaml"

// ServerConfigMapPolicyFile, relative to the repository root, holds the ValidatingAdmissionPolicy and its
// binding that confine dkc-server's ConfigMap writes to its revision snapshots (label dkc.dev/pool). The dev
// cluster installs this very file, as it does AdmissionPolicyFile.
const ServerConfigMapPolicyFile = "deploy/base/server-configmap-policy.yaml"

// decodeAdmissionPolicy decodes AdmissionPolicyFile's content: exactly one ValidatingAdmissionPolicy and one
// binding of it, admissionregistration.k8s.io/v1, no unknown fields.
func decodeAdmissionPolicy(data []byte) (*admissionregistrationv1.ValidatingAdmissionPolicy,
	*admissionregistrationv1.ValidatingAdmissionPolicyBinding, error) {
	var (
		policy  *admissionregistrationv1.ValidatingAdmissionPolicy
		binding *admissionregistrationv1.ValidatingAdmissionPolicyBinding
	)
	docs, err := splitManifest(data)
	if err != nil {
		return nil, nil, err
	}
	for _, doc := range docs {
		if doc.APIVersion != admissionregistrationv1.SchemeGroupVersion.String() {
			return nil, nil, fmt.Errorf("unexpected apiVersion %q of %s", doc.APIVersion, doc.Kind)
		}
		switch {
		case doc.Kind == "ValidatingAdmissionPolicy" && policy == nil:
			policy = &admissionregistrationv1.ValidatingAdmissionPolicy{}
			err = doc.decodeStrict(policy)
		case doc.Kind == "ValidatingAdmissionPolicyBinding" && binding == nil:
			binding = &admissionregistrationv1.ValidatingAdmissionPolicyBinding{}
			err = doc.decodeStrict(binding)
		default:
			err = fmt.Errorf("unexpected (or second) %s", doc.Kind)
		}
		if err != nil {
			return nil, nil, err
		}
	}
	switch {
	case policy == nil || binding == nil:
		return nil, nil, errors.New("want a ValidatingAdmissionPolicy and a ValidatingAdmissionPolicyBinding")
	case binding.Spec.PolicyName != policy.Name:
		return nil, nil, fmt.Errorf("binding %s binds policy %q, not %q", binding.Name, binding.Spec.PolicyName, policy.Name)
	}
	return policy, binding, nil
}

// installEnforcedPolicy creates the ValidatingAdmissionPolicy and binding of file and waits until the
// apiserver enforces them: a policy takes effect only once the apiserver's informers have seen both, and
// tests may write Nodes right after Start returns. probe is a JSON merge patch of the first node's status
// that the policy refuses whoever asks (the admin), sent with dryRun until it is refused.
func (c *Cluster) installEnforcedPolicy(ctx context.Context, client kubernetes.Interface, file string,
	probe []byte) error {
	file = filepath.Join(c.cfg.RepoRoot, file)
	if err := installPolicy(ctx, client, file); err != nil {
		return err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read admission policy: %w", err)
	}
	policy, _, err := decodeAdmissionPolicy(data)
	if err != nil {
		return fmt.Errorf("decode admission policy %s: %w", file, err)
	}
	if len(c.state.Nodes) == 0 {
		return nil
	}
	node := c.state.Nodes[0].Name
	var last error
	err = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 30*time.Second, true,
		func(ctx context.Context) (bool, error) {
			_, last = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, probe,
				metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}}, "status")
			return apierrors.IsForbidden(last) && refusedBy(policy, last), nil
		})
	if err != nil {
		return fmt.Errorf("admission policy %s not enforced (last probe of node %s: %w): %w", policy.Name, node, last, err)
	}
	return nil
}

// installPolicy creates the ValidatingAdmissionPolicy and binding of file (decodeAdmissionPolicy's form).
// It does not wait for the apiserver to enforce them; tests of the policy poll for its refusal.
func installPolicy(ctx context.Context, client kubernetes.Interface, file string) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read admission policy: %w", err)
	}
	policy, binding, err := decodeAdmissionPolicy(data)
	if err != nil {
		return fmt.Errorf("decode admission policy %s: %w", file, err)
	}
	asDevUser(policy)
	// A cluster started again keeps its etcd: what it holds is replaced by the file's current content.
	vaps := client.AdmissionregistrationV1()
	_, err = vaps.ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var old *admissionregistrationv1.ValidatingAdmissionPolicy
		if old, err = vaps.ValidatingAdmissionPolicies().Get(ctx, policy.Name, metav1.GetOptions{}); err == nil {
			policy.ResourceVersion = old.ResourceVersion
			_, err = vaps.ValidatingAdmissionPolicies().Update(ctx, policy, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("install validating admission policy %s: %w", policy.Name, err)
	}
	_, err = vaps.ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		var old *admissionregistrationv1.ValidatingAdmissionPolicyBinding
		if old, err = vaps.ValidatingAdmissionPolicyBindings().Get(ctx, binding.Name, metav1.GetOptions{}); err == nil {
			binding.ResourceVersion = old.ResourceVersion
			_, err = vaps.ValidatingAdmissionPolicyBindings().Update(ctx, binding, metav1.UpdateOptions{})
		}
	}
	if err != nil {
		return fmt.Errorf("install validating admission policy binding %s: %w", binding.Name, err)
	}
	return nil
}

// asDevUser names this cluster's dkc-server, the User ServiceUser, where a policy names the installed
// dkc-server's ServiceAccount (its variable dkcServer); the rest of the file is installed as users get it.
func asDevUser(policy *admissionregistrationv1.ValidatingAdmissionPolicy) {
	for i, v := range policy.Spec.Variables {
		if v.Name == "dkcServer" {
			policy.Spec.Variables[i].Expression = strconv.Quote(ServiceUser)
		}
	}
}

// refusedBy says whether err is a refusal by one of policy's validations — not, say, an expression that
// failed to evaluate, which failurePolicy Fail turns into a refusal too.
func refusedBy(policy *admissionregistrationv1.ValidatingAdmissionPolicy, err error) bool {
	for _, v := range policy.Spec.Validations {
		if v.Message != "" && strings.Contains(err.Error(), v.Message) {
			return true
		}
	}
	return false
}

// registerWebhook installs the validating webhook of the dkc service for Node writes that change the
// dkc.dev/config-source annotation; it validates the value only (who may write it is the admission policy's
// business, see installEnforcedPolicy). matchConditions keep every other Node write — heartbeats, labels —
// out of it, so failurePolicy Fail cannot block them.
func (c *Cluster) registerWebhook(ctx context.Context, client kubernetes.Interface) error {
	ca, err := os.ReadFile(c.CAFile())
	if err != nil {
		return err
	}
	fail := admissionregistrationv1.Fail
	none := admissionregistrationv1.SideEffectClassNone
	timeout := int32(5)
	url := "https://" + net.JoinHostPort(c.state.Network.GatewayIP, strconv.Itoa(c.state.Service.WebhookPort)) +
		"/validate-node"
	cfg := &admissionregistrationv1.ValidatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: "dkc-dev-validate-nodes"}, // deploy/ installs dkc-validate-nodes
		Webhooks: []admissionregistrationv1.ValidatingWebhook{{
			Name:         "nodes.dkc.dev",
			ClientConfig: admissionregistrationv1.WebhookClientConfig{URL: &url, CABundle: ca},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create, admissionregistrationv1.Update},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"nodes"},
				},
			}},
			FailurePolicy:           &fail,
			SideEffects:             &none,
			TimeoutSeconds:          &timeout,
			AdmissionReviewVersions: []string{"v1"},
			ObjectSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{
				Key: AdmissionSkipLabel, Operator: metav1.LabelSelectorOpNotIn, Values: []string{"skip"},
			}}},
			MatchConditions: []admissionregistrationv1.MatchCondition{{
				Name: "changes-dkc-config-source",
				Expression: `has(object.metadata.annotations) && 'dkc.dev/config-source' in object.metadata.annotations && ` +
					`(request.operation == 'CREATE' || !has(oldObject.metadata.annotations) || ` +
					`!('dkc.dev/config-source' in oldObject.metadata.annotations) || ` +
					`oldObject.metadata.annotations['dkc.dev/config-source'] != object.metadata.annotations['dkc.dev/config-source'])`,
			}},
		}},
	}
	if _, err := client.AdmissionregistrationV1().ValidatingWebhookConfigurations().Create(ctx, cfg,
		metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("register admission webhook: %w", err)
	}
	return nil
}

// DialService opens a gRPC connection to the config service, trusting the cluster CA.
func (c *Cluster) DialService() (*grpc.ClientConn, error) {
	ca, err := os.ReadFile(c.pki.CAFile())
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca)
	return grpc.NewClient(c.ServiceAddress(),
		grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12})))
}

// NodeTokenPath is where node's sidecar credential is (docs/design.md, "Local cluster").
func (c *Cluster) NodeTokenPath(node string) string { return filepath.Join(c.NodeDir(node), "token") }

// NodeToken mints the sidecar credential of node — a dkc-sidecar ServiceAccount token for audience dkc,
// bound to the Node object so that it carries the node claim, as a pod-bound token of a DaemonSet pod does
// in production — writes it to NodeTokenPath and returns it. The Node must exist.
func (c *Cluster) NodeToken(ctx context.Context, node string) (string, error) {
	client, err := c.Client()
	if err != nil {
		return "", err
	}
	return MintToken(ctx, client, SidecarNamespace, SidecarServiceAccount, TokenAudience, node, c.NodeTokenPath(node))
}

// MintToken requests a token of namespace/sa for audience, bound to Node node (empty: unbound), valid for
// 24 hours, and writes it to path if path is not empty.
func MintToken(ctx context.Context, client kubernetes.Interface, namespace, sa, audience, node,
	path string) (string, error) {
	expiry := int64(24 * 3600)
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{
		Audiences: []string{audience}, ExpirationSeconds: &expiry,
	}}
	if node != "" {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return "", fmt.Errorf("get node %s to bind its token: %w", node, err)
		}
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Node", APIVersion: "v1", Name: node,
			UID: n.UID}
	}
	tr, err := client.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("mint token of %s/%s for node %q: %w", namespace, sa, node, err)
	}
	if path != "" {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(path, []byte(tr.Status.Token), 0o600); err != nil {
			return "", fmt.Errorf("write token %s: %w", path, err)
		}
	}
	return tr.Status.Token, nil
}
