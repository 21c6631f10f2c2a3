// SPDX-License-Identifier: Apache-2.0

package kubeletcheck

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"github.com/spf13/pflag"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	"k8s.io/apimachinery/pkg/runtime/schema"
	cliflag "k8s.io/component-base/cli/flag"
	kubeletconfigv1beta1 "k8s.io/kubelet/config/v1beta1"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"
	kubeletconfigv1beta1conversion "k8s.io/kubernetes/pkg/kubelet/apis/config/v1beta1"
	"k8s.io/kubernetes/pkg/kubelet/kubeletconfig/configfiles"
	utilfs "k8s.io/kubernetes/pkg/util/filesystem"
	"sigs.k8s.io/yaml"
)

// DropIns is what MergeDropIns merged into a config.
type DropIns struct {
	// Files are the drop-ins, in the order the kubelet merges them.
	Files []string
	// Keys are the top-level fields they set (v1beta1 JSON names, without apiVersion and kind), sorted.
	Keys []string
	// setBy is the last drop-in that set each key.
	setBy map[string]string
}

// ConfigDir is the kubelet's --config-dir among its command-line flags, "" if it has none. The flags are
// parsed as the kubelet's first parse does (its KubeletFlags; the rest registered as no-ops), so every form
// of the flag counts (--config-dir=d, --config-dir d, --config_dir, the last one winning).
func ConfigDir(args []string) (string, error) {
	fs := pflag.NewFlagSet("kubelet", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	fs.SetOutput(io.Discard)
	flags := options.NewKubeletFlags()
	flags.AddFlags(fs)
	kc, err := options.NewKubeletConfiguration()
	if err != nil {
		return "", err
	}
	others := pflag.NewFlagSet("", pflag.ContinueOnError)
	options.AddGlobalFlags(others)
	options.AddKubeletConfigFlags(others, kc)
	others.VisitAll(func(f *pflag.Flag) { fs.VarP(cliflag.NoOp{}, f.Name, f.Shorthand, f.Usage) })
	if err := fs.Parse(args); err != nil {
		return "", err
	}
	dir := flags.KubeletDropinConfigDirectory
	if dir != "" && !filepath.IsAbs(dir) {
		// The kubelet walks a relative --config-dir from its working directory, which for a systemd unit is
		// / unless the unit says otherwise (WorkingDirectory=); the sidecar's own may differ.
		dir = filepath.Join("/", dir)
	}
	return dir, nil
}

// MergeDropIns merges the drop-ins in dir (--config-dir) into kc as the kubelet (v1.34 and later) does before it
// applies its flags. The kubelet's code (cmd/kubelet/app/server.go mergeKubeletConfigurations and
// loadDropinConfigFileIntoJSON) is unexported, in a package that links the whole kubelet, so it is followed
// here step for step, with the kubelet's own loader, conversions, defaulting and JSON merge patch:
//   - every file whose name ends in .conf, in filepath.WalkDir order: lexical by name, subdirectories too
//     (walked where their name sorts); other files are ignored, whatever they hold;
//   - each decoded by the kubelet's loader into JSON (not strictly: fields unknown to this kubelet are
//     dropped silently; relative paths are NOT resolved, unlike the config file's), and refused if it is
//     empty or not apiVersion kubelet.config.k8s.io/v1beta1, kind KubeletConfiguration;
//   - merged over the config as v1beta1 JSON with an RFC 7386 merge patch: objects merge key by key, lists
//     and scalars replace, null deletes;
//   - the result decoded, defaulted and converted back. Going through v1beta1 JSON loses what omitempty
//     drops: an empty list in the config file (enforceNodeAllocatable: []) comes back as its default, as in
//     the kubelet; an empty list in a drop-in survives.
//
// Since v1.34 the kubelet merges them on the flag alone: no feature gate, no environment variable (the alpha's is
// gone). A directory that cannot be walked (also a missing one), or a drop-in that cannot be loaded, is an error
// that names it; the kubelet refuses to start with it.
func MergeDropIns(kc *kubeletconfiginternal.KubeletConfiguration, dir string) (*DropIns, error) {
	const dropinFileExtension = ".conf"
	res := &DropIns{setBy: map[string]string{}}

	versionedConfig := &kubeletconfigv1beta1.KubeletConfiguration{}
	if err := kubeletconfigv1beta1conversion.Convert_config_KubeletConfiguration_To_v1beta1_KubeletConfiguration(kc,
		versionedConfig, nil); err != nil {
		return nil, err
	}
	baseKubeletConfigJSON, err := json.Marshal(versionedConfig)
	if err != nil {
		return nil, fmt.Errorf("failed to marshal base config: %w", err)
	}
	if err := filepath.WalkDir(dir, func(path string, info fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !info.IsDir() && filepath.Ext(info.Name()) == dropinFileExtension {
			dropinConfigJSON, gvk, err := loadDropinConfigFileIntoJSON(path)
			if err != nil {
				return fmt.Errorf("failed to load kubelet dropin file, path: %s, error: %w", path, err)
			}
			if gvk == nil || gvk.Empty() {
				return fmt.Errorf("failed to load kubelet dropin file, path: %s, no apiVersion/kind", path)
			}
			if *gvk != kubeletconfigv1beta1.SchemeGroupVersion.WithKind("KubeletConfiguration") {
				return fmt.Errorf("failed to load kubelet dropin file, path: %s, unknown apiVersion/kind: %v", path, gvk.String())
			}
			mergedConfigJSON, err := jsonpatch.MergePatch(baseKubeletConfigJSON, dropinConfigJSON)
			if err != nil {
				return fmt.Errorf("failed to merge drop-in and current config: %w", err)
			}
			baseKubeletConfigJSON = mergedConfigJSON
			// Not the kubelet's: what the sidecar needs to compare /configz on the fields the drop-ins set.
			var fields map[string]json.RawMessage
			if err := json.Unmarshal(dropinConfigJSON, &fields); err != nil {
				return fmt.Errorf("failed to load kubelet dropin file, path: %s, error: %w", path, err)
			}
			for k := range fields {
				if k != "apiVersion" && k != "kind" {
					res.setBy[k] = path
				}
			}
			res.Files = append(res.Files, path)
		}
		return nil
	}); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			// The kubelet would not start without it, so here it is most likely not mounted into the
			// sidecar's pod: say what to do.
			return nil, fmt.Errorf("failed to walk through kubelet dropin directory %q: %w (the kubelet runs with "+
				"--config-dir=%s: mount that directory into the dkc-sidecar pod at the same path, read-only)", dir, err, dir)
		}
		return nil, fmt.Errorf("failed to walk through kubelet dropin directory %q: %w", dir, err)
	}

	versionedConfig = &kubeletconfigv1beta1.KubeletConfiguration{}
	if err := json.Unmarshal(baseKubeletConfigJSON, versionedConfig); err != nil {
		return nil, fmt.Errorf("failed to unmarshal merged JSON into kubelet configuration: %w", err)
	}
	kubeletconfigv1beta1conversion.SetDefaults_KubeletConfiguration(versionedConfig)
	if err := kubeletconfigv1beta1conversion.Convert_v1beta1_KubeletConfiguration_To_config_KubeletConfiguration(
		versionedConfig, kc, nil); err != nil {
		return nil, fmt.Errorf("failed to convert merged config to internal kubelet configuration: %w", err)
	}
	for k := range res.setBy {
		res.Keys = append(res.Keys, k)
	}
	sort.Strings(res.Keys)
	return res, nil
}

