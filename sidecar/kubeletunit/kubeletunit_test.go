package kubeletunit

import (
	"os"
	"strings"
	"testing"
)

func TestEnvFile(t *testing.T) {
	dir := t.TempDir()
	e := New(dir)
	if got, err := e.Get(); err != nil || got != "" {
		t.Fatalf("missing file: %q, %v", got, err)
	}
	for _, p := range []string{"/var/lib/kubelet/config.yaml", dir + "/checkpoints/u/1/kubelet"} {
		if err := e.Set(p); err != nil {
			t.Fatal(err)
		}
		if got, err := e.Get(); err != nil || got != p {
			t.Fatalf("Get = %q, %v; want %q", got, err, p)
		}
	}
	data, _ := os.ReadFile(e.Path)
	if !strings.Contains(string(data), "KUBELET_CONFIG_ARGS=--config="+dir+"/checkpoints/u/1/kubelet\n") {
		t.Errorf("env file:\n%s", data)
	}
	for _, bad := range []string{"", "/a b", "/a\nKUBELET_EXTRA_ARGS=--x", `/a"`} {
		if err := e.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
	if !strings.Contains(DropIn("/var/lib/kubelet/dynamic-config"), "EnvironmentFile=-/var/lib/kubelet/dynamic-config/kubelet.env") {
		t.Error("drop-in does not read the env file")
	}
}
