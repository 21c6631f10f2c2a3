// SPDX-License-Identifier: Apache-2.0

package devcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ServerRBACFile, relative to the repository root, holds dkc-server's ClusterRole, Roles and their bindings.
// The dev cluster grants its dkc-server exactly these, so that tests run the service with what users install.
const ServerRBACFile = "deploy/base/server-rbac.yaml"

// deployNamespace is what deploy/base/kustomization.yaml gives objects without a namespace of their own.
const deployNamespace = "kube-system"

// serverRBAC is ServerRBACFile as the dev cluster applies it.
type serverRBAC struct {
	clusterRoles        []*rbacv1.ClusterRole
	clusterRoleBindings []*rbacv1.ClusterRoleBinding
	roles               []*rbacv1.Role
	roleBindings        []*rbacv1.RoleBinding
}

// decodeServerRBAC decodes ServerRBACFile's content (rbac.authorization.k8s.io/v1 and the ServiceAccount, no
// unknown fields), as kustomize would place it: objects without a namespace go to kube-system. The dev
// cluster's dkc-server authenticates as the User ServiceUser with a client certificate, not as the
// ServiceAccount kube-system/dkc-server, so subjects naming that ServiceAccount name the User instead; the
// ServiceAccount itself is skipped.
func decodeServerRBAC(data []byte) (*serverRBAC, error) {
	var out serverRBAC
	docs, err := splitManifest(data)
	if err != nil {
		return nil, err
	}
	for _, doc := range docs {
		switch {
		case doc.APIVersion == "v1" && doc.Kind == "ServiceAccount":
			continue
		case doc.APIVersion != rbacv1.SchemeGroupVersion.String():
			return nil, fmt.Errorf("unexpected apiVersion %q of %s", doc.APIVersion, doc.Kind)
		}
		switch doc.Kind {
		case "ClusterRole":
			var o rbacv1.ClusterRole
			err = doc.decodeStrict(&o)
			out.clusterRoles = append(out.clusterRoles, &o)
		case "ClusterRoleBinding":
			var o rbacv1.ClusterRoleBinding
			err = doc.decodeStrict(&o)
			o.Subjects = asServiceUser(o.Subjects)
			out.clusterRoleBindings = append(out.clusterRoleBindings, &o)
		case "Role":
			var o rbacv1.Role
			err = doc.decodeStrict(&o)
			if o.Namespace == "" {
				o.Namespace = deployNamespace
			}
			out.roles = append(out.roles, &o)
		case "RoleBinding":
			var o rbacv1.RoleBinding
			err = doc.decodeStrict(&o)
			if o.Namespace == "" {
				o.Namespace = deployNamespace
			}
			o.Subjects = asServiceUser(o.Subjects)
			out.roleBindings = append(out.roleBindings, &o)
		default:
			err = fmt.Errorf("unexpected %s", doc.Kind)
		}
		if err != nil {
			return nil, err
		}
	}
	if len(out.clusterRoles) == 0 || len(out.clusterRoleBindings) == 0 {
		return nil, errors.New("want at least a ClusterRole and a ClusterRoleBinding")
	}
	return &out, nil
}

// asServiceUser replaces the ServiceAccount kube-system/dkc-server with the User ServiceUser.
func asServiceUser(subjects []rbacv1.Subject) []rbacv1.Subject {
	out := make([]rbacv1.Subject, 0, len(subjects))
	for _, s := range subjects {
		if s.Kind == rbacv1.ServiceAccountKind && s.Name == ServiceUser &&
			(s.Namespace == "" || s.Namespace == deployNamespace) {
			s = rbacv1.Subject{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: ServiceUser}
		}
		out = append(out, s)
	}
	return out
}

