// SPDX-License-Identifier: Apache-2.0

package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dkc-dev/dkc/api/v1alpha1"
	"github.com/dkc-dev/dkc/internal/configcheck"
	"github.com/dkc-dev/dkc/internal/kubeletcheck/checkapi"
)

// Results of checking a config with another kubelet minor's code.
const (
	CheckOK      = "ok"
	CheckRefused = "refused"
	// CheckUnknown: the config could not be read or checked (the message says why); nothing is known.
	CheckUnknown = "unknown"
)

// CheckResult is what the kubelet of one minor makes of one config a pool or a node has.
type CheckResult struct {
	// Object is pool/NAME or node/NAME.
	Object string `json:"object"`
	// Config says which config: a ConfigMap key and why it is this object's, or the node's running config.
	Config string `json:"config"`
	// KubeletVersion is the version whose code checked it (the helper's, e.g. v1.37.2).
	KubeletVersion string `json:"kubeletVersion,omitempty"`
	Result         string `json:"result"`
	// Error is the kubelet's refusal, or why nothing is known.
	Error    string   `json:"error,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

// Errors of check, after its table: a kubelet of the minor asked about would refuse a config, or a config
// could not be checked (nothing is known of it, so an upgrade is not known to be safe either).
var (
	ErrConfigsRefused = errors.New("configs refused")
	ErrConfigsUnknown = errors.New("configs not checked")
)

// checkVerdict is check's error for its results.
func checkVerdict(results []CheckResult, minor string) error {
	refused, unknown := countResults(results, CheckRefused), countResults(results, CheckUnknown)
	switch {
	case refused > 0:
		return fmt.Errorf("%w: kubelet %s refuses %d of %d configs", ErrConfigsRefused, minor, refused, len(results))
	case unknown > 0:
		return fmt.Errorf("%w: %d of %d configs could not be checked (see the rows)", ErrConfigsUnknown, unknown,
			len(results))
	}
	return nil
}

// dataChecker checks a config held in memory with the code of a kubelet version (configcheck.Helpers).
type dataChecker interface {
	CheckData(ctx context.Context, kubeletVersion string, data []byte) (*configcheck.Checked, error)
}

func (o *Options) checkCommand() *cobra.Command {
	var minor, selector, checkDir string
	cmd := &cobra.Command{
		Use:   "check --kubelet-version X.Y [NODE... | -l SELECTOR]",
		Short: "Tell, before a kubelet upgrade, which pools' and nodes' configs the kubelet of another minor refuses",
		//nolint:lll // the help text is printed as its lines stand
		Long: `check loads and validates, with the code of the kubelet minor X.Y (the dkc-kubelet-check-X.Y helper), every
config a kubelet would run after an upgrade to X.Y:
  - each KubeletConfigPool's current revision (the snapshot its nodes are assigned) and, when the pool's
    ConfigMap holds another revision not rolled out yet, that one too;
  - each node's active dkc config (the ConfigMap its status says the kubelet runs) or, for a node on its
    local config, the config its kubelet runs now (/configz, through the API server's node proxy).
A config the X.Y kubelet refuses (a feature gate it removed, a field value it no longer accepts) is named with
the kubelet's error. Exit status 1 if any config is refused or could not be checked (a ConfigMap that cannot
be read, a node whose /configz cannot be: the row says why). ConfigMaps are checked as files alone: the nodes'
kubelet flags and --config-dir drop-ins, which only the nodes know, are checked by each node's sidecar before
its kubelet uses a config; a local config's row is what the kubelet runs, its flags applied. With NODE or -l,
only those nodes are checked, and no pool.`,
		Example: `  # before upgrading the kubelets to 1.37
  kubectl dkc check --kubelet-version 1.37`,
		RunE: func(cmd *cobra.Command, args []string) error {
			h, err := kubeletCheckers(checkDir)
			if err != nil {
				return err
			}
			if checkapi.Minor(minor) != minor || !slices.Contains(h.Minors, minor) {
				return fmt.Errorf("--kubelet-version %q: this kubectl-dkc checks configs for kubelet minors %s (one "+
					"dkc-kubelet-check-<minor> helper each)", minor, h.Range())
			}
			var nodes []corev1.Node
			pools := len(args) == 0 && selector == ""
			if pools {
				list, err := o.client.CoreV1().Nodes().List(cmd.Context(), metav1.ListOptions{})
				if err != nil {
					return fmt.Errorf("list nodes: %w", err)
				}
				nodes = list.Items
				sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
			} else if nodes, err = o.selectNodes(cmd.Context(), args, selector); err != nil {
				return err
			}
			results, err := o.checkMinor(cmd.Context(), h, minor, pools, nodes)
			if err != nil {
				return err
			}
			if err := o.printCheck(results, minor); err != nil {
				return err
			}
			return checkVerdict(results, minor)
		},
	}
	cmd.Flags().StringVar(&minor, "kubelet-version", "", "the kubelet minor to check the configs with, X.Y (e.g. 1.37)")
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label selector of the nodes to check (no pool is checked)")
	cmd.Flags().StringVar(&checkDir, "kubelet-check-dir", "",
		"directory of the dkc-kubelet-check-<minor> helpers; default: next to kubectl-dkc, else the "+
			"directory of the first on $PATH")
	_ = cmd.MarkFlagRequired("kubelet-version")
	return cmd
}

// checkMinor checks the pools' configs (when pools is set) and the nodes' with the kubelet code of minor.
// A config is checked once however many objects have it.
func (o *Options) checkMinor(ctx context.Context, checker dataChecker, minor string, pools bool,
	nodes []corev1.Node) ([]CheckResult, error) {
	c := &configChecks{o: o, checker: checker, version: "v" + minor + ".0", done: map[[sha256.Size]byte]CheckResult{},
		configMaps: map[string]*corev1.ConfigMap{}, getErrs: map[string]error{}}
	out := []CheckResult{}
	if pools {
		list, err := o.pools.DkcV1alpha1().KubeletConfigPools().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("list kubeletconfigpools: %w", err)
		}
		sort.Slice(list.Items, func(i, j int) bool { return list.Items[i].Name < list.Items[j].Name })
		for i := range list.Items {
			out = append(out, c.pool(ctx, &list.Items[i])...)
		}
	}
	for i := range nodes {
		out = append(out, c.node(ctx, &nodes[i]))
	}
	return out, nil
}

// configChecks checks configs for check: each ConfigMap read once, each content checked once.
type configChecks struct {
	o          *Options
	checker    dataChecker
	version    string
	done       map[[sha256.Size]byte]CheckResult // by content
	configMaps map[string]*corev1.ConfigMap      // by namespace/name
	getErrs    map[string]error
}

// pool checks the pool's current revision and, when the pool's ConfigMap holds another, that one.
func (c *configChecks) pool(ctx context.Context, p *v1alpha1.KubeletConfigPool) []CheckResult {
	obj, ref := "pool/"+p.Name, p.Spec.ConfigMap
	var out []CheckResult
	current := p.Status.CurrentRevision
	if current != "" {
		ns, key := ref.Namespace, ref.KubeletConfigKey
		if s, ok := p.Status.RevisionSnapshots.Snapshot(current); ok {
			ns, key = s.Namespace, s.KubeletConfigKey
		}
		r, _ := c.configMap(ctx, ns, v1alpha1.SnapshotName(p.Name, current), key)
		r.Object, r.Config = obj, r.Config+" (current revision "+current+")"
		out = append(out, r)
	}
	r, cm := c.configMap(ctx, ref.Namespace, ref.Name, ref.KubeletConfigKey)
	if cm == nil {
		r.Object = obj
		return append(out, r)
	}
	if rev := v1alpha1.RevisionName(ref.Namespace, ref.KubeletConfigKey, cm.Data); rev != current {
		r.Object, r.Config = obj, r.Config+" (revision "+rev+", not rolled out)"
		out = append(out, r)
	}
	return out
}

// node checks the config the node's kubelet runs: its active dkc config, or its local config as /configz
// shows it (the node's flags and drop-ins included).
func (c *configChecks) node(ctx context.Context, n *corev1.Node) CheckResult {
	obj := "node/" + n.Name
	st := StatusOf(n)
	if st.Reported && st.Status.Active != nil && st.Status.Active.ConfigMap != nil {
		a := st.Status.Active.ConfigMap
		r, cm := c.configMap(ctx, a.Namespace, a.Name, a.KubeletConfigKey)
		r.Object, r.Config = obj, r.Config+" (active)"
		if cm != nil && a.ResourceVersion != "" && a.ResourceVersion != cm.ResourceVersion {
			// Edited since the kubelet took it: the node applies the edit next, so that is what is checked.
			r.Config = fmt.Sprintf("%s (active at resourceVersion %s; checked as edited since, %s)",
				configMapKey(a.Namespace, a.Name, a.KubeletConfigKey), a.ResourceVersion, cm.ResourceVersion)
		}
		return r
	}
	r := CheckResult{Object: obj, Config: "local config, as the kubelet runs it with its flags (/configz)"}
	running, _, err := c.o.runningConfig(ctx, n.Name)
	var data []byte
	if err == nil {
		data, err = json.Marshal(running)
	}
	if err != nil {
		r.Result, r.Error = CheckUnknown, err.Error()
		return r
	}
	return c.content(ctx, r, data)
}

// configMap checks namespace/name's key; cm is nil when the ConfigMap could not be read.
func (c *configChecks) configMap(ctx context.Context, namespace, name, key string) (CheckResult, *corev1.ConfigMap) {
	r := CheckResult{Config: configMapKey(namespace, name, key)}
	id := namespace + "/" + name
	cm, err := c.configMaps[id], c.getErrs[id]
	if cm == nil && err == nil {
		if cm, err = c.o.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{}); err != nil {
			cm, c.getErrs[id] = nil, fmt.Errorf("read configmap %s: %w", id, err)
		} else {
			c.configMaps[id] = cm
		}
	}
	if err = c.getErrs[id]; err != nil {
		r.Result, r.Error = CheckUnknown, err.Error()
		return r, nil
	}
	content, ok := cm.Data[key]
	if !ok {
		r.Result, r.Error = CheckUnknown, fmt.Sprintf("configmap %s has no key %q", id, key)
		return r, cm
	}
	return c.content(ctx, r, []byte(content)), cm
}

// content checks a config, once per content.
func (c *configChecks) content(ctx context.Context, r CheckResult, data []byte) CheckResult {
	sum := sha256.Sum256(data)
	if done, ok := c.done[sum]; ok {
		done.Object, done.Config = r.Object, r.Config
		return done
	}
	checked, err := c.checker.CheckData(ctx, c.version, data)
	r = c.result(r, checked, err)
	c.done[sum] = r
	return r
}

// result fills r with a check's outcome: refused for the kubelet's refusals, unknown when the check itself
// failed.
func (c *configChecks) result(r CheckResult, checked *configcheck.Checked, err error) CheckResult {
	switch {
	case err == nil:
		r.Result = CheckOK
		if checked != nil {
			r.KubeletVersion, r.Warnings = checked.KubeletVersion, checked.Warnings
		}
	case errors.Is(err, configcheck.ErrLoad) || errors.Is(err, configcheck.ErrValidate) ||
		errors.Is(err, configcheck.ErrFlags):
		r.Result, r.Error = CheckRefused, err.Error()
	default:
		r.Result, r.Error = CheckUnknown, err.Error()
	}
	return r
}

func configMapKey(namespace, name, key string) string {
	return "configmap " + namespace + "/" + name + " key " + key
}

func countResults(rs []CheckResult, result string) int {
	n := 0
	for _, r := range rs {
		if r.Result == result {
			n++
		}
	}
	return n
}

func (o *Options) printCheck(results []CheckResult, minor string) error {
	if o.output != "table" && o.output != "" {
		return o.print(o.io.Out, results)
	}
	w := tabwriter.NewWriter(o.io.Out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "OBJECT\tCONFIG\tKUBELET %s\n", minor)
	for _, r := range results {
		res := r.Result
		if r.Error != "" {
			res += ": " + r.Error
		}
		if len(r.Warnings) > 0 {
			res += " (warnings: " + strings.Join(r.Warnings, "; ") + ")"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\n", r.Object, r.Config, res)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(o.io.Out, "%d configs: %d ok, %d refused by kubelet %s, %d unknown\n", len(results),
		countResults(results, CheckOK), countResults(results, CheckRefused), minor, countResults(results, CheckUnknown))
	return nil
}
