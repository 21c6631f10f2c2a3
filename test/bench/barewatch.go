// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// BareWatchFlag makes the benchmark binary run BareWatch instead of the benchmark.
const BareWatchFlag = "bare-watch-kubeconfig"

const bareWatchSynced = "synced"

// BareWatch is the propagation baseline, run in a process of its own so that the thousands of simulated
// nodes of the benchmark process do not slow it: a client-go informer on Nodes (the same watch dkc-server
// has, protobuf-encoded) with nothing behind it. For every node and value of its config-source annotation it
// prints "<node>\t<annotation>\t<unix nanoseconds>" the first time it sees them, after one "synced" line.
func BareWatch(ctx context.Context, kubeconfig string, out io.Writer) error {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	rc.ContentType = "application/vnd.kubernetes.protobuf"
	rc.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(out)
	var mu sync.Mutex
	seen := map[string]bool{}
	note := func(obj any) {
		now := time.Now().UnixNano()
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		a := n.Annotations[nodeconfig.SourceAnnotation]
		mu.Lock()
		defer mu.Unlock()
		if key := n.Name + "\t" + a; !seen[key] {
			seen[key] = true
			fmt.Fprintf(w, "%s\t%d\n", key, now)
			_ = w.Flush()
		}
	}
	inf := cache.NewSharedIndexInformer(cache.NewListWatchFromClient(client.CoreV1().RESTClient(), "nodes",
		metav1.NamespaceAll, fields.Everything()), &corev1.Node{}, 0, cache.Indexers{})
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: note,
		UpdateFunc: func(_, obj any) { note(obj) }}); err != nil {
		return err
	}
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return errors.New("node informer did not sync")
	}
	mu.Lock()
	fmt.Fprintln(w, bareWatchSynced)
	err = w.Flush()
	mu.Unlock()
	if err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}

// bareWatcher runs BareWatch in a child process and collects what it saw.
type bareWatcher struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	seen map[string]time.Time // node + "\t" + annotation
	done chan struct{}
}

func startBareWatch(ctx context.Context, kubeconfig string) (*bareWatcher, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	b := &bareWatcher{seen: map[string]time.Time{}, done: make(chan struct{})}
	b.cmd = exec.Command(self, "-"+BareWatchFlag+"="+kubeconfig)
	b.cmd.Stderr = os.Stderr
	stdout, err := b.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := b.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the bare watch: %w", err)
	}
	synced := make(chan struct{})
	go func() {
		defer close(b.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if line == bareWatchSynced {
				close(synced)
				continue
			}
			i := strings.LastIndexByte(line, '\t')
			if i < 0 {
				continue
			}
			ns, err := strconv.ParseInt(line[i+1:], 10, 64)
			if err != nil {
				continue
			}
			b.mu.Lock()
			b.seen[line[:i]] = time.Unix(0, ns)
			b.mu.Unlock()
		}
	}()
	select {
	case <-synced:
		return b, nil
	case <-b.done:
		b.stop()
		return nil, errors.New("the bare watch exited before its cache synced")
	case <-ctx.Done():
		b.stop()
		return nil, ctx.Err()
	}
}

// at is when the bare watch first saw node with annotation.
func (b *bareWatcher) at(node, annotation string) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.seen[node+"\t"+annotation]
	return t, ok
}

// stop kills the child by PID and reaps it.
func (b *bareWatcher) stop() {
	_ = b.cmd.Process.Kill()
	_ = b.cmd.Wait()
	<-b.done
}
