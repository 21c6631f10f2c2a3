// Command fake-kubelet is the stand-in kubelet of the dev cluster's simulated nodes. It takes the kubelet's
// command line, loads --config with the kubelet's own loader, flag precedence and validation (exiting 1 on a
// config the kubelet would refuse, as the kubelet does), fails to start when containerRuntimeEndpoint names a
// unix socket that does not exist (as the kubelet does), and otherwise serves /healthz (HTTP) and /configz
// (HTTPS, self-signed) where the config says, until SIGTERM. $FAKE_KUBELET_PID_FILE receives its PID once
// it serves. Simulated nodes exercise the real sidecar code without a real kubelet each.
package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dkc-dev/dkc/sidecar/configcheck"
	"github.com/dkc-dev/dkc/sidecar/kubeletconfig"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "fake-kubelet: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	cfgFile, flags := configcheck.ConfigFlag(os.Args[1:])
	r, err := kubeletconfig.Load(context.Background(), cfgFile, flags)
	if err != nil {
		return fmt.Errorf("failed to load kubelet config file %s: %w", cfgFile, err)
	}
	kc := r.Config
	if sock, ok := strings.CutPrefix(kc.ContainerRuntimeEndpoint, "unix://"); ok {
		if _, err := os.Stat(sock); err != nil {
			time.Sleep(200 * time.Millisecond)
			return fmt.Errorf("validate service connection: %s: %w", kc.ContainerRuntimeEndpoint, err)
		}
	}
	configz, err := kubeletconfig.ToV1beta1JSON(kc)
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
	cert, err := selfSigned()
	if err != nil {
		return err
	}
	al, err := tls.Listen("tcp", net.JoinHostPort(kc.Address, strconv.Itoa(int(kc.Port))), &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		return err
	}
	go func() { _ = http.Serve(hl, health) }()
	go func() { _ = http.Serve(al, api) }()
	if f := os.Getenv("FAKE_KUBELET_PID_FILE"); f != "" {
		if err := os.WriteFile(f, []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
			return err
		}
	}
	fmt.Printf("fake-kubelet serving config %s (eventRecordQPS %d)\n", cfgFile, kc.EventRecordQPS)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, os.Interrupt)
	<-sig
	return nil
}

func selfSigned() (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "fake-kubelet"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour), IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, nil
}
