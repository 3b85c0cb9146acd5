//go:build linux

package palisade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Leases against a real palisade dev cluster: the takeover, fence-on-acquire,
// the gateway's fence behind the local deadline, handover, preemption, the
// options, the API key, the elector.

// pauseRenewals makes c's leases' renewals hang (as a stuck goroutine or a
// network that swallows requests would) until the returned func is called.
func pauseRenewals(c *Client) (resume func()) {
	ch := make(chan struct{})
	var once sync.Once
	hook := renewHook(func(ctx context.Context, _ GrantID) error {
		select {
		case <-ch:
		case <-ctx.Done():
		}
		return &UnavailableError{Last: "paused by the test"}
	})
	c.t.renewHook.Store(&hook)
	return func() { once.Do(func() { close(ch) }) }
}

func fenceOf(t *testing.T, dev *devCluster, lease string) uint64 {
	t.Helper()
	req, _ := http.NewRequest("GET", dev.gateway+"/v1/fences/"+lease, nil)
	req.Header.Set(APIKeyHeader, dev.apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var doc struct {
		Fence uint64 `json:"fence"`
	}
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&doc) != nil {
		t.Fatalf("fence of %s: %d", lease, resp.StatusCode)
	}
	return doc.Fence
}

type acquired struct {
	lease *Lease
	err   error
	at    time.Time
}

func acquireAsync(c *Client, name, holder string, ttl time.Duration, opts ...AcquireOption) <-chan acquired {
	out := make(chan acquired, 1)
	go func() {
		l, err := c.Acquire(context.Background(), name, holder, ttl, opts...)
		out <- acquired{l, err, time.Now()}
	}()
	return out
}

