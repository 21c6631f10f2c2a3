package devcluster

import (
	"os"
	"path/filepath"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
)

// The dev cluster grants its dkc-server what deploy/base/server-rbac.yaml grants, no more: no ClusterRole
// rule on ConfigMaps, Events or Leases, ConfigMaps and the leader election's Lease only in kube-system,
// Events only in default, to the User dkc-server.
func TestServerRBACFileAsTheDevClusterApplies(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", ServerRBACFile))
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeServerRBAC(data)
	if err != nil {
		t.Fatal(err)
	}
	user := rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ServiceUser}
	for _, cr := range r.clusterRoles {
		for _, rule := range cr.Rules {
			for _, res := range rule.Resources {
				if res == "configmaps" || res == "events" || res == "leases" {
					t.Errorf("ClusterRole %s grants %v on %s cluster-wide", cr.Name, rule.Verbs, res)
				}
			}
		}
	}
	want := map[string]string{"dkc-server-configs": "kube-system", "dkc-server-events": "default", "dkc-server-leader-election": "kube-system"}
	for _, role := range r.roles {
		if ns, ok := want[role.Name]; !ok || role.Namespace != ns {
			t.Errorf("Role %s/%s; want only %v", role.Namespace, role.Name, want)
		}
	}
	if len(r.roles) != len(want) || len(r.roleBindings) != len(want) {
		t.Errorf("%d roles and %d bindings, want %d each", len(r.roles), len(r.roleBindings), len(want))
	}
	for _, b := range r.roleBindings {
		if want[b.Name] != b.Namespace || len(b.Subjects) != 1 || b.Subjects[0] != user {
			t.Errorf("RoleBinding %s/%s binds %v", b.Namespace, b.Name, b.Subjects)
		}
	}
	for _, b := range r.clusterRoleBindings {
		if len(b.Subjects) != 1 || b.Subjects[0] != user {
			t.Errorf("ClusterRoleBinding %s binds %v, want the User %s", b.Name, b.Subjects, ServiceUser)
		}
	}
}
