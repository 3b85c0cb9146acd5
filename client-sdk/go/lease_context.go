package palisade

import (
	"context"
	"fmt"
	"sync"
)

// A lease as a context: cancelled the moment the lease may be lost.

// Context returns a context derived from parent that is cancelled the
// moment the lease may be lost: when Done is closed, and at the safe
// deadline at the latest — its Err compares with the clock on every call,
// so code that checks ctx.Err() after its process was frozen past the
// deadline never sees nil. The context carries the lease
// (LeaseFromContext). Call cancel when done with it.
func (l *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	c := &leaderContext{Context: parent, lease: l, done: make(chan struct{}), stop: make(chan struct{})}
	go func() {
		select {
		case <-parent.Done():
		case <-l.done:
		case <-c.stop:
		}
		c.finish()
	}()
	return c, c.cancel
}

type leaseKey struct{}

// LeaseFromContext returns the lease a context from Lease.Context (such as
// the one an Elector gives OnStartedLeading) carries, or nil.
func LeaseFromContext(ctx context.Context) *Lease {
	l, _ := ctx.Value(leaseKey{}).(*Lease)
	return l
}

// leaderContext is a context cancelled on the loss of its lease. Its Err
// checks the lease against the clock every time (and closes Done when it
// finds the lease lost), so it never answers nil past the safe deadline.
type leaderContext struct {
	context.Context
	lease    *Lease
	done     chan struct{}
	stop     chan struct{}
	stopOnce sync.Once
	doneOnce sync.Once
}

func (c *leaderContext) finish() { c.doneOnce.Do(func() { close(c.done) }) }

func (c *leaderContext) cancel() {
	c.stopOnce.Do(func() { close(c.stop) })
	c.finish()
}

func (c *leaderContext) Done() <-chan struct{} { return c.done }

func (c *leaderContext) Err() error {
	if err := c.Context.Err(); err != nil {
		c.finish()
		return err
	}
	if !c.lease.IsHeld() {
		c.finish()
		return context.Canceled
	}
	select {
	case <-c.done:
		return context.Canceled
	default:
		return nil
	}
}

func (c *leaderContext) Value(key any) any {
	if key == (leaseKey{}) {
		return c.lease
	}
	return c.Context.Value(key)
}

func (c *leaderContext) String() string {
	return fmt.Sprintf("palisade.LeaseContext(%s, token %d)", c.lease.id.Lease, c.lease.id.Token)
}
