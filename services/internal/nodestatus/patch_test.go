// SPDX-License-Identifier: Apache-2.0

package nodestatus

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestStatusPatchOverHTTP checks the request patchStatus makes through the REST client (the fake clientsets
// of the other tests take the typed fallback) and that refusals keep their kind: the UID precondition's
// handling relies on apierrors.IsConflict and IsInvalid.
func TestStatusPatchOverHTTP(t *testing.T) {
	for _, tt := range []struct {
		name    string
		answer  int
		garbled bool
		wantErr func(error) bool
	}{
		{name: "written", answer: http.StatusOK, wantErr: func(err error) bool { return err == nil }},
		// The answer is never decoded: one that would not decode does not fail the write.
		{name: "answer not decoded", answer: http.StatusOK, garbled: true, wantErr: func(err error) bool { return err == nil }},
		{name: "conflict", answer: http.StatusConflict, wantErr: apierrors.IsConflict},
		{name: "invalid (metadata.uid changed)", answer: http.StatusUnprocessableEntity, wantErr: apierrors.IsInvalid},
		{name: "node gone", answer: http.StatusNotFound, wantErr: apierrors.IsNotFound},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var got struct{ method, path, fieldManager, contentType, body string }
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				got.method, got.path, got.fieldManager = r.Method, r.URL.Path, r.URL.Query().Get("fieldManager")
				got.contentType, got.body = r.Header.Get("Content-Type"), string(b)
				w.Header().Set("Content-Type", "application/json")
				if tt.answer != http.StatusOK {
					st := apierrors.NewConflict(schema.GroupResource{Resource: "nodes"}, "node-1", nil).Status()
					st.Code, st.Reason = int32(tt.answer), map[int]metav1.StatusReason{
						http.StatusConflict: metav1.StatusReasonConflict, http.StatusUnprocessableEntity: metav1.StatusReasonInvalid,
						http.StatusNotFound: metav1.StatusReasonNotFound}[tt.answer]
					w.WriteHeader(tt.answer)
					_ = json.NewEncoder(w).Encode(&st)
					return
				}
				if tt.garbled {
					_, _ = w.Write([]byte("{not a Node"))
					return
				}
				_ = json.NewEncoder(w).Encode(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}})
			}))
			defer srv.Close()
			// As dkc-server configures its client (services/internal/server): protobuf preferred.
			cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{
				ContentType: "application/vnd.kubernetes.protobuf", AcceptContentTypes: "application/vnd.kubernetes.protobuf,application/json"}})
			if err != nil {
				t.Fatal(err)
			}
			w := &Writer{client: cs}
			patch := `{"metadata":{"uid":"u1"},"status":{}}`
			err = w.patchStatus(context.Background(), "node-1", []byte(patch))
			if !tt.wantErr(err) {
				t.Errorf("patchStatus: %v", err)
			}
			if got.method != http.MethodPatch || got.path != "/api/v1/nodes/node-1/status" || got.fieldManager != FieldManager ||
				got.contentType != "application/strategic-merge-patch+json" || got.body != patch {
				t.Errorf("request %+v; want PATCH /api/v1/nodes/node-1/status, fieldManager %s, a strategic merge patch of %s", got, FieldManager, patch)
			}
		})
	}
}
