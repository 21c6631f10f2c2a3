// Package probe asks the running kubelet how it is: /healthz, and /configz compared with the config the
// sidecar meant it to run. A restart counts as successful only when the kubelet is healthy AND reports the
// intended config — the original trusted its own process to have loaded what it checkpointed; dkc checks.
package probe

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/dkc-dev/dkc/sidecar/configcheck"
)

// Kubelet probes one kubelet.
type Kubelet struct {
	// TokenFile holds a bearer token the kubelet's webhook authentication accepts, with RBAC `get` on
	// nodes/configz (fine-grained kubelet authorization, on by default since 1.33). Read on every call, so
	// rotated projected tokens work.
	TokenFile string
	// Host overrides the address from the config (which may be 0.0.0.0).
	Host   string
	client *http.Client
}

// New returns a prober. The kubelet's serving certificate is self-signed by default, so it is not verified
// (the kubelet is on the same node and the token is the authentication that matters), as metrics-server's
// --kubelet-insecure-tls does; caFile, if set, is used instead.
func New(tokenFile, host, caFile string) (*Kubelet, error) {
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: caFile == ""} //nolint:gosec // see doc
	if caFile != "" {
		pool, err := loadPool(caFile)
		if err != nil {
			return nil, err
		}
		tlsCfg.RootCAs = pool
	}
	return &Kubelet{TokenFile: tokenFile, Host: host, client: &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableKeepAlives: true,
			DialContext: (&net.Dialer{Timeout: dialTimeout}).DialContext},
	}}, nil
}

func (k *Kubelet) host(addr string) string {
	if k.Host != "" {
		return k.Host
	}
	if addr == "" || addr == "0.0.0.0" || addr == "::" {
		return "127.0.0.1"
	}
	return addr
}

// Healthz checks http://<healthzBindAddress>:<healthzPort>/healthz of the config.
func (k *Kubelet) Healthz(ctx context.Context, kc *configcheck.Checked) error {
	if kc.HealthzPort == 0 {
		return nil // disabled: configz is the only signal
	}
	url := "http://" + net.JoinHostPort(k.host(kc.HealthzBindAddress), strconv.Itoa(int(kc.HealthzPort))) + "/healthz"
	_, err := k.get(ctx, url, false)
	return err
}

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

// Configz returns the running kubelet's configuration as JSON fields (the "kubeletconfig" object).
func (k *Kubelet) Configz(ctx context.Context, kc *configcheck.Checked) (map[string]any, error) {
	url := "https://" + net.JoinHostPort(k.host(kc.Address), strconv.Itoa(int(kc.Port))) + "/configz"
	body, err := k.get(ctx, url, true)
	if err != nil {
		return nil, err
	}
	var resp struct {
		KubeletConfig map[string]any `json:"kubeletconfig"`
	}
	if err := json.Unmarshal(body, &resp); err != nil {
		return nil, fmt.Errorf("decode configz: %w", err)
	}
	return resp.KubeletConfig, nil
}

func (k *Kubelet) get(ctx context.Context, url string, auth bool) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if auth && k.TokenFile != "" {
		token, err := os.ReadFile(k.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("read kubelet token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(token)))
	}
	resp, err := k.client.Do(req)
	if err != nil {
		if auth && answerTimedOut(err) {
			return nil, fmt.Errorf("%w: %v", ErrNoAnswer, err)
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return nil, err
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