// loadDropinConfigFileIntoJSON is the kubelet's (cmd/kubelet/app/server.go).
func loadDropinConfigFileIntoJSON(name string) ([]byte, *schema.GroupVersionKind, error) {
	const errFmt = "failed to load drop-in kubelet config file %s, error %v"
	kubeletConfigFile, err := filepath.Abs(name)
	if err != nil {
		return nil, nil, fmt.Errorf(errFmt, name, err)
	}
	loader, err := configfiles.NewFsLoader(&utilfs.DefaultFs{}, kubeletConfigFile)
	if err != nil {
		return nil, nil, fmt.Errorf(errFmt, name, err)
	}
	return loader.LoadIntoJSON()
}

// overridden warns of the fields the config file sets that a drop-in sets again: the drop-in's value is
// what the kubelet runs (merged key by key for objects), whatever the file (an assigned config) says.
func (d *DropIns) overridden(file string) []string {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil // loaded already; nothing to add
	}
	var fields map[string]any
	if yaml.Unmarshal(data, &fields) != nil {
		return nil
	}
	var out []string
	for k := range fields {
		if by, ok := d.setBy[k]; ok {
			out = append(out, fmt.Sprintf("field %s of %s is also set by the kubelet's drop-in %s, whose value the kubelet "+
				"runs (objects merged key by key)", k, file, by))
		}
	}
	sort.Strings(out)
	return out
}
