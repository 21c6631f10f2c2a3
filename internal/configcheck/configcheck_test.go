// SPDX-License-Identifier: Apache-2.0

package configcheck_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"

	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
)

// TestMain makes this test binary the helper when DKC_TEST_HELPER says so: Exec then runs the real
// dkc-kubelet-check code (kubeletcheck.Serve) in a child process, or misbehaves on purpose.
func TestMain(m *testing.M) {
	switch os.Getenv("DKC_TEST_HELPER") {
	case "":
		os.Exit(m.Run())
	case "serve":
		if err := kubeletcheck.Serve(context.Background(), os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		if path := os.Getenv("DKC_TEST_HELPER_MEMORY"); path != "" {
			// What the memory test measures: this process's peak RSS, and the limit it ran with.
			status, err := os.ReadFile("/proc/self/status")
			if err == nil {
				err = os.WriteFile(path, fmt.Appendf(status, "GoMemLimit: %d\n", debug.SetMemoryLimit(-1)), 0o644)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, "helper:", err)
				os.Exit(1)
			}
		}
	case "crash":
		fmt.Fprintln(os.Stderr, "panic: boom")
		os.Exit(2)
	case "garbage":
		fmt.Println("not json")
	}
	os.Exit(0)
}

func helper(t *testing.T, mode string) configcheck.Exec {
	t.Setenv("DKC_TEST_HELPER", mode)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return configcheck.Exec{Binary: self}
}

func TestExec(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	head := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"
	good := write("good.yaml", head+"maxPods: 42\nhealthzPort: 10999\n")
	dropIns, badDropIns := filepath.Join(dir, "conf.d"), filepath.Join(dir, "bad.d")
	for _, d := range []string{dropIns, badDropIns} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write("conf.d/10-pods.conf", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nmaxPods: 90\n")
	write("bad.d/20-bad.conf", "{{{")
	cases := []struct {
		name, mode, file string
		flags            []string
		kubelet          string // the kubelet version asked for
		kind             error  // expected kind; nil with wantErr: the check itself failed
		wantErr          string // substring of the error
		check            func(*testing.T, *configcheck.Checked)
	}{
		{name: "valid", mode: "serve", file: good, check: func(t *testing.T, c *configcheck.Checked) {
			if c.Fields["maxPods"] != float64(42) || c.HealthzPort != 10999 || c.Port != 10250 {
				t.Errorf("checked = %+v", c)
			}
		}},
		{name: "flags win", mode: "serve", file: good, flags: []string{"--max-pods=7"}, check: func(t *testing.T, c *configcheck.Checked) {
			if c.Fields["maxPods"] != float64(7) {
				t.Errorf("maxPods = %v, want the flag's 7", c.Fields["maxPods"])
			}
		}},
		{name: "drop-ins merged", mode: "serve", file: good, flags: []string{"--config-dir=" + dropIns}, check: func(t *testing.T, c *configcheck.Checked) {
			if c.Fields["maxPods"] != float64(90) || strings.Join(c.DropInKeys, ",") != "maxPods" {
				t.Errorf("maxPods = %v, DropInKeys = %v; want the drop-in's 90 and its key", c.Fields["maxPods"], c.DropInKeys)
			}
		}},
		{name: "bad drop-in", mode: "serve", file: good, flags: []string{"--config-dir=" + badDropIns}, kind: configcheck.ErrFlags, wantErr: "20-bad.conf"},
		{name: "unknown field warns", mode: "serve", file: write("unknown.yaml", head+"noSuchField: 1\n"), check: func(t *testing.T, c *configcheck.Checked) {
			if len(c.Warnings) == 0 {
				t.Error("no warning for an unknown field")
			}
		}},
		{name: "not yaml", mode: "serve", file: write("bad.yaml", "{{{"), kind: configcheck.ErrLoad, wantErr: "failed to load config: "},
		{name: "missing", mode: "serve", file: filepath.Join(dir, "missing"), kind: configcheck.ErrLoad},
		{name: "invalid", mode: "serve", file: write("invalid.yaml", head+"maxPods: -1\n"), kind: configcheck.ErrValidate, wantErr: "failed to validate config: "},
		{name: "bad flag", mode: "serve", file: good, flags: []string{"--max-pods=lots"}, kind: configcheck.ErrFlags},
		{name: "kubelet of this minor", mode: "serve", file: good, kubelet: "v" + strings.TrimPrefix(kubeletcheck.Version(), "v"), check: func(t *testing.T, c *configcheck.Checked) {
			if c.KubeletVersion != kubeletcheck.Version() {
				t.Errorf("checked by %q, want %q", c.KubeletVersion, kubeletcheck.Version())
			}
		}},
		{name: "kubelet of another minor", mode: "serve", file: good, kubelet: "v1.20.0", kind: configcheck.ErrUnsupportedKubelet, wantErr: "kubelet v1.20.0, but this check runs the code of kubelet " + kubeletcheck.Version()},
		{name: "helper crashes", mode: "crash", file: good, wantErr: "panic: boom"},
		{name: "helper prints garbage", mode: "garbage", file: good, wantErr: "decode"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := helper(t, tc.mode).Check(context.Background(), configcheck.Request{File: tc.file, Flags: tc.flags, KubeletVersion: tc.kubelet})
			if tc.kind == nil && tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				tc.check(t, c)
				return
			}
			if err == nil {
				t.Fatalf("no error; got %+v", c)
			}
			if tc.kind != nil && !errors.Is(err, tc.kind) {
				t.Errorf("error %v is not %v", err, tc.kind)
			}
			if tc.kind == nil && func() bool { k, _ := checkapi.Split(err); return k != "" }() {
				t.Errorf("a failed check was blamed on the config: %v", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q: want it to contain %q", err, tc.wantErr)
			}
			if tc.kind != nil && strings.Count(err.Error(), tc.kind.Error()) != 1 {
				t.Errorf("error %q: want %q in it once", err, tc.kind)
			}
		})
	}
}

