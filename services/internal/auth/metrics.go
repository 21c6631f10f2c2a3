// SPDX-License-Identifier: Apache-2.0

package auth

import "github.com/prometheus/client_golang/prometheus"

// Refusal reasons, the values of dkc_server_token_refusals_total's reason label.
const (
	reasonMissing     = "missing"      // no bearer token
	reasonTooLarge    = "too_large"    // over MaxTokenBytes, not reviewed
	reasonMalformed   = "malformed"    // not shaped like a ServiceAccount JWT, not reviewed
	reasonRateLimited = "rate_limited" // the caller address's review budget is spent, not reviewed
	reasonRejected    = "rejected"     // TokenReview: not authenticated, or not for audience dkc
	reasonForbidden   = "forbidden"    // authenticated, but not an allowed ServiceAccount or no node claim
	reasonUnavailable = "unavailable"  // the TokenReview failed or timed out
	reasonExpired     = "expired"      // past its exp claim and ExpiryLeeway, not reviewed
)

// Results of re-checking an open stream's token, the values of dkc_server_stream_reauth_total's result label.
const (
	reauthOK              = "ok"               // still valid, for the same node and ServiceAccount
	reauthRefused         = "refused"          // no longer valid: the stream ends
	reauthIdentityChanged = "identity_changed" // valid, but for another node or ServiceAccount: the stream ends
	reauthUnavailable     = "unavailable"      // could not be checked (TokenReview failed): the stream stays, retried
	// the token's exp came: the stream ends so the node reconnects with its current one
	reauthExpired = "expired"
)

// Metrics of the authenticator; a nil *Metrics records nothing.
type Metrics struct {
	refusals *prometheus.CounterVec
	reviews  *prometheus.CounterVec
	reauths  *prometheus.CounterVec
	local    *prometheus.CounterVec
}

// NewMetrics registers the authenticator's metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dkc", Subsystem: "server", Name: "token_refusals_total",
			Help: "Calls refused by authentication, by reason: missing, too_large, malformed and rate_limited (refused " +
				"without a TokenReview), expired (past its exp and a minute of leeway, not reviewed), rejected (not " +
				"authenticated or not for audience dkc), forbidden (not an allowed service account, or no node claim), " +
				"unavailable (the TokenReview failed).",
		}, []string{"reason"}),
		reviews: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dkc", Subsystem: "server", Name: "token_reviews_total",
			Help: "TokenReviews sent to the apiserver, by result: authenticated, unauthenticated, error.",
		}, []string{"result"}),
		reauths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dkc", Subsystem: "server", Name: "stream_reauth_total",
			Help: "Re-checks of an open WatchConfig stream's token once its verification lapsed (at least once per " +
				"--token-cache-ttl), by result: ok, refused and identity_changed (the stream was ended), unavailable (the " +
				"TokenReview failed; the stream stays and the check is retried), expired (the token's exp came; the stream was " +
				"ended so that the node reconnects with its current token).",
		}, []string{"result"}),
		local: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "dkc", Subsystem: "server", Name: "token_local_verifications_total",
			Help: "Tokens verified in dkc-server with the apiserver's published keys and cached objects, by result: " +
				"accepted, refused (signed by the apiserver, but not for audience dkc, of a service account not allowed, " +
				"or without a node claim), or why it went to TokenReview instead: no_key (no keys fetched, or none " +
				"under the token's key ID), bad_signature, other_issuer, claims (not yet valid, secret-bound), " +
				"objects_unseen (its service account, pod or Node not cached with the UID it names).",
		}, []string{"result"}),
	}
	for _, r := range localResults {
		m.local.WithLabelValues(r)
	}
	for _, r := range []string{reauthOK, reauthRefused, reauthIdentityChanged, reauthUnavailable, reauthExpired} {
		m.reauths.WithLabelValues(r) // exported at 0, so that a rate over it works before the first of each
	}
	reg.MustRegister(m.refusals, m.reviews, m.reauths, m.local)
	return m
}

func (m *Metrics) refused(reason string) {
	if m != nil {
		m.refusals.WithLabelValues(reason).Inc()
	}
}

func (m *Metrics) reviewed(result string) {
	if m != nil {
		m.reviews.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) reauthenticated(result string) {
	if m != nil {
		m.reauths.WithLabelValues(result).Inc()
	}
}

func (m *Metrics) verifiedLocally(result string) {
	if m != nil {
		m.local.WithLabelValues(result).Inc()
	}
}
