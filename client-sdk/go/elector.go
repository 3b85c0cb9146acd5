package palisade

import (
	"context"
	"errors"
	"sync"
	"time"
)

// LeaderCallbacks are an Elector's callbacks, shaped like client-go's
// leaderelection.LeaderCallbacks.
type LeaderCallbacks struct {
	// OnStartedLeading runs (on its own goroutine) when this process starts
	// leading; the fence is raised already. Its ctx is cancelled the moment
	// the lease may be lost — on a refused renewal, a fenced write, and at
	// the safe deadline at the latest (ctx.Err() compares with the clock on
	// every call) — and when the Elector's context ends. It should return
	// soon after. LeaseFromContext(ctx) is the lease, for fenced writes.
	//
	// Unlike client-go, returning from it gives up leadership: the lease is
	// released and the elector campaigns again (reason "task finished").
	// Block until ctx is done to keep leading.
	OnStartedLeading func(ctx context.Context)
	// OnStoppedLeading is called once after each OnStartedLeading, and
	// never without one (unlike client-go, a process that never led gets
	// none), after OnStartedLeading has returned, so no task code runs
	// after it; then the lease is released.
	OnStoppedLeading func()
	// OnNewLeader is called with each new holder of the lease seen through
	// the watch API (including this process, and the first holder seen),
	// from a goroutine of its own, not ordered with the other two.
	OnNewLeader func(identity string)
}

// ElectorConfig describes an Elector.
type ElectorConfig struct {
	// Lease is the lease name to campaign for.
	Lease string
	// Identity is this process's holder name (unique per process).
	Identity string
	// TTL is the lease's ttl. Default 5 s.
	TTL time.Duration
	// CampaignWait is how long each acquire waits (it is cut short when
	// Run's context ends). Default 10 s.
	CampaignWait time.Duration
	// AcquireOptions are passed to every acquire (WithPriority,
	// WithPreemptible, WithLockDelay, WithMaxHold).
	AcquireOptions []AcquireOption
	// Callbacks are called as leadership comes and goes.
	Callbacks LeaderCallbacks
}

// Elector campaigns for a lease, calls OnStartedLeading with a context
// cancelled the moment leadership may be lost, and campaigns again after
// a loss, until Run's context ends.
type Elector struct {
	c   *Client
	cfg ElectorConfig

	mu      sync.Mutex
	current *Lease
	leader  string
	reason  string
	running bool
}

// NewElector returns an elector for cfg. ErrBadRequest for a bad lease
// name, identity, ttl or option.
func NewElector(c *Client, cfg ElectorConfig) (*Elector, error) {
	if cfg.TTL == 0 {
		cfg.TTL = 5 * time.Second
	}
	if cfg.CampaignWait == 0 {
		cfg.CampaignWait = 10 * time.Second
	}
	if err := CheckLeaseName(cfg.Lease); err != nil {
		return nil, err
	}
	if err := checkHolder(cfg.Identity); err != nil {
		return nil, err
	}
	if cfg.TTL < time.Millisecond || cfg.CampaignWait < 0 {
		return nil, badRequest("bad ttl %v or campaign wait %v", cfg.TTL, cfg.CampaignWait)
	}
	var o acquireOptions
	for _, opt := range cfg.AcquireOptions {
		opt(&o)
	}
	if _, err := o.body(); err != nil {
		return nil, err
	}
	return &Elector{c: c, cfg: cfg}, nil
}

// Lease is the lease while leading, else nil.
func (e *Elector) Lease() *Lease {
	e.mu.Lock()
	l := e.current
	e.mu.Unlock()
	if l != nil && l.IsHeld() {
		return l
	}
	return nil
}

// IsLeader reports whether this process leads now (holds the lease,
// compared with the clock).
func (e *Elector) IsLeader() bool { return e.Lease() != nil }

// Leader is the last holder seen through the watch (only with an
// OnNewLeader callback), or this identity while leading.
func (e *Elector) Leader() string {
	if e.IsLeader() {
		return e.cfg.Identity
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.leader
}

// StopReason says why this process last stopped leading: "lease lost: ...",
// "shutting down" or "task finished" ("" if it never led).
func (e *Elector) StopReason() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reason
}

