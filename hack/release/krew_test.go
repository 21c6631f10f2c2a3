// SPDX-License-Identifier: Apache-2.0

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

const testURL = "https://example.com/dkc/releases/download/v0.2.0/"

// publishFixture writes one small archive per supported platform as run does (helpers on linux only) and
// returns them as run passes them to krewManifest.
func publishFixture(t *testing.T) (string, []publishedArchive) {
	t.Helper()
	dir := t.TempDir()
	var published []publishedArchive
	for _, p := range supportedPlatforms {
		src := t.TempDir()
		paths := writeFiles(t, src, 0o755, map[string]string{cliBin: "kubectl-dkc for " + p.String(),
			"dkc-kubelet-check-1.37": "helper for " + p.String()})
		entries := []entry{{name: cliBin, mode: 0o755, source: paths[cliBin]}}
		if shipsKubeletChecks(p) {
			entries = append(entries, entry{name: "dkc-kubelet-check-1.37", mode: 0o755, source: paths["dkc-kubelet-check-1.37"]})
		}
		a := publishedArchive{platform: p, name: archiveName("v0.2.0", p)}
		path := filepath.Join(dir, a.name)
		if err := writeArchive(path, entries, time.Unix(0, 0)); err != nil {
			t.Fatal(err)
		}
		var err error
		if a.files, err = readArchive(path); err != nil {
			t.Fatal(err)
		}
		if a.sha256, err = sha256File(path); err != nil {
			t.Fatal(err)
		}
		published = append(published, a)
	}
	return dir, published
}

// TestKrewManifest generates the manifest, renders and parses it back, and checks each platform against
// the archive on disk: selected by exactly its os/arch, the URI of its archive, the archive's own sha256
// (hashed here, not taken from the generator), and its files.
func TestKrewManifest(t *testing.T) {
	dir, published := publishFixture(t)
	slices.Reverse(published) // the manifest's order must not follow the build's
	m, err := krewManifest("v0.2.0", testURL, published)
	if err != nil {
		t.Fatal(err)
	}
	y, err := marshalManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	var back plugin
	if err := yaml.UnmarshalStrict(y, &back); err != nil {
		t.Fatalf("manifest does not parse back strictly: %v\n%s", err, y)
	}
	if err := validateManifest(pluginName, back); err != nil {
		t.Fatalf("validateManifest: %v\n%s", err, y)
	}
	if back.Spec.Version != "v0.2.0" || back.Metadata.Name != "dkc" || len(back.Spec.Platforms) != len(supportedPlatforms) {
		t.Fatalf("manifest: version %q name %q, %d platforms\n%s", back.Spec.Version, back.Metadata.Name, len(back.Spec.Platforms), y)
	}
	var order []string
	for _, pl := range back.Spec.Platforms {
		var selected []platform
		for _, env := range krewPlatforms {
			if selectorMatches(pl.Selector, env) {
				selected = append(selected, env)
			}
		}
		if len(selected) != 1 {
			t.Errorf("platform %s selects %v, want exactly one os/arch", pl.URI, selected)
			continue
		}
		p := selected[0]
		order = append(order, p.String())
		name := archiveName("v0.2.0", p)
		if pl.URI != "https://example.com/dkc/releases/download/v0.2.0/"+name {
			t.Errorf("%s: uri %s", p, pl.URI)
		}
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if sum := sha256.Sum256(data); pl.Sha256 != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: sha256 %s, the archive's is %x", p, pl.Sha256, sum)
		}
		want := []fileOperation{{From: "kubectl-dkc", To: "."}}
		if p.os == "linux" {
			want = []fileOperation{{From: "dkc-kubelet-check-1.37", To: "."}, {From: "kubectl-dkc", To: "."}}
		}
		if !slices.Equal(pl.Files, want) || pl.Bin != "kubectl-dkc" {
			t.Errorf("%s: files %v bin %q, want %v bin kubectl-dkc", p, pl.Files, pl.Bin, want)
		}
	}
	if !slices.Equal(order, []string{"darwin/amd64", "darwin/arm64", "linux/amd64", "linux/arm64"}) {
		t.Errorf("platforms in order %v, want sorted by os/arch", order)
	}
}

// TestKrewManifestFieldNames reads the rendered manifest without dkc's types: the field names are krew's
// (pkg/index/types.go in krew v0.4.3), which a strict decode into types that mirror them cannot show.
func TestKrewManifestFieldNames(t *testing.T) {
	_, published := publishFixture(t)
	m, err := krewManifest("v0.2.0", testURL, published)
	if err != nil {
		t.Fatal(err)
	}
	y, err := marshalManifest(m)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(y, &doc); err != nil {
		t.Fatal(err)
	}
	get := func(v any, path ...any) any {
		for _, k := range path {
			switch k := k.(type) {
			case string:
				obj, _ := v.(map[string]any)
				v = obj[k]
			case int:
				l, _ := v.([]any)
				if k >= len(l) {
					return nil
				}
				v = l[k]
			}
		}
		return v
	}
	for _, tc := range []struct {
		path []any
		want any
	}{
		{[]any{"apiVersion"}, "krew.googlecontainertools.github.com/v1alpha2"},
		{[]any{"kind"}, "Plugin"},
		{[]any{"metadata", "name"}, "dkc"},
		{[]any{"spec", "version"}, "v0.2.0"},
		{[]any{"spec", "homepage"}, "https://github.com/dkc-dev/dkc"},
		{[]any{"spec", "platforms", 0, "selector", "matchLabels", "os"}, "darwin"},
		{[]any{"spec", "platforms", 0, "selector", "matchLabels", "arch"}, "amd64"},
		{[]any{"spec", "platforms", 0, "bin"}, "kubectl-dkc"},
		{[]any{"spec", "platforms", 0, "files", 0, "from"}, "kubectl-dkc"},
		{[]any{"spec", "platforms", 0, "files", 0, "to"}, "."},
		{[]any{"spec", "platforms", 0, "uri"}, testURL + "kubectl-dkc_v0.2.0_darwin_amd64.tar.gz"},
	} {
		if got := get(doc, tc.path...); got != tc.want {
			t.Errorf("%v = %v, want %v", tc.path, got, tc.want)
		}
	}
	for _, key := range []string{"shortDescription", "description", "caveats"} {
		if s, _ := get(doc, "spec", key).(string); s == "" {
			t.Errorf("spec.%s is empty", key)
		}
	}
	if s, _ := get(doc, "spec", "platforms", 0, "sha256").(string); len(s) != 64 {
		t.Errorf("spec.platforms[0].sha256 = %q", s)
	}
}