func TestConfigFlag(t *testing.T) {
	cfg, rest := configcheck.ConfigFlag([]string{"--kubeconfig=/k", "--config", "/c.yaml", "--v=2"})
	if cfg != "/c.yaml" || strings.Join(rest, " ") != "--kubeconfig=/k --v=2" {
		t.Errorf("ConfigFlag = %q, %v", cfg, rest)
	}
	cfg, _ = configcheck.ConfigFlag([]string{"--config=/d.yaml"})
	if cfg != "/d.yaml" {
		t.Errorf("ConfigFlag = %q", cfg)
	}
}

// TestHelpers picks the helper by the kubelet's minor and refuses what no helper speaks. The helpers are this
// test binary under the names of two minors: it links one minor's code, so the other's name shows that a
// helper refuses a kubelet of a minor it does not link, and that nothing falls back to another minor.
func TestHelpers(t *testing.T) {
	t.Setenv("DKC_TEST_HELPER", "serve")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	linked := checkapi.Minor(kubeletcheck.Version())
	dir := t.TempDir()
	for _, name := range []string{configcheck.HelperPrefix + linked, configcheck.HelperPrefix + "1.9", "dkc-kubelet-check", configcheck.HelperPrefix + "x"} {
		if err := os.Symlink(self, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	h, err := configcheck.FindHelpers(dir)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"1.9", linked}; strings.Join(h.Minors, " ") != strings.Join(want, " ") {
		t.Fatalf("minors = %v, want %v (numeric order, other names ignored)", h.Minors, want)
	}
	file := filepath.Join(dir, "kubelet.yaml")
	if err := os.WriteFile(file, []byte("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\nmaxPods: 42\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		kubelet, wantErr string
	}{
		{kubelet: "v" + linked + ".3-eks-1a2b3c"},
		{kubelet: "v1.9.0", wantErr: "kubelet v1.9.0, but this check runs the code of kubelet " + kubeletcheck.Version()},
		{kubelet: "v1.8.15", wantErr: "kubelet v1.8.15 is not supported by this dkc (kubelet minors 1.9–" + linked + ")"},
		{kubelet: "v1.99.0", wantErr: "kubelet v1.99.0 is not supported"},
		{kubelet: "", wantErr: "the kubelet's version is not known yet"},
		{kubelet: "garbage", wantErr: "kubelet garbage is not supported"},
	} {
		c, err := h.Check(context.Background(), configcheck.Request{File: file, KubeletVersion: tc.kubelet})
		if tc.wantErr == "" {
			if err != nil || c.Fields["maxPods"] != float64(42) {
				t.Errorf("kubelet %q: %+v, %v", tc.kubelet, c, err)
			}
			continue
		}
		if !errors.Is(err, configcheck.ErrUnsupportedKubelet) || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("kubelet %q: error %v, want ErrUnsupportedKubelet with %q", tc.kubelet, err, tc.wantErr)
		}
	}
	if _, err := configcheck.FindHelpers(t.TempDir()); err == nil {
		t.Error("FindHelpers of an empty directory: no error")
	}
}

// TestCheckData: a config handed over in memory (dkc-server's pool check) is checked as the same file
// would be, also one larger than a pipe holds, and fails with the same kinds.
func TestCheckData(t *testing.T) {
	head := "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\n"
	// ~300 KiB of comments: more than the 64 KiB a pipe buffers, so the helper must read while we write.
	big := head + strings.Repeat("# padding to exceed a pipe's buffer\n", 8000) + "maxPods: 43\n"
	for _, tc := range []struct {
		name, data string
		kind       error
		wantErr    string
		maxPods    float64
	}{
		{name: "valid", data: head + "maxPods: 42\n", maxPods: 42},
		{name: "larger than a pipe", data: big, maxPods: 43},
		{name: "invalid", data: head + "eventRecordQPS: -3\n", kind: configcheck.ErrValidate, wantErr: "eventRecordQPS"},
		{name: "wrong kind", data: "apiVersion: v1\nkind: ConfigMap\n", kind: configcheck.ErrLoad},
		{name: "not yaml", data: "{{{", kind: configcheck.ErrLoad},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := helper(t, "serve").CheckData(context.Background(), "", []byte(tc.data))
			if tc.kind == nil {
				if err != nil {
					t.Fatal(err)
				}
				if c.Fields["maxPods"] != tc.maxPods {
					t.Errorf("maxPods = %v, want %v", c.Fields["maxPods"], tc.maxPods)
				}
				return
			}
			if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %v, want %v with %q", err, tc.kind, tc.wantErr)
			}
		})
	}
}

