package palisade

import (
	"context"
	"errors"
	"time"
)

// A Lease's renewals: a goroutine per lease queues one every ttl *
// RenewRatio and moves the safe deadline on each answer.

// renewLoop renews every ttl * RenewRatio (the ttl the leader answered),
// counted from the send time of the acquire or renewal; retries failures
// every 50 ms until the deadline; marks the lease lost on a refusal or when
// the deadline passes.
func (l *Lease) renewLoop(sent time.Time) {
	ratio := renewRatio(l.t.cfg.RenewRatio)
	next := sent.Add(time.Duration(float64(l.ttl) * ratio))
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		deadline := l.Deadline()
		wake := next
		if deadline.Before(wake) {
			wake = deadline
		}
		if !l.sleepUntil(timer, wake) {
			// Let go, or lost: at its deadline (the holder saw it first),
			// the grant is still given back.
			if l.lostAtDeadline() {
				l.lapse()
			}
			return
		}
		now := time.Now()
		if !now.Before(deadline) {
			l.lapse()
			return
		}
		if now.Before(next) {
			continue
		}
		// The deadline counts from here: the moment the renewal is queued.
		sent := time.Now()
		grant, err := l.renewOnce(deadline)
		if err != nil {
			if l.renewalFailed(err) {
				return
			}
			next = time.Now().Add(50 * time.Millisecond)
			continue
		}
		ttl, held := l.extend(grant, sent)
		if !held {
			return
		}
		next = sent.Add(time.Duration(float64(ttl) * ratio))
	}
}

// lapse: the safe deadline passed with no renewal answered. The lease is
// lost here, and its grant is given back (unless taken with a lock-delay):
// every new leader treats a live grant as renewed at its takeover, so while
// leadership moves faster than the ttl an abandoned grant would never
// expire and no one else could be granted the lease. The release names the
// grant by token, secret and grant index, so it frees nothing else, and is
// sent after this holder stopped believing it holds the lease. Retried
// while the cluster is unavailable, for three ttls (5 s..60 s).
func (l *Lease) lapse() {
	l.markLost(&LeaseLostError{Reason: reasonDeadline}, false)
	if l.lockDelayed {
		return
	}
	l.giveBack.Do(l.releaseLapsed)
}

// lostAtDeadline: the lease was marked lost because its safe deadline
// passed (by the renewer, or by a write or IsHeld that saw it first).
func (l *Lease) lostAtDeadline() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	lost, ok := l.lost.(*LeaseLostError)
	return ok && lost.Reason == reasonDeadline
}

// releaseLapsed releases the lapsed grant in the background, retried while
// the cluster is unavailable for three ttls (5 s..60 s).
func (l *Lease) releaseLapsed() {
	patience := 3 * l.ttl
	if patience < 5*time.Second {
		patience = 5 * time.Second
	} else if patience > time.Minute {
		patience = time.Minute
	}
	go func() {
		until := time.Now().Add(patience)
		pause := 100 * time.Millisecond
		for {
			ctx, cancel := context.WithTimeout(context.Background(), l.t.cfg.RequestTimeout+l.t.cfg.RetryBudget)
			err := l.t.releaseGrant(ctx, l.id)
			cancel()
			if err == nil || !errors.Is(err, ErrUnavailable) || time.Now().Add(pause).After(until) {
				return
			}
			time.Sleep(pause)
			if pause *= 2; pause > time.Second {
				pause = time.Second
			}
		}
	}()
}

// renewRatio is RenewRatio clamped to 0.05..0.9.
func renewRatio(ratio float64) float64 {
	if ratio < 0.05 {
		return 0.05
	} else if ratio > 0.9 {
		return 0.9
	}
	return ratio
}

// sleepUntil waits on timer until wake; false when the lease was let go
// meanwhile (Done closed).
func (l *Lease) sleepUntil(timer *time.Timer, wake time.Time) bool {
	if !timer.Stop() {
		select {
		case <-timer.C:
		default:
		}
	}
	timer.Reset(time.Until(wake))
	select {
	case <-l.done:
		return false
	case <-timer.C:
		return true
	}
}

// renewalFailed handles a renewal that got no grant; whether the loop
// stops: the lease was let go meanwhile, the renewal was refused (lost, or
// preempted: released at once), or the deadline passed. Otherwise the
// failure is logged and the renewal retried.
func (l *Lease) renewalFailed(err error) bool {
	select {
	case <-l.done:
		if l.lostAtDeadline() {
			l.lapse()
		}
		return true
	default:
	}
	var preempted *PreemptedError
	switch {
	case errors.As(err, &preempted):
		// Let go at once: the preemptor waits for this release, not
		// for the grant's deadline. Marked lost (no more writes)
		// before the release.
		l.markLost(preempted, false)
		l.t.releaseInBackground(l.id)
		return true
	case errors.Is(err, ErrLeaseLost):
		var lost *LeaseLostError
		reason := err.Error()
		if errors.As(err, &lost) {
			reason = lost.Reason
		}
		l.markLost(&LeaseLostError{Reason: "renewal refused: " + reason}, false)
		return true
	}
	if !time.Now().Before(l.Deadline()) {
		l.lapse()
		return true
	}
	l.t.logf("palisade: renewal of %s failed; retrying: %v", l.id.Lease, err)
	return false
}

// extend moves the safe deadline by a renewal sent at sent; the ttl the
// leader answered, and whether the lease is still held (not when it was
// lost meanwhile, or its deadline passed before the answer came).
func (l *Lease) extend(grant *Grant, sent time.Time) (time.Duration, bool) {
	ttl := grant.TTL()
	margin := marginFor(l.t.cfg.DriftMarginRatio, ttl)
	l.mu.Lock()
	if l.lost != nil {
		l.mu.Unlock()
		return ttl, false
	}
	passed := !time.Now().Before(l.deadline)
	if !passed {
		// The leader extended the grant by the ttl it answered: that,
		// from the send time, bounds the deadline; never move it back.
		if d := sent.Add(ttl - margin); d.After(l.deadline) {
			l.deadline = d
		}
		l.jwt = grant.JWT
	}
	l.mu.Unlock()
	if passed {
		// Once the deadline has passed the lease stays lost, even if
		// the renewal made it in time at the leader.
		l.lapse()
		return ttl, false
	}
	return ttl, true
}

// renewOnce sends one renewal (in a batch), giving up at the deadline or
// when the lease is let go: a renewal stuck on a frozen node cannot hide
// the loss.
func (l *Lease) renewOnce(deadline time.Time) (*Grant, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	go func() {
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if hook := l.t.renewHook.Load(); hook != nil {
		if err := (*hook)(ctx, l.id); err != nil {
			return nil, err
		}
	}
	return l.t.renew(ctx, l.id, deadline)
}
