// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"text/tabwriter"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/internal/capacity"
	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/configz"
	"github.com/dkc-dev/dkc/internal/disruption"
)

// Safety of changing a field on a running node.
const (
	RestartSafe = "restart-safe"
	NeedsReset  = "needs-state-reset-and-drain"
	Disruptive  = "disruptive"
)

// fieldSafety is the advice the original documentation gave per field (kubernetes/kubernetes#64354 and the
// resource-manager docs): most fields take effect on the kubelet restart that applying a config is; some
// change checkpointed state the kubelet refuses to reinterpret; some disturb running pods or the node's
// connection to the control plane.
var fieldSafety = map[string]struct{ class, reason string }{
	"cpuManagerPolicy": {NeedsReset,
		"the kubelet refuses to start with a cpu_manager_state of another policy: drain, delete " +
			"/var/lib/kubelet/cpu_manager_state, then apply"},
	"cpuManagerPolicyOptions": {NeedsReset, "options are recorded in cpu_manager_state: drain and delete it first"},
	"reservedSystemCPUs":      {NeedsReset, "changes the CPU sets in cpu_manager_state: drain and delete it first"},
	"memoryManagerPolicy": {NeedsReset,
		"the kubelet refuses to start with a memory_manager_state of another policy: drain, delete " +
			"/var/lib/kubelet/memory_manager_state"},
	"reservedMemory":        {NeedsReset, "recorded in memory_manager_state: drain and delete it first"},
	"topologyManagerPolicy": {NeedsReset, "admitted pods were aligned under the old policy: drain the node first"},
	"topologyManagerScope":  {NeedsReset, "admitted pods were aligned under the old scope: drain the node first"},
	"cgroupDriver": {Disruptive,
		"must match the container runtime's; a mismatch keeps the kubelet from starting"},
	"cgroupRoot":               {Disruptive, "moves the pod cgroup hierarchy; running pods are orphaned"},
	"cgroupsPerQOS":            {Disruptive, "rebuilds the QoS cgroup hierarchy under running pods"},
	"enforceNodeAllocatable":   {Disruptive, "changes which cgroups are limited; may evict or throttle pods"},
	"systemReserved":           {Disruptive, "shrinks or grows allocatable; pods may be evicted or become unschedulable"},
	"kubeReserved":             {Disruptive, "shrinks or grows allocatable; pods may be evicted or become unschedulable"},
	"evictionHard":             {Disruptive, "new thresholds may evict pods right after the restart"},
	"evictionSoft":             {Disruptive, "new thresholds may evict pods"},
	"maxPods":                  {Disruptive, "lowering it below the running pods rejects pods on the next admission"},
	"containerRuntimeEndpoint": {Disruptive, "a wrong endpoint keeps the kubelet from starting"},
	"imageServiceEndpoint":     {Disruptive, "a wrong endpoint keeps the kubelet from starting"},
	"address":                  {Disruptive, "the apiserver and monitoring lose the kubelet if it moves"},
	"port":                     {Disruptive, "the apiserver reaches the kubelet on this port (logs, exec, configz)"},
	"authentication":           {Disruptive, "may lock the apiserver and monitoring out of the kubelet"},
	"authorization":            {Disruptive, "may lock the apiserver and monitoring out of the kubelet"},
	"tlsCertFile":              {Disruptive, "a missing file keeps the kubelet from starting"},
	"tlsPrivateKeyFile":        {Disruptive, "a missing file keeps the kubelet from starting"},
	"staticPodPath":            {Disruptive, "static pods of the old path stop, those of the new one start"},
	"featureGates": {Disruptive,
		"gates change behaviour broadly; some are locked and crash the kubelet's decoder"},
	"failSwapOn":                     {Disruptive, "with swap on, the kubelet refuses to start"},
	"protectKernelDefaults":          {Disruptive, "the kubelet refuses to start if the kernel differs from its defaults"},
	"providerID":                     {Disruptive, "the node's identity towards the cloud provider"},
	"registerNode":                   {Disruptive, "the node stops re-registering itself"},
	"serverTLSBootstrap":             {Disruptive, "needs approved CSRs before the kubelet serves again"},
	"rotateCertificates":             {Disruptive, "changes how the kubelet's client credential is renewed"},
	"shutdownGracePeriod":            {RestartSafe, "applies at the next node shutdown"},
	"eventRecordQPS":                 {RestartSafe, ""},
	"eventBurst":                     {RestartSafe, ""},
	"kubeAPIQPS":                     {RestartSafe, ""},
	"kubeAPIBurst":                   {RestartSafe, ""},
	"imageGCHighThresholdPercent":    {RestartSafe, ""},
	"imageGCLowThresholdPercent":     {RestartSafe, ""},
	"serializeImagePulls":            {RestartSafe, ""},
	"logging":                        {RestartSafe, ""},
	"nodeStatusUpdateFrequency":      {RestartSafe, ""},
	"containerLogMaxSize":            {RestartSafe, ""},
	"containerLogMaxFiles":           {RestartSafe, ""},
	"podPidsLimit":                   {RestartSafe, "applies to pods started afterwards"},
	"allowedUnsafeSysctls":           {RestartSafe, "applies to pods admitted afterwards"},
	"streamingConnectionIdleTimeout": {RestartSafe, ""},
}

