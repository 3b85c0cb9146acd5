package palisade

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
)

// Hedged calls: a renewal that has not answered within its slice of the
// time left to the lease's safe deadline is sent to the next node too, and
// the first definitive answer wins.
//
// A renewal is idempotent (the same holder, token and secret extend the
// same grant), so sending it twice is safe; waiting out a request timeout
// on a frozen leader is not, when the lease has less than that left.

// attemptOutcome is what one attempt brought: an answer, or an error.
type attemptOutcome struct {
	index int
	ans   *answer
	err   error
}

// transient: a transport failure, 503 or 429, worth another attempt.
func (o attemptOutcome) transient() bool {
	return o.err != nil || o.ans.status == 503 || o.ans.status == 429
}

// hedgeCall is one hedged call's state.
type hedgeCall struct {
	t         *transport
	method    string
	path      string
	first     int // the endpoint tried first (a partition leader's), or -1
	url       func(index int) string
	payload   []byte
	results   chan attemptOutcome
	out       map[int]bool      // endpoints with an attempt out
	tries     map[int]int       // attempts per endpoint
	notBefore map[int]time.Time // Retry-After, within the slice
	attempts  int
	last      string
}

// hedged sends an idempotent election request (a renewal) until ctx's
// deadline (without one: the retry budget) and returns the first
// definitive answer (anything but a transport failure, 503 or 429). One
// attempt goes at once, to the first endpoint in order(); another, to the
// next endpoint, whenever the last has gone unanswered for its
// attemptSlice (that endpoint is then avoided for a request timeout), or
// soon after one failed (backoff 20 ms doubling, never longer than a
// slice). A Retry-After keeps this call off that endpoint for as long, but
// never longer than a slice. Each attempt's timeout ends at the deadline
// (and within a request timeout); the attempts still out when an answer
// wins are cancelled.
func (t *transport) hedged(ctx context.Context, method, path string, payload []byte) (*answer, error) {
	started := time.Now()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = started.Add(t.cfg.RetryBudget)
	}
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	h := &hedgeCall{t: t, method: method, payload: payload, path: path, first: t.first(path),
		url:     func(index int) string { return t.urls[index] + path },
		results: make(chan attemptOutcome, len(t.urls)),
		out:     map[int]bool{}, tries: map[int]int{}, notBefore: map[int]time.Time{},
		last: "no attempt made: the deadline had passed"}
	unavailable := func() error {
		return &UnavailableError{Attempts: h.attempts, Elapsed: time.Since(started), Last: h.last, Err: ctx.Err()}
	}
	launchAt, latest, lateAt := started, -1, time.Time{}
	backoff := firstBackoff
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		if !now.Before(deadline) {
			return nil, unavailable()
		}
		if latest >= 0 && h.out[latest] && !now.Before(lateAt) {
			t.avoid(latest, t.cfg.RequestTimeout) // it stalled
			latest = -1
		}
		if !now.Before(launchAt) {
			slice := attemptSlice(deadline.Sub(now), t.cfg.RequestTimeout)
			index, wait := h.next(now)
			if index >= 0 {
				h.launch(ctx, index, deadline)
				latest, lateAt = index, now.Add(slice)
				wait = slice
			} else if wait > slice {
				wait = slice
			}
			launchAt = now.Add(wait)
		}
		wake := launchAt
		if deadline.Before(wake) {
			wake = deadline
		}
		resetTimer(timer, time.Until(wake))
		select {
		case <-ctx.Done():
			return nil, unavailable()
		case <-timer.C:
			continue
		case o := <-h.results:
			delete(h.out, o.index)
			if !o.transient() {
				t.learnFrom(o.index, path, o.ans, true)
				return o.ans, nil
			}
			if re, ok := o.err.(*RequestError); ok {
				return nil, re
			}
			if at := h.failed(o, deadline, backoff); at.Before(launchAt) {
				launchAt = at
			}
			if backoff *= 2; backoff > maxBackoff {
				backoff = maxBackoff
			}
		}
	}
}

// next is the endpoint for the next attempt: of those with no attempt out
// and no Retry-After pending, the one tried least by this call (ties: in
// order()); else -1 and how long until one is free of its Retry-After (an
// hour if all have attempts out).
func (h *hedgeCall) next(now time.Time) (int, time.Duration) {
	best, wait := -1, time.Hour
	for _, index := range h.t.orderFrom(h.first) {
		if h.out[index] {
			continue
		}
		if nb := h.notBefore[index]; nb.After(now) {
			if d := nb.Sub(now); d < wait {
				wait = d
			}
			continue
		}
		if best < 0 || h.tries[index] < h.tries[best] {
			best = index
		}
	}
	return best, wait
}

