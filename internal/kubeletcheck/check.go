// SPDX-License-Identifier: Apache-2.0

package kubeletcheck

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"runtime/debug"
	"sync"

	componentversion "k8s.io/component-base/version"
	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"
	kubeletscheme "k8s.io/kubernetes/pkg/kubelet/apis/config/scheme"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
)

// Check loads and validates like Load and reduces the result to what the sidecar needs.
func Check(ctx context.Context, path string, flags []string) (*checkapi.Checked, error) {
	r, err := Load(ctx, path, flags)
	if err != nil {
		return nil, err
	}
	fields, err := ToV1beta1JSON(r.Config)
	if err != nil {
		return nil, err
	}
	kc := r.Config
	return &checkapi.Checked{
		HealthzBindAddress: kc.HealthzBindAddress, HealthzPort: kc.HealthzPort, Address: kc.Address, Port: kc.Port,
		Fields: fields, DropInKeys: r.DropInKeys, Warnings: r.Warnings, KubeletVersion: Version(),
	}, nil
}

// InProcess checks with the kubelet code linked into this process (tests, the benchmark, the fake
// kubelet): the newest minor's, as the main module pins it.
type InProcess struct{}

// Check implements the sidecar's configcheck.Checker; like a helper, it refuses a kubelet of another minor.
func (InProcess) Check(ctx context.Context, req checkapi.Request) (*checkapi.Checked, error) {
	if err := sameMinor(req.KubeletVersion); err != nil {
		return nil, err
	}
	return Check(ctx, req.File, req.Flags)
}

// Serve is the helper process (dkc-kubelet-check-<minor>): one checkapi.Request on in, one
// checkapi.Response on out. A config at fault is a Response, not an error; an error means the helper could
// not do its job.
func Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	var req checkapi.Request
	if err := json.NewDecoder(io.LimitReader(in, 1<<20)).Decode(&req); err != nil {
		return fmt.Errorf("decode request: %w", err)
	}
	resp := checkapi.Response{KubeletVersion: Version()}
	checked, err := InProcess{}.Check(ctx, req)
	if err != nil {
		if resp.Kind, resp.Error = checkapi.Split(err); resp.Kind == "" {
			return err
		}
	}
	resp.Checked = checked
	return json.NewEncoder(out).Encode(resp)
}

// sameMinor refuses a kubelet version of another minor than the code linked here: its fields, defaults,
// feature gates and validation differ.
func sameMinor(kubelet string) error {
	if kubelet == "" {
		return nil
	}
	if want, have := checkapi.Minor(kubelet), checkapi.Minor(Version()); want == "" || want != have {
		return fmt.Errorf("%w: kubelet %s, but this check runs the code of kubelet %s", checkapi.ErrUnsupportedKubelet,
			kubelet, Version())
	}
	return nil
}

// Version is the version of the kubelet code linked here: the same source builds one helper per minor with
// another go.mod (build.sh). The minor is the code's own (component-base's DefaultKubeBinaryVersion, which
// each release sets); the patch comes from the build information when there is one (e.g. "v1.37.2"; test
// binaries have none: "v1.37").
var Version = sync.OnceValue(func() string {
	minor := "v" + componentversion.DefaultKubeBinaryVersion
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "k8s.io/kubernetes" && checkapi.Minor(d.Version) == checkapi.Minor(minor) {
				return d.Version
			}
		}
	}
	return minor
})

// ToV1beta1JSON is the config as /configz shows it: v1beta1 fields as JSON values.
func ToV1beta1JSON(kc *kubeletconfiginternal.KubeletConfiguration) (map[string]any, error) {
	scheme, _, err := kubeletscheme.NewSchemeAndCodecs()
	if err != nil {
		return nil, err
	}
	out := &kubeletv1beta1.KubeletConfiguration{}
	if err := scheme.Convert(kc, out, nil); err != nil {
		return nil, fmt.Errorf("convert config to v1beta1: %w", err)
	}
	data, err := json.Marshal(out)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	return m, json.Unmarshal(data, &m)
}

// Defaults is a defaulted, otherwise empty v1beta1 KubeletConfiguration as JSON: what this minor's kubelet
// runs for every field a config leaves out. kubectl-dkc embeds one per minor (internal/configz).
func Defaults() ([]byte, error) {
	scheme, _, err := kubeletscheme.NewSchemeAndCodecs()
	if err != nil {
		return nil, err
	}
	obj := &kubeletv1beta1.KubeletConfiguration{}
	scheme.Default(obj)
	return json.MarshalIndent(obj, "", "  ")
}
