// SPDX-License-Identifier: Apache-2.0

// Package probe asks the running kubelet how it is: /healthz, and /configz compared with the config the
// sidecar meant it to run. A restart counts as successful only when the kubelet is healthy AND reports the
// intended config — the original trusted its own process to have loaded what it checkpointed; dkc checks.
//
// /configz carries a token the kubelet accepts, and the addresses and certificate files it is sent by come
// from a config that a ConfigMap author wrote. So the token goes only to this node (loopback or an address of
// its interfaces, target) and only over a connection whose certificate is the kubelet's own (trust): the
// one its config makes it serve, read from disk at each probe, or one signed by the operator's
// --kubelet-ca-file. Anything else is refused before a byte is sent.
package probe

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	statsapi "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/internal/configcheck"
)

// DefaultCertDir is the kubelet's --cert-dir default, where it keeps its serving certificate.
const DefaultCertDir = "/var/lib/kubelet/pki"

// Kubelet probes this node's kubelet.
type Kubelet struct {
	// tokenFile holds a bearer token the kubelet's webhook authentication accepts, with RBAC `get` on
	// nodes/configz (fine-grained kubelet authorization, on by default since 1.33). Read on every call, so
	// rotated projected tokens work.
	tokenFile string
	// host, the operator's --kubelet-host, replaces the config's addresses and their checks.
	host string
	// caFile, the operator's --kubelet-ca-file, signs the kubelet's serving certificate; "" pins the
	// certificate the kubelet's config makes it serve instead.
	caFile string
	log    *zap.Logger

	timeout time.Duration
	// interfaceAddrs lists this node's addresses (net.InterfaceAddrs: the sidecar runs in the node's
	// network namespace, hostNetwork).
	interfaceAddrs func() ([]net.Addr, error)

	mu sync.Mutex
	// certDir is the kubelet's --cert-dir, learnt from the flags configs are checked with (ObserveFlags).
	certDir string
	// refusal is the last reason the token was withheld, logged once per reason.
	refusal string
}

// Config of a Kubelet prober.
type Config struct {
	// Log is where the prober says why it withheld the token (once per reason); nil: nowhere.
	Log *zap.Logger
	// TokenFile (--kubelet-token-file) holds a bearer token the kubelet's webhook authentication accepts,
	// with RBAC `get` on nodes/configz; read at every /configz. "": no token is sent.
	TokenFile string
	// Host (--kubelet-host), if set, is the kubelet's address, used as given instead of the config's
	// addresses and their checks.
	Host string
	// CAFile (--kubelet-ca-file), if set, is the CA of the kubelet's serving certificate, read now to fail
	// early and again at every probe, so that it can be rotated. "": the certificate the kubelet's config
	// makes it serve is pinned.
	CAFile string
	// Timeout bounds one request to the kubelet; 0: 5s.
	Timeout time.Duration
	// InterfaceAddrs lists this node's addresses, where the token may go; nil: net.InterfaceAddrs (the
	// sidecar runs in the node's network namespace, hostNetwork). Tests give others.
	InterfaceAddrs func() ([]net.Addr, error)
}

// New returns a prober; it fails when CAFile cannot be read.
func New(cfg Config) (*Kubelet, error) {
	if cfg.CAFile != "" {
		if _, err := loadPool(cfg.CAFile); err != nil {
			return nil, err
		}
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 5 * time.Second
	}
	if cfg.InterfaceAddrs == nil {
		cfg.InterfaceAddrs = net.InterfaceAddrs
	}
	return &Kubelet{tokenFile: cfg.TokenFile, host: cfg.Host, caFile: cfg.CAFile, log: cfg.Log, timeout: cfg.Timeout,
		interfaceAddrs: cfg.InterfaceAddrs, certDir: DefaultCertDir}, nil
}

// ErrForeignAddress: a config has the kubelet listen on an address that is not this node's. Such a kubelet
// cannot listen there (it fails to bind), and the sidecar must not send its token off the node: nothing is
// sent, and the kubelet is not healthy with that config.
var ErrForeignAddress = errors.New("kubelet address is not this node's")

// ErrServingCert: the kubelet's serving certificate cannot be verified — the file it serves from cannot be
// read by the sidecar, or what answers presents another certificate (a process other than the kubelet on its
// port). The token is not sent. Not Unverifiable: a kubelet that cannot be recognised proves nothing, and a
// config that moves its certificate where the sidecar cannot see it is not proven to run.
var ErrServingCert = errors.New("kubelet serving certificate not verified")

