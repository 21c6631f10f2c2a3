// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"slices"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Objects answers from caches what the apiserver looks up when it authenticates a ServiceAccount token: the
// UID of the ServiceAccount, pod or Node of that name. ok is false when the cache cannot vouch for one (not
// synced, not watched, absent, or being deleted): the token then goes to TokenReview, which can.
type Objects interface {
	ServiceAccountUID(namespace, name string) (uid string, ok bool)
	PodUID(namespace, name string) (uid string, ok bool)
	NodeUID(name string) (uid string, ok bool)
}

// signatureAlgorithms are those the apiserver signs ServiceAccount tokens with (RS256 for RSA keys, ES256,
// ES384 or ES512 for ECDSA ones); a token with any other goes to TokenReview.
var signatureAlgorithms = []jose.SignatureAlgorithm{jose.RS256, jose.ES256, jose.ES384, jose.ES512}

// Results of verifying a token locally, the values of dkc_server_token_local_verifications_total's result
// label: accepted and refused are decided; the others are why the token went to TokenReview.
const (
	localAccepted  = "accepted"
	localRefused   = "refused"
	localNoKey     = "no_key"         // no keys fetched, or none under the token's key ID
	localSignature = "bad_signature"  // not parsed, or no published key verifies it
	localIssuer    = "other_issuer"   // signed by a published key, but for another issuer
	localClaims    = "claims"         // not yet valid, a secret-bound token, or claims the apiserver reads otherwise
	localObjects   = "objects_unseen" // its ServiceAccount, pod or Node not cached as the token names them
)

// localResults lists every result, exported at 0.
var localResults = []string{localAccepted, localRefused, localNoKey, localSignature, localIssuer, localClaims,
	localObjects}

// privateClaims are the apiserver's claims about the token's ServiceAccount and what it is bound to
// (k8s.io/kubernetes/pkg/serviceaccount, claims.go).
type privateClaims struct {
	Kubernetes struct {
		Namespace      string     `json:"namespace"`
		ServiceAccount objectRef  `json:"serviceaccount"`
		Pod            *objectRef `json:"pod"`
		Secret         *objectRef `json:"secret"`
		Node           *objectRef `json:"node"`
	} `json:"kubernetes.io"`
}

type objectRef struct {
	Name string `json:"name"`
	UID  string `json:"uid"`
}

// verifyLocally decides token as the apiserver's ServiceAccount authenticator would, without asking it: a
// signature by a key the issuer publishes (Keys), the issuer, the time claims with the apiserver's leeway,
// and the ServiceAccount, pod and Node it names still there with the UIDs it names (Objects). It accepts,
// refuses only what the apiserver would refuse for every TokenReview dkc sends (a verified token not for
// audience dkc, of a ServiceAccount dkc does not allow, or without a node claim), and otherwise says why it
// could not decide (decided false): the token then goes to TokenReview, so that whatever the caches cannot
// vouch for — an unpublished or new key, another accepted issuer, a pod created a moment ago — is decided by
// the apiserver as before. The Node is checked for pod-bound tokens too, which the apiserver does not do: a
// token whose node was re-created under its name is reviewed.
func (a *Authenticator) verifyLocally(token string) (id Identity, result, reason string, err error) {
	tok, err := jwt.ParseSigned(token, signatureAlgorithms)
	if err != nil || len(tok.Headers) != 1 {
		return Identity{}, localSignature, "", nil
	}
	issuer, keys, err := a.keys.lookup(tok.Headers[0].KeyID)
	if err != nil {
		return Identity{}, localNoKey, "", nil
	}
	var public jwt.Claims
	var private privateClaims
	verified := slices.ContainsFunc(keys, func(k jose.JSONWebKey) bool {
		return tok.Claims(k.Key, &public, &private) == nil
	})
	switch {
	case !verified:
		return Identity{}, localSignature, "", nil
	case public.Issuer != issuer:
		return Identity{}, localIssuer, "", nil
	case public.ValidateWithLeeway(jwt.Expected{Time: a.clock.Now()}, ExpiryLeeway) != nil:
		return Identity{}, localClaims, "", nil
	}
	k := private.Kubernetes
	if k.Namespace == "" || k.ServiceAccount.Name == "" || k.ServiceAccount.UID == "" || k.Secret != nil {
		return Identity{}, localClaims, "", nil
	}
	// From here the token is the apiserver's, as it signed it: what follows is what a review would answer.
	if !slices.Contains(public.Audience, Audience) {
		return Identity{}, localRefused, reasonRejected, status.Errorf(codes.Unauthenticated,
			"token is not for audience %q (it is for %q)", Audience, []string(public.Audience))
	}
	sa := k.Namespace + "/" + k.ServiceAccount.Name
	if !a.allowed[sa] {
		return Identity{}, localRefused, reasonForbidden, status.Errorf(codes.PermissionDenied,
			"service account %s is not allowed to call dkc", sa)
	}
	if k.Node == nil || k.Node.Name == "" {
		return Identity{}, localRefused, reasonForbidden, status.Errorf(codes.PermissionDenied,
			"token of %s carries no node claim (%s): use a pod-bound or node-bound token on an apiserver >= 1.32", sa,
			NodeNameExtra)
	}
	if uid, ok := a.objects.ServiceAccountUID(k.Namespace, k.ServiceAccount.Name); !ok || uid != k.ServiceAccount.UID {
		return Identity{}, localObjects, "", nil
	}
	if k.Pod != nil {
		if uid, ok := a.objects.PodUID(k.Namespace, k.Pod.Name); !ok || uid != k.Pod.UID {
			return Identity{}, localObjects, "", nil
		}
	}
	if uid, ok := a.objects.NodeUID(k.Node.Name); !ok || uid != k.Node.UID {
		return Identity{}, localObjects, "", nil
	}
	return Identity{Node: k.Node.Name, ServiceAccount: sa}, localAccepted, "", nil
}
