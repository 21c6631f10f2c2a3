// SPDX-License-Identifier: Apache-2.0

package pernode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"sigs.k8s.io/yaml"
)

// decode reads a KubeletConfiguration document (YAML or JSON) as a JSON object whose numbers are json.Number,
// so that writing it back keeps 110 as 110 rather than 110.0 or 1e+06 as a float64 would.
func decode(text []byte) (map[string]any, error) {
	j, err := yaml.YAMLToJSON(text)
	if err != nil {
		return nil, fmt.Errorf("the document is not YAML: %w", err)
	}
	return decodeJSON(j)
}

func decodeJSON(j []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(j))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("the document is not JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("the document holds more than one JSON value")
	}
	doc, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("the document is not an object but %s", kind(v))
	}
	return doc, nil
}

// encode writes doc as YAML. sigs.k8s.io/yaml sorts the keys, so equal documents give equal bytes and equal
// revisions, and writes json.Number as its digits.
func encode(doc map[string]any) ([]byte, error) {
	return yaml.Marshal(doc)
}

// set sets the field at path in doc to v, creating missing parent objects.
func set(doc map[string]any, path []string, v any) error {
	obj := doc
	for i, name := range path[:len(path)-1] {
		next, ok := obj[name]
		if !ok || next == nil {
			m := map[string]any{}
			obj[name] = m
			obj = m
			continue
		}
		m, ok := next.(map[string]any)
		if !ok {
			return fmt.Errorf("%s is %s, not an object", strings.Join(path[:i+1], "."), kind(next))
		}
		obj = m
	}
	obj[path[len(path)-1]] = v
	return nil
}

// kind names a decoded JSON value's type for an error.
func kind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case string:
		return "a string"
	case bool:
		return "a bool"
	case json.Number, int64, float64:
		return "a number"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	default:
		return fmt.Sprintf("a %T", v)
	}
}