// ErrRefused: the kubelet answered but refused the sidecar's credentials (401, 403). A kubelet does so when
// its webhook authentication or authorization cannot reach the apiserver and nothing is cached (a freshly
// restarted kubelet, or an outage longer than its cache), or when the sidecar lacks nodes/configz: either
// way it says nothing about the config the kubelet runs.
var ErrRefused = errors.New("kubelet refused the request")

// ErrNoAnswer: the kubelet accepted the connection to /configz but did not answer in time. A kubelet does
// so while its webhook authentication or authorization waits on an apiserver whose packets are dropped
// (not refused: that is ErrRefused), retrying for longer than the sidecar waits. Like a refusal it says
// nothing about the config. A connection that cannot be made at all is not this: that is a kubelet not
// serving.
var ErrNoAnswer = errors.New("kubelet did not answer in time")

// Unverifiable says whether err, from Configz, leaves open what the kubelet runs without saying anything
// against the config (ErrRefused, ErrNoAnswer): the caller neither proves nor blames the config.
func Unverifiable(err error) bool { return errors.Is(err, ErrRefused) || errors.Is(err, ErrNoAnswer) }

// dialTimeout bounds connecting to the kubelet on its own node, so that a request that times out has
// reached a kubelet that did not answer (ErrNoAnswer), rather than none.
const dialTimeout = 2 * time.Second

// ObserveFlags returns checker, through which the prober learns the kubelet's --cert-dir from the command
// line each config is checked with. The directory is a kubelet flag, not a config field, so it is the same
// for every config the node runs; the agent checks a config before it probes the kubelet running it. A
// check without the node's command line (Flags nil: the drift check asks what a config says by itself)
// teaches nothing.
func (k *Kubelet) ObserveFlags(checker configcheck.Checker) configcheck.Checker {
	return flagObserver{Checker: checker, k: k}
}

type flagObserver struct {
	configcheck.Checker
	k *Kubelet
}

func (o flagObserver) Check(ctx context.Context, req configcheck.Request) (*configcheck.Checked, error) {
	if req.Flags != nil {
		dir := CertDir(req.Flags)
		o.k.mu.Lock()
		o.k.certDir = dir
		o.k.mu.Unlock()
	}
	return o.Checker.Check(ctx, req)
}

// CertDir is the kubelet's --cert-dir in its command line, DefaultCertDir without one.
func CertDir(flags []string) string { return FlagValue(flags, "cert-dir", DefaultCertDir) }

// FlagValue is the value of the kubelet flag --name in its command line (pflag syntax: --name=VALUE or
// --name VALUE, `_` for `-`, the last one wins, nothing after `--`), def without one.
func FlagValue(flags []string, name, def string) string {
	value := def
	for i := 0; i < len(flags); i++ {
		a := flags[i]
		if a == "--" {
			break
		}
		flag, ok := strings.CutPrefix(a, "--")
		if !ok {
			continue
		}
		flag, v, hasValue := strings.Cut(flag, "=")
		if strings.ReplaceAll(flag, "_", "-") != name {
			continue
		}
		if !hasValue {
			if i+1 >= len(flags) {
				break
			}
			i++
			v = flags[i]
		}
		value = v
	}
	return value
}

// target is where to reach a kubelet that listens on addr, the config's field: the operator's
// --kubelet-host as given; loopback for all addresses; otherwise addr itself, but only when it is this
// node's — loopback, or an address of the node's interfaces, looked up now (they can change). Anything else
// is ErrForeignAddress: no request is made.
func (k *Kubelet) target(field, addr string) (string, error) {
	if k.host != "" {
		return k.host, nil
	}
	if addr == "" || addr == "localhost" {
		return "127.0.0.1", nil
	}
	ip := net.ParseIP(addr)
	if ip == nil {
		return "", fmt.Errorf("%w: %s %q is not an IP address; the sidecar sends requests only to loopback or an address "+
			"of this node's interfaces (--kubelet-host overrides)",
			ErrForeignAddress, field, addr)
	}
	if ip.IsUnspecified() {
		return "127.0.0.1", nil
	}
	if ip.IsLoopback() {
		return addr, nil
	}
	addrs, err := k.interfaceAddrs()
	if err != nil {
		return "", fmt.Errorf("list this node's addresses to check %s %s: %w", field, addr, err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
			return addr, nil
		}
	}
	return "", fmt.Errorf("%w: %s %s is neither loopback nor an address of this node's interfaces, so the kubelet "+
		"cannot listen there, and the sidecar sends its token only to this node's kubelet (--kubelet-host overrides)",
		ErrForeignAddress, field, addr)
}