// Safety returns the class and reason for changing field live.
func Safety(field string) (string, string) {
	if s, ok := fieldSafety[field]; ok {
		return s.class, s.reason
	}
	return RestartSafe, ""
}

// FieldChange is one differing field.
type FieldChange struct {
	Field   string `json:"field"`
	Running any    `json:"running"`
	New     any    `json:"new"`
	Safety  string `json:"safety"`
	Reason  string `json:"reason,omitempty"`
}

// Diff compares the running config with a new one, both as complete v1beta1 JSON maps.
func Diff(running, next map[string]any) []FieldChange {
	keys := map[string]bool{}
	for k := range running {
		keys[k] = true
	}
	for k := range next {
		keys[k] = true
	}
	var out []FieldChange
	for k := range keys {
		if k == "apiVersion" || k == "kind" {
			continue
		}
		if !reflect.DeepEqual(running[k], next[k]) {
			class, reason := Safety(k)
			out = append(out, FieldChange{Field: k, Running: running[k], New: next[k], Safety: class, Reason: reason})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Field < out[j].Field })
	return out
}

// configMapConfig loads a ConfigMap key as a kubelet of kubeletVersion would (without the node's flags) and
// returns it as complete v1beta1 JSON. The kubelet's code runs in the dkc-kubelet-check helper of that
// kubelet's minor, as on the nodes: kubectl-dkc does not link the kubelet.
func (o *Options) configMapConfig(ctx context.Context, ns, name, key, kubeletVersion,
	checkDir string) (map[string]any, error) {
	checker, err := kubeletCheckers(checkDir)
	if err != nil {
		return nil, err
	}
	cm, err := o.client.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s: %w", ns, name, err)
	}
	data, ok := cm.Data[key]
	if !ok {
		return nil, fmt.Errorf("configmap %s/%s has no key %q", ns, name, key)
	}
	dir, err := os.MkdirTemp("", "kubectl-dkc-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, key)
	if err := os.WriteFile(file, []byte(data), 0o600); err != nil {
		return nil, err
	}
	checked, err := checker.Check(ctx, configcheck.Request{File: file, KubeletVersion: kubeletVersion})
	if err != nil {
		return nil, fmt.Errorf("configmap %s/%s key %s for kubelet %s: %w", ns, name, key, kubeletVersion, err)
	}
	return configz.Config(kubeletVersion, checked.Fields, nil)
}

