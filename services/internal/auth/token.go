// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// MaxTokenBytes caps a bearer token before dkc-server does anything else with it. A projected
// ServiceAccount token is about 1 KiB (an RS256 header, a dozen claims naming the pod, node and
// ServiceAccount with their UIDs, a 342-character signature); an RSA-4096 or external signer and long
// names and issuer URLs keep it under 4 KiB. 16 KiB leaves four times that, and refuses at once what can
// only be an attempt to make dkc-server hash and forward, and the apiserver parse, megabytes per call.
const MaxTokenBytes = 16 << 10

// tokenClaims are what dkc reads from a token without verifying its signature: only ever used to skip
// a review the apiserver would refuse anyway, or to shorten how long a verified token is cached.
type tokenClaims struct {
	// exp is the token's expiry; zero when it has none dkc can use.
	exp time.Time
}

// maxExp is the largest exp taken as a time (year 9999); later ones bound nothing.
const maxExp = 253402300799

// parseToken takes the apiserver's first look at a ServiceAccount token (hasCorrectIssuer in
// k8s.io/kubernetes/pkg/serviceaccount/jwt.go): not JSON, exactly three dot-separated segments, a payload of
// unpadded base64url holding a JSON object whose iss, if present, is a string. A token failing this is
// refused by that authenticator before its signature is looked at, and dkc accepts only ServiceAccount
// users, so dkc refuses it without a review.
func parseToken(token string) (tokenClaims, error) {
	if strings.HasPrefix(strings.TrimSpace(token), "{") {
		return tokenClaims{}, errors.New("JSON serialization, not a compact JWT")
	}
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return tokenClaims{}, fmt.Errorf("%d dot-separated segments, want 3 (a JWT)", len(parts))
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return tokenClaims{}, errors.New("JWT payload is not unpadded base64url")
	}
	var claims struct {
		// The same field and type as the apiserver's check: a non-string iss fails both.
		Issuer string          `json:"iss"`
		Exp    json.RawMessage `json:"exp"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return tokenClaims{}, errors.New("JWT payload is not a JSON object of claims")
	}
	var c tokenClaims
	// As go-jose's NumericDate: a JSON number of seconds, truncated. Anything else leaves exp unknown:
	// the apiserver would refuse such a token, and the cache TTL still applies.
	if f, err := strconv.ParseFloat(string(claims.Exp), 64); err == nil && f < maxExp && f > -maxExp {
		c.exp = time.Unix(int64(f), 0)
	}
	return c, nil
}
