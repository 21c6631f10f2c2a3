// SPDX-License-Identifier: Apache-2.0

package chart

import (
	"fmt"
	"strings"
)

// image is a container image reference split as values.yaml holds it.
type image struct {
	ref        string // as deploy/base renders it
	repository string
	tag        string
	digest     string
}

func parseImage(ref string) image {
	im := image{ref: ref, repository: ref}
	if repo, digest, ok := strings.Cut(ref, "@"); ok {
		im.repository, im.digest = repo, digest
		return im
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		im.repository, im.tag = ref[:i], ref[i+1:]
	}
	return im
}

// workloads are the two the chart templates: values key (server, sidecar) by kind and name.
var workloads = []struct {
	key, kind, name string
}{
	{"server", "Deployment", serverName},
	{"sidecar", "DaemonSet", sidecarName},
}

func find(objs []object, kind, name string) (object, error) {
	for _, o := range objs {
		if o.kind() == kind && o.name() == name {
			return o, nil
		}
	}
	return nil, fmt.Errorf("no %s %s rendered", kind, name)
}

// imagesOf returns each workload's image (its main container's, which names it) by values key.
func imagesOf(objs []object) (map[string]image, error) {
	out := map[string]image{}
	for _, w := range workloads {
		o, err := find(objs, w.kind, w.name)
		if err != nil {
			return nil, err
		}
		for _, c := range items(o, "spec", "template", "spec", "containers") {
			if c["name"] == w.name {
				ref, _ := c["image"].(string)
				out[w.key] = parseImage(ref)
			}
		}
		if out[w.key].ref == "" {
			return nil, fmt.Errorf("%s %s: no container %s with an image", w.kind, w.name, w.name)
		}
	}
	return out, nil
}

// placement holds what deploy/ renders for the values that replace it (values.yaml's defaults).
type placement struct {
	replicas         any
	configNamespaces []string
	nodeSelector     map[string]any // by values key
	tolerations      map[string]any
}

// templateWorkloads puts the values into dkc-server's Deployment and dkc-sidecar's DaemonSet, in place.
func (g *generator) templateWorkloads(objs []object) (placement, error) {
	images, err := imagesOf(objs)
	if err != nil {
		return placement{}, err
	}
	p := placement{nodeSelector: map[string]any{}, tolerations: map[string]any{}}
	for _, w := range workloads {
		o, _ := find(objs, w.kind, w.name)
		pod := get(o, "spec", "template", "spec").(map[string]any)
		for _, list := range []string{"initContainers", "containers"} {
			for _, c := range items(pod, list) {
				key := ""
				for k, im := range images {
					if c["image"] == im.ref {
						key = k
					}
				}
				if key == "" {
					return p, fmt.Errorf("%s %s container %v: image %v is neither dkc-server's nor dkc-sidecar's", w.kind, w.name,
						c["name"], c["image"])
				}
				c["image"] = g.tpl.scalar(`{{ include "dkc.image" .Values.` + key + `.image | quote }}`)
			}
		}
		p.nodeSelector[w.key] = pod["nodeSelector"]
		pod["nodeSelector"] = g.tpl.block(".Values."+w.key+".nodeSelector", "yaml")
		p.tolerations[w.key] = pod["tolerations"]
		pod["tolerations"] = g.tpl.block(".Values."+w.key+".tolerations", "yaml")
	}

	d, _ := find(objs, "Deployment", serverName)
	p.replicas = get(d, "spec", "replicas")
	if p.replicas == nil {
		return p, fmt.Errorf("deployment %s sets no replicas", serverName)
	}
	set(d, g.tpl.scalar("{{ .Values.server.replicas }}"), "spec", "replicas")
	for _, c := range items(d, "spec", "template", "spec", "containers") {
		if c["name"] != serverName {
			continue
		}
		args, _ := c["args"].([]any)
		for i, a := range args {
			if s, ok := a.(string); ok && strings.HasPrefix(s, configNSFlag) {
				if p.configNamespaces != nil {
					return p, fmt.Errorf("deployment %s: %s twice", serverName, configNSFlag)
				}
				p.configNamespaces = strings.Split(strings.TrimPrefix(s, configNSFlag), ",")
				args[i] = configNSFlag + g.tpl.scalar(`{{ join "," .Values.configNamespaces }}`)
			}
		}
	}
	if p.configNamespaces == nil {
		return p, fmt.Errorf("deployment %s: no %s argument", serverName, configNSFlag)
	}
	found := false
	for _, v := range items(d, "spec", "template", "spec", "volumes") {
		if v["name"] == tlsVolumeName && get(v, "secret", "secretName") == tlsSecret {
			set(v, g.tpl.scalar(`{{ include "dkc.tlsSecretName" . }}`), "secret", "secretName")
			found = true
		}
	}
	if !found {
		return p, fmt.Errorf("deployment %s: no volume %s of Secret %s", serverName, tlsVolumeName, tlsSecret)
	}
	return p, nil
}
