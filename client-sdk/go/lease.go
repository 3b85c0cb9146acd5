package palisade

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

const (
	reasonDeadline = "the safe deadline has passed"
	reasonReleased = "released"
)

// Lease is a held lease. While IsHeld is true no other holder has been
// granted it: the local safe deadline is the SEND time of the last
// acknowledged acquire or renew, plus the ttl the leader answered, minus a
// drift margin (10% of the ttl by default), on this process's monotonic
// clock — which the leader's own deadline always exceeds.
//
// A goroutine renews every ttl/3 (RenewRatio), through the client's
// renewal batches. The lease is lost when a renewal is refused (409 lost,
// max_hold, preempted), when the deadline passes without an acknowledged
// renewal (even if this process was frozen: IsHeld compares with the clock
// every time, never with a flag), or when a write is fenced (409
// stale_token). Done is closed then (and on Release and HandoverTo), and
// writes are refused locally, with nothing sent.
//
// A Lease is safe for concurrent use. Release it when done (Client.Close
// releases the leases still held); a Lease dropped without either keeps
// renewing.
type Lease struct {
	t   *transport
	id  GrantID
	ttl time.Duration
	// lockDelayed: taken with a lock-delay, so a lapsed grant is left to
	// expire (a release would clear the delay the holder asked for).
	lockDelayed bool
	// giveBack releases a lapsed grant once, whichever path saw the
	// deadline pass first.
	giveBack  sync.Once
	done      chan struct{}
	closeOnce sync.Once

	mu       sync.Mutex
	jwt      string
	deadline time.Time
	lost     error // *LeaseLostError or *PreemptedError once lost
	released bool
}

// marginFor is the drift margin for ttl: ttl * ratio, at least 1 ms.
func marginFor(ratio float64, ttl time.Duration) time.Duration {
	margin := time.Duration(float64(ttl) * ratio)
	if margin < time.Millisecond {
		margin = time.Millisecond
	}
	return margin
}

func startLease(t *transport, g *Grant, sent time.Time, lockDelayed bool) *Lease {
	ttl := g.TTL()
	l := &Lease{
		t:           t,
		id:          g.ID(),
		ttl:         ttl,
		lockDelayed: lockDelayed,
		done:        make(chan struct{}),
		jwt:         g.JWT,
		deadline:    sent.Add(ttl - marginFor(t.cfg.DriftMarginRatio, ttl)),
	}
	if !t.track(l) {
		l.markLost(&LeaseLostError{Reason: "the client was closed"}, true)
	}
	go l.renewLoop(sent)
	return l
}

// markLost marks the lease lost with err (once; later calls keep the first
// reason) and closes Done. quiet: the holder's own doing (release,
// handover), not logged. Whether this call marked it.
func (l *Lease) markLost(err error, quiet bool) bool {
	l.mu.Lock()
	first := l.lost == nil
	if first {
		l.lost = err
	}
	l.mu.Unlock()
	l.closeOnce.Do(func() { close(l.done) })
	l.t.untrack(l)
	if first && !quiet {
		l.t.logf("palisade: lease %s (token %d) lost: %v", l.id.Lease, l.id.Token, err)
	}
	return first
}

// heldJWT is the JWT if the lease is held now; the reason otherwise (and
// the lease is marked lost once the deadline has passed: a lease whose
// deadline passed is never held again).
func (l *Lease) heldJWT() (string, error) {
	l.mu.Lock()
	lost, expired, jwt := l.lost, !time.Now().Before(l.deadline), l.jwt
	l.mu.Unlock()
	if lost != nil {
		return "", lost
	}
	if expired {
		err := &LeaseLostError{Reason: reasonDeadline}
		l.markLost(err, false)
		return "", err
	}
	return jwt, nil
}

// Name is the lease name.
func (l *Lease) Name() string { return l.id.Lease }

// Holder is the holder this lease was granted to.
func (l *Lease) Holder() string { return l.id.Holder }

// Token is the fencing token of this grant.
func (l *Lease) Token() uint64 { return l.id.Token }

// ID names this grant, with its secret (as powerful as the handle: hand it
// only to a process that must renew or release it).
func (l *Lease) ID() GrantID { return l.id }

// TTL is the ttl the grant was acquired with.
func (l *Lease) TTL() time.Duration { return l.ttl }

// IsHeld reports whether the lease is held now. It compares the safe
// deadline with the monotonic clock on every call: a process frozen past
// its deadline never sees true again after it wakes.
func (l *Lease) IsHeld() bool {
	_, err := l.heldJWT()
	return err == nil
}

// Err is nil while the lease is held, else why it is not (an error matching
// ErrLeaseLost; ErrPreempted too after a preemption).
func (l *Lease) Err() error {
	_, err := l.heldJWT()
	return err
}

// JWT is the current lease JWT while the lease is held (renewals bring new
// ones), else the error Err returns.
func (l *Lease) JWT() (string, error) { return l.heldJWT() }

// Deadline is the safe local deadline (a time.Time carrying the monotonic
// clock reading; compare it with time.Now()).
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Done is closed once the lease is lost, released or handed over. It is
// closed by a timer at the deadline; IsHeld and Err do not wait for it.
func (l *Lease) Done() <-chan struct{} { return l.done }

func (l *Lease) write(ctx context.Context, method, path string, content []byte, cond Precondition) (*answer, error) {
	jwt, err := l.heldJWT()
	if err != nil {
		return nil, err
	}
	ans, err := l.t.gatewayWrite(ctx, jwt, method, path, content, cond)
	var fenced *FencedError
	if errors.As(err, &fenced) {
		l.markLost(&LeaseLostError{Reason: fmt.Sprintf("fenced at the gateway: token %d is below fence %d",
			fenced.Token, fenced.Fence)}, false)
	}
	return ans, err
}