func TestTakeoverThenTheLateWriteIsRefused(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	ctx := context.Background()
	name := leaseName("takeover")
	key := name + "/state"
	first, second := dev.client(t), dev.client(t)
	// Liveness is not what this test is about: ttls leave room for a
	// loaded machine (renewals must still get through in time).
	const ttlA = 5 * time.Second
	a, err := first.Acquire(ctx, name, "A", ttlA, WithWait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := a.Put(ctx, key, []byte("from A")); err != nil || res.Token != a.Token() {
		t.Fatalf("put: %+v %v", res, err)
	}
	if f := fenceOf(t, dev, name); f != a.Token() { // fence-on-acquire
		t.Fatalf("fence %d, token %d", f, a.Token())
	}
	b := acquireAsync(second, name, "B", 5*time.Second, WithWait(30*time.Second))
	time.Sleep(ttlA + 500*time.Millisecond) // over a ttl: only renewals keep A's lease
	select {
	case r := <-b:
		t.Fatalf("B got the lease while A renews: %v %v", r.lease, r.err)
	default:
	}
	if !a.IsHeld() {
		t.Fatalf("A lost: %v", a.Err())
	}
	resume := pauseRenewals(first)
	defer resume()
	var r acquired
	select {
	case r = <-b:
	case <-time.After(40 * time.Second):
		t.Fatal("B did not get the lease")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.lease.Token() <= a.Token() || fenceOf(t, dev, name) != r.lease.Token() {
		t.Fatalf("B's token %d, A's %d, fence %d", r.lease.Token(), a.Token(), fenceOf(t, dev, name))
	}
	if !r.at.After(a.Deadline()) {
		t.Fatalf("B was granted %v before A's deadline", a.Deadline().Sub(r.at))
	}
	if _, err := r.lease.Put(ctx, key, []byte("from B")); err != nil {
		t.Fatal(err)
	}
	if a.IsHeld() {
		t.Fatal("A holds after B was granted")
	}
	if _, err := a.Put(ctx, key, []byte("late A")); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("A's late write: %v", err)
	}
	obj, err := r.lease.Get(ctx, key)
	if err != nil || string(obj.Value) != "from B" || obj.Token != r.lease.Token() {
		t.Fatalf("object %+v %v", obj, err)
	}
	if err := r.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if r.lease.IsHeld() {
		t.Fatal("held after release")
	}
	if err := a.Release(ctx); err != nil { // no longer held: nothing returned
		t.Fatal(err)
	}
}

func TestALateWriteThatReachesTheGatewayIsFenced(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	ctx := context.Background()
	name := leaseName("fenced")
	key := name + "/state"
	first, second := dev.client(t), dev.client(t)
	// A's JWT lives two ttls: long enough for B to take over first.
	a, err := first.Acquire(ctx, name, "A", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Put(ctx, key, []byte("from A")); err != nil {
		t.Fatal(err)
	}
	resume := pauseRenewals(first)
	defer resume()
	b, err := second.Acquire(ctx, name, "B", 5*time.Second, WithWait(40*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if _, err := b.Put(ctx, key, []byte("from B")); err != nil {
		t.Fatal(err)
	}
	// A's clock lies: its deadline looks far away, so the write goes out.
	a.mu.Lock()
	a.lost = nil
	a.deadline = time.Now().Add(time.Minute)
	a.mu.Unlock()
	_, err = a.Put(ctx, key, []byte("late A"))
	if errors.Is(err, ErrUnauthorized) && b.Token() > a.Token() {
		// The takeover took longer than A's JWT lives (a starved cluster):
		// the gateway refused the write by its exp, the second line.
		t.Skipf("A's JWT expired before its late write (%v); the fence was not reached", err)
	}
	var fenced *FencedError
	if !errors.As(err, &fenced) || fenced.Token != a.Token() || fenced.Fence != b.Token() || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("err = %v, want fenced %d < %d", err, a.Token(), b.Token())
	}
	if a.IsHeld() {
		t.Fatal("held after a fenced write")
	}
	if _, err := a.Put(ctx, key, []byte("later A")); !errors.Is(err, ErrLeaseLost) || errors.As(err, &fenced) {
		t.Fatalf("the next write: %v (want a local refusal)", err)
	}
	obj, err := second.GetObject(ctx, key)
	if err != nil || string(obj.Value) != "from B" {
		t.Fatalf("object %+v %v", obj, err)
	}
	// The raw JWT is refused by the gateway too.
	a.mu.Lock()
	staleJWT := a.jwt
	a.mu.Unlock()
	if _, err := first.PutWithJWT(ctx, staleJWT, key, []byte("raw A")); !errors.Is(err, ErrFenced) {
		t.Fatalf("raw stale write: %v", err)
	}
}

func TestHandover(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	ctx := context.Background()
	name := leaseName("handover")
	c := dev.client(t)
	a, err := c.Acquire(ctx, name, "A", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.HandoverTo(ctx, "A"); !errors.Is(err, ErrBadRequest) || !a.IsHeld() {
		t.Fatalf("handover to oneself: %v (held %v)", err, a.IsHeld())
	}
	token, err := a.HandoverTo(ctx, "B")
	if err != nil {
		t.Fatal(err)
	}
	if a.IsHeld() || token <= a.Token() {
		t.Fatalf("held %v, successor token %d, A's %d", a.IsHeld(), token, a.Token())
	}
	if _, err := a.Put(ctx, name+"/x", []byte("A")); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("A's write after handing over: %v", err)
	}
	if _, err := c.Acquire(ctx, name, "C", 5*time.Second); !errors.Is(err, ErrHeld) {
		t.Fatalf("a third holder during the reservation: %v", err)
	}
	b, err := dev.client(t).Acquire(ctx, name, "B", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	if b.Token() != token || fenceOf(t, dev, name) != token {
		t.Fatalf("B's token %d, handed %d, fence %d", b.Token(), token, fenceOf(t, dev, name))
	}
	if _, err := b.Put(ctx, name+"/x", []byte("B")); err != nil {
		t.Fatal(err)
	}
	history, err := c.History(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, h := range history {
		got = append(got, fmt.Sprintf("%s %s %d", h.Cause, h.Holder, h.Token))
	}
	want := []string{
		fmt.Sprintf("acquire A %d", a.Token()),
		fmt.Sprintf("handover B %d", token),
		fmt.Sprintf("claim B %d", token),
	}
	if strings.Join(got, "; ") != strings.Join(want, "; ") || history[0].AtMs == 0 {
		t.Fatalf("history %v, want %v (stamped)", history, want)
	}
	if _, err := c.History(ctx, name+"-never"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("the history of a lease never granted: %v", err)
	}
}

func TestPreemption(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	ctx := context.Background()
	name := leaseName("preempt")
	const ttl = 6 * time.Second
	a, err := dev.client(t).Acquire(ctx, name, "small", ttl, WithPreemptible())
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
	b, err := dev.client(t).Acquire(ctx, name, "big", 5*time.Second, WithPriority(10), WithWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	took := time.Since(started)
	select {
	case <-a.Done():
	case <-time.After(time.Second):
		t.Fatal("the preempted lease's Done was not closed")
	}
	if !errors.Is(a.Err(), ErrPreempted) || !errors.Is(a.Err(), ErrLeaseLost) {
		t.Fatalf("A's Err() = %v", a.Err())
	}
	if b.Token() <= a.Token() || took > ttl {
		t.Fatalf("B's token %d (A's %d), granted after %v (ttl %v)", b.Token(), a.Token(), took, ttl)
	}
	if _, err := a.Put(ctx, name+"/x", []byte("A")); !errors.Is(err, ErrPreempted) {
		t.Fatalf("A's write: %v", err)
	}
	t.Logf("the preemptor was granted after %v", took.Round(time.Millisecond))
}

func TestOptionsReachTheCluster(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	ctx := context.Background()
	name := leaseName("options")
	c := dev.client(t)
	l, err := c.Acquire(ctx, name, "A", 5*time.Second,
		WithPriority(7), WithPreemptible(), WithLockDelay(1500*time.Millisecond), WithMaxHold(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	info, err := c.Get(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Holder != "A" || info.Token != l.Token() || info.Priority != 7 || !info.Preemptible ||
		info.LockDelayMillis != 1500 || info.MaxHoldMillis != 3600000 {
		t.Fatalf("lease %+v", info)
	}
	leases, err := c.List(ctx, name)
	if err != nil || len(leases) != 1 || leases[0].Lease != name {
		t.Fatalf("list: %+v %v", leases, err)
	}
	jwt, err := l.JWT()
	if err != nil {
		t.Fatal(err)
	}
	claims, err := c.VerifyJWT(ctx, &Grant{Lease: name, Holder: "A", Token: l.Token(), JWT: jwt})
	if err != nil || claims.Issuer != "palisade" || claims.Expiry <= time.Now().Unix() {
		t.Fatalf("claims %+v %v", claims, err)
	}
}

func TestTheAPIKeyIsNeeded(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	ctx := context.Background()
	name := leaseName("key")
	noKey := dev.client(t, func(c *Config) { c.APIKey = "" })
	if _, err := noKey.Acquire(ctx, name, "A", 2*time.Second); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("without a key: %v", err)
	}
	wrongKey := dev.client(t, func(c *Config) { c.APIKey = "pal_0000" })
	if _, err := wrongKey.Get(ctx, name); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("a wrong key: %v", err)
	}
	if _, err := dev.client(t).Get(ctx, name); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a lease never granted: %v", err)
	}
}

func TestTheElectorContextIsCancelledBeforeAnotherHolderIsGranted(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	name := leaseName("elector")
	const ttl = 2 * time.Second
	t0 := time.Now()
	clientA := dev.client(t)
	type term struct {
		lease       *Lease
		cancelledAt time.Time
		late        []time.Duration // ctx.Err() nil at or after the deadline: never
	}
	var mu sync.Mutex
	var events []string
	var terms []*term
	record := func(e string) {
		mu.Lock()
		events = append(events, e)
		mu.Unlock()
	}
	started := make(chan *term, 16)
	stopped := make(chan struct{}, 16)
	elector, err := NewElector(clientA, ElectorConfig{
		Lease: name, Identity: "A", TTL: ttl,
		Callbacks: LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				record("started")
				tm := &term{lease: LeaseFromContext(ctx)}
				mu.Lock()
				terms = append(terms, tm)
				mu.Unlock()
				started <- tm
				for ctx.Err() == nil {
					// The deadline only moves forward, and only before it
					// passes, so a time taken before Err() said nil that is
					// at or past the deadline read after it is a late
					// cancellation.
					before := time.Now()
					if ctx.Err() == nil && !before.Before(tm.lease.Deadline()) {
						tm.late = append(tm.late, before.Sub(tm.lease.Deadline()))
					}
					time.Sleep(time.Millisecond)
				}
				tm.cancelledAt = time.Now()
				<-ctx.Done()
			},
			OnStoppedLeading: func() {
				record("stopped")
				stopped <- struct{}{}
			},
			OnNewLeader: func(id string) { record("leader " + id) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- elector.Run(ctx) }()
	defer func() {
		cancel()
		select {
		case <-runDone:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return")
		}
	}()
	// A term that lasts a ttl (renewals keep it); an earlier one may be
	// lost to the cluster settling.
	var current *term
	for current == nil {
		select {
		case tm := <-started:
			time.Sleep(ttl)
			if tm.lease.IsHeld() && elector.IsLeader() {
				current = tm
			}
		case <-time.After(40 * time.Second):
			t.Fatal("A never led for a ttl")
		}
	}
	resume := pauseRenewals(clientA)
	defer resume()
	// B waits for the lease; A's context must be cancelled before B is
	// granted.
	b := acquireAsync(dev.client(t), name, "B", 5*time.Second, WithWait(40*time.Second))
	var r acquired
	select {
	case r = <-b:
	case <-time.After(45 * time.Second):
		t.Fatal("B was not granted")
	}
	if r.err != nil {
		t.Fatal(r.err)
	}
	defer r.lease.Release(context.Background())
	if !waitFor(5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !current.cancelledAt.IsZero() && index(events, "stopped") >= 0
	}) {
		t.Fatal("A's task was not cancelled and OnStoppedLeading not called")
	}
	mu.Lock()
	deadline, cancelledAt, late := current.lease.Deadline(), current.cancelledAt, current.late
	for _, tm := range terms {
		late = append(late, tm.late...)
	}
	mu.Unlock()
	t.Logf("A's deadline %v, cancelled %v, B granted %v (since start)", deadline.Sub(t0), cancelledAt.Sub(t0), r.at.Sub(t0))
	if !cancelledAt.Before(r.at) {
		t.Fatalf("A's context cancelled at %v, B granted at %v", cancelledAt.Sub(t0), r.at.Sub(t0))
	}
	// The task sees the cancellation at once; only a starved scheduler
	// delays it (Err() itself is never nil past the deadline: checked
	// below, sample by sample).
	if cancelledAt.Sub(deadline) > 500*time.Millisecond {
		t.Fatalf("A's context cancelled %v after its deadline", cancelledAt.Sub(deadline))
	}
	if len(late) > 0 {
		t.Fatalf("ctx.Err() was nil at or after the deadline: %v", late)
	}
	if r.lease.Token() <= current.lease.Token() {
		t.Fatalf("B's token %d, A's %d", r.lease.Token(), current.lease.Token())
	}
	if _, err := r.lease.Put(context.Background(), name+"/state", []byte("from B")); err != nil {
		t.Fatal(err)
	}
	if _, err := current.lease.Put(context.Background(), name+"/state", []byte("late A")); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("A's late write: %v", err)
	}
	// The watch saw A, then B; every start has its stop.
	if !waitFor(5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		ia, ib := index(events, "leader A"), index(events, "leader B")
		return ia >= 0 && ib > ia && count(events, "started") == count(events, "stopped")
	}) {
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("events %v", events)
	}
	if elector.StopReason() == "" || elector.IsLeader() {
		t.Fatalf("stop reason %q, leader %v", elector.StopReason(), elector.IsLeader())
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("events %v; A's context cancelled %v after its deadline, %v before B's grant; stop reason: %s",
		events, cancelledAt.Sub(deadline), r.at.Sub(cancelledAt), elector.StopReason())
}

func waitFor(limit time.Duration, cond func() bool) bool {
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

func count(list []string, s string) int {
	n := 0
	for _, e := range list {
		if e == s {
			n++
		}
	}
	return n
}

func index(list []string, s string) int {
	for i, e := range list {
		if e == s {
			return i
		}
	}
	return -1
}

func TestAnElectorStopsLeadingAndReleasesOnShutdown(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	name := leaseName("shutdown")
	c := dev.client(t)
	var startedN, stoppedN int
	var mu sync.Mutex
	leading := make(chan struct{}, 1)
	elector, err := NewElector(c, ElectorConfig{Lease: name, Identity: "A", TTL: 5 * time.Second,
		Callbacks: LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				mu.Lock()
				startedN++
				mu.Unlock()
				leading <- struct{}{}
				<-ctx.Done()
			},
			OnStoppedLeading: func() {
				mu.Lock()
				stoppedN++
				mu.Unlock()
			},
		}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- elector.Run(ctx) }()
	select {
	case <-leading:
	case <-time.After(10 * time.Second):
		t.Fatal("never led")
	}
	// A second elector of the same lease waits, and never gets a stop
	// without a start.
	var otherStopped int
	other, _ := NewElector(dev.client(t), ElectorConfig{Lease: name, Identity: "B", TTL: 5 * time.Second,
		Callbacks: LeaderCallbacks{OnStoppedLeading: func() { otherStopped++ }}})
	otherCtx, otherCancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer otherCancel()
	if err := other.Run(otherCtx); err != nil || otherStopped != 0 || other.IsLeader() {
		t.Fatalf("the waiting elector: %v, %d stops", err, otherStopped)
	}
	cancel()
	select {
	case err := <-runDone:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return")
	}
	mu.Lock()
	defer mu.Unlock()
	if startedN != 1 || stoppedN != 1 || elector.StopReason() != "shutting down" {
		t.Fatalf("started %d, stopped %d, reason %q", startedN, stoppedN, elector.StopReason())
	}
	info, err := c.Get(context.Background(), name)
	if err != nil || info.Holder != "" {
		t.Fatalf("not released on shutdown: %+v %v", info, err)
	}
}
