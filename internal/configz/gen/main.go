// Command gen writes internal/configz/defaults.json: the JSON of a defaulted, otherwise empty v1beta1
// KubeletConfiguration, from the kubelet's own scheme at the version go.mod pins. configz embeds the file so
// that kubectl-dkc knows the kubelet's defaults without linking the kubelet. `make generate` runs it and
// `make verify-generated` fails when the file no longer matches the kubelet's code.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"

	kubeletv1beta1 "k8s.io/kubelet/config/v1beta1"
	kubeletscheme "k8s.io/kubernetes/pkg/kubelet/apis/config/scheme"
)

func main() {
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintf(os.Stderr, "gen: %v\n", err)
		os.Exit(1)
	}
}

func run(out string) error {
	scheme, _, err := kubeletscheme.NewSchemeAndCodecs()
	if err != nil {
		return err
	}
	obj := &kubeletv1beta1.KubeletConfiguration{}
	scheme.Default(obj)
	data, err := json.Marshal(obj)
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, data, "", "  "); err != nil {
		return err
	}
	buf.WriteByte('\n')
	return os.WriteFile(out, buf.Bytes(), 0o644)
}