// Put writes value at key (whose first segment must be this lease's name)
// through the gateway, stamped with the lease JWT.
//
// Errors: a *LeaseLostError (ErrLeaseLost) locally, with nothing sent, once
// the lease is not held; a *FencedError (ErrFenced, ErrLeaseLost) when the
// gateway refuses the token as stale, and the lease is marked lost;
// ErrUnavailable on a transport failure (not retried: a write may have
// landed).
func (l *Lease) Put(ctx context.Context, key string, value []byte) (*WriteResult, error) {
	if value == nil {
		value = []byte{}
	}
	return l.writeResult(l.write(ctx, "PUT", "/v1/objects/"+EncodeKey(key), value, Precondition{}))
}

// Delete deletes key through the gateway, fenced like Put (it raises the
// fence even if nothing was there).
func (l *Lease) Delete(ctx context.Context, key string) (*WriteResult, error) {
	return l.writeResult(l.write(ctx, "DELETE", "/v1/objects/"+EncodeKey(key), nil, Precondition{}))
}

func (l *Lease) writeResult(ans *answer, err error) (*WriteResult, error) {
	if err != nil {
		return nil, err
	}
	var res WriteResult
	if err := ans.decode(&res); err != nil {
		return nil, err
	}
	return &res, nil
}

// Fence raises the gateway fence of this lease to its token (Acquire does
// it already when a gateway is configured); the fence. Errors as Put.
func (l *Lease) Fence(ctx context.Context) (uint64, error) {
	ans, err := l.write(ctx, "POST", "/v1/fences/"+l.id.Lease, nil, Precondition{})
	if err != nil {
		return 0, err
	}
	var doc struct {
		Fence uint64 `json:"fence"`
	}
	if err := ans.decode(&doc); err != nil {
		return 0, err
	}
	return doc.Fence, nil
}

// Get reads key through the gateway (reads are not fenced and need no
// lease); ErrNotFound when there is no object.
func (l *Lease) Get(ctx context.Context, key string) (*Object, error) {
	return l.t.getObject(ctx, key)
}

// HandoverTo hands the lease to successor: this handle stops holding it at
// once (writes through it fail with ErrLeaseLost, and it is not renewed),
// the leader ends the grant and reserves one with a higher token for
// successor, whose acquire (waiting or not) takes it within the
// reservation window (10 s). It returns the successor's token. If the
// handover cannot be made the lease is released instead (this handle has
// let go either way).
//
// Errors: ErrBadRequest for an empty successor or this holder (nothing
// changed, the lease is still held); ErrLeaseLost if the lease was no
// longer held; ErrUnavailable.
func (l *Lease) HandoverTo(ctx context.Context, successor string) (uint64, error) {
	if successor == "" || successor == l.id.Holder {
		return 0, badRequest("a handover names another holder than %q", l.id.Holder)
	}
	if err := checkHolder(successor); err != nil {
		return 0, err
	}
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return 0, &LeaseLostError{Reason: reasonReleased}
	}
	l.released = true
	l.mu.Unlock()
	_, wasHeld := l.heldJWT()
	l.markLost(&LeaseLostError{Reason: fmt.Sprintf("handed over to %q", successor)}, true)
	if wasHeld != nil {
		return 0, &LeaseLostError{Reason: "the lease was no longer held"}
	}
	token, err := l.t.handover(ctx, l.id, successor)
	if err != nil {
		// Let go instead: a grant preempted meanwhile (the handover answers
		// lost for it) must be released for its preemptor.
		l.t.releaseInBackground(l.id)
		return 0, err
	}
	return token, nil
}

// Release stops renewing and releases the lease. Idempotent.
//
// Errors: ErrLeaseLost if the lease was held locally but the cluster no
// longer knew the grant (a lease already lost releases without error);
// ErrUnavailable if no node answered (the lease then ends at its ttl).
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return nil
	}
	l.released = true
	l.mu.Unlock()
	_, notHeld := l.heldJWT()
	l.markLost(&LeaseLostError{Reason: reasonReleased}, true)
	err := l.t.releaseGrant(ctx, l.id)
	if err != nil && notHeld != nil && errors.Is(err, ErrLeaseLost) {
		return nil
	}
	if err == nil || !errors.Is(err, ErrLeaseLost) {
		return err
	}
	// Held, yet the cluster refused. Either the grant is gone already (a
	// release retried after its first answer was lost), or a request of
	// this handle's own Acquire that timed out here reached the leader
	// later and made a newer grant index for the same grant: every grant
	// with this handle's secret is this handle's, so it is released by its
	// secret alone.
	if gone, checked := l.grantGone(ctx); checked && gone {
		return nil
	}
	if l.id.GrantIndex != nil {
		id := l.id
		id.GrantIndex = nil
		if again := l.t.releaseGrant(ctx, id); again == nil {
			return nil
		}
	}
	return err
}

// grantGone reports whether the cluster shows this grant no longer held
// (checked: whether it could tell; a principal without the read right
// cannot).
func (l *Lease) grantGone(ctx context.Context) (gone, checked bool) {
	ans, err := l.t.election(ctx, "GET", "/v1/leases/"+l.id.Lease, nil, 0)
	if err != nil {
		return false, false
	}
	if ans.status == 404 {
		return true, true
	}
	if ans.status != 200 {
		return false, false
	}
	info, err := parseLeaseInfo(ans.body)
	if err != nil {
		return false, false
	}
	return info.Holder != l.id.Holder || info.Token != l.id.Token, true
}
