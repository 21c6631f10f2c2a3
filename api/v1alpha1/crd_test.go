// SPDX-License-Identifier: Apache-2.0

package v1alpha1

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	"k8s.io/apimachinery/pkg/runtime"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

const crdFile = "../../deploy/crds/dkc.dev_kubeletconfigpools.yaml"

// loadCRD reads the generated CRD and checks it the way the apiserver does on create (structural schema,
// CEL rules compiled and within the cost budget, defaults valid), returning its schema.
func loadCRD(t *testing.T) *apiextensions.CustomResourceDefinition {
	t.Helper()
	raw, err := os.ReadFile(crdFile)
	if err != nil {
		t.Fatalf("read the generated CRD (make generate): %v", err)
	}
	var v1 apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(raw, &v1); err != nil {
		t.Fatalf("decode %s: %v", crdFile, err)
	}
	scheme := runtime.NewScheme()
	if err := apiextensions.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	scheme.Default(&v1)
	var crd apiextensions.CustomResourceDefinition
	if err := scheme.Convert(&v1, &crd, nil); err != nil {
		t.Fatalf("convert the CRD: %v", err)
	}
	crd.Status.StoredVersions = []string{GroupVersion.Version} // the apiserver's PrepareForCreate does this
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &crd); len(errs) > 0 {
		t.Fatalf("the apiserver would refuse the CRD: %v", errs.ToAggregate())
	}
	return &crd
}

func TestCRDNames(t *testing.T) {
	crd := loadCRD(t)
	if crd.Spec.Group != GroupVersion.Group || crd.Spec.Names.Plural != PoolResource || crd.Spec.Names.Kind != "KubeletConfigPool" ||
		crd.Spec.Scope != apiextensions.ClusterScoped {
		t.Errorf("group %q plural %q kind %q scope %q; want %s, %s, KubeletConfigPool, Cluster",
			crd.Spec.Group, crd.Spec.Names.Plural, crd.Spec.Names.Kind, crd.Spec.Scope, GroupVersion.Group, PoolResource)
	}
	if got := strings.Join(crd.Spec.Names.ShortNames, ","); got != "kcpool" {
		t.Errorf("short names %q, want kcpool", got)
	}
	var v *apiextensions.CustomResourceDefinitionVersion
	for i := range crd.Spec.Versions {
		if crd.Spec.Versions[i].Name == GroupVersion.Version {
			v = &crd.Spec.Versions[i]
		}
	}
	if v == nil {
		t.Fatalf("version %s not found", GroupVersion.Version)
	}
	// The internal form holds what all versions share at the top.
	subresources, columns := v.Subresources, v.AdditionalPrinterColumns
	if subresources == nil {
		subresources = crd.Spec.Subresources
	}
	if columns == nil {
		columns = crd.Spec.AdditionalPrinterColumns
	}
	if subresources == nil || subresources.Status == nil {
		t.Error("no status subresource")
	}
	var cols []string
	for _, c := range columns {
		if c.Priority == 0 {
			cols = append(cols, c.Name)
		}
	}
	if got, want := strings.Join(cols, ","), "Config,Revision,Selected,Up-to-date,Failed,Updated,Halted,Age"; got != want {
		t.Errorf("kubectl get columns %s, want %s", got, want)
	}
}