// Foreign says why the kubelet cannot listen where kc puts it on this node, or nil: its address, or its
// healthzBindAddress while healthz is on, is neither loopback, all addresses, nor an address of the node's
// interfaces (ErrForeignAddress). With --kubelet-host nothing is foreign: the operator says where the kubelet is.
// An address that cannot be checked (the interfaces unreadable) is not called foreign.
func (k *Kubelet) Foreign(kc *configcheck.Checked) error {
	if _, err := k.target("address", kc.Address); errors.Is(err, ErrForeignAddress) {
		return err
	}
	if kc.HealthzPort != 0 {
		if _, err := k.target("healthzBindAddress", kc.HealthzBindAddress); errors.Is(err, ErrForeignAddress) {
			return err
		}
	}
	return nil
}

// Healthz checks http://<healthzBindAddress>:<healthzPort>/healthz of the config. No token is sent, but the
// address must be this node's all the same: the sidecar talks to its own kubelet only.
func (k *Kubelet) Healthz(ctx context.Context, kc *configcheck.Checked) error {
	if kc.HealthzPort == 0 {
		return nil // disabled: configz is the only signal
	}
	host, err := k.target("healthzBindAddress", kc.HealthzBindAddress)
	if err != nil {
		return err
	}
	url := "http://" + net.JoinHostPort(host, strconv.Itoa(int(kc.HealthzPort))) + "/healthz"
	_, err = k.get(ctx, url, nil)
	return err
}

