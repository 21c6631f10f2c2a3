// SPDX-License-Identifier: Apache-2.0

// Package admission is the validating webhook the config service serves for Node writes that change the
// dkc.dev/config-source annotation. It refuses a malformed source with the apiserver's own messages for
// spec.configSource (e.g. "...configMap.namespace: Required value: namespace must be set"), and a source
// whose ConfigMap lies outside the namespaces dkc-server reads configs from (--config-namespaces), naming
// them, so that a mistake is refused at the write instead of showing up as the node's sync error.
//
// Validation only: a ValidatingAdmissionPolicy cannot do it (CEL has no JSON decoding, and the annotation is
// JSON). Who may change the annotation — not a node's own credentials, not through nodes/status — is a
// matter of string comparisons and lives in the ValidatingAdmissionPolicy of
// deploy/base/config-source-policy.yaml, which, unlike this webhook, no label exempts a Node from.
package admission

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"go.uber.org/zap"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/dkc-dev/dkc/internal/nodeconfig"
	"github.com/dkc-dev/dkc/services/internal/resolve"
)

// Path is where the webhook is served.
const Path = "/validate-node"

// Review decides one AdmissionRequest for a Node; namespaces are where a source may point.
func Review(req *admissionv1.AdmissionRequest, namespaces resolve.Namespaces) *admissionv1.AdmissionResponse {
	resp := &admissionv1.AdmissionResponse{UID: req.UID, Allowed: true}
	deny := func(code int32, msg string) *admissionv1.AdmissionResponse {
		resp.Allowed = false
		resp.Result = &metav1.Status{Status: metav1.StatusFailure, Code: code, Message: msg,
			Reason: metav1.StatusReasonInvalid}
		return resp
	}
	var node, old corev1.Node
	if err := json.Unmarshal(req.Object.Raw, &node); err != nil {
		return deny(http.StatusBadRequest, "decode node: "+err.Error())
	}
	oldValue, hadOld := "", false
	if len(req.OldObject.Raw) > 0 {
		if err := json.Unmarshal(req.OldObject.Raw, &old); err != nil {
			return deny(http.StatusBadRequest, "decode old node: "+err.Error())
		}
		oldValue, hadOld = old.Annotations[nodeconfig.SourceAnnotation]
	}
	value, has := node.Annotations[nodeconfig.SourceAnnotation]
	if !has || (hadOld && value == oldValue) {
		return resp // not set, or unchanged
	}
	path := field.NewPath("metadata", "annotations").Key(nodeconfig.SourceAnnotation)
	src, err := resolve.ParseAnnotation(value, path)
	if err != nil {
		var se *resolve.SourceError
		if !errors.As(err, &se) {
			return deny(http.StatusUnprocessableEntity, err.Error())
		}
		return deny(http.StatusUnprocessableEntity,
			string(se.Status)[len(nodeconfig.SyncErrorPrefix+nodeconfig.InvalidSourcePrefix):])
	}
	if errs := nodeconfig.ValidateSpec(src, path); len(errs) > 0 {
		return deny(http.StatusUnprocessableEntity, errs.ToAggregate().Error())
	}
	if ns := src.ConfigMap.Namespace; !namespaces.Allows(ns) {
		return deny(http.StatusUnprocessableEntity, field.Forbidden(path.Child("configMap", "namespace"),
			fmt.Sprintf("namespace %q is not one dkc-server reads configs from; allowed: %s (dkc-server --config-namespaces)",
				ns, strings.Join(namespaces.List(), ", "))).Error())
	}
	return resp
}

// Handler serves AdmissionReview v1 requests; namespaces are the server's --config-namespaces.
func Handler(log *zap.Logger, namespaces resolve.Namespaces) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 3<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var review admissionv1.AdmissionReview
		if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
			http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
			return
		}
		resp := Review(review.Request, namespaces)
		if !resp.Allowed {
			log.Info("refused node write", zap.String("node", review.Request.Name),
				zap.String("user", review.Request.UserInfo.Username), zap.String("reason", resp.Result.Message))
		}
		review.Response = resp
		review.Request = nil
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(review)
	})
}
