// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// apiserverShape is the apiserver's first look at a ServiceAccount token, hasCorrectIssuer in
// k8s.io/kubernetes/pkg/serviceaccount/jwt.go (v1.34) without the issuer lookup: parseToken must accept
// exactly what it accepts, or dkc would refuse tokens the apiserver might accept.
func apiserverShape(tokenData string) bool {
	if strings.HasPrefix(strings.TrimSpace(tokenData), "{") {
		return false
	}
	parts := strings.Split(tokenData, ".")
	if len(parts) != 3 {
		return false
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return false
	}
	claims := struct {
		Issuer string `json:"iss"`
	}{}
	return json.Unmarshal(payload, &claims) == nil
}

func FuzzParseToken(f *testing.F) {
	for _, s := range []string{
		sjwt(map[string]any{"iss": "https://kubernetes.default.svc", "exp": 1700000000}),
		sjwt(map[string]any{"exp": 1.7e9}), sjwt(map[string]any{"exp": "1700000000"}), sjwt(map[string]any{"exp": 1e300}),
		sjwt(map[string]any{"iss": 5}), sjwt(nil), "not-a-token", "a.b.c", " {.e30.x", "eyJ9.e30=.x", "..", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, token string) {
		c, err := parseToken(token)
		if want := apiserverShape(token); (err == nil) != want {
			t.Fatalf("parseToken(%q) = %v; the apiserver's check says %v", token, err, want)
		}
		if err != nil && !c.exp.IsZero() {
			t.Fatalf("parseToken(%q) failed (%v) but returned exp %v", token, err, c.exp)
		}
		if !c.exp.IsZero() && (c.exp.Year() < -9998 || c.exp.Year() > 9999) {
			t.Fatalf("parseToken(%q): exp %v out of range", token, c.exp)
		}
	})
}

func TestParseTokenExp(t *testing.T) {
	tests := []struct {
		name string
		exp  any
		want time.Time
	}{
		{name: "integer", exp: 1700000000, want: time.Unix(1700000000, 0)},
		{name: "fraction truncated", exp: 1700000000.9, want: time.Unix(1700000000, 0)},
		{name: "exponent", exp: 1.7e9, want: time.Unix(1700000000, 0)},
		{name: "string", exp: "1700000000"},
		{name: "null", exp: nil},
		{name: "beyond year 9999", exp: 1e300},
		{name: "object", exp: map[string]any{"a": 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseToken(sjwt(map[string]any{"exp": tt.exp}))
			if err != nil {
				t.Fatal(err)
			}
			if !c.exp.Equal(tt.want) {
				t.Errorf("exp %v: got %v, want %v", tt.exp, c.exp, tt.want)
			}
		})
	}
}
