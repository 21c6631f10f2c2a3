// SPDX-License-Identifier: Apache-2.0

package probe

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dkc-dev/dkc/internal/ciskip"
	"github.com/dkc-dev/dkc/internal/configcheck"
)

// keyPair is a test certificate and its key, PEM-encoded as a kubelet keeps them.
type keyPair struct {
	cert    *x509.Certificate
	certPEM []byte
	keyPEM  []byte
	tls     tls.Certificate
}

// newPair returns a serving certificate for 127.0.0.1, self-signed when ca is nil, signed by ca otherwise;
// isCA makes it a CA.
func newPair(t *testing.T, ca *keyPair, isCA bool) *keyPair {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	tmpl := &x509.Certificate{SerialNumber: serial, Subject: pkix.Name{CommonName: "kubelet-" + serial.String()},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: isCA, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	parent, signer := tmpl, any(key)
	if ca != nil {
		parent, signer = ca.cert, ca.tls.PrivateKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	keyDER, _ := x509.MarshalECPrivateKey(key)
	p := &keyPair{cert: cert, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		keyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})}
	p.tls = tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: cert}
	if ca != nil {
		p.tls.Certificate = append(p.tls.Certificate, ca.cert.Raw)
	}
	return p
}

// kubeletServer is a stand-in kubelet on addr serving /configz with the certificate in serving (swappable:
// a rotation). It counts connections (before any handshake) and the tokens that reached it.
type kubeletServer struct {
	*httptest.Server
	serving atomic.Pointer[keyPair]
	conns   atomic.Int32
	mu      sync.Mutex
	tokens  []string
}

func newKubeletServer(t *testing.T, addr string, serving *keyPair) *kubeletServer {
	t.Helper()
	s := &kubeletServer{}
	s.serving.Store(serving)
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		s.tokens = append(s.tokens, r.Header.Get("Authorization"))
		s.mu.Unlock()
		switch r.URL.Path {
		case "/stats/summary":
			_, _ = w.Write([]byte(`{"node":{"nodeName":"node-1","memory":{"availableBytes":1024,"workingSetBytes":3072}}}`))
		case "/pods":
			_, _ = w.Write([]byte(`{"kind":"PodList","apiVersion":"v1","items":[{"metadata":{"namespace":"web","name":"hungry"}}]}`))
		default:
			_, _ = w.Write([]byte(`{"kubeletconfig":{"eventRecordQPS":7}}`))
		}
	}))
	l, err := net.Listen("tcp", net.JoinHostPort(addr, "0"))
	if err != nil {
		t.Fatal(err)
	}
	s.Listener = l
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	s.Config.ErrorLog = log.New(io.Discard, "", 0) // refused handshakes are the point
	// Per handshake (a rotation); httptest's own certificate would win over GetCertificate without SNI.
	s.TLS = &tls.Config{GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return &tls.Config{Certificates: []tls.Certificate{s.serving.Load().tls}}, nil
	}}
	s.StartTLS()
	t.Cleanup(s.Close)
	return s
}

func (s *kubeletServer) port() int32 { return int32(s.Listener.Addr().(*net.TCPAddr).Port) }

func (s *kubeletServer) seen() (conns int, tokens []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return int(s.conns.Load()), append([]string(nil), s.tokens...)
}

func writeFile(t *testing.T, path string, data ...[]byte) {
	t.Helper()
	var all []byte
	for _, d := range data {
		all = append(all, d...)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, all, 0o600); err != nil {
		t.Fatal(err)
	}
}

func tokenFile(t *testing.T) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "token")
	writeFile(t, f, []byte("secret-token\n"))
	return f
}

// nodeAddr is a non-loopback address of this machine, or "" when it has none.
func nodeAddr(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP.String()
		}
	}
	return ""
}

func addrs(cidrs ...string) func() ([]net.Addr, error) {
	return func() ([]net.Addr, error) {
		var out []net.Addr
		for _, c := range cidrs {
			ip, n, err := net.ParseCIDR(c)
			if err != nil {
				return nil, err
			}
			n.IP = ip
			out = append(out, n)
		}
		return out, nil
	}
}

