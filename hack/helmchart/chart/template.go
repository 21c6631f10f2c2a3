// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"fmt"
	"strconv"
	"strings"

	sigsyaml "sigs.k8s.io/yaml"
)

// templater turns rendered objects into Helm template text. Where a value goes, the object first gets a
// token (a string no manifest contains), the object is marshalled to YAML, and the token is replaced by the
// template expression: the YAML stays kustomize's, and only the marked places are templated.
type templater struct {
	scalars map[string]string // token -> expression written in its place
	blocks  map[string]block  // token -> the lines its key becomes
}

// block replaces a whole `key: token` line: the key is written only when cond is true (Helm's `with`,
// so that an empty value leaves the key out, as the manifests do), its value then being body.
type block struct {
	cond string // a pipeline; `with` makes its value `.` in body
	body string // `yaml`: toYaml of `.` below the key; `scalar`: `.` after it; else literal YAML
}

func newTemplater() *templater {
	return &templater{scalars: map[string]string{}, blocks: map[string]block{}}
}

func (t *templater) token() string {
	return fmt.Sprintf("helmchart-token-%d-x", len(t.scalars)+len(t.blocks))
}

// scalar returns a token to put into an object where expr's value goes; it may be part of a longer string.
func (t *templater) scalar(expr string) string {
	tok := t.token()
	t.scalars[tok] = expr
	return tok
}

// indentMarker, in a literal block body, becomes the column the body is indented to (for nindent).
const indentMarker = "helmchart-indent"

// block returns a token to set as a key's value: the key is rendered only when cond is non-empty; with
// cond "" always (a literal body that holds its own conditions).
func (t *templater) block(cond, body string) string {
	tok := t.token()
	t.blocks[tok] = block{cond: cond, body: body}
	return tok
}

// escape keeps `{{` in a manifest (a CEL expression, a description) from being read as a template action.
func escape(s string) string {
	return strings.ReplaceAll(s, "{{", `{{ "{{" }}`)
}

// yaml marshals o and replaces its tokens; every token must be found.
func (t *templater) yaml(o object) (string, error) {
	b, err := sigsyaml.Marshal(o)
	if err != nil {
		return "", fmt.Errorf("marshal %s: %w", o.id(), err)
	}
	lines := strings.Split(escape(strings.TrimRight(string(b), "\n")), "\n")
	var out []string
	for _, l := range lines {
		replaced, err := t.line(l)
		if err != nil {
			return "", fmt.Errorf("%s: %w", o.id(), err)
		}
		out = append(out, replaced)
	}
	s := strings.Join(out, "\n")
	if i := strings.Index(s, "helmchart-token-"); i >= 0 {
		return "", fmt.Errorf("%s: token left in %q", o.id(), s[i:min(len(s), i+40)])
	}
	return s, nil
}

func (t *templater) line(l string) (string, error) {
	for tok, b := range t.blocks {
		if !strings.HasSuffix(l, ": "+tok) {
			continue
		}
		key := strings.TrimSuffix(l, " "+tok)
		indent := len(l) - len(strings.TrimLeft(l, " "))
		if strings.HasPrefix(strings.TrimLeft(l, " "), "- ") {
			return "", fmt.Errorf("block %s opens a list item: unsupported", key)
		}
		pad := strings.Repeat(" ", indent)
		var body string
		switch b.body {
		case "yaml":
			body = fmt.Sprintf("%s\n%s  {{- toYaml . | nindent %d }}", key, pad, indent+2)
		case "scalar":
			body = key + " {{ . }}"
		default:
			body = key + "\n" + indentLines(strings.ReplaceAll(b.body, indentMarker, strconv.Itoa(indent+2)), indent+2)
		}
		if b.cond == "" {
			return body, nil
		}
		verb := "with"
		if b.body != "yaml" && b.body != "scalar" {
			verb = "if"
		}
		return fmt.Sprintf("%s{{- %s %s }}\n%s\n%s{{- end }}", pad, verb, b.cond, body, pad), nil
	}
	for tok, expr := range t.scalars {
		l = strings.ReplaceAll(l, tok, expr)
	}
	return l, nil
}

func indentLines(s string, n int) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = pad + l
	}
	return strings.Join(lines, "\n")
}

// set puts v at the map path keys of o, creating maps on the way.
func set(o map[string]any, v any, keys ...string) {
	for _, k := range keys[:len(keys)-1] {
		next, ok := o[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			o[k] = next
		}
		o = next
	}
	o[keys[len(keys)-1]] = v
}

// get returns the value at the map path keys of o, nil if there is none.
func get(o map[string]any, keys ...string) any {
	var v any = o
	for _, k := range keys {
		m, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = m[k]
	}
	return v
}

// items returns the list at keys as maps (containers, volumes, webhooks).
func items(o map[string]any, keys ...string) []map[string]any {
	l, _ := get(o, keys...).([]any)
	var out []map[string]any
	for _, e := range l {
		if m, ok := e.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}
