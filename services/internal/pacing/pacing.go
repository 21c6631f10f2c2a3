// SPDX-License-Identifier: Apache-2.0

// Package pacing bounds how many nodes dkc-server starts on a new direct config version at once. A Node
// pointed straight at a ConfigMap (dkc.dev/config-source, not a pool's snapshot) follows every edit of
// it: an in-place edit of a ConfigMap that many Nodes name would otherwise restart all their kubelets
// together. A pool paces its own nodes (maxUnavailable) and is not paced here.
//
// A node takes a slot when it is given a version it does not have yet, and frees it when its status
// shows the outcome (it runs the version, or reports an error about it), or after SlotTimeout without
// one (its sidecar gone: a slot must not be held for ever). The others wait, first come first served
// (ties by name), keeping what they run; they are woken when a slot frees.
//
// Every replica resolves every node, so each paces all of them with its own slots: the bound holds per
// replica. Replicas take waiting nodes in the same order, from the same Node statuses, so they mostly
// pick the same nodes, but nothing shared enforces it: at worst Limit × replicas nodes change at once.
package pacing

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/utils/clock"
)

// DefaultSlotTimeout is how long a node may hold a slot without its status showing the outcome: longer
// than a kubelet restart and its health check, short enough that a node whose sidecar died frees it.
const DefaultSlotTimeout = 10 * time.Minute

// Config of a Pacer.
type Config struct {
	Log *zap.Logger
	// Limit is how many nodes may be changing to a new direct version at once; 0 is no bound.
	Limit int
	// SlotTimeout: see DefaultSlotTimeout (the default).
	SlotTimeout time.Duration
	// Wake is called, outside any lock, with each waiting node that a freed slot may now admit: the
	// caller resolves it again, which calls Admit.
	Wake func(node string)
	// Metrics, if not nil, receives the waiting and changing counts.
	Metrics *Metrics
	// Clock defaults to the real one.
	Clock clock.WithTicker
}

// Pacer hands out the slots. Build it with New; its methods are safe for concurrent use.
type Pacer struct {
	cfg Config
	mu  sync.Mutex
	// changing: nodes holding a slot, with the version they were given and since when.
	changing map[string]slot
	// waiting: nodes refused a slot, with the version they wait for and since when.
	waiting map[string]slot
}

type slot struct {
	version string
	since   time.Time
}

