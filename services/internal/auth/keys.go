// SPDX-License-Identifier: Apache-2.0

package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
)

// The apiserver's service-account issuer discovery (KEP 1393), served at these paths of every apiserver that
// issues ServiceAccount tokens, to every ServiceAccount by the built-in ClusterRole
// system:service-account-issuer-discovery (and to dkc-server by its own ClusterRole).
const (
	openIDConfigPath = "/.well-known/openid-configuration"
	jwksPath         = "/openid/v1/jwks"
)

const (
	// KeyRefreshInterval is how often the issuer's keys are fetched again. The apiserver publishes a key at
	// least the JWKS's max-age (an hour) before it signs with it, so a rotation is seen long before tokens
	// signed with the new key arrive; a token whose key is not known yet goes to TokenReview meanwhile.
	KeyRefreshInterval = 5 * time.Minute
	// keyRefetchAfter is how soon after a fetch an unknown key ID may trigger another: a caller presenting
	// tokens with made-up key IDs must not make dkc-server fetch the keys per call.
	keyRefetchAfter = 30 * time.Second
	// keyFetchTimeout bounds one fetch of the discovery document and the key set.
	keyFetchTimeout = 10 * time.Second
	// MaxKeyAge is how long keys are used after the last fetch that succeeded: the apiserver may have
	// stopped publishing one (a key rotated out after a compromise) while fetches fail (discovery refused,
	// a network split). Past it every token goes to TokenReview until a fetch succeeds again.
	MaxKeyAge = 3 * KeyRefreshInterval
	// maxKeySetBytes caps what a fetch reads: a key set of a few keys is a few KiB.
	maxKeySetBytes = 1 << 20
)

// KeySource fetches the issuer the apiserver signs ServiceAccount tokens as and the public keys it verifies
// them with.
type KeySource interface {
	FetchKeys(ctx context.Context) (issuer string, keys jose.JSONWebKeySet, err error)
}

// APIServerKeys is the KeySource of the apiserver behind a REST client (the discovery client: JSON, the
// apiserver's address and dkc-server's credentials). It reads the key set from the apiserver's own path, not
// from the discovery document's jwks_uri, which --service-account-jwks-uri may point at an address outside
// the cluster: the apiserver serves the same keys at its own path whatever that flag says.
type APIServerKeys struct {
	Client rest.Interface
}

// FetchKeys implements KeySource.
func (k APIServerKeys) FetchKeys(ctx context.Context) (string, jose.JSONWebKeySet, error) {
	ctx, cancel := context.WithTimeout(ctx, keyFetchTimeout)
	defer cancel()
	var set jose.JSONWebKeySet
	doc, err := k.get(ctx, openIDConfigPath)
	if err != nil {
		return "", set, err
	}
	var meta struct {
		Issuer string `json:"issuer"`
	}
	if err := json.Unmarshal(doc, &meta); err != nil {
		return "", set, fmt.Errorf("decode %s: %w", openIDConfigPath, err)
	}
	if u, err := url.Parse(meta.Issuer); err != nil || u.Scheme == "" || u.Host == "" {
		return "", set, fmt.Errorf("%s names issuer %q, not a URL", openIDConfigPath, meta.Issuer)
	}
	keys, err := k.get(ctx, jwksPath)
	if err != nil {
		return "", set, err
	}
	if err := json.Unmarshal(keys, &set); err != nil {
		return "", set, fmt.Errorf("decode %s: %w", jwksPath, err)
	}
	return meta.Issuer, set, nil
}

func (k APIServerKeys) get(ctx context.Context, path string) ([]byte, error) {
	rc, err := k.Client.Get().AbsPath(path).SetHeader("Accept", "application/json, application/jwk-set+json").
		Stream(ctx)
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", path, err)
	}
	defer rc.Close()
	// Read no more than the cap (and one byte to tell): the cap bounds memory, not only what is kept.
	body, err := io.ReadAll(io.LimitReader(rc, maxKeySetBytes+1))
	if err != nil {
		return nil, fmt.Errorf("get %s: %w", path, err)
	}
	if len(body) > maxKeySetBytes {
		return nil, fmt.Errorf("get %s: more than a key set holds (%d bytes)", path, maxKeySetBytes)
	}
	return body, nil
}

