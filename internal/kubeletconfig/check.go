package kubeletconfig

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"
	kubeletscheme "k8s.io/kubernetes/pkg/kubelet/apis/config/scheme"

	"github.com/dkc-dev/dkc/internal/configcheck"
)

// Check loads and validates like Load and reduces the result to what the sidecar needs.
func Check(ctx context.Context, path string, flags []string) (*configcheck.Checked, error) {
	r, err := Load(ctx, path, flags)
	if err != nil {
		return nil, err
	}
	fields, err := ToV1beta1JSON(r.Config)
	if err != nil {
		return nil, err
	}
	kc := r.Config
	return &configcheck.Checked{
		HealthzBindAddress: kc.HealthzBindAddress, HealthzPort: kc.HealthzPort, Address: kc.Address, Port: kc.Port,
		Fields: fields, DropInKeys: r.DropInKeys, Warnings: r.Warnings,
	}, nil
}

// InProcess is a configcheck.Checker running the kubelet's code in this process (tests, the benchmark).
type InProcess struct{}

// Check implements configcheck.Checker.
func (InProcess) Check(ctx context.Context, path string, flags []string) (*configcheck.Checked, error) {
	return Check(ctx, path, flags)
}

// Serve is the helper process (dkc-kubelet-check): one configcheck.Request on in, one configcheck.Response
// on out. A config at fault is a Response, not an error; an error means the helper could not do its job.
func Serve(ctx context.Context, in io.Reader, out io.Writer) error {
	var req configcheck.Request
	if err := json.NewDecoder(io.LimitReader(in, 1<<20)).Decode(&req); err != nil {
		return fmt.Errorf("decode request: %w", err)
	}
	var resp configcheck.Response
	checked, err := Check(ctx, req.File, req.Flags)
	if err != nil {
		if resp.Kind, resp.Error = configcheck.Split(err); resp.Kind == "" {
			return err
		}
	}
	resp.Checked = checked
	return json.NewEncoder(out).Encode(resp)
}

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