// permanent reports whether err will not get better by campaigning again.
func permanent(err error) bool {
	return errors.Is(err, ErrBadRequest) || errors.Is(err, ErrUnauthorized) || errors.Is(err, ErrForbidden)
}

// Run campaigns, leads and campaigns again until ctx ends; then it stops
// leading (cancelling OnStartedLeading's context, waiting for it, calling
// OnStoppedLeading and releasing the lease) and returns nil. It returns an
// error early only when campaigning cannot succeed (ErrBadRequest,
// ErrUnauthorized, ErrForbidden). Transient failures are retried every
// 200 ms.
func (e *Elector) Run(ctx context.Context) error {
	e.mu.Lock()
	if e.running {
		e.mu.Unlock()
		return badRequest("the elector is running already")
	}
	e.running = true
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		e.running = false
		e.mu.Unlock()
	}()

	watchCtx, stopWatch := context.WithCancel(ctx)
	var watcher sync.WaitGroup
	if e.cfg.Callbacks.OnNewLeader != nil {
		watcher.Add(1)
		go func() {
			defer watcher.Done()
			e.watch(watchCtx)
		}()
	}
	defer func() {
		stopWatch()
		watcher.Wait()
	}()

	opts := append([]AcquireOption{WithWait(e.cfg.CampaignWait)}, e.cfg.AcquireOptions...)
	for ctx.Err() == nil {
		lease, err := e.c.Acquire(ctx, e.cfg.Lease, e.cfg.Identity, e.cfg.TTL, opts...)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, ErrHeld), errors.Is(err, ErrLockDelay):
				continue
			case permanent(err):
				return err
			}
			e.c.t.logf("palisade: campaign for %s failed; retrying: %v", e.cfg.Lease, err)
			if !sleepCtx(ctx, 200*time.Millisecond) {
				return nil
			}
			continue
		}
		e.lead(ctx, lease)
	}
	return nil
}

// lead runs one term of leadership, from acquired to released.
func (e *Elector) lead(ctx context.Context, lease *Lease) {
	e.mu.Lock()
	e.current = lease
	e.mu.Unlock()
	leaderCtx, cancel := lease.Context(ctx)
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		if start := e.cfg.Callbacks.OnStartedLeading; start != nil {
			start(leaderCtx)
		} else {
			<-leaderCtx.Done()
		}
	}()
	var reason string
	select {
	case <-lease.Done():
		reason = "lease lost"
	case <-leaderCtx.Done():
		reason = "lease lost"
		if ctx.Err() != nil {
			reason = "shutting down"
		}
	case <-ctx.Done():
		reason = "shutting down"
	case <-finished:
		reason = "task finished"
	}
	if reason == "lease lost" {
		if err := lease.Err(); err != nil {
			reason = err.Error()
		}
	}
	cancel()
	<-finished
	e.mu.Lock()
	e.reason = reason
	e.current = nil
	e.mu.Unlock()
	if stop := e.cfg.Callbacks.OnStoppedLeading; stop != nil {
		stop()
	}
	releaseCtx, done := context.WithTimeout(context.Background(), e.c.t.cfg.RequestTimeout+e.c.t.cfg.RetryBudget)
	defer done()
	if err := lease.Release(releaseCtx); err != nil {
		e.c.t.logf("palisade: release of %s failed: %v", e.cfg.Lease, err)
	}
}

// watch reports every new holder, through the watch API.
func (e *Elector) watch(ctx context.Context) {
	var index uint64
	last := ""
	for ctx.Err() == nil {
		info, err := e.c.Watch(ctx, e.cfg.Lease, index, 30*time.Second)
		if err != nil {
			if !sleepCtx(ctx, 200*time.Millisecond) {
				return
			}
			continue
		}
		index = info.ModifyIndex
		if info.Holder != "" && info.Holder != last && !info.Reserved {
			last = info.Holder
			e.mu.Lock()
			e.leader = info.Holder
			e.mu.Unlock()
			if ctx.Err() != nil {
				return
			}
			e.cfg.Callbacks.OnNewLeader(info.Holder)
		}
	}
}

// sleepCtx sleeps d or until ctx ends; false when ctx ended.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-timer.C:
		return true
	}
}