// TestTokenGoesOnlyToThisNode: the kubelet's address comes from a config a ConfigMap author wrote, so the
// token goes only to loopback or an address of this node's interfaces; anything else is refused before any
// connection is made (--kubelet-host, the operator's, is used as given).
func TestTokenGoesOnlyToThisNode(t *testing.T) {
	for _, tc := range []struct {
		addr, host, want string
		foreign          bool
	}{
		{addr: "", want: "127.0.0.1"},
		{addr: "0.0.0.0", want: "127.0.0.1"},
		{addr: "::", want: "127.0.0.1"},
		{addr: "localhost", want: "127.0.0.1"},
		{addr: "127.0.0.1", want: "127.0.0.1"},
		{addr: "127.0.0.53", want: "127.0.0.53"},
		{addr: "::1", want: "::1"},
		{addr: "198.18.0.10", want: "198.18.0.10"},
		{addr: "fd00::10", want: "fd00::10"},
		{addr: "198.18.0.1", foreign: true},
		{addr: "203.0.113.7", foreign: true},
		{addr: "fd00::11", foreign: true},
		{addr: "collector.example.com", foreign: true},
		{addr: "203.0.113.7", host: "10.1.2.3", want: "10.1.2.3"},
	} {
		t.Run(tc.addr+"/"+tc.host, func(t *testing.T) {
			k, err := New(Config{Host: tc.host, InterfaceAddrs: addrs("127.0.0.1/8", "::1/128", "198.18.0.10/24", "fd00::10/64")})
			if err != nil {
				t.Fatal(err)
			}
			got, err := k.target("address", tc.addr)
			if tc.foreign {
				if !errors.Is(err, ErrForeignAddress) || Unverifiable(err) {
					t.Fatalf("target(%q) = %q, %v; want ErrForeignAddress, not Unverifiable", tc.addr, got, err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("target(%q) = %q, %v; want %q", tc.addr, got, err, tc.want)
			}
		})
	}

	// On the wire: a kubelet-like server on an address of this machine that the prober is told is not the
	// node's gets no connection at all, for /configz nor /healthz; told it is, it gets the token.
	ip := nodeAddr(t)
	if ip == "" {
		ciskip.Skipf(t, "this machine has no non-loopback IPv4 address to listen on")
	}
	pair := newPair(t, nil, false)
	srv := newKubeletServer(t, ip, pair)
	certFile := filepath.Join(t.TempDir(), "kubelet.crt")
	writeFile(t, certFile, pair.certPEM)
	k, err := New(Config{TokenFile: tokenFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	kc := &configcheck.Checked{Address: ip, Port: srv.port(), HealthzBindAddress: ip, HealthzPort: srv.port(),
		Fields: map[string]any{"tlsCertFile": certFile}}
	k.interfaceAddrs = addrs("127.0.0.1/8", "::1/128")
	if _, err := k.Configz(context.Background(), kc); !errors.Is(err, ErrForeignAddress) {
		t.Errorf("Configz on a foreign address: %v, want ErrForeignAddress", err)
	}
	if err := k.Healthz(context.Background(), kc); !errors.Is(err, ErrForeignAddress) {
		t.Errorf("Healthz on a foreign address: %v, want ErrForeignAddress", err)
	}
	if conns, tokens := srv.seen(); conns != 0 || len(tokens) != 0 {
		t.Fatalf("foreign address got %d connections, tokens %q; want none", conns, tokens)
	}
	k.interfaceAddrs = net.InterfaceAddrs
	if _, err := k.Configz(context.Background(), kc); err != nil {
		t.Fatalf("Configz on this node's address %s: %v", ip, err)
	}
	if _, tokens := srv.seen(); len(tokens) != 1 || tokens[0] != "Bearer secret-token" {
		t.Fatalf("this node's kubelet got tokens %q, want the token once", tokens)
	}
}

func TestForeign(t *testing.T) {
	for _, tc := range []struct {
		name, host string
		kc         configcheck.Checked
		want       string // "" for nil, else what the error says
	}{
		{name: "all addresses", kc: configcheck.Checked{Address: "0.0.0.0", HealthzBindAddress: "127.0.0.1", HealthzPort: 10248}},
		{name: "the node's", kc: configcheck.Checked{Address: "198.18.0.10", HealthzBindAddress: "198.18.0.10", HealthzPort: 10248}},
		{name: "address elsewhere", kc: configcheck.Checked{Address: "203.0.113.7"}, want: "address 203.0.113.7 is neither"},
		{name: "healthz elsewhere", kc: configcheck.Checked{Address: "0.0.0.0", HealthzBindAddress: "203.0.113.7", HealthzPort: 10248},
			want: "healthzBindAddress 203.0.113.7 is neither"},
		{name: "healthz elsewhere but off", kc: configcheck.Checked{Address: "0.0.0.0", HealthzBindAddress: "203.0.113.7"}},
		{name: "--kubelet-host says where", host: "10.1.2.3", kc: configcheck.Checked{Address: "203.0.113.7"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k, err := New(Config{Host: tc.host, InterfaceAddrs: addrs("127.0.0.1/8", "198.18.0.10/24")})
			if err != nil {
				t.Fatal(err)
			}
			err = k.Foreign(&tc.kc)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Foreign = %v, want nil", err)
			case tc.want != "" && (!errors.Is(err, ErrForeignAddress) || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("Foreign = %v, want ErrForeignAddress saying %q", err, tc.want)
			}
		})
	}
}

// TestServingCertificateIsPinned: the token goes only over a connection whose certificate is the one the
// kubelet's config makes it serve (or, with --kubelet-ca-file, one the CA signed); a wrong or unreadable
// certificate sends nothing, and the error is neither Unverifiable nor a foreign address.
func TestServingCertificateIsPinned(t *testing.T) {
	served := newPair(t, nil, false)
	other := newPair(t, nil, false)
	ca := newPair(t, nil, true)
	fromCA := newPair(t, ca, false)
	otherCA := newPair(t, nil, true)

	for _, tc := range []struct {
		name    string
		serving *keyPair
		files   map[string][][]byte // relative to a temp dir
		fields  map[string]any      // "DIR" in a string value is the temp dir
		flags   []string
		caFile  string // relative to the temp dir
		ok      bool
		dialled bool // a connection was made (and refused at the handshake)
	}{
		{name: "tlsCertFile", serving: served, files: map[string][][]byte{"tls.crt": {served.certPEM}},
			fields: map[string]any{"tlsCertFile": "DIR/tls.crt"}, ok: true},
		{name: "tlsCertFile holds another certificate", serving: served, files: map[string][][]byte{"tls.crt": {other.certPEM}},
			fields: map[string]any{"tlsCertFile": "DIR/tls.crt"}, dialled: true},
		{name: "tlsCertFile unreadable", serving: served, fields: map[string]any{"tlsCertFile": "DIR/missing.crt"}},
		{name: "tlsCertFile with its CA after it", serving: fromCA, files: map[string][][]byte{"tls.crt": {fromCA.certPEM, ca.certPEM}},
			fields: map[string]any{"tlsCertFile": "DIR/tls.crt"}, ok: true},
		{name: "self-signed in --cert-dir", serving: served, files: map[string][][]byte{"pki/kubelet.crt": {served.certPEM}},
			flags: []string{"--v=1", "--cert-dir", "DIR/pki"}, ok: true},
		{name: "self-signed in --cert-dir is another", serving: served, files: map[string][][]byte{"pki/kubelet.crt": {other.certPEM}},
			flags: []string{"--cert-dir=DIR/pki"}, dialled: true},
		{name: "self-signed where the sidecar does not see it", serving: served, files: map[string][][]byte{"pki/kubelet.crt": {served.certPEM}},
			flags: []string{"--cert-dir=DIR/not-mounted"}},
		{name: "bootstrapped, key in the same file", serving: served,
			files:  map[string][][]byte{"pki/kubelet-server-current.pem": {served.certPEM, served.keyPEM}, "pki/kubelet.crt": {other.certPEM}},
			fields: map[string]any{"serverTLSBootstrap": true}, flags: []string{"--cert-dir=DIR/pki"}, ok: true},
		{name: "bootstrapped, not yet issued", serving: served, files: map[string][][]byte{"pki/kubelet.crt": {served.certPEM}},
			fields: map[string]any{"serverTLSBootstrap": true}, flags: []string{"--cert-dir=DIR/pki"}},
		{name: "--kubelet-ca-file signed it", serving: fromCA, files: map[string][][]byte{"ca.crt": {ca.certPEM}}, caFile: "ca.crt", ok: true},
		{name: "--kubelet-ca-file did not sign it", serving: fromCA, files: map[string][][]byte{"ca.crt": {otherCA.certPEM}}, caFile: "ca.crt", dialled: true},
		{name: "--kubelet-ca-file, self-signed", serving: served, files: map[string][][]byte{"ca.crt": {ca.certPEM}}, caFile: "ca.crt", dialled: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, data := range tc.files {
				writeFile(t, filepath.Join(dir, name), data...)
			}
			fields := map[string]any{}
			for key, v := range tc.fields {
				if s, ok := v.(string); ok {
					v = strings.ReplaceAll(s, "DIR", dir)
				}
				fields[key] = v
			}
			var flags []string
			for _, f := range tc.flags {
				flags = append(flags, strings.ReplaceAll(f, "DIR", dir))
			}
			caFile := ""
			if tc.caFile != "" {
				caFile = filepath.Join(dir, tc.caFile)
			}
			srv := newKubeletServer(t, "127.0.0.1", tc.serving)
			k, err := New(Config{TokenFile: tokenFile(t), CAFile: caFile})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := k.ObserveFlags(nopChecker{}).Check(context.Background(), configcheck.Request{Flags: flags}); err != nil {
				t.Fatal(err)
			}
			got, err := k.Configz(context.Background(), &configcheck.Checked{Address: "127.0.0.1", Port: srv.port(), Fields: fields})
			conns, tokens := srv.seen()
			if tc.ok {
				if err != nil || got["eventRecordQPS"] != float64(7) || len(tokens) != 1 {
					t.Fatalf("Configz = %v, %v; tokens %q; want the config, the token sent once", got, err, tokens)
				}
				return
			}
			if !errors.Is(err, ErrServingCert) || Unverifiable(err) || errors.Is(err, ErrForeignAddress) {
				t.Errorf("Configz error %v; want ErrServingCert only", err)
			}
			if len(tokens) != 0 {
				t.Errorf("token sent to an unverified kubelet: %q", tokens)
			}
			if (conns > 0) != tc.dialled {
				t.Errorf("%d connections; want dialled=%v (an unknown certificate is refused before dialling)", conns, tc.dialled)
			}
		})
	}
}

type nopChecker struct{}

func (nopChecker) Check(context.Context, configcheck.Request) (*configcheck.Checked, error) {
	return &configcheck.Checked{}, nil
}

// TestRotatedCertificateIsPickedUp: the pinned file is read at every probe, so a rotation (the kubelet's
// certificate manager, or the operator replacing tlsCertFile) is followed, in both directions.
func TestRotatedCertificateIsPickedUp(t *testing.T) {
	first, second := newPair(t, nil, false), newPair(t, nil, false)
	srv := newKubeletServer(t, "127.0.0.1", first)
	dir := filepath.Join(t.TempDir(), "pki")
	writeFile(t, filepath.Join(dir, "kubelet-server-current.pem"), first.certPEM, first.keyPEM)
	k, err := New(Config{TokenFile: tokenFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k.ObserveFlags(nopChecker{}).Check(context.Background(), configcheck.Request{Flags: []string{"--cert_dir=" + dir}}); err != nil {
		t.Fatal(err)
	}
	kc := &configcheck.Checked{Address: "0.0.0.0", Port: srv.port(), Fields: map[string]any{"serverTLSBootstrap": true}}
	for i, step := range []struct {
		file, serving *keyPair
		ok            bool
	}{
		{file: first, serving: first, ok: true},
		{file: second, serving: first},            // rotated on disk, the old one still served: not the kubelet's
		{file: second, serving: second, ok: true}, // the kubelet serves the new one
		{file: first, serving: second},
	} {
		writeFile(t, filepath.Join(dir, "kubelet-server-current.pem"), step.file.certPEM, step.file.keyPEM)
		srv.serving.Store(step.serving)
		_, before := srv.seen()
		_, err := k.Configz(context.Background(), kc)
		_, after := srv.seen()
		if step.ok != (err == nil) || (len(after) > len(before)) != step.ok {
			t.Errorf("step %d: Configz error %v, tokens %d→%d; want ok=%v", i, err, len(before), len(after), step.ok)
		}
	}
}

// TestServingCertFile: where the kubelet (1.34 to 1.37) keeps the certificate it serves, for each way a config can
// set it up.
func TestServingCertFile(t *testing.T) {
	dir := t.TempDir()
	pki := filepath.Join(dir, "pki")
	writeFile(t, filepath.Join(dir, "tls.crt"), []byte("x"))
	writeFile(t, filepath.Join(dir, "tls.key"), []byte("x"))
	bootDir := filepath.Join(dir, "boot")
	writeFile(t, filepath.Join(bootDir, "kubelet-server-current.pem"), []byte("x"))
	for _, tc := range []struct {
		name    string
		fields  map[string]any
		certDir string
		want    string // "" = error
	}{
		{name: "default: self-signed", certDir: pki, want: filepath.Join(pki, "kubelet.crt")},
		{name: "tlsCertFile", fields: map[string]any{"tlsCertFile": "/etc/kubelet/tls.crt"}, certDir: pki, want: "/etc/kubelet/tls.crt"},
		{name: "rotateCertificates is the client certificate", fields: map[string]any{"rotateCertificates": true}, certDir: pki, want: filepath.Join(pki, "kubelet.crt")},
		{name: "bootstrap: current", fields: map[string]any{"serverTLSBootstrap": true, "tlsCertFile": filepath.Join(dir, "tls.crt"), "tlsPrivateKeyFile": filepath.Join(dir, "tls.key")},
			certDir: bootDir, want: filepath.Join(bootDir, "kubelet-server-current.pem")},
		{name: "bootstrap: tlsCertFile until issued", fields: map[string]any{"serverTLSBootstrap": true, "tlsCertFile": filepath.Join(dir, "tls.crt"), "tlsPrivateKeyFile": filepath.Join(dir, "tls.key")},
			certDir: pki, want: filepath.Join(dir, "tls.crt")},
		{name: "bootstrap: nothing yet", fields: map[string]any{"serverTLSBootstrap": true}, certDir: pki},
		{name: "bootstrap with the gate off: tlsCertFile", fields: map[string]any{"serverTLSBootstrap": true, "tlsCertFile": "/etc/kubelet/tls.crt",
			"featureGates": map[string]any{"RotateKubeletServerCertificate": false}}, certDir: bootDir, want: "/etc/kubelet/tls.crt"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ServingCertFile(tc.fields, tc.certDir)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("ServingCertFile = %q, want an error", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ServingCertFile = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestCertDir(t *testing.T) {
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{nil, DefaultCertDir},
		{[]string{"--v=1", "--root-dir=/srv/kubelet"}, DefaultCertDir},
		{[]string{"--cert-dir=/a"}, "/a"},
		{[]string{"--cert-dir", "/a", "--v=1"}, "/a"},
		{[]string{"--cert_dir=/a"}, "/a"},
		{[]string{"--cert-dir=/a", "--cert-dir=/b"}, "/b"},
		{[]string{"--", "--cert-dir=/a"}, DefaultCertDir},
		{[]string{"--cert-dir"}, DefaultCertDir},
	} {
		if got := CertDir(tc.flags); got != tc.want {
			t.Errorf("CertDir(%q) = %q, want %q", tc.flags, got, tc.want)
		}
	}
}

// TestRedirectIsNotFollowed: an answer that redirects does not take the token anywhere.
func TestRedirectIsNotFollowed(t *testing.T) {
	pair := newPair(t, nil, false)
	elsewhere := newKubeletServer(t, "127.0.0.1", pair)
	srv := httptest.NewUnstartedServer(http.RedirectHandler("https://127.0.0.1:"+strconv.Itoa(int(elsewhere.port()))+"/configz", http.StatusFound))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{pair.tls}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	certFile := filepath.Join(t.TempDir(), "kubelet.crt")
	writeFile(t, certFile, pair.certPEM)
	k, err := New(Config{TokenFile: tokenFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	if _, err := k.Configz(context.Background(), &configcheck.Checked{Address: "127.0.0.1", Port: int32(port), Fields: map[string]any{"tlsCertFile": certFile}}); err == nil {
		t.Error("a redirect was taken for /configz")
	}
	if conns, tokens := elsewhere.seen(); conns != 0 || len(tokens) != 0 {
		t.Errorf("redirect target got %d connections, tokens %q", conns, tokens)
	}
}

// TestUsageGoesWhereConfigzGoes: /stats/summary and /pods are read from the kubelet's own certificate with
// the token, as /configz is; another certificate gets no token.
func TestUsageGoesWhereConfigzGoes(t *testing.T) {
	pair := newPair(t, nil, false)
	srv := newKubeletServer(t, "127.0.0.1", pair)
	certFile := filepath.Join(t.TempDir(), "kubelet.crt")
	writeFile(t, certFile, pair.certPEM)
	k, err := New(Config{TokenFile: tokenFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	kc := &configcheck.Checked{Address: "127.0.0.1", Port: srv.port(), Fields: map[string]any{"tlsCertFile": certFile}}
	summary, err := k.Summary(context.Background(), kc)
	if err != nil || summary.Node.Memory == nil || *summary.Node.Memory.AvailableBytes != 1024 {
		t.Fatalf("Summary = %+v, %v; want the node's memory", summary, err)
	}
	pods, err := k.Pods(context.Background(), kc)
	if err != nil || len(pods) != 1 || pods[0].Namespace+"/"+pods[0].Name != "web/hungry" {
		t.Fatalf("Pods = %+v, %v; want web/hungry", pods, err)
	}
	if _, tokens := srv.seen(); len(tokens) != 2 || tokens[0] != "Bearer secret-token" {
		t.Fatalf("the kubelet got tokens %q, want the token twice", tokens)
	}
	other := newPair(t, nil, false)
	writeFile(t, certFile, other.certPEM)
	if _, err := k.Summary(context.Background(), kc); !errors.Is(err, ErrServingCert) {
		t.Errorf("Summary from a kubelet presenting another certificate: %v, want ErrServingCert", err)
	}
	if _, tokens := srv.seen(); len(tokens) != 2 {
		t.Errorf("the token went to a kubelet presenting another certificate: %q", tokens)
	}
}
