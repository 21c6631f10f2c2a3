package durable

import (
	"fmt"
	"path/filepath"
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
					time.Sleep(5 * time.Millisecond)
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
