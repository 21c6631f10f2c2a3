// SPDX-License-Identifier: Apache-2.0

package rpc

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"weak"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	dkcv1 "github.com/dkc-dev/dkc/proto/dkc/v1"
	"github.com/dkc-dev/dkc/services/internal/assignment"
)

// How a WatchConfigResponse is encoded once for every node on the same assignment.
//
// The nodes on a ConfigMap version share one *Assignment (package assignment), of up to
// payload.MaxBytes. Marshalled per stream, 2,000 nodes on a 1 MiB ConfigMap would hold 2,000 encoded
// copies: grpc-go keeps a message's encoding until the peer's flow control has taken all of it, so a slow
// node holds its copy for as long as it is slow. grpc.PreparedMsg encodes once for many streams, but the
// whole message, and sync_error and resolved_time are each node's own. So the assignment is encoded once,
// as a WatchConfigResponse holding only it, and each stream adds its own fields, encoded as a second
// WatchConfigResponse: protobuf parsers merge concatenated messages, and as the two share no field, the
// concatenation is the whole message (field 1 first, as proto.Marshal orders it too). The codec hands
// gRPC both parts as the buffers of one message: nothing is copied, and the shared part, never written
// to, is not returned to a pool either (mem.SliceBuffer's Free does nothing).

// ServerOptions are the gRPC server options the service relies on: the codec that sends a shared
// assignment without copying it. Other messages (every other service's too) are gRPC's proto codec's.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ForceServerCodecV2(codec{})}
}

// response is a WatchConfigResponse whose assignment is already encoded.
type response struct {
	shared  []byte                     // field 1 encoded, shared with every stream sending that assignment; nil: none
	preview []byte                     // field 8 encoded, shared likewise; nil: none
	own     *dkcv1.WatchConfigResponse // the node's own fields, without the assignment and preview
}

var protoCodec = encoding.GetCodecV2(grpcproto.Name)

// codec is gRPC's proto codec, except that a *response is written as its two parts.
type codec struct{}

func (codec) Name() string { return grpcproto.Name }

func (codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*response)
	if !ok {
		return protoCodec.Marshal(v)
	}
	own, err := proto.Marshal(r.own)
	if err != nil {
		return nil, fmt.Errorf("marshal WatchConfigResponse: %w", err)
	}
	out := make(mem.BufferSlice, 0, 3)
	for _, b := range [][]byte{r.shared, r.preview, own} {
		if len(b) > 0 {
			out = append(out, mem.SliceBuffer(b))
		}
	}
	return out, nil
}

func (codec) Unmarshal(data mem.BufferSlice, v any) error { return protoCodec.Unmarshal(data, v) }

// encodings holds the encoding of each assignment sent, for as long as the assignment itself lives: keyed
// weakly, so that the cache never keeps an assignment (and its 1 MiB) alive, and dropped by a cleanup once
// the assignment is collected, that is once no node's state and no resolved source holds it any more. A
// pool's preview carries a snapshot as large, shared by the nodes it selects: it is encoded once as well,
// as its own part (field 8), beside the assignment's.
type encodings struct {
	assignments weakEncodings[dkcv1.Assignment]
	previews    weakEncodings[dkcv1.Preview]
	encodes     atomic.Int64 // assignments encoded, ever
}

// weakEncodings holds the encoding of each *T for as long as it lives.
type weakEncodings[T any] struct {
	mu sync.Mutex
	m  map[weak.Pointer[T]]*encoded
}

type encoded struct {
	once sync.Once
	b    []byte
	err  error
}

// get returns v's encoding, made by encode on first use; encoded says whether this call made it.
func (w *weakEncodings[T]) get(v *T, encode func() ([]byte, error)) (b []byte, made bool, err error) {
	k := weak.Make(v)
	w.mu.Lock()
	x := w.m[k]
	if x == nil {
		if w.m == nil {
			w.m = map[weak.Pointer[T]]*encoded{}
		}
		x = &encoded{}
		w.m[k] = x
		runtime.AddCleanup(v, w.forget, k)
	}
	w.mu.Unlock()
	// Thousands of streams wake up together on a new version: one encodes, the others wait for it.
	x.once.Do(func() {
		x.b, x.err = encode()
		made = true
	})
	return x.b, made, x.err
}

func (w *weakEncodings[T]) forget(k weak.Pointer[T]) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.m, k)
}

func (w *weakEncodings[T]) size() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.m)
}

// response returns the message telling a node its state; st.Assignment and st.Preview may be nil.
func (e *encodings) response(st assignment.State) (*response, error) {
	r := &response{own: &dkcv1.WatchConfigResponse{SyncError: st.SyncError, ResolvedTime: timestamppb.New(st.Changed),
		NodeUid: st.NodeUID, KubeletVersion: st.KubeletVersion, Drained: st.Drained, NodeCapacity: st.NodeCapacity,
		DriftRepair: st.DriftRepair}}
	if a := st.Assignment; a != nil {
		b, made, err := e.assignments.get(a, func() ([]byte, error) {
			return proto.Marshal(&dkcv1.WatchConfigResponse{Assignment: a})
		})
		if made {
			e.encodes.Add(1)
		}
		if err != nil {
			return nil, fmt.Errorf("encode assignment %s: %w", a.GetContentHash(), err)
		}
		r.shared = b
	}
	if p := st.Preview; p != nil {
		b, _, err := e.previews.get(p, func() ([]byte, error) {
			return proto.Marshal(&dkcv1.WatchConfigResponse{Preview: p})
		})
		if err != nil {
			return nil, fmt.Errorf("encode preview of pool %s revision %s: %w", p.GetPool(), p.GetRevision(), err)
		}
		r.preview = b
	}
	return r, nil
}

// count is how many assignments were encoded.
func (e *encodings) count() int { return int(e.encodes.Load()) }

// size is how many assignments' encodings are held.
func (e *encodings) size() int { return e.assignments.size() }