// applyServerRBAC creates or updates every object of ServerRBACFile. Updating matters on a dev cluster that
// outlives a change of the file: a grant removed from deploy/ must be removed here too.
func (c *Cluster) applyServerRBAC(ctx context.Context, client kubernetes.Interface) error {
	file := filepath.Join(c.cfg.RepoRoot, ServerRBACFile)
	data, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("read server RBAC: %w", err)
	}
	r, err := decodeServerRBAC(data)
	if err != nil {
		return fmt.Errorf("decode server RBAC %s: %w", file, err)
	}
	rbac := client.RbacV1()
	for _, o := range r.clusterRoles {
		if err := apply(ctx, o, rbac.ClusterRoles().Create, rbac.ClusterRoles().Get, rbac.ClusterRoles().Update,
			func(cur *rbacv1.ClusterRole) {
				cur.Rules, cur.AggregationRule = o.Rules, o.AggregationRule
			}); err != nil {
			return fmt.Errorf("apply clusterrole %s: %w", o.Name, err)
		}
	}
	for _, o := range r.clusterRoleBindings {
		if err := applyBinding(ctx, o.Name, o, o.RoleRef, rbac.ClusterRoleBindings().Create, rbac.ClusterRoleBindings().Get,
			rbac.ClusterRoleBindings().Update,
			rbac.ClusterRoleBindings().Delete, func(cur *rbacv1.ClusterRoleBinding) (*rbacv1.RoleRef, *[]rbacv1.Subject) {
				return &cur.RoleRef, &cur.Subjects
			}); err != nil {
			return fmt.Errorf("apply clusterrolebinding %s: %w", o.Name, err)
		}
	}
	for _, o := range r.roles {
		roles := rbac.Roles(o.Namespace)
		if err := apply(ctx, o, roles.Create, roles.Get, roles.Update,
			func(cur *rbacv1.Role) { cur.Rules = o.Rules }); err != nil {
			return fmt.Errorf("apply role %s/%s: %w", o.Namespace, o.Name, err)
		}
	}
	for _, o := range r.roleBindings {
		bindings := rbac.RoleBindings(o.Namespace)
		if err := applyBinding(ctx, o.Name, o, o.RoleRef, bindings.Create, bindings.Get, bindings.Update, bindings.Delete,
			func(cur *rbacv1.RoleBinding) (*rbacv1.RoleRef, *[]rbacv1.Subject) {
				return &cur.RoleRef, &cur.Subjects
			}); err != nil {
			return fmt.Errorf("apply rolebinding %s/%s: %w", o.Namespace, o.Name, err)
		}
	}
	return nil
}

type object interface{ GetName() string }

// apply creates o, or sets the existing object's content with set and updates it.
func apply[T object](ctx context.Context, o T,
	create func(context.Context, T, metav1.CreateOptions) (T, error),
	get func(context.Context, string, metav1.GetOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error),
	set func(T)) error {
	if _, err := create(ctx, o, metav1.CreateOptions{}); !apierrors.IsAlreadyExists(err) {
		return err
	}
	cur, err := get(ctx, o.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	set(cur)
	_, err = update(ctx, cur, metav1.UpdateOptions{})
	return err
}

// applyBinding is apply for a binding, whose roleRef cannot change: one bound to another role is replaced.
func applyBinding[T object](ctx context.Context, name string, o T, ref rbacv1.RoleRef,
	create func(context.Context, T, metav1.CreateOptions) (T, error),
	get func(context.Context, string, metav1.GetOptions) (T, error),
	update func(context.Context, T, metav1.UpdateOptions) (T, error),
	del func(context.Context, string, metav1.DeleteOptions) error,
	fields func(T) (*rbacv1.RoleRef, *[]rbacv1.Subject)) error {
	cur, err := get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = create(ctx, o, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	curRef, curSubjects := fields(cur)
	if *curRef != ref {
		if err := del(ctx, name, metav1.DeleteOptions{}); err != nil {
			return err
		}
		_, err = create(ctx, o, metav1.CreateOptions{})
		return err
	}
	_, subjects := fields(o)
	*curSubjects = *subjects
	_, err = update(ctx, cur, metav1.UpdateOptions{})
	return err
}
