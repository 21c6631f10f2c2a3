// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

// ForwardConfig says what Forward serves: connections to Listen are passed to a ready endpoint of the
// Service Namespace/Service, port PortName, chosen afresh for every connection.
type ForwardConfig struct {
	Kubeconfig string
	Namespace  string
	Service    string
	PortName   string
	Listen     string
	// AddrFile receives the address Forward listens on (Listen may end in :0), once it does.
	AddrFile string
}

// Forward is the installed form's DKC_SERVER (CONTRACT §6: an address reachable from the host, "a
// port-forward is fine"). kubectl port-forward would do for a moment, but it sticks to one pod and ends
// with it, and the installed suite deletes dkc-server pods on purpose; this forwarder asks the Service's
// EndpointSlices for a ready pod on every connection and dials its IP, which the host routes to the node
// that runs it (setupPodNetwork). It runs until ctx ends, as the `dkc-dev forward` process the cluster
// starts and stops by PID like its other processes.
func Forward(ctx context.Context, cfg ForwardConfig) error {
	rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
	if err != nil {
		return fmt.Errorf("forward: kubeconfig %s: %w", cfg.Kubeconfig, err)
	}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("forward: %w", err)
	}
	defer ln.Close()
	if cfg.AddrFile != "" {
		if err := writeFileAtomic(cfg.AddrFile, []byte(ln.Addr().String()+"\n")); err != nil {
			return fmt.Errorf("forward: %w", err)
		}
	}
	fmt.Fprintf(os.Stderr, "forwarding %s to service %s/%s port %s\n", ln.Addr(), cfg.Namespace, cfg.Service, cfg.PortName)
	go func() { <-ctx.Done(); ln.Close() }()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("forward: accept: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := forwardConn(ctx, client, cfg, conn); err != nil {
				fmt.Fprintf(os.Stderr, "forward %s: %v\n", conn.RemoteAddr(), err)
			}
		}()
	}
}

// forwardConn passes conn to one ready endpoint, trying them in random order.
func forwardConn(ctx context.Context, client kubernetes.Interface, cfg ForwardConfig, conn net.Conn) error {
	defer conn.Close()
	addrs, err := readyEndpoints(ctx, client, cfg)
	if err != nil {
		return err
	}
	var upstream net.Conn
	var errs []error
	d := net.Dialer{Timeout: 3 * time.Second}
	for _, a := range addrs {
		if upstream, err = d.DialContext(ctx, "tcp", a); err == nil {
			break
		}
		errs = append(errs, err)
	}
	if upstream == nil {
		return fmt.Errorf("no endpoint of service %s/%s answered: %w", cfg.Namespace, cfg.Service, errors.Join(errs...))
	}
	defer upstream.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		if tc, ok := dst.(*net.TCPConn); ok {
			_ = tc.CloseWrite() // pass the half-close on, as a proxy must for protocols that use it
		}
		done <- struct{}{}
	}
	go pipe(upstream, conn)
	go pipe(conn, upstream)
	select {
	case <-done:
		<-done
	case <-ctx.Done():
	}
	return nil
}

// readyEndpoints are host:port of the Service's ready endpoints for cfg.PortName, shuffled.
func readyEndpoints(ctx context.Context, client kubernetes.Interface, cfg ForwardConfig) ([]string, error) {
	slices, err := client.DiscoveryV1().EndpointSlices(cfg.Namespace).List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=" + cfg.Service,
	})
	if err != nil {
		return nil, fmt.Errorf("list endpoints of service %s/%s: %w", cfg.Namespace, cfg.Service, err)
	}
	var addrs []string
	for _, s := range slices.Items {
		port := int32(0)
		for _, p := range s.Ports {
			if p.Name != nil && *p.Name == cfg.PortName && p.Port != nil {
				port = *p.Port
			}
		}
		if port == 0 {
			continue
		}
		for _, e := range s.Endpoints {
			if e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			for _, ip := range e.Addresses {
				addrs = append(addrs, net.JoinHostPort(ip, strconv.Itoa(int(port))))
			}
		}
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("service %s/%s has no ready endpoint for port %s", cfg.Namespace, cfg.Service, cfg.PortName)
	}
	rand.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
	return addrs, nil
}

// startForwarder runs `<bin> forward` for the dkc-server Service's gRPC port on a free loopback port and
// returns the address it listens on.
func (c *Cluster) startForwarder(ctx context.Context, bin string) (string, error) {
	addrFile := filepath.Join(c.runDir(), "dkc-server-forward.addr")
	_ = os.Remove(addrFile)
	p, err := startProcess("dkc-server-forward", c.runDir(), c.logFile("dkc-server-forward"), nil, bin, "forward",
		"-kubeconfig", c.KubeconfigPath(), "-namespace", "kube-system", "-service", "dkc-server", "-port-name", "grpc",
		"-listen", "127.0.0.1:0", "-addr-file", addrFile)
	if err != nil {
		return "", err
	}
	c.procs = append(c.procs, p)
	var addr string
	err = pollUntil(ctx, 30*time.Second, "dkc-server forwarder listening", func(context.Context) error {
		data, err := os.ReadFile(addrFile)
		if err != nil {
			return err
		}
		addr = strings.TrimSpace(string(data))
		return nil
	})
	return addr, err
}

func writeFileAtomic(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