func (o *Options) diffCommand() *cobra.Command {
	var cm, key, checkDir string
	cmd := &cobra.Command{
		Use:   "diff NODE --configmap NAMESPACE/NAME [--key kubelet]",
		Short: "Show what applying a ConfigMap would change on a node, field by field, with how safe each change is",
		//nolint:lll // the help text is printed as its lines stand
		Long: `diff compares the node's running config (/configz) with the ConfigMap's config as the kubelet would load
it — both with the code and defaults of the node kubelet's own minor — and marks each changed field restart-safe, needs-state-reset-and-drain (e.g. cpuManagerPolicy,
memoryManagerPolicy, topologyManagerPolicy) or disruptive, with the reason. Fields the node's kubelet flags
override show up too: flags keep winning over any config.
When the change moves the node's allocatable (maxPods, podsPerCore, kubeReserved, systemReserved,
evictionHard), the table is followed by the node's pods, CPU and memory allocatable now and under the new
config, what the pods bound to the node request, and the pods the kubelet may reject when it restarts with
it: it admits them again, oldest first (OutOfpods, OutOfcpu, OutOfmemory); a critical pod evicts others
instead. No pod is named where the node's allocatable now is not what its running config gives (a kubelet
flag such as --max-pods wins over the config). Table output only.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ns, name, err := parseConfigMap(cm)
			if err != nil {
				return err
			}
			running, kubeletVersion, err := o.runningConfig(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			next, err := o.configMapConfig(cmd.Context(), ns, name, key, kubeletVersion, checkDir)
			if err != nil {
				return err
			}
			changes := Diff(running, next)
			if o.output != "table" && o.output != "" {
				return o.print(o.io.Out, changes)
			}
			if len(changes) == 0 {
				fmt.Fprintf(o.io.Out, "no changes: node %s already runs this config\n", args[0])
				return nil
			}
			w := tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "FIELD\tRUNNING\tNEW\tSAFETY\tREASON")
			for _, c := range changes {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", c.Field, compact(c.Running), compact(c.New), c.Safety, c.Reason)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			// What assign refuses without --drain or --drained: the kubelet would not start on its managers' state.
			for _, r := range disruption.Resets(running, next) {
				fmt.Fprintf(o.io.Out, "the kubelet refuses to start with this on its current state: "+
					"drain node %s and remove %s first\n", args[0], r)
			}
			if capacity.Changes(running, next) || capacity.EvictionChanges(running, next) {
				return o.printCapacity(cmd.Context(), args[0], running, next)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&cm, "configmap", "", "the ConfigMap, NAMESPACE/NAME")
	cmd.Flags().StringVar(&key, "key", "kubelet", "the ConfigMap key holding the KubeletConfiguration")
	cmd.Flags().StringVar(&checkDir, "kubelet-check-dir", "",
		"directory of the dkc-kubelet-check-<minor> helpers, which load the config with the kubelet's own code of the "+
			"node's minor; default: next to kubectl-dkc, else the directory of the first on $PATH")
	_ = cmd.MarkFlagRequired("configmap")
	return cmd
}

// kubeletCheckers are the dkc-kubelet-check-<minor> helpers in dir, or next to this executable, or beside
// the first one on $PATH.
func kubeletCheckers(dir string) (configcheck.Helpers, error) {
	const helper = configcheck.HelperPrefix + "*"
	if dir == "" {
		if self, err := os.Executable(); err == nil {
			if m, _ := filepath.Glob(filepath.Join(filepath.Dir(self), helper)); len(m) > 0 {
				dir = filepath.Dir(self)
			}
		}
	}
	if dir == "" {
		for _, p := range filepath.SplitList(os.Getenv("PATH")) {
			if m, _ := filepath.Glob(filepath.Join(p, helper)); p != "" && len(m) > 0 {
				dir = p
				break
			}
		}
	}
	if dir == "" {
		return configcheck.Helpers{}, fmt.Errorf("the %s helpers, which load configs with the kubelet's code, are "+
			"neither next to kubectl-dkc nor on $PATH (install them beside kubectl-dkc, or --kubelet-check-dir)", helper)
	}
	h, err := configcheck.FindHelpers(dir)
	if err != nil {
		return configcheck.Helpers{}, fmt.Errorf("%w (--kubelet-check-dir)", err)
	}
	return h, nil
}

func compact(v any) string {
	if v == nil {
		return "<unset>"
	}
	b, _ := json.Marshal(v)
	if len(b) > 60 {
		return string(b[:57]) + "..."
	}
	return string(b)
}