// launch sends one attempt to index on a goroutine of its own.
func (h *hedgeCall) launch(ctx context.Context, index int, deadline time.Time) {
	h.attempts++
	h.tries[index]++
	h.out[index] = true
	timeout := h.t.cfg.RequestTimeout
	if left := time.Until(deadline); left < timeout {
		timeout = left
	}
	go func() {
		ans, err := h.t.do(ctx, h.method, h.url(index), h.payload, "application/json", nil, timeout)
		if err == nil {
			h.t.heard(index) // it answered, if only late or with a 503: slow, not stalled
		}
		select {
		case h.results <- attemptOutcome{index: index, ans: ans, err: err}:
		case <-ctx.Done():
		}
	}()
}

// failed records a transient outcome; when the next attempt may go.
func (h *hedgeCall) failed(o attemptOutcome, deadline time.Time, backoff time.Duration) time.Time {
	if o.err != nil {
		h.last = fmt.Sprintf("%s: %v", h.url(o.index), o.err)
	} else {
		h.last = fmt.Sprintf("%s: %d %s", h.url(o.index), o.ans.status, o.ans.message())
	}
	h.t.moveOff(o.index)
	h.t.missed(h.path, o.index)
	now := time.Now()
	slice := attemptSlice(deadline.Sub(now), h.t.cfg.RequestTimeout)
	if o.ans != nil {
		if ra := retryAfter(o.ans.header.Get("Retry-After")); ra > 0 {
			h.t.avoid(o.index, ra)
			h.t.mu.Lock()
			h.t.notBefore[o.index] = now.Add(ra) // for the calls that are not hedged
			h.t.mu.Unlock()
			if ra > slice {
				ra = slice
			}
			h.notBefore[o.index] = now.Add(ra)
		}
	}
	h.t.logf("palisade: %s attempt failed; trying again: %s", h.method, h.last)
	wait := backoff/2 + h.t.jitter(backoff)/2
	if wait > slice {
		wait = slice
	}
	return now.Add(wait)
}

// learnFrom learns from a definitive answer of index: which node leads (an
// answer a follower forwarded names it; identify, for a hedged call, finds
// which endpoint that node is), which node answered /v1/cluster.
func (t *transport) learnFrom(index int, path string, ans *answer, identify bool) {
	header := ans.header.Get(forwardedByFollower)
	if k := t.parts.ofPath(path); k >= 0 {
		t.learnPartitionLeader(k, index, header)
	} else if t.answered(index, header) && identify {
		t.identify(t.nodeView)
	} else if header != "" && t.parts.size() == 0 && leaseInPath(path) != "" {
		t.identify(t.nodeView) // a forwarded lease call: learn the partition map
	}
	if path == "/v1/cluster" && ans.status == 200 {
		if v := viewOf(ans.body); v.ok {
			t.learn(index, v.id)
		}
		t.parts.learn(ans.body)
	}
}

// nodeView is what endpoint index says in /v1/cluster (one short request).
func (t *transport) nodeView(index int) nodeView {
	timeout := t.cfg.RequestTimeout
	if timeout > time.Second {
		timeout = time.Second
	}
	ans, err := t.do(context.Background(), "GET", t.urls[index]+"/v1/cluster", nil, "", nil, timeout)
	if err != nil || ans.status != 200 {
		return nodeView{}
	}
	t.parts.learn(ans.body)
	return viewOf(ans.body)
}

func viewOf(body []byte) nodeView {
	var doc struct {
		NodeID *uint64 `json:"node_id"`
		Leader *uint64 `json:"leader"`
	}
	if json.Unmarshal(body, &doc) != nil {
		return nodeView{}
	}
	var v nodeView
	if doc.NodeID != nil {
		v.id, v.ok = *doc.NodeID, true
	}
	if doc.Leader != nil {
		v.leader = *doc.Leader
	}
	return v
}

// resetTimer stops timer, drains it, and sets it to d.
func resetTimer(timer *time.Timer, d time.Duration) {
	if !timer.Stop() {
		select {
		case <-timer.C:
		default:
		}
	}
	timer.Reset(d)
}