// New builds a Pacer.
func New(cfg Config) *Pacer {
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	if cfg.SlotTimeout <= 0 {
		cfg.SlotTimeout = DefaultSlotTimeout
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	return &Pacer{cfg: cfg, changing: map[string]slot{}, waiting: map[string]slot{}}
}

// Admit says whether node may be given version now. A node already changing keeps its slot (a newer
// edit meanwhile changes nothing about how many nodes restart); one that is not takes a free slot if no
// node waits before it, and waits otherwise.
func (p *Pacer) Admit(node, version string) bool {
	if p.cfg.Limit <= 0 {
		return true
	}
	now := p.cfg.Clock.Now()
	p.mu.Lock()
	if s, ok := p.changing[node]; ok {
		s.version = version
		p.changing[node] = s
		p.mu.Unlock()
		return true
	}
	w, known := p.waiting[node]
	if !known {
		w = slot{since: now}
	}
	w.version = version
	p.waiting[node] = w
	free := p.cfg.Limit - len(p.changing)
	admitted := free > 0 && p.ahead(node, w, free) < free
	if admitted {
		delete(p.waiting, node)
		p.changing[node] = slot{version: version, since: now}
	}
	changing, waiting := len(p.changing), len(p.waiting)
	p.mu.Unlock()
	p.cfg.Metrics.set(changing, waiting)
	if !admitted && !known {
		p.cfg.Log.Info("node config change held: too many nodes are changing to a new direct config version",
			zap.String("node", node), zap.String("version", version), zap.Int("changing", changing),
			zap.Int("limit", p.cfg.Limit), zap.Int("waiting", waiting))
	}
	return admitted
}

// ahead counts the waiting nodes before node (w) in line, up to max.
func (p *Pacer) ahead(node string, w slot, max int) int {
	n := 0
	for other, o := range p.waiting {
		if other != node && before(other, o, node, w) {
			if n++; n >= max {
				return n
			}
		}
	}
	return n
}

func before(a string, as slot, b string, bs slot) bool {
	if c := as.since.Compare(bs.since); c != 0 {
		return c < 0
	}
	return a < b
}

// Done says that node reported the outcome of its version (or no longer needs one: its source is no
// direct ConfigMap any more, the Node is gone, it already runs what it is given): its slot, or its place
// in line, is freed.
func (p *Pacer) Done(node string) {
	if p.cfg.Limit <= 0 {
		return
	}
	p.mu.Lock()
	_, freed := p.changing[node]
	_, queued := p.waiting[node]
	if !freed && !queued {
		p.mu.Unlock()
		return
	}
	delete(p.changing, node)
	delete(p.waiting, node)
	wake := p.next()
	changing, waiting := len(p.changing), len(p.waiting)
	p.mu.Unlock()
	p.cfg.Metrics.set(changing, waiting)
	p.wake(wake)
}

// Changing says whether node holds a slot, and for which version.
func (p *Pacer) Changing(node string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	s, ok := p.changing[node]
	return s.version, ok
}

// next are the waiting nodes the free slots can take, first in line first. Called with mu held.
func (p *Pacer) next() []string {
	free := p.cfg.Limit - len(p.changing)
	if free <= 0 || len(p.waiting) == 0 {
		return nil
	}
	type w struct {
		node string
		s    slot
	}
	line := make([]w, 0, len(p.waiting))
	for n, s := range p.waiting {
		line = append(line, w{n, s})
	}
	slices.SortFunc(line, func(a, b w) int {
		if c := a.s.since.Compare(b.s.since); c != 0 {
			return c
		}
		return cmp.Compare(a.node, b.node)
	})
	out := make([]string, 0, min(free, len(line)))
	for _, x := range line[:min(free, len(line))] {
		out = append(out, x.node)
	}
	return out
}

func (p *Pacer) wake(nodes []string) {
	if p.cfg.Wake == nil {
		return
	}
	for _, n := range nodes {
		p.cfg.Wake(n)
	}
}

// Run frees the slots of nodes that did not report an outcome within SlotTimeout, until ctx ends.
func (p *Pacer) Run(ctx context.Context) error {
	if p.cfg.Limit <= 0 {
		return nil
	}
	t := p.cfg.Clock.NewTicker(max(p.cfg.SlotTimeout/10, time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			p.expire()
		}
	}
}

// expire frees the slots held past SlotTimeout.
func (p *Pacer) expire() {
	now := p.cfg.Clock.Now()
	p.mu.Lock()
	var expired []string
	for n, s := range p.changing {
		if now.Sub(s.since) >= p.cfg.SlotTimeout {
			expired = append(expired, n)
			delete(p.changing, n)
		}
	}
	var wake []string
	if len(expired) > 0 {
		wake = p.next()
	}
	changing, waiting := len(p.changing), len(p.waiting)
	p.mu.Unlock()
	for _, n := range expired {
		p.cfg.Log.Warn("node config change: no outcome reported in time; its slot goes to the next node",
			zap.String("node", n), zap.Duration("slotTimeout", p.cfg.SlotTimeout))
	}
	p.cfg.Metrics.set(changing, waiting)
	p.wake(wake)
}

// Metrics are the pacer's gauges.
type Metrics struct {
	waiting  prometheus.Gauge
	changing prometheus.Gauge
}

// NewMetrics registers the pacer's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		waiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dkc", Name: "direct_config_changes_waiting",
			Help: "Nodes whose direct config source (not a pool's) has a new version they are not sent yet: " +
				"--max-direct-config-changes nodes are changing already. Per replica."}),
		changing: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dkc", Name: "direct_config_changes_in_flight",
			Help: "Nodes sent a new direct config version that have not reported its outcome yet (each takes one of " +
				"--max-direct-config-changes). Per replica."}),
	}
	reg.MustRegister(m.waiting, m.changing)
	return m
}

func (m *Metrics) set(changing, waiting int) {
	if m != nil {
		m.changing.Set(float64(changing))
		m.waiting.Set(float64(waiting))
	}
}
