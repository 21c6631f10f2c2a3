// SPDX-License-Identifier: Apache-2.0

package resolve

import (
	"errors"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
)

// FuzzParseAnnotation: any annotation value yields a valid source or a SourceError with a status text in the
// original's style; never a panic.
func FuzzParseAnnotation(f *testing.F) {
	for _, s := range []string{
		`{"configMap":{"namespace":"kube-system","name":"c","kubeletConfigKey":"kubelet"}}`,
		`{}`, `null`, `[]`, `"x"`, `{"configMap":null}`, `{"configMap":{"uid":"u"}}`, `{"secret":{}}`, "\xff", `{"configMap":{"name":"` + "\x00" + `"}}`,
	} {
		f.Add(s)
	}
	path := field.NewPath("metadata", "annotations").Key(nodeconfig.SourceAnnotation)
	f.Fuzz(func(t *testing.T, raw string) {
		src, err := ParseAnnotation(raw, path)
		if err == nil {
			err = Validate(src, path)
		}
		if err == nil {
			if src == nil || src.ConfigMap == nil || src.ConfigMap.Namespace == "" || src.ConfigMap.Name == "" || src.ConfigMap.KubeletConfigKey == "" {
				t.Fatalf("accepted incomplete source %q: %+v", raw, src)
			}
			return
		}
		var se *SourceError
		if !errors.As(err, &se) || len(se.Status) < len(nodeconfig.SyncErrorPrefix) || se.Status[:len(nodeconfig.SyncErrorPrefix)] != nodeconfig.SyncErrorPrefix {
			t.Fatalf("error for %q is not a status error: %v", raw, err)
		}
	})
}
