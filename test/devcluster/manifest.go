// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsyaml "sigs.k8s.io/yaml"
)

// manifestDoc is one object of a multi-document YAML manifest from deploy/: its kind, and its text for a
// strict decode into the typed object.
type manifestDoc struct {
	metav1.TypeMeta
	raw []byte
}

// decodeStrict decodes the document into obj, refusing fields obj does not have.
func (d manifestDoc) decodeStrict(obj any) error {
	if err := sigsyaml.UnmarshalStrict(d.raw, obj); err != nil {
		return fmt.Errorf("decode %s: %w", d.Kind, err)
	}
	return nil
}

// splitManifest splits a deploy/ manifest into its objects, skipping documents that hold only comments. The
// dev cluster applies deploy/'s own files (not copies), so that tests run with what users install.
func splitManifest(data []byte) ([]manifestDoc, error) {
	var docs []manifestDoc
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for {
		raw, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		var tm metav1.TypeMeta
		if err := sigsyaml.Unmarshal(raw, &tm); err != nil {
			return nil, err
		}
		if tm != (metav1.TypeMeta{}) {
			docs = append(docs, manifestDoc{TypeMeta: tm, raw: raw})
		}
	}
}