// Keys holds the issuer's current public keys, fetched at start and every KeyRefreshInterval, and again
// (at most once per keyRefetchAfter) when a token names a key it does not hold. Until a fetch succeeds it
// holds none, and every token goes to TokenReview.
type Keys struct {
	source KeySource
	clock  clock.Clock
	log    *zap.Logger

	mu        sync.RWMutex
	issuer    string
	byID      map[string][]jose.JSONWebKey
	all       []jose.JSONWebKey
	fetched   time.Time // of the last attempt, successful or not
	succeeded time.Time // of the last fetch that succeeded
	wake      chan struct{}
}

// NewKeys returns Keys fetched from source once Run runs; nil log: no logs, nil clk: the real clock.
func NewKeys(source KeySource, log *zap.Logger, clk clock.Clock) *Keys {
	if log == nil {
		log = zap.NewNop()
	}
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Keys{source: source, clock: clk, log: log, wake: make(chan struct{}, 1)}
}

// Run fetches the keys until ctx ends.
func (k *Keys) Run(ctx context.Context) {
	for {
		k.refresh(ctx)
		t := k.clock.NewTimer(KeyRefreshInterval)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-k.wake:
			t.Stop()
			// Not sooner than keyRefetchAfter after the last attempt, whatever asks.
			if wait := keyRefetchAfter - k.clock.Since(k.lastAttempt()); wait > 0 {
				select {
				case <-ctx.Done():
					return
				case <-k.clock.After(wait):
				}
			}
		case <-t.C():
		}
	}
}

func (k *Keys) lastAttempt() time.Time {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.fetched
}

func (k *Keys) refresh(ctx context.Context) {
	issuer, set, err := k.source.FetchKeys(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fetched = k.clock.Now()
	if err != nil {
		if ctx.Err() == nil {
			// The keys held stay: a key the apiserver stopped publishing a moment ago still verifies tokens it
			// accepts (it keeps verification keys longer than signing ones), and a lapse of discovery only
			// sends tokens to TokenReview.
			k.log.Warn("service-account issuer keys not fetched; tokens go to TokenReview until they are",
				zap.Error(err), zap.Int("keysHeld", len(k.all)))
		}
		return
	}
	byID := map[string][]jose.JSONWebKey{}
	var all []jose.JSONWebKey
	for _, key := range set.Keys {
		if !key.Valid() || !key.IsPublic() {
			continue
		}
		byID[key.KeyID] = append(byID[key.KeyID], key)
		all = append(all, key)
	}
	if k.issuer != issuer || len(k.all) != len(all) {
		k.log.Info("service-account issuer keys fetched", zap.String("issuer", issuer), zap.Int("keys", len(all)))
	}
	k.issuer, k.byID, k.all = issuer, byID, all
	k.succeeded = k.fetched
}

// Fetched says whether a fetch has succeeded within MaxKeyAge: tokens signed with the keys it published
// verify here.
func (k *Keys) Fetched() bool {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.issuer != "" && k.clock.Since(k.succeeded) <= MaxKeyAge
}

// errNoKeys: nothing fetched yet, or the issuer publishes no key under the token's key ID.
var errNoKeys = errors.New("no published key")

// lookup returns the issuer and the keys a token with key ID kid may be signed with: those with that ID, or
// every key for a token without one (as the apiserver tries them). An unknown ID asks Run for a fetch.
func (k *Keys) lookup(kid string) (string, []jose.JSONWebKey, error) {
	k.mu.RLock()
	issuer, keys, stale := k.issuer, k.all, k.clock.Since(k.succeeded) > MaxKeyAge
	if kid != "" {
		keys = k.byID[kid]
	}
	k.mu.RUnlock()
	if issuer == "" || len(keys) == 0 || stale {
		select {
		case k.wake <- struct{}{}:
		default:
		}
		return "", nil, errNoKeys
	}
	return issuer, keys, nil
}
