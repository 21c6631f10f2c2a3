// SPDX-License-Identifier: Apache-2.0

// Command fake-kubelet is the stand-in kubelet of the dev cluster's simulated nodes. It takes the kubelet's
// command line, loads --config with the kubelet's own loader, flag precedence and validation (exiting 1 on a
// config the kubelet would refuse, as the kubelet does), exits when containerRuntimeEndpoint or
// imageServiceEndpoint names a unix socket that does not exist (as the kubelet does, after its service
// manager reported it started), and otherwise serves /healthz (HTTP) and /configz (HTTPS) where the config
// says, until SIGTERM. $FAKE_KUBELET_PID_FILE receives its PID once its config is loaded: the start a
// service manager would report.
// Simulated nodes exercise the real sidecar code without a real kubelet each.
//
// It serves the certificate a kubelet would (servingCert): the config's tlsCertFile, or the self-signed
// <--cert-dir>/kubelet.crt it creates on first start and reuses after, because dkc-sidecar sends its token
// only to a kubelet presenting that certificate.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	certutil "k8s.io/client-go/util/cert"
	nodeutil "k8s.io/component-helpers/node/util"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/durable"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "fake-kubelet: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	cfgFile, flags := configcheck.ConfigFlag(os.Args[1:])
	r, err := kubeletcheck.Load(context.Background(), cfgFile, flags)
	if err != nil {
		return fmt.Errorf("failed to load kubelet config file %s: %w", cfgFile, err)
	}
	kc := r.Config
	// Running, as a service manager would report it (systemd's Type=simple: the process exists): a kubelet
	// that now fails to reach its runtime exits after its start was reported, and the sidecar sees a
	// kubelet that never gets healthy (and rolls back), not one that was never started.
	if f := os.Getenv("FAKE_KUBELET_PID_FILE"); f != "" {
		if err := os.WriteFile(f, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return err
		}
	}
	// The runtime and the image service (which defaults to the runtime's endpoint), as the kubelet's
	// validateServiceConnection checks them.
	for _, endpoint := range []string{kc.ContainerRuntimeEndpoint, kc.ImageServiceEndpoint} {
		if sock, ok := strings.CutPrefix(endpoint, "unix://"); ok {
			if _, err := os.Stat(sock); err != nil {
				time.Sleep(200 * time.Millisecond)
				return fmt.Errorf("validate service connection: %s: %w", endpoint, err)
			}
		}
	}
	kf, err := kubeletcheck.ParseKubeletFlags(flags)
	if err != nil {
		return err
	}
	configz, err := kubeletcheck.ToV1beta1JSON(kc)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(map[string]any{"kubeletconfig": configz})

	health := http.NewServeMux()
	health.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	hl, err := net.Listen("tcp", net.JoinHostPort(kc.HealthzBindAddress, strconv.Itoa(int(kc.HealthzPort))))
	if err != nil {
		return err
	}
	api := http.NewServeMux()
	api.HandleFunc("/configz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	cert, err := servingCert(kf, kc)
	if err != nil {
		return err
	}
	al, err := tls.Listen("tcp", net.JoinHostPort(kc.Address, strconv.Itoa(int(kc.Port))),
		&tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(hl, health) }()
	go func() { _ = http.Serve(al, api) }()
	fmt.Printf("fake-kubelet serving config %s (eventRecordQPS %d)\n", cfgFile, kc.EventRecordQPS)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	return nil
}

// servingCert is the certificate the kubelet (v1.34 to v1.37) serves (cmd/kubelet/app/server.go, InitializeTLS):
// tlsCertFile/tlsPrivateKeyFile when set; otherwise <cert-dir>/kubelet.crt and kubelet.key, created
// self-signed when they cannot be read and reused as they are otherwise. A bootstrapped serving certificate
// (serverTLSBootstrap) needs a CSR signer the dev cluster does not run: refused, not faked.
func servingCert(kf *options.KubeletFlags, kc *kubeletconfiginternal.KubeletConfiguration) (tls.Certificate, error) {
	if kc.ServerTLSBootstrap {
		return tls.Certificate{}, errors.New("serverTLSBootstrap: the stand-in kubelet does not " +
			"bootstrap serving certificates")
	}
	if kc.TLSCertFile != "" || kc.TLSPrivateKeyFile != "" {
		return tls.LoadX509KeyPair(kc.TLSCertFile, kc.TLSPrivateKeyFile)
	}
	return selfSigned(kf)
}

// selfSigned creates <cert-dir>/kubelet.crt and kubelet.key when they cannot be read, as the kubelet does,
// and loads them. Simulated nodes started without --cert-dir share the kubelet's default directory, so the
// check and the writes happen under a lock on it, and the files are written durably by rename: a stand-in
// kubelet starting beside another never reads a half-written or mismatched pair.
func selfSigned(kf *options.KubeletFlags) (tls.Certificate, error) {
	certFile := filepath.Join(kf.CertDirectory, "kubelet.crt")
	keyFile := filepath.Join(kf.CertDirectory, "kubelet.key")
	if err := os.MkdirAll(kf.CertDirectory, 0o755); err != nil {
		return tls.Certificate{}, fmt.Errorf("create cert dir: %w", err)
	}
	dir, err := os.Open(kf.CertDirectory)
	if err != nil {
		return tls.Certificate{}, err
	}
	defer dir.Close()
	if err := syscall.Flock(int(dir.Fd()), syscall.LOCK_EX); err != nil {
		return tls.Certificate{}, fmt.Errorf("lock %s: %w", kf.CertDirectory, err)
	}
	defer func() { _ = syscall.Flock(int(dir.Fd()), syscall.LOCK_UN) }()
	if ok, err := certutil.CanReadCertAndKey(certFile, keyFile); err != nil {
		return tls.Certificate{}, err
	} else if !ok {
		host, err := nodeutil.GetHostname(kf.HostnameOverride)
		if err != nil {
			return tls.Certificate{}, err
		}
		cert, key, err := certutil.GenerateSelfSignedCertKey(host, nil, nil)
		if err != nil {
			return tls.Certificate{}, fmt.Errorf("unable to generate self signed cert: %w", err)
		}
		if err := durable.WriteFile(keyFile, key, 0o600); err != nil {
			return tls.Certificate{}, err
		}
		if err := durable.WriteFile(certFile, cert, 0o644); err != nil {
			return tls.Certificate{}, err
		}
	}
	return tls.LoadX509KeyPair(certFile, keyFile)
}