// Configz returns the running kubelet's configuration as JSON fields (the "kubeletconfig" object). The
// token is sent only to this node's address and only once the kubelet has presented its own certificate.
func (k *Kubelet) Configz(ctx context.Context, kc *configcheck.Checked) (map[string]any, error) {
	body, err := k.configz(ctx, kc)
	if err != nil {
		if errors.Is(err, ErrForeignAddress) || errors.Is(err, ErrServingCert) {
			k.withheld(err)
		}
		return nil, err
	}
	k.mu.Lock()
	k.refusal = ""
	k.mu.Unlock()
	var resp struct {
		KubeletConfig map[string]any `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("decode configz: %w", err)
	}
	return resp.KubeletConfig, nil
}

func (k *Kubelet) configz(ctx context.Context, kc *configcheck.Checked) ([]byte, error) {
	return k.authorized(ctx, kc, "/configz")
}

// authorized GETs path from the kubelet's authenticated port, where kc makes it listen, with the token.
func (k *Kubelet) authorized(ctx context.Context, kc *configcheck.Checked, path string) ([]byte, error) {
	host, err := k.target("address", kc.Address)
	if err != nil {
		return nil, err
	}
	verify, err := k.trust(kc)
	if err != nil {
		return nil, err
	}
	url := "https://" + net.JoinHostPort(host, strconv.Itoa(int(kc.Port))) + path
	return k.get(ctx, url, verify)
}

// Summary is the kubelet's stats summary (/stats/summary; RBAC get nodes/stats): what its eviction manager
// observes. Sent the way /configz is: this node only, the kubelet's own certificate.
func (k *Kubelet) Summary(ctx context.Context, kc *configcheck.Checked) (*statsapi.Summary, error) {
	body, err := k.authorized(ctx, kc, "/stats/summary")
	if err != nil {
		return nil, err
	}
	var s statsapi.Summary
	if err := json.Unmarshal(body, &s); err != nil {
		return nil, fmt.Errorf("decode /stats/summary: %w", err)
	}
	return &s, nil
}

// Pods are the pods the kubelet runs (/pods; RBAC get nodes/pods, fine-grained kubelet authorization): what
// its eviction manager ranks and its admission admits again after a restart.
func (k *Kubelet) Pods(ctx context.Context, kc *configcheck.Checked) ([]corev1.Pod, error) {
	body, err := k.authorized(ctx, kc, "/pods")
	if err != nil {
		return nil, err
	}
	var l corev1.PodList
	if err := json.Unmarshal(body, &l); err != nil {
		return nil, fmt.Errorf("decode /pods: %w", err)
	}
	return l.Items, nil
}

// withheld logs, once per reason, that the token was not sent: an operator must act (a missing mount, a
// ConfigMap pointing the kubelet elsewhere), and the agent only logs the outcome of its health wait.
func (k *Kubelet) withheld(err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.refusal == err.Error() {
		return
	}
	k.refusal = err.Error()
	k.log.Error("kubelet token withheld: the kubelet cannot be reached on this node or recognised by its certificate",
		zap.Error(err))
}

// trust returns the check the certificate presented for /configz must pass, before the token is sent.
func (k *Kubelet) trust(kc *configcheck.Checked) (func(tls.ConnectionState) error, error) {
	if k.caFile != "" {
		pool, err := loadPool(k.caFile)
		if err != nil {
			//nolint:errorlint // callers decide on the sentinel alone; the cause is for the reader
			return nil, fmt.Errorf("%w: %v", ErrServingCert, err)
		}
		return func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: no certificate presented", ErrServingCert)
			}
			inter := x509.NewCertPool()
			for _, c := range cs.PeerCertificates[1:] {
				inter.AddCert(c)
			}
			// The chain, not the name: a kubelet's certificate names the node's addresses and hostname, not
			// the loopback address it is probed on. Only this node's addresses are dialled.
			if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter,
				KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
				//nolint:errorlint // callers decide on the sentinel alone; the cause is for the reader
				return fmt.Errorf("%w: not signed by --kubelet-ca-file %s: %v; token not sent", ErrServingCert, k.caFile, err)
			}
			return nil
		}, nil
	}
	k.mu.Lock()
	certDir := k.certDir
	k.mu.Unlock()
	file, err := ServingCertFile(kc.Fields, certDir)
	if err != nil {
		//nolint:errorlint // callers decide on the sentinel alone; the cause is for the reader
		return nil, fmt.Errorf("%w: %v", ErrServingCert, err)
	}
	pinned, err := leaf(file)
	if err != nil {
		return nil, fmt.Errorf("%w: %v; the sidecar sends its token only to a kubelet whose certificate it can "+
			"check: make the kubelet's certificate readable to the sidecar at the same path (its --cert-dir, default "+
			"%s), or give --kubelet-ca-file",
			ErrServingCert, err, DefaultCertDir)
	}
	return func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 || !bytes.Equal(cs.PeerCertificates[0].Raw, pinned.Raw) {
			return fmt.Errorf("%w: the certificate presented is not the kubelet's %s (another process on its port, or a "+
				"rotation in progress); token not sent",
				ErrServingCert, file)
		}
		return nil
	}, nil
}

// ServingCertFile is the file holding the certificate the kubelet running fields (a config's v1beta1
// fields, flags applied) serves, as kubelets v1.34 to v1.37 pick it (cmd/kubelet/app/server.go InitializeTLS,
// pkg/kubelet/kubelet.go, client-go's certificate file store): with serverTLSBootstrap (and the
// RotateKubeletServerCertificate gate, on by default) the first that exists of
// <certDir>/kubelet-server-current.pem, tlsCertFile with tlsPrivateKeyFile, <certDir>/kubelet-server.crt
// with .key; otherwise tlsCertFile; otherwise the self-signed <certDir>/kubelet.crt it creates at first start.
// Paths are the kubelet's (host paths): the sidecar must see them at the same place.
func ServingCertFile(fields map[string]any, certDir string) (string, error) {
	certFile, _ := fields["tlsCertFile"].(string)
	keyFile, _ := fields["tlsPrivateKeyFile"].(string)
	bootstrap, _ := fields["serverTLSBootstrap"].(bool)
	rotate := true
	if gates, ok := fields["featureGates"].(map[string]any); ok {
		if on, ok := gates["RotateKubeletServerCertificate"].(bool); ok {
			rotate = on
		}
	}
	if !bootstrap || !rotate {
		if certFile != "" {
			return certFile, nil
		}
		return filepath.Join(certDir, "kubelet.crt"), nil
	}
	current := filepath.Join(certDir, "kubelet-server-current.pem")
	candidates := [][2]string{{current, ""}}
	if certFile != "" && keyFile != "" {
		candidates = append(candidates, [2]string{certFile, keyFile})
	}
	candidates = append(candidates,
		[2]string{filepath.Join(certDir, "kubelet-server.crt"), filepath.Join(certDir, "kubelet-server.key")})
	for _, c := range candidates {
		if exists(c[0]) && (c[1] == "" || exists(c[1])) {
			return c[0], nil
		}
	}
	return "", fmt.Errorf("serverTLSBootstrap: no serving certificate in %s yet (is the kubelet's CSR approved? is the "+
		"directory visible to the sidecar?)", current)
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// leaf is the first certificate in file: the one served (a CA may follow it; a key may be in the same file).
func leaf(file string) (*x509.Certificate, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read kubelet serving certificate: %w", err)
	}
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, fmt.Errorf("no certificate in %s", file)
		}
		if block.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return nil, fmt.Errorf("parse certificate in %s: %w", file, err)
			}
			return c, nil
		}
	}
}

// maxBody bounds what is read of an answer: a /pods of a node at 250 pods with large specs fits.
const maxBody = 32 << 20

// get GETs url; with verify (HTTPS), the token goes with the request, and the connection is used only
// after verify accepted the certificate presented: the request, headers included, is written after the
// handshake.
func (k *Kubelet) get(ctx context.Context, url string, verify func(tls.ConnectionState) error) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	auth := verify != nil
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if auth {
		// Go's own verification checks the name against the dialled address, which a kubelet certificate
		// does not carry for loopback (self-signed: its hostname); verify replaces it — it pins the kubelet's
		// certificate or checks its chain — and runs on every handshake, before any request is written.
		tlsCfg.InsecureSkipVerify = true //nolint:gosec // verified by VerifyConnection
		tlsCfg.VerifyConnection = verify
		if k.tokenFile != "" {
			token, err := os.ReadFile(k.tokenFile)
			if err != nil {
				return nil, fmt.Errorf("read kubelet token: %w", err)
			}
			req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
		}
	}
	client := &http.Client{
		Timeout: k.timeout,
		// No Proxy: straight to the kubelet.
		Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true,
			DialContext: (&net.Dialer{Timeout: dialTimeout}).DialContext},
		// A redirect would take the token to wherever the answer points.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	resp, err := client.Do(req)
	if err != nil {
		if auth && answerTimedOut(err) {
			//nolint:errorlint // callers decide on the sentinel alone; the cause is for the reader
			return nil, fmt.Errorf("%w: %v", ErrNoAnswer, err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxBody {
		return nil, fmt.Errorf("GET %s: answer larger than %d MiB", url, maxBody>>20)
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		return nil, fmt.Errorf("%w: GET %s: %s: %.200s", ErrRefused, url, resp.Status, body)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s: %.200s", url, resp.Status, body)
	}
	return body, nil
}

// Mismatch compares the running config (configz) with the intended one on every field the config file
// sets explicitly (its top-level keys) or the kubelet's --config-dir drop-ins set (intended.DropInKeys,
// merged over the file in intended.Fields): those are what a new config changes, while fields the kubelet
// fills in at run time (a self-signed tlsCertFile, say) would make a full comparison fail for no reason. It
// returns the differing fields, empty when the kubelet runs the intended config.
func Mismatch(intended *configcheck.Checked, fileContent []byte, running map[string]any) ([]string, error) {
	want := intended.Fields
	var file map[string]any
	if err := yaml.Unmarshal(fileContent, &file); err != nil {
		return nil, fmt.Errorf("parse config file: %w", err)
	}
	keys := map[string]bool{}
	for key := range file {
		keys[key] = true
	}
	for _, key := range intended.DropInKeys {
		keys[key] = true
	}
	var diff []string
	for key := range keys {
		if key == "apiVersion" || key == "kind" {
			continue
		}
		if !reflect.DeepEqual(want[key], running[key]) {
			diff = append(diff, fmt.Sprintf("%s: running %v, want %v", key, running[key], want[key]))
		}
	}
	sort.Strings(diff)
	return diff, nil
}

func loadPool(caFile string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("read kubelet CA %s: %w", caFile, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("no certificates in %s", caFile)
	}
	return pool, nil
}

// answerTimedOut: the request timed out after its connection was made (a timed-out dial is an *net.OpError
// with Op "dial"; the caller's cancellation is no timeout).
func answerTimedOut(err error) bool {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