func TestKrewManifestNeedsTheBinary(t *testing.T) {
	_, published := publishFixture(t)
	published[0].files = []archivedFile{{name: "LICENSE", mode: 0o644}}
	if _, err := krewManifest("v0.2.0", testURL, published); err == nil || !strings.Contains(err.Error(), "has no kubectl-dkc") {
		t.Errorf("an archive without kubectl-dkc: err = %v", err)
	}
}

// TestValidateManifest: each of krew's rules, and dkc's own, refuses the manifest it is about.
func TestValidateManifest(t *testing.T) {
	_, published := publishFixture(t)
	valid := func() plugin {
		m, err := krewManifest("v0.2.0", testURL, published)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if err := validateManifest("dkc", valid()); err != nil {
		t.Fatalf("the generated manifest: %v", err)
	}
	sel := func(labels map[string]string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchLabels: labels}
	}
	for _, tc := range []struct {
		name   string
		file   string // default dkc
		mutate func(*plugin)
		want   string
	}{
		{name: "apiVersion", mutate: func(p *plugin) { p.APIVersion = "krew.googlecontainertools.github.com/v1alpha1" }, want: "apiVersion"},
		{name: "kind", mutate: func(p *plugin) { p.Kind = "plugin" }, want: "kind"},
		{name: "file name differs", file: "kubectl-dkc", want: `should be named "kubectl-dkc"`},
		{name: "unsafe name", file: "dkc/x", mutate: func(p *plugin) { p.Metadata.Name = "dkc/x" }, want: "not allowed"},
		{name: "windows device name", file: "con", mutate: func(p *plugin) { p.Metadata.Name = "con" }, want: "not allowed"},
		{name: "no short description", mutate: func(p *plugin) { p.Spec.ShortDescription = "" }, want: "short description"},
		{name: "short description on two lines", mutate: func(p *plugin) { p.Spec.ShortDescription = "a\nb" }, want: "line breaks"},
		{name: "no platform", mutate: func(p *plugin) { p.Spec.Platforms = nil }, want: "platform specified"},
		{name: "no version", mutate: func(p *plugin) { p.Spec.Version = "" }, want: "version specified"},
		{name: "version without v", mutate: func(p *plugin) { p.Spec.Version = "0.2.0" }, want: "version"},
		{name: "version no semver", mutate: func(p *plugin) { p.Spec.Version = "v0.2" }, want: "version"},
		{name: "no uri", mutate: func(p *plugin) { p.Spec.Platforms[1].URI = "" }, want: "`uri`"},
		{name: "no sha256", mutate: func(p *plugin) { p.Spec.Platforms[1].Sha256 = "" }, want: "`sha256`"},
		{name: "sha256 upper case", mutate: func(p *plugin) { p.Spec.Platforms[1].Sha256 = strings.ToUpper(p.Spec.Platforms[1].Sha256) }, want: "`sha256`"},
		{name: "no bin", mutate: func(p *plugin) { p.Spec.Platforms[1].Bin = "" }, want: "`bin`"},
		{name: "empty files", mutate: func(p *plugin) { p.Spec.Platforms[1].Files = []fileOperation{} }, want: "`files`"},
		{name: "file without to", mutate: func(p *plugin) { p.Spec.Platforms[1].Files[0].To = "" }, want: "`to`"},
		{name: "file without from", mutate: func(p *plugin) { p.Spec.Platforms[1].Files[0].From = "" }, want: "`from`"},
		{name: "no selector", mutate: func(p *plugin) { p.Spec.Platforms[1].Selector = nil }, want: "nil selector"},
		{name: "empty selector", mutate: func(p *plugin) { p.Spec.Platforms[1].Selector = &metav1.LabelSelector{} }, want: "empty selector"},
		{name: "selector key", mutate: func(p *plugin) { p.Spec.Platforms[1].Selector = sel(map[string]string{"os": "linux", "cpu": "x"}) }, want: `key "cpu"`},
		{name: "selector selects nothing", mutate: func(p *plugin) { p.Spec.Platforms[1].Selector = sel(map[string]string{"os": "plan9"}) }, want: "doesn't match any"},
		{name: "selectors overlap", mutate: func(p *plugin) { p.Spec.Platforms[1].Selector = sel(map[string]string{"os": "darwin"}) }, want: "overlapping"},
		{name: "bin not installed", mutate: func(p *plugin) { p.Spec.Platforms[1].Bin = "kubectl-other" }, want: "not among the files"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := valid()
			if tc.mutate != nil {
				tc.mutate(&m)
			}
			file := tc.file
			if file == "" {
				file = "dkc"
			}
			err := validateManifest(file, m)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want one saying %q", err, tc.want)
			}
		})
	}
}
