// SPDX-License-Identifier: Apache-2.0

// Package kubeletcheck validates a config exactly as the kubelet would run it, with the kubelet's own code
// (k8s.io/kubernetes at the version this module is built with: go.mod for the newest minor dkc supports,
// kube-<minor>.mod for each older one; see build.sh): the config file is loaded by the kubelet's file loader (strict
// decoding, lenient v1beta1 fallback for fields of newer kubelets, defaulting, relative paths resolved against the
// file's directory — so against the checkpoint directory), the drop-ins of the kubelet's --config-dir are
// merged over it (MergeDropIns), the node kubelet's command-line flags are applied on top as the kubelet's
// kubeletConfigFlagPrecedence does (flags win; the file replaces the local config wholesale), and the
// result is validated by ValidateKubeletConfiguration against the feature gates it will run with. The
// original fixed two bugs here (#56171 flag precedence, #63305 feature gates); so does this.
package kubeletcheck

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/cmd/kubelet/app/options"
	kubeletconfiginternal "k8s.io/kubernetes/pkg/kubelet/apis/config"
	kubeletconfigvalidation "k8s.io/kubernetes/pkg/kubelet/apis/config/validation"
	"k8s.io/kubernetes/pkg/kubelet/eviction"
	"k8s.io/kubernetes/pkg/kubelet/kubeletconfig/configfiles"
	utilfs "k8s.io/kubernetes/pkg/util/filesystem"

	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
)

// Kind of failure, mapped to the original's status errors by the caller (checkapi's, so that errors.Is
// works on both sides of the helper process).
var (
	ErrLoad     = checkapi.ErrLoad
	ErrFlags    = checkapi.ErrFlags
	ErrValidate = checkapi.ErrValidate
)

// Result is a config as the kubelet would run it.
type Result struct {
	Config *kubeletconfiginternal.KubeletConfiguration
	// DropIns are the --config-dir files merged into Config, in the kubelet's order; DropInKeys the
	// top-level fields they set (v1beta1 names), sorted.
	DropIns, DropInKeys []string
	// Warnings, e.g. fields unknown to this kubelet version that were ignored.
	Warnings []string
}

// Load reads, merges the drop-ins of --config-dir into, applies flags to and validates the config file at
// path: what the kubelet would run. flags are the kubelet's command-line arguments (without its --config).
// The returned error wraps ErrLoad, ErrFlags (also for a drop-in that cannot be merged: the node's kubelet
// setup is at fault, not the file) or ErrValidate.
func Load(ctx context.Context, path string, flags []string) (res *Result, err error) {
	// The kubelet's defaulting panics on some configs (e.g. setting a feature gate that is locked to its
	// default); the kubelet would crash on them. The sidecar must survive any payload: a panic is a load error.
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("%w: the kubelet's config decoder panicked: %v", ErrLoad, p)
		}
	}()
	res = &Result{}
	// The kubelet's loader reports a lenient decode only through its logger: capture it as a warning.
	logger := funcr.New(func(prefix, args string) {
		if strings.Contains(args, "lenient decoding") {
			res.Warnings = append(res.Warnings, "fields unknown to kubelet "+Version()+" were ignored: "+args)
		}
	}, funcr.Options{})
	ctx = klog.NewContext(ctx, logger)

	loader, err := configfiles.NewFsLoader(&utilfs.DefaultFs{}, path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLoad, err)
	}
	kc, err := loader.Load(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrLoad, err)
	}
	// As the kubelet's loadConfigFile: EvictionHard has OS-specific defaults applied outside the scheme.
	if kc.EvictionHard == nil {
		kc.EvictionHard = eviction.DefaultEvictionHard
	} else if kc.MergeDefaultEvictionSettings {
		for k, v := range eviction.DefaultEvictionHard {
			if _, ok := kc.EvictionHard[k]; !ok {
				kc.EvictionHard[k] = v
			}
		}
	}
	dir, err := ConfigDir(flags)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFlags, err)
	}
	if dir != "" {
		merged, err := MergeDropIns(kc, dir)
		if err != nil {
			return nil, fmt.Errorf("%w: merge the kubelet's --config-dir drop-ins: %w", ErrFlags, err)
		}
		res.DropIns, res.DropInKeys = merged.Files, merged.Keys
		res.Warnings = append(res.Warnings, merged.overridden(path)...)
	}
	if err := ApplyFlags(kc, flags); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrFlags, err)
	}
	if err := Validate(kc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrValidate, err)
	}
	res.Config = kc
	return res, nil
}

// ApplyFlags re-parses the kubelet's command line over kc, as the kubelet's kubeletConfigFlagPrecedence
// does: flags override the file, and feature gates from the file survive unless a flag sets the same gate.
func ApplyFlags(kc *kubeletconfiginternal.KubeletConfiguration, args []string) error {
	fs := pflag.NewFlagSet("kubelet", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	fs.SetOutput(io.Discard)
	// Global flags (klog's and others') and KubeletFlags are parsed into throw-away values, as the kubelet
	// does with its fake flag set.
	global := pflag.NewFlagSet("", pflag.ContinueOnError)
	options.AddGlobalFlags(global)
	options.NewKubeletFlags().AddFlags(global)
	global.VisitAll(func(f *pflag.Flag) { fs.VarP(cliflag.NoOp{}, f.Name, f.Shorthand, f.Usage) })
	options.AddKubeletConfigFlags(fs, kc)
	original := kc.FeatureGates
	if err := fs.Parse(args); err != nil {
		return err
	}
	if kc.FeatureGates == nil && len(original) > 0 {
		kc.FeatureGates = map[string]bool{}
	}
	for k, v := range original {
		if _, ok := kc.FeatureGates[k]; !ok {
			kc.FeatureGates[k] = v
		}
	}
	return nil
}

// Validate runs the kubelet's validation with the feature gates the config turns on (a copy of the
// defaults: validating never changes this process's gates).
func Validate(kc *kubeletconfiginternal.KubeletConfiguration) error {
	gates := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	if err := gates.SetFromMap(kc.FeatureGates); err != nil {
		return err
	}
	return kubeletconfigvalidation.ValidateKubeletConfiguration(kc, gates)
}

// ParseKubeletFlags parses the kubelet's own command-line flags (--cert-dir, --hostname-override, ...) as the
// kubelet does; the flags that set config fields are applied by Load and are ignored here.
func ParseKubeletFlags(args []string) (*options.KubeletFlags, error) {
	fs := pflag.NewFlagSet("kubelet", pflag.ContinueOnError)
	fs.SetNormalizeFunc(cliflag.WordSepNormalizeFunc)
	fs.SetOutput(io.Discard)
	kf := options.NewKubeletFlags()
	kf.AddFlags(fs)
	others := pflag.NewFlagSet("", pflag.ContinueOnError)
	options.AddGlobalFlags(others)
	options.AddKubeletConfigFlags(others, &kubeletconfiginternal.KubeletConfiguration{})
	others.VisitAll(func(f *pflag.Flag) {
		if fs.Lookup(f.Name) == nil {
			fs.VarP(cliflag.NoOp{}, f.Name, f.Shorthand, f.Usage)
		}
	})
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("parse kubelet flags: %w", err)
	}
	return kf, nil
}
