// SPDX-License-Identifier: Apache-2.0

package app

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/zap"
)

// TestOneSidecarPerNode: while one sidecar holds the node's lock, another waits (here: until its context
// ends); once the holder is gone — released, or its process dead — the next one takes it.
func TestOneSidecarPerNode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "dynamic-config")
	release, err := lockNode(context.Background(), dir, zap.NewNop())
	if err != nil {
		t.Fatal(err)
	}
	// flock locks belong to open file descriptions: a second open in this process contends like another
	// process would.
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if _, err := lockNode(ctx, dir, zap.NewNop()); err == nil {
		t.Fatal("a second sidecar took the lock while the first held it")
	}
	got := make(chan error, 1)
	go func() {
		r, err := lockNode(context.Background(), dir, zap.NewNop())
		if err == nil {
			r()
		}
		got <- err
	}()
	time.Sleep(300 * time.Millisecond) // proves a negative: the waiting sidecar does not go on meanwhile
	select {
	case err := <-got:
		t.Fatalf("the waiting sidecar went on while the lock was held: %v", err)
	default:
	}
	release()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the waiting sidecar did not take the released lock")
	}

	// A holder that dies (killed, not released) frees the lock too: the kernel drops it with the process.
	sh := exec.Command("sh", "-c", `exec 9>"$0" && flock -x 9 && echo locked && exec sleep 30`, filepath.Join(dir, LockFileName))
	out, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 7)
	if _, err := out.Read(buf); err != nil || string(buf[:6]) != "locked" {
		t.Fatalf("holder process: %q, %v", buf, err)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if _, err := lockNode(ctx2, dir, zap.NewNop()); err == nil {
		t.Fatal("took the lock a live process holds")
	}
	_ = sh.Process.Kill()
	_ = sh.Wait()
	r, err := lockNode(context.Background(), dir, zap.NewNop())
	if err != nil {
		t.Fatalf("after the holder died: %v", err)
	}
	r()
	if _, err := os.Stat(filepath.Join(dir, LockFileName)); err != nil {
		t.Fatal(err)
	}
}