// TestHelperMemoryIsBounded runs the real helper code on the largest config a ConfigMap holds
// (MaxConfigBytes) made of what costs the kubelet's decoder most per byte, a long list, and measures the
// helper process's peak RSS: it stays under the bound its caller sizes its container by, with the GOMEMLIMIT
// the caller gives it — the sidecar's (SidecarMemoryLimit) for a file, as the sidecar checks a checkpoint,
// and the default (dkc-server's) for CheckData. A larger config, up to the payload limit
// (checkpoint.MaxTotalBytes, 2 MiB, which only a forged payload reaches), is refused before any helper runs.
func TestHelperMemoryIsBounded(t *testing.T) {
	if raceDetector {
		// The helper is this binary: under -race its RSS is the detector's, not the program's. make test-unit
		// runs it without -race.
		t.Skip("the helper's RSS under the race detector says nothing of its bound")
	}
	list := func(size int) string {
		var b strings.Builder
		b.WriteString("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfailCgroupV1: false\nclusterDNS:\n")
		for b.Len() < size-12 {
			b.WriteString("- 10.0.0.10\n")
		}
		return b.String()
	}
	config, forged := list(configcheck.MaxConfigBytes), list(2<<20)
	dir := t.TempDir()
	file, forgedFile := filepath.Join(dir, "kubelet"), filepath.Join(dir, "forged")
	for p, c := range map[string]string{file: config, forgedFile: forged} {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, limit string
		maxRSS      int64 // bytes
		check       func(e configcheck.Exec, file string, data []byte) error
	}{
		{"file, the sidecar's limit", configcheck.SidecarMemoryLimit, configcheck.SidecarHelperMaxRSS, func(e configcheck.Exec, file string, _ []byte) error {
			_, err := e.Check(context.Background(), configcheck.Request{File: file, Flags: []string{}})
			return err
		}},
		{"data, the default limit", "", 96 << 20, func(e configcheck.Exec, _ string, data []byte) error {
			_, err := e.CheckData(context.Background(), "", data)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := helper(t, "serve")
			e.MemoryLimit = tc.limit
			report := filepath.Join(t.TempDir(), "memory")
			t.Setenv("DKC_TEST_HELPER_MEMORY", report)
			if err := tc.check(e, forgedFile, []byte(forged)); !errors.Is(err, configcheck.ErrLoad) || !strings.Contains(err.Error(), "more than dkc checks") {
				t.Errorf("check of a %d-byte config: %v, want a load error", len(forged), err)
			}
			if _, err := os.Stat(report); err == nil {
				t.Error("a helper ran for the config larger than a ConfigMap holds")
			}
			if err := tc.check(e, file, []byte(config)); err != nil && !errors.Is(err, configcheck.ErrValidate) {
				t.Fatalf("check of a %d-byte config: %v", len(config), err)
			}
			raw, err := os.ReadFile(report)
			if err != nil {
				t.Fatal(err)
			}
			field := func(re string) int64 {
				m := regexp.MustCompile(re).FindSubmatch(raw)
				if m == nil {
					t.Fatalf("no %s in %s", re, raw)
				}
				v, _ := strconv.ParseInt(string(m[1]), 10, 64)
				return v
			}
			peak, limit := field(`VmHWM:\s+(\d+) kB`)<<10, field(`GoMemLimit: (\d+)`)
			t.Logf("config of %d bytes: helper peak RSS %d MiB with GOMEMLIMIT %d MiB", len(config), peak>>20, limit>>20)
			if want := tc.limit; want == "" && limit != 96<<20 || want != "" && limit == 96<<20 {
				t.Errorf("helper ran with GOMEMLIMIT %d, want %q", limit, tc.limit)
			}
			if peak > tc.maxRSS {
				t.Errorf("helper peak RSS %d MiB, more than %d MiB", peak>>20, tc.maxRSS>>20)
			}
		})
	}
}
