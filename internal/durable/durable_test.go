// SPDX-License-Identifier: Apache-2.0

package durable

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSetMaxConcurrentBoundsWriters(t *testing.T) {
	for _, limit := range []int{1, 3} {
		t.Run(fmt.Sprint(limit), func(t *testing.T) {
			var now, peak atomic.Int32
			SetFault(func(step, _ string) error {
				if step == "write" {
					n := now.Add(1)
					for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
					}
					time.Sleep(5 * time.Millisecond) // a slow write, so that writes over the limit would overlap
					now.Add(-1)
				}
				return nil
			})
			SetMaxConcurrent(limit)
			defer func() { SetFault(nil); SetMaxConcurrent(0) }()
			dir := t.TempDir()
			var wg sync.WaitGroup
			for i := 0; i < 12; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					if i%2 == 0 {
						err = WriteFile(filepath.Join(dir, fmt.Sprint(i)), []byte("x"), 0o644)
					} else {
						err = WriteDir(filepath.Join(dir, fmt.Sprintf("d%d", i)), map[string][]byte{"f": []byte("x")}, 0o644)
					}
					if err != nil {
						t.Error(err)
					}
				}()
			}
			wg.Wait()
			if p := peak.Load(); p > int32(limit) || p == 0 {
				t.Errorf("peak concurrent writes = %d, limit %d", p, limit)
			}
		})
	}
}

// TestMkdirAllSyncsEachParent: every directory MkdirAll creates is synced into its parent (the "fsync-dir"
// step names the created directory), and nothing is synced for what already exists.
func TestMkdirAllSyncsEachParent(t *testing.T) {
	for _, tc := range []struct {
		name     string
		existing string // under the temp root, created beforehand
		path     string
		created  []string
	}{
		{"one level", "", "a", []string{"a"}},
		{"three levels", "", "a/b/c", []string{"a", "a/b", "a/b/c"}},
		{"partly there", "a/b", "a/b/c/d", []string{"a/b/c", "a/b/c/d"}},
		{"all there", "a/b", "a/b", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			if tc.existing != "" {
				if err := os.MkdirAll(filepath.Join(root, tc.existing), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			var synced []string
			SetFault(func(step, path string) error {
				if step == "fsync-dir" {
					rel, _ := filepath.Rel(root, path)
					synced = append(synced, rel)
				}
				return nil
			})
			defer SetFault(nil)
			if err := MkdirAll(filepath.Join(root, tc.path), 0o755); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(synced, tc.created) {
				t.Errorf("parents synced for %v, want %v", synced, tc.created)
			}
			if st, err := os.Stat(filepath.Join(root, tc.path)); err != nil || !st.IsDir() {
				t.Errorf("%s not a directory: %v", tc.path, err)
			}
		})
	}
}

func TestMkdirAllOverAFile(t *testing.T) {
	root := t.TempDir()
	if err := os.WriteFile(filepath.Join(root, "f"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"f", "f/sub"} {
		if err := MkdirAll(filepath.Join(root, p), 0o755); err == nil {
			t.Errorf("MkdirAll(%s) over a file succeeded", p)
		}
	}
}