// TestSchemaRules plays objects through the generated schema as the apiserver does on create: defaulting,
// then OpenAPI validation, then the CEL rules.
func TestSchemaRules(t *testing.T) {
	crd := loadCRD(t)
	var schema *apiextensions.JSONSchemaProps
	for _, v := range crd.Spec.Versions {
		if v.Name == GroupVersion.Version && v.Schema != nil {
			schema = v.Schema.OpenAPIV3Schema
		}
	}
	if schema == nil && crd.Spec.Validation != nil {
		schema = crd.Spec.Validation.OpenAPIV3Schema
	}
	ss, err := structuralschema.NewStructural(schema)
	if err != nil {
		t.Fatalf("structural schema: %v", err)
	}
	validator, _, err := apiservervalidation.NewSchemaValidator(schema)
	if err != nil {
		t.Fatalf("schema validator: %v", err)
	}
	celValidator := cel.NewValidator(ss, true, celconfig.PerCallLimit)

	const valid = `{"apiVersion":"dkc.dev/v1alpha1","kind":"KubeletConfigPool","metadata":{"name":"blue"},
		"spec":{"nodeSelector":{"matchLabels":{"pool":"blue"}},"configMap":{"namespace":"kube-system","name":"blue-config","kubeletConfigKey":"kubelet"}}}`
	for _, tc := range []struct {
		name    string
		patch   func(obj map[string]any)
		wantErr string // substring of the errors; "" = accepted
	}{
		{name: "minimal pool", patch: func(map[string]any) {}},
		{name: "maxUnavailable number", patch: set("spec", "maxUnavailable", int64(3))},
		{name: "maxUnavailable percent", patch: set("spec", "maxUnavailable", "25%")},
		{name: "maxUnavailable 100%", patch: set("spec", "maxUnavailable", "100%")},
		{name: "maxUnavailable 0", patch: set("spec", "maxUnavailable", int64(0)), wantErr: "maxUnavailable must be a number of at least 1"},
		{name: "maxUnavailable 0%", patch: set("spec", "maxUnavailable", "0%"), wantErr: "maxUnavailable must be a number of at least 1"},
		{name: "maxUnavailable 101%", patch: set("spec", "maxUnavailable", "101%"), wantErr: "maxUnavailable must be"},
		{name: "maxUnavailable number as string", patch: set("spec", "maxUnavailable", "3"), wantErr: "maxUnavailable must be"},
		{name: "maxFailures 0", patch: set("spec", "maxFailures", int64(0)), wantErr: "spec.maxFailures"},
		{name: "nodeTimeout", patch: set("spec", "nodeTimeout", "45m")},
		{name: "nodeTimeout 0", patch: set("spec", "nodeTimeout", "0s"), wantErr: "nodeTimeout must be positive"},
		{name: "pauseBetweenBatches", patch: set("spec", "pauseBetweenBatches", "2m")},
		{name: "pauseBetweenBatches negative", patch: set("spec", "pauseBetweenBatches", "-1m"), wantErr: "pauseBetweenBatches must not be negative"},
		{name: "revisionHistoryLimit negative", patch: set("spec", "revisionHistoryLimit", int64(-1)), wantErr: "spec.revisionHistoryLimit"},
		{name: "namespace missing", patch: del("spec", "configMap", "namespace"), wantErr: "spec.configMap.namespace: Required value"},
		{name: "name missing", patch: del("spec", "configMap", "name"), wantErr: "spec.configMap.name: Required value"},
		{name: "key missing", patch: del("spec", "configMap", "kubeletConfigKey"), wantErr: "spec.configMap.kubeletConfigKey: Required value"},
		{name: "namespace not a DNS label", patch: set("spec", "configMap", "namespace", "Kube_System"), wantErr: "spec.configMap.namespace"},
		{name: "name not a DNS subdomain", patch: set("spec", "configMap", "name", "B.."), wantErr: "spec.configMap.name"},
		{name: "dotted name", patch: set("spec", "configMap", "name", "blue.v2")},
		{name: "key with a slash", patch: set("spec", "configMap", "kubeletConfigKey", "../k"), wantErr: "spec.configMap.kubeletConfigKey"},
		{name: "key '.'", patch: set("spec", "configMap", "kubeletConfigKey", "."), wantErr: "must not be '.' or start with '..'"},
		{name: "key '..x'", patch: set("spec", "configMap", "kubeletConfigKey", "..x"), wantErr: "must not be '.' or start with '..'"},
		{name: "key with dots inside", patch: set("spec", "configMap", "kubeletConfigKey", "kubelet.yaml")},
		{name: "nodeSelector missing", patch: del("spec", "nodeSelector"), wantErr: "spec.nodeSelector: Required value"},
		{name: "a maintenance window", patch: set("spec", "maintenanceWindows", []any{map[string]any{
			"days": []any{"Sat", "Sun"}, "start": "02:00", "duration": "4h", "timeZone": "Europe/Berlin"}})},
		{name: "a maintenance window without days or time zone", patch: set("spec", "maintenanceWindows",
			[]any{map[string]any{"start": "23:30", "duration": "90m"}})},
		{name: "a maintenance window on a misspelt day", patch: set("spec", "maintenanceWindows", []any{map[string]any{
			"days": []any{"Saturday"}, "start": "02:00", "duration": "4h"}}), wantErr: "spec.maintenanceWindows[0].days[0]: Unsupported value"},
		{name: "a maintenance window at 24:00", patch: set("spec", "maintenanceWindows", []any{map[string]any{
			"start": "24:00", "duration": "4h"}}), wantErr: "spec.maintenanceWindows[0].start"},
		{name: "a maintenance window without a start", patch: set("spec", "maintenanceWindows", []any{map[string]any{
			"duration": "4h"}}), wantErr: "spec.maintenanceWindows[0].start: Required value"},
		{name: "a maintenance window longer than a week", patch: set("spec", "maintenanceWindows", []any{map[string]any{
			"start": "02:00", "duration": "169h"}}), wantErr: "duration must be from 1m to 168h"},
		{name: "a maintenance window of no time", patch: set("spec", "maintenanceWindows", []any{map[string]any{
			"start": "02:00", "duration": "0s"}}), wantErr: "duration must be from 1m to 168h"},
		{name: "pool name of 63", patch: set("metadata", "name", strings.Repeat("a", 63))},
		{name: "pool name of 64", patch: set("metadata", "name", strings.Repeat("a", 64)), wantErr: "at most 63 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var obj map[string]any
			if err := json.Unmarshal([]byte(valid), &obj); err != nil {
				t.Fatal(err)
			}
			normalize(obj)
			tc.patch(obj)
			structuraldefaulting.Default(obj, ss)
			errs := apiservervalidation.ValidateCustomResource(nil, obj, validator)
			celErrs, _ := celValidator.Validate(context.Background(), nil, ss, obj, nil, celconfig.RuntimeCELCostBudget)
			errs = append(errs, celErrs...)
			got := errs.ToAggregate()
			switch {
			case tc.wantErr == "" && got != nil:
				t.Fatalf("refused: %v", got)
			case tc.wantErr != "" && got == nil:
				t.Fatalf("accepted, want an error with %q", tc.wantErr)
			case tc.wantErr != "" && !strings.Contains(got.Error(), tc.wantErr):
				t.Fatalf("error %v, want one with %q", got, tc.wantErr)
			}
			if tc.name == "minimal pool" {
				checkDefaults(t, obj)
			}
		})
	}
}

