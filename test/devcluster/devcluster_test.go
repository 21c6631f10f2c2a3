// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestUnescapeMountPath(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"/var/lib/kubelet", "/var/lib/kubelet"},
		{`/a\040b`, "/a b"},
		{`/tab\011x`, "/tab\tx"},
		{`/back\134slash`, `/back\slash`},
		{`/trailing\04`, `/trailing\04`},
	} {
		if got := unescapeMountPath(tc.in); got != tc.want {
			t.Errorf("unescapeMountPath(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestKubeVersionLDFlags(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name, gomod, want string
		wantErr           bool
	}{
		{"single require", "module x\n\nrequire k8s.io/kubernetes v1.34.4\n", "gitVersion=v1.34.4", false},
		{"require block", "module x\n\nrequire (\n\tk8s.io/kubernetes v1.23.17\n)\n", "gitMinor=23", false},
		{"missing", "module x\n", "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(dir, tc.name+".mod")
			if err := os.WriteFile(p, []byte(tc.gomod), 0o644); err != nil {
				t.Fatal(err)
			}
			got, err := kubeVersionLDFlags(p, "k8s.io/kubernetes")
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tc.wantErr)
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("ldflags %q lack %q", got, tc.want)
			}
		})
	}
}

// TestProcessLifecycle runs a real child through start, pid-file identity, and stop by PID.
func TestProcessLifecycle(t *testing.T) {
	dir := t.TempDir()
	p, err := startProcess("sleeper", filepath.Join(dir, "run"), filepath.Join(dir, "logs", "sleeper.log"), nil, "sleep", "300")
	if err != nil {
		t.Fatal(err)
	}
	pid := p.pid()
	if pid == 0 || pid != p.cmd.Process.Pid {
		t.Fatalf("pid() = %d, want %d", pid, p.cmd.Process.Pid)
	}
	// A second handle, as `make down` gets from the pid file, sees the same process.
	loaded, err := loadProcess("sleeper", filepath.Join(dir, "run"))
	if err != nil || loaded == nil || loaded.pid() != pid {
		t.Fatalf("loadProcess = %v, %v; want pid %d", loaded, err, pid)
	}
	if loaded.exited() {
		t.Fatal("running process reported as exited")
	}
	start := time.Now()
	if err := p.stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) > 4*time.Second {
		t.Errorf("stop took %v; SIGTERM should end sleep at once", time.Since(start))
	}
	if _, err := os.Stat(filepath.Join(dir, "run", "sleeper.pid")); !os.IsNotExist(err) {
		t.Errorf("pid file left behind: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil && procState(pid) != 'Z' {
		t.Errorf("process %d still running", pid)
	}
}

// TestStalePidFileIsNotKilled checks that a recycled PID (same number, other start time) is never signalled.
func TestStalePidFileIsNotKilled(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	// Our own PID with a wrong start time stands for a recycled PID.
	if err := os.WriteFile(filepath.Join(run, "ghost.pid"), []byte(strconv.Itoa(os.Getpid())+" 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p, _ := loadProcess("ghost", run)
	if p.pid() != 0 {
		t.Fatal("a pid file with a wrong start time matched a live process")
	}
	if err := p.stop(time.Second); err != nil { // must not signal us
		t.Fatal(err)
	}
}
