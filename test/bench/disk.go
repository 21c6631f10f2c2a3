// SPDX-License-Identifier: Apache-2.0

package bench

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dkc-dev/dkc/internal/durable"
)

// Disk modes of the simulated nodes (Config.Disk).
const (
	// DiskSimulated keeps every simulated node's directory on tmpfs and makes each fsync there cost one
	// fsync of this machine's real disk, drawn from latencies measured on it before the cluster starts.
	DiskSimulated = "simulated"
	// DiskShared keeps every simulated node's directory on the real disk, shared with etcd and every other
	// simulated node, with at most Config.DiskWriters durable writes at once.
	DiskShared = "shared"
)

// defaultTmpfs holds the simulated nodes' directories in DiskSimulated mode.
const defaultTmpfs = "/dev/shm"

// simulatedFsyncThreads bounds the simulated fsyncs charged in a blocked thread at once (syscallSleeper).
// The propagation phase, a change every 40 ms and a checkpoint's fsyncs one after another, has one or two
// at a time.
const simulatedFsyncThreads = 8

// fsyncLatencies measures n fsyncs on dir's filesystem, as a sidecar's durable write makes them: a small
// new file written and fsynced, then its directory fsynced. Each fsync is one sample.
func fsyncLatencies(dir string, n int) ([]time.Duration, error) {
	tmp, err := os.MkdirTemp(dir, ".fsync-probe-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	d, err := os.Open(tmp)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	data := make([]byte, 1024)
	var out []time.Duration
	for i := range n {
		f, err := os.Create(filepath.Join(tmp, fmt.Sprintf("f%d", i)))
		if err != nil {
			return nil, err
		}
		if _, err := f.Write(data); err != nil {
			f.Close()
			return nil, err
		}
		start := time.Now()
		err = f.Sync()
		out = append(out, time.Since(start))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		start = time.Now()
		if err := d.Sync(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// fsyncCost makes every fsync of durable (the sidecar's only writer) in this process take one of samples,
// drawn at random, before the real fsync runs on tmpfs (where it costs next to nothing). Each simulated node
// then pays its own disk's latency without queueing behind 999 other nodes and etcd in one journal, as a
// node with its own disk does. durable's fault hook is called once before each fsync: "fsync" and
// "fsync-dir" precede one each; "write" precedes one only inside durable.WriteDir, whose files are written
// into a temporary directory before the target directory exists. sleep is a syscallSleeper's outside tests.
func fsyncCost(samples []time.Duration, sleep func(time.Duration)) durable.FaultFunc {
	return func(step, path string) error {
		switch step {
		case "fsync", "fsync-dir":
		case "write":
			if _, err := os.Stat(filepath.Dir(path)); !errors.Is(err, os.ErrNotExist) {
				return nil // durable.WriteFile: its fsync is the "fsync" step
			}
		default:
			return nil
		}
		sleep(samples[rand.IntN(len(samples))])
		return nil
	}
}

// syscallSleeper charges a simulated fsync as a real one costs while precise: the calling thread blocked
// in the kernel for the sample's duration (nanosleep). time.Sleep cannot charge sub-millisecond fsyncs:
// the Go scheduler waits for timers in whole milliseconds when it has nothing else to run, so a 0.3 ms
// sample measured 1.1 ms p50 and 4 ms p99 on this machine while the benchmark ran, and a checkpoint's
// fsyncs cost three times the disk's. Precise is for latency measurements (propagation), where a few
// nodes checkpoint at a time. Thousands of nodes checkpointing at once in this one process (a fan-out)
// would instead hold its 2 Ps in syscalls, stalling every other node's goroutines, which nodes with
// their own CPUs do not suffer (measured: a 2,000-node fan-out took 4.6 s instead of 0.7 s): there,
// and past simulatedFsyncThreads, time.Sleep, whose rounding is small against the seconds a fan-out takes.
type syscallSleeper struct {
	precise atomic.Bool
	threads chan struct{}
}

func newSyscallSleeper(threads int) *syscallSleeper {
	return &syscallSleeper{threads: make(chan struct{}, threads)}
}

func (s *syscallSleeper) sleep(d time.Duration) {
	if !s.precise.Load() {
		time.Sleep(d)
		return
	}
	select {
	case s.threads <- struct{}{}:
		defer func() { <-s.threads }()
	default:
		time.Sleep(d)
		return
	}
	ts := unix.NsecToTimespec(d.Nanoseconds())
	for unix.Nanosleep(&ts, &ts) == unix.EINTR {
	}
}

// setPrecise turns precise charging on or off; a nil sleeper (-disk=shared) ignores it.
func (s *syscallSleeper) setPrecise(on bool) {
	if s != nil {
		s.precise.Store(on)
	}
}

// sleepAccuracy measures how long sleep takes for each of samples (the charged fsync latencies).
func sleepAccuracy(sleep func(time.Duration), samples []time.Duration) []time.Duration {
	took := make([]time.Duration, 0, len(samples))
	for _, d := range samples {
		start := time.Now()
		sleep(d)
		took = append(took, time.Since(start))
	}
	return took
}