// checkDefaults: what the schema fills in is what the spec's getters assume.
func checkDefaults(t *testing.T, obj map[string]any) {
	t.Helper()
	raw, err := json.Marshal(obj)
	if err != nil {
		t.Fatal(err)
	}
	var pool KubeletConfigPool
	if err := json.Unmarshal(raw, &pool); err != nil {
		t.Fatalf("decode the defaulted pool: %v", err)
	}
	s := pool.Spec
	if s.MaxUnavailable == nil || s.MaxFailures == nil || s.NodeTimeout == nil || s.RevisionHistoryLimit == nil {
		t.Fatalf("defaults missing: %s", raw)
	}
	empty := KubeletConfigPoolSpec{}
	defMaxUnavailable := empty.MaxUnavailableOrDefault()
	if s.MaxUnavailable.String() != defMaxUnavailable.String() || *s.MaxFailures != empty.MaxFailuresOrDefault() ||
		s.NodeTimeout.Duration != empty.NodeTimeoutOrDefault() || *s.RevisionHistoryLimit != empty.RevisionHistoryLimitOrDefault() {
		t.Errorf("schema defaults %s differ from the getters' (%v, %d, %v, %d)", raw,
			empty.MaxUnavailableOrDefault(), empty.MaxFailuresOrDefault(), empty.NodeTimeoutOrDefault(), empty.RevisionHistoryLimitOrDefault())
	}
}

// normalize turns JSON's float64 numbers into int64, as the apiserver's decoder does.
func normalize(v any) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if f, ok := e.(float64); ok {
				x[k] = int64(f)
			} else {
				normalize(e)
			}
		}
	case []any:
		for i, e := range x {
			if f, ok := e.(float64); ok {
				x[i] = int64(f)
			} else {
				normalize(e)
			}
		}
	}
}

// set returns a patch that sets obj[path...][last] = value.
func set(pathAndValue ...any) func(map[string]any) {
	return func(obj map[string]any) {
		m := obj
		keys := pathAndValue[:len(pathAndValue)-1]
		for _, k := range keys[:len(keys)-1] {
			m = m[k.(string)].(map[string]any)
		}
		m[keys[len(keys)-1].(string)] = pathAndValue[len(pathAndValue)-1]
	}
}

// del returns a patch that deletes obj[path...].
func del(path ...string) func(map[string]any) {
	return func(obj map[string]any) {
		m := obj
		for _, k := range path[:len(path)-1] {
			m = m[k].(map[string]any)
		}
		delete(m, path[len(path)-1])
	}
}
