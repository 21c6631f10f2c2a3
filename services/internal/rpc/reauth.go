// SPDX-License-Identifier: Apache-2.0

package rpc

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	"github.com/dkc-dev/dkc/services/internal/auth"
)

const (
	// minRecheckInterval spaces the checks of a token whose verification is not cached at all (its exp
	// is now, or the clocks of dkc-server and the apiserver disagree about it): one review a second, not a
	// loop of them.
	minRecheckInterval = time.Second
	// recheckMargin moves a check just past the end of the verification: the token cache still answers at
	// the instant it expires, and the check is meant to reach the apiserver.
	recheckMargin = time.Millisecond
	// reauthRetryInitial and reauthRetryMax bound the backoff of a check that could not be made (the
	// apiserver unreachable). Every stream retries; doubling and jitter keep their reviews from arriving
	// together when the apiserver comes back.
	reauthRetryInitial = 5 * time.Second
	reauthRetryMax     = time.Minute
)

// recheck times one WatchConfig stream's token checks (Config.Reauth). A check runs in a goroutine
// of its own, so that a slow TokenReview never holds up a push; the stream's loop selects on due (start a
// check) and done (its result). A nil *recheck (no Reauthenticator) never fires.
type recheck struct {
	reauth Reauthenticator
	clock  clock.Clock
	ctx    context.Context
	timer  clock.Timer // nil while a check runs
	result chan recheckResult
	retry  time.Duration // the last retry delay while checks cannot be made; 0 after a check
}

type recheckResult struct {
	until time.Time
	err   error
}

// newRecheck schedules the first check of the stream of ctx for when the verification made as it opened
// lapses; a stream whose verification time is unknown is checked after minRecheckInterval.
func (s *Service) newRecheck(ctx context.Context) *recheck {
	if s.reauth == nil {
		return nil
	}
	r := &recheck{reauth: s.reauth, clock: s.clock, ctx: ctx, result: make(chan recheckResult, 1)}
	until, ok := auth.VerifiedUntil(ctx)
	if !ok {
		until = s.clock.Now()
	}
	r.schedule(until)
	return r
}

func (r *recheck) schedule(until time.Time) {
	r.timer = r.clock.NewTimer(max(until.Sub(r.clock.Now())+recheckMargin, minRecheckInterval))
}

// due fires when a check should start.
func (r *recheck) due() <-chan time.Time {
	if r == nil || r.timer == nil {
		return nil
	}
	return r.timer.C()
}

// start runs a check; its result arrives on done. The result channel has room for it, so the goroutine
// ends even when the stream has ended meanwhile (its context cancels the review).
func (r *recheck) start() {
	r.timer = nil
	go func() {
		until, err := r.reauth.Reauthenticate(r.ctx)
		r.result <- recheckResult{until: until, err: err}
	}()
}

// done delivers a check's result.
func (r *recheck) done() <-chan recheckResult {
	if r == nil {
		return nil
	}
	return r.result
}

// handle schedules the next check after res, or returns the error that ends the stream: a refusal,
// as codes.Unauthenticated. A check that could not be made is logged and retried with backoff.
func (r *recheck) handle(res recheckResult, log *zap.Logger) error {
	switch {
	case res.err == nil:
		r.retry = 0
		r.schedule(res.until)
		return nil
	case status.Code(res.err) == codes.Unavailable:
		r.retry = min(max(2*r.retry, reauthRetryInitial), reauthRetryMax)
		wait := r.retry/2 + rand.N(r.retry/2)
		log.Warn("could not check the node's token again; keeping its stream and retrying", zap.Error(res.err),
			zap.Duration("in", wait))
		r.timer = r.clock.NewTimer(wait)
		return nil
	case status.Code(res.err) == codes.Canceled || status.Code(res.err) == codes.DeadlineExceeded:
		return res.err // the stream ended while its token was being checked
	case errors.Is(res.err, auth.ErrTokenExpired):
		log.Info("node's token expired; ending its stream so that it reconnects with its current token")
		return status.Error(codes.Unavailable,
			"the token this stream was opened with has expired; reconnect with the current one")
	default:
		msg := status.Convert(res.err).Message()
		log.Warn("node's token refused when checked again; ending its stream", zap.String("reason", msg))
		return status.Errorf(codes.Unauthenticated, "token checked again and refused: %s", msg)
	}
}

// stop releases the timer.
func (r *recheck) stop() {
	if r != nil && r.timer != nil {
		r.timer.Stop()
	}
}
