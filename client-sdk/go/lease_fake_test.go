package palisade

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Acquire options, the safe deadline, renewals, local refusals and JWT
// checks, against fake servers that answer on cue.

func TestBadOptionsAreRefusedBeforeSending(t *testing.T) {
	f := newFake(t, scripted(reply{status: 200, body: grantJSON("orders", "A", 7, 5000, nil)}))
	c := fakeClient(t, noJWT(), f.URL)
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		lease  string
		holder string
		ttl    time.Duration
		opts   []AcquireOption
	}{
		{"priority -1", "orders", "A", time.Second, []AcquireOption{WithPriority(-1)}},
		{"priority 1001", "orders", "A", time.Second, []AcquireOption{WithPriority(1001)}},
		{"lock-delay 61s", "orders", "A", time.Second, []AcquireOption{WithLockDelay(61 * time.Second)}},
		{"lock-delay -1ms", "orders", "A", time.Second, []AcquireOption{WithLockDelay(-time.Millisecond)}},
		{"max-hold 0", "orders", "A", time.Second, []AcquireOption{WithMaxHold(0)}},
		{"max-hold 25h", "orders", "A", time.Second, []AcquireOption{WithMaxHold(25 * time.Hour)}},
		{"max-hold 1µs", "orders", "A", time.Second, []AcquireOption{WithMaxHold(time.Microsecond)}},
		{"wait -1s", "orders", "A", time.Second, []AcquireOption{WithWait(-time.Second)}},
		{"ttl 0", "orders", "A", 0, nil},
		{"ttl -1s", "orders", "A", -time.Second, nil},
		{"empty name", "", "A", time.Second, nil},
		{"name ..", "..", "A", time.Second, nil},
		{"name with /", "a/b", "A", time.Second, nil},
		{"name of 129", strings.Repeat("a", 129), "A", time.Second, nil},
		{"empty holder", "orders", "", time.Second, nil},
		{"holder of 257", "orders", strings.Repeat("h", 257), time.Second, nil},
		{"holder with a newline", "orders", "a\nb", time.Second, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := c.Acquire(ctx, tc.lease, tc.holder, tc.ttl, tc.opts...)
			var re *RequestError
			if !errors.Is(err, ErrBadRequest) || !errors.As(err, &re) || re.Status != 0 {
				t.Fatalf("err = %v, want a local ErrBadRequest", err)
			}
			if _, err := c.AcquireGrant(ctx, tc.lease, tc.holder, tc.ttl, tc.opts...); !errors.Is(err, ErrBadRequest) {
				t.Fatalf("AcquireGrant: err = %v", err)
			}
		})
	}
	for _, cfg := range []ElectorConfig{
		{Lease: "orders", Identity: "A", AcquireOptions: []AcquireOption{WithPriority(5000)}},
		{Lease: "a b", Identity: "A"},
		{Lease: "orders"},
		{Lease: "orders", Identity: "A", TTL: -time.Second},
	} {
		if _, err := NewElector(c, cfg); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("NewElector(%+v): %v", cfg, err)
		}
	}
	if n := f.count(); n != 0 {
		t.Fatalf("%d requests reached the server: %s", n, fmtPaths(f))
	}
}

func TestOptionsAreSentWithinTheirBounds(t *testing.T) {
	f := newFake(t, scripted(reply{status: 200, body: grantJSON("orders", "A", 7, 5000, nil)}))
	c := fakeClient(t, noJWT(), f.URL)
	_, err := c.AcquireGrant(context.Background(), "orders", "A", 5*time.Second,
		WithPriority(1000), WithPreemptible(), WithLockDelay(60*time.Second), WithMaxHold(24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	body := f.all()[0].json(t)
	want := map[string]any{"holder": "A", "ttl_ms": float64(5000), "priority": float64(1000), "preemptible": true,
		"lock_delay_ms": float64(60000), "max_hold_ms": float64(86400000)}
	for k, v := range want {
		if body[k] != v {
			t.Fatalf("body[%s] = %v, want %v (%v)", k, body[k], v, body)
		}
	}
	if _, ok := body["wait_ms"]; ok {
		t.Fatalf("an acquire without a wait sent wait_ms: %v", body)
	}
	if _, err := c.AcquireGrant(context.Background(), "orders", "A", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if body := f.all()[1].json(t); len(body) != 3 {
		t.Fatalf("defaults sent fields: %v", body)
	}
}

func TestAWaitIsAskedForInSlicesWithOneSecret(t *testing.T) {
	held := func(r request) reply {
		var wait float64
		if doc := r.json(t); doc["wait_ms"] != nil {
			wait = doc["wait_ms"].(float64)
		}
		return reply{status: 409, body: map[string]any{"error": "held", "holder": "B", "token": 3},
			delay: time.Duration(wait) * time.Millisecond}
	}
	f := newFake(t, held)
	c := fakeClient(t, Config{NoJWTVerification: true, RequestTimeout: 400 * time.Millisecond}, f.URL)
	started := time.Now()
	_, err := c.AcquireGrant(context.Background(), "orders", "A", 5*time.Second, WithWait(700*time.Millisecond))
	elapsed := time.Since(started)
	if !errors.Is(err, ErrHeld) {
		t.Fatalf("err = %v", err)
	}
	if elapsed < 650*time.Millisecond || elapsed > 2*time.Second {
		t.Fatalf("gave up after %v, want about 700 ms", elapsed)
	}
	reqs := f.all()
	if len(reqs) < 4 {
		t.Fatalf("%d slices, want at least 4 of at most 200 ms", len(reqs))
	}
	secret := reqs[0].json(t)["secret"]
	for _, r := range reqs {
		doc := r.json(t)
		if doc["secret"] != secret || doc["wait_ms"].(float64) > 200 {
			t.Fatalf("slice %v: want the one secret and wait_ms <= 200", doc)
		}
	}
}

func TestAWaitingAcquireRidesOutAnOutageLongerThanTheBudget(t *testing.T) {
	started := time.Now()
	f := newFake(t, func(r request) reply {
		if time.Since(started) < time.Second {
			return noQuorum
		}
		return reply{status: 200, body: grantJSON("orders", "A", 8, 5000, nil)}
	})
	c := fakeClient(t, Config{NoJWTVerification: true, RetryBudget: 200 * time.Millisecond}, f.URL)
	if _, err := c.AcquireGrant(context.Background(), "orders", "A", 5*time.Second); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("without a wait: %v, want ErrUnavailable within the budget", err)
	}
	if g, err := c.AcquireGrant(context.Background(), "orders", "A", 5*time.Second, WithWait(5*time.Second)); err != nil || g.Token != 8 {
		t.Fatalf("with a wait: %v %v", g, err)
	}
}

func TestAWaitingAcquireIsGrantedOnALaterSlice(t *testing.T) {
	held := reply{status: 409, body: map[string]any{"error": "held", "holder": "B", "token": 3}, delay: 50 * time.Millisecond}
	f := newFake(t, scripted(held, held, reply{status: 200, body: grantJSON("orders", "A", 8, 5000, nil)}))
	g, err := fakeClient(t, noJWT(), f.URL).AcquireGrant(context.Background(), "orders", "A", 5*time.Second, WithWait(10*time.Second))
	if err != nil || g.Token != 8 || f.count() != 3 {
		t.Fatalf("grant %v err %v after %d requests", g, err, f.count())
	}
}

func TestALockDelayIsWaitedOutWithinTheWait(t *testing.T) {
	delayed := reply{status: 409, body: map[string]any{"error": "lock_delay", "retry_after_ms": 300, "message": "lock-delay"}}
	f := newFake(t, scripted(delayed, reply{status: 200, body: grantJSON("orders", "A", 8, 5000, nil)}))
	c := fakeClient(t, noJWT(), f.URL)
	started := time.Now()
	if _, err := c.AcquireGrant(context.Background(), "orders", "A", 5*time.Second, WithWait(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(started); elapsed < 280*time.Millisecond {
		t.Fatalf("retried after %v, before the lock-delay ended", elapsed)
	}
	f2 := newFake(t, scripted(delayed))
	_, err := fakeClient(t, noJWT(), f2.URL).AcquireGrant(context.Background(), "orders", "A", 5*time.Second)
	var ld *LockDelayError
	if !errors.As(err, &ld) || ld.RetryAfter != 300*time.Millisecond || f2.count() != 1 {
		t.Fatalf("err = %v after %d requests", err, f2.count())
	}
}

func TestTheSafeDeadlineStartsAtTheSendTime(t *testing.T) {
	// The acquire answer takes 0.5 s: the deadline is send + 1.0 - 0.1, so
	// about 0.4 s are left when Acquire returns, not 0.9.
	f := newFake(t, func(r request) reply {
		if strings.HasSuffix(r.path, "/acquire") {
			return reply{status: 200, body: grantJSON("orders", "A", 7, 1000, nil), delay: 500 * time.Millisecond}
		}
		if strings.HasSuffix(r.path, "/release") {
			return reply{status: 200, body: map[string]any{}}
		}
		return noQuorum
	})
	c := fakeClient(t, Config{NoJWTVerification: true, RetryBudget: 200 * time.Millisecond}, f.URL)
	sent := time.Now()
	l, err := c.Acquire(context.Background(), "orders", "A", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if left := time.Until(l.Deadline()); left > 450*time.Millisecond {
		t.Fatalf("%v left after a 0.5 s answer to a 1 s lease", left)
	}
	if d := l.Deadline().Sub(sent); d < 890*time.Millisecond || d > 1000*time.Millisecond {
		t.Fatalf("deadline at send + %v, want send + 900ms", d)
	}
}

func TestAGrantAnsweredTooLateIsAskedForAgain(t *testing.T) {
	// The first answer comes after the grant's safe deadline (counted from
	// the send time) has passed: the acquire asks again with the same
	// secret, and the lease it returns has its deadline ahead.
	var calls atomic.Int32
	f := newFake(t, func(r request) reply {
		if strings.HasSuffix(r.path, "/acquire") {
			delay := time.Duration(0)
			if calls.Add(1) == 1 {
				delay = 1100 * time.Millisecond
			}
			return reply{status: 200, body: grantJSON("orders", "A", 7, 1000, nil), delay: delay}
		}
		return reply{status: 200, body: grantJSON("orders", "A", 7, 1000, nil)}
	})
	l, err := fakeClient(t, noJWT(), f.URL).Acquire(context.Background(), "orders", "A", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	reqs := f.all()
	if len(reqs) < 2 || reqs[0].json(t)["secret"] != reqs[1].json(t)["secret"] {
		t.Fatalf("requests %v: want a second acquire with the same secret", fmtPaths(f))
	}
	if left := time.Until(l.Deadline()); left < 400*time.Millisecond {
		t.Fatalf("only %v left", left)
	}
}

func TestRenewalsFollowTheTTLTheLeaderAnswers(t *testing.T) {
	// Asked for 0.9 s, the renewal answers 3 s (a longer grant): the
	// deadline moves to about send + 2.7 s.
	f := newFake(t, func(r request) reply {
		switch {
		case strings.HasSuffix(r.path, "/acquire"):
			return reply{status: 200, body: grantJSON("orders", "A", 7, 900, nil)}
		case strings.HasSuffix(r.path, "/renew"):
			return reply{status: 200, body: grantJSON("orders", "A", 7, 3000, nil)}
		}
		return reply{status: 200, body: map[string]any{"lease": "orders", "released": true, "token": 7}}
	})
	l, err := fakeClient(t, noJWT(), f.URL).Acquire(context.Background(), "orders", "A", 900*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 100 && !strings.Contains(fmtPaths(f), "/renew"); i++ {
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	if left := time.Until(l.Deadline()); left < 1500*time.Millisecond || left > 2700*time.Millisecond || !l.IsHeld() {
		t.Fatalf("%v left (held %v), want 1.5..2.7 s", left, l.IsHeld())
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	last := f.all()[f.count()-1]
	if last.path != "/v1/leases/orders/release" || last.json(t)["grant_index"] != float64(7) {
		t.Fatalf("last request %s %s", last.path, last.body)
	}
}

func TestAReleaseRefusedForAnOlderGrantIndexIsMadeBySecret(t *testing.T) {
	f := newFake(t, func(r request) reply {
		switch {
		case strings.HasSuffix(r.path, "/acquire"), strings.HasSuffix(r.path, "/renew"):
			return reply{status: 200, body: grantJSON("orders", "A", 7, 5000, nil)}
		case strings.HasSuffix(r.path, "/release"):
			if _, named := r.json(t)["grant_index"]; named {
				return reply{status: 409, body: map[string]any{"error": "lost", "message": "a newer acquire"}}
			}
			return reply{status: 200, body: map[string]any{"lease": "orders", "released": true, "token": 7}}
		case r.path == "/v1/leases/orders": // still ours
			return reply{status: 200, body: map[string]any{"lease": "orders", "holder": "A", "token": 7, "ttl_ms": 5000, "transitions": 1, "modify_index": 7}}
		}
		return noQuorum
	})
	l, err := fakeClient(t, noJWT(), f.URL).Acquire(context.Background(), "orders", "A", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	var releases []map[string]any
	for _, r := range f.all() {
		if strings.HasSuffix(r.path, "/release") {
			releases = append(releases, r.json(t))
		}
	}
	if len(releases) != 2 || releases[1]["secret"] != strings.Repeat("s", 64) || releases[1]["token"] != float64(7) {
		t.Fatalf("releases %v", releases)
	}
}

func TestARetriedReleaseOfAGrantAlreadyGoneSucceeds(t *testing.T) {
	// The first release's answer is lost (the connection is cut after the
	// leader released): the retry is told "lost", and the lease shows
	// another holder now. The release is done.
	var releases atomic.Int32
	f := newFake(t, func(r request) reply {
		switch {
		case strings.HasSuffix(r.path, "/acquire"), strings.HasSuffix(r.path, "/renew"):
			return reply{status: 200, body: grantJSON("orders", "A", 7, 5000, nil)}
		case strings.HasSuffix(r.path, "/release"):
			if releases.Add(1) == 1 {
				return reply{cut: true}
			}
			return reply{status: 409, body: map[string]any{"error": "lost", "message": "A does not hold orders"}}
		case r.path == "/v1/leases/orders":
			return reply{status: 200, body: map[string]any{"lease": "orders", "holder": "B", "token": 9, "ttl_ms": 5000, "transitions": 2, "modify_index": 9}}
		}
		return noQuorum
	})
	l, err := fakeClient(t, noJWT(), f.URL).Acquire(context.Background(), "orders", "A", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(context.Background()); err != nil {
		t.Fatalf("release: %v", err)
	}
	if releases.Load() != 2 {
		t.Fatalf("%d release requests: %v", releases.Load(), fmtPaths(f))
	}
}

func TestWritesAfterTheDeadlineAreRefusedLocally(t *testing.T) {
	election := newFake(t, func(r request) reply {
		switch {
		case strings.HasSuffix(r.path, "/acquire"):
			return reply{status: 200, body: grantJSON("orders", "A", 7, 600, nil)}
		case strings.HasSuffix(r.path, "/release"):
			return reply{status: 409, body: map[string]any{"error": "lost", "message": "expired"}}
		}
		return noQuorum // renewals never succeed
	})
	gateway := newFake(t, scripted(reply{status: 200, body: map[string]any{"key": "orders/x", "version": 1, "token": 7}}))
	c := fakeClient(t, Config{NoJWTVerification: true, NoFenceOnAcquire: true, Gateway: gateway.URL, RetryBudget: 200 * time.Millisecond}, election.URL)
	l, err := c.Acquire(context.Background(), "orders", "A", 600*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := l.Context(context.Background())
	defer cancel()
	if res, err := l.Put(context.Background(), "orders/x", []byte("1")); err != nil || res.Version != 1 || res.Token != 7 {
		t.Fatalf("put: %+v %v", res, err)
	}
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done was not closed at the deadline")
	}
	if lostAt := time.Now(); lostAt.Before(l.Deadline()) {
		t.Fatalf("lost %v before the deadline", l.Deadline().Sub(lostAt))
	}
	if l.IsHeld() || !errors.Is(l.Err(), ErrLeaseLost) || !strings.Contains(l.Err().Error(), "deadline") {
		t.Fatalf("held %v, err %v", l.IsHeld(), l.Err())
	}
	if _, err := l.JWT(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("JWT after the deadline: %v", err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("the lease context was not cancelled")
	}
	if !errors.Is(ctx.Err(), context.Canceled) || LeaseFromContext(ctx) != l {
		t.Fatalf("ctx.Err() = %v", ctx.Err())
	}
	if _, err := l.Put(context.Background(), "orders/x", []byte("2")); !errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrFenced) {
		t.Fatalf("late put: %v", err)
	}
	if gateway.count() != 1 {
		t.Fatalf("%d gateway requests: the late write was sent", gateway.count())
	}
	if err := l.Release(context.Background()); err != nil { // not held any more: a 409 lost is no error
		t.Fatal(err)
	}
}

func TestAStaleTokenAnswerMarksTheLeaseLost(t *testing.T) {
	election := newFake(t, func(r request) reply {
		if strings.HasSuffix(r.path, "/acquire") || strings.HasSuffix(r.path, "/renew") {
			return reply{status: 200, body: grantJSON("orders", "A", 7, 5000, nil)}
		}
		return reply{status: 200, body: map[string]any{}}
	})
	stale := map[string]any{"error": "stale_token", "token": 7, "fence": 9, "message": "token 7 is below 9"}
	gateway := newFake(t, scripted(reply{status: 409, body: stale}))
	c := fakeClient(t, Config{NoJWTVerification: true, NoFenceOnAcquire: true, Gateway: gateway.URL}, election.URL)
	l, err := c.Acquire(context.Background(), "orders", "A", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Put(context.Background(), "orders/x", []byte("late"))
	var fenced *FencedError
	if !errors.As(err, &fenced) || fenced.Token != 7 || fenced.Fence != 9 || !errors.Is(err, ErrFenced) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("err = %#v, want a FencedError 7/9 that is ErrLeaseLost", err)
	}
	select {
	case <-l.Done():
	default:
		t.Fatal("Done not closed after a fenced write")
	}
	if l.IsHeld() {
		t.Fatal("held after a fenced write")
	}
	if _, err := l.Delete(context.Background(), "orders/x"); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("later write: %v", err)
	}
	if gateway.count() != 1 {
		t.Fatalf("%d gateway requests, want 1", gateway.count())
	}
	_ = l.Release(context.Background())
}

func TestAPreemptedRenewalIsLostAndReleasedAtOnce(t *testing.T) {
	released := make(chan time.Time, 1)
	election := newFake(t, func(r request) reply {
		switch {
		case strings.HasSuffix(r.path, "/acquire"):
			return reply{status: 200, body: grantJSON("orders", "A", 7, 900, nil)}
		case strings.HasSuffix(r.path, "/renew"):
			return reply{status: 409, body: map[string]any{"error": "preempted", "message": "preempted by big"}}
		case strings.HasSuffix(r.path, "/release"):
			select {
			case released <- time.Now():
			default:
			}
			return reply{status: 200, body: map[string]any{"lease": "orders", "released": true, "token": 7}}
		}
		return noQuorum
	})
	l, err := fakeClient(t, noJWT(), election.URL).Acquire(context.Background(), "orders", "A", 900*time.Millisecond, WithPreemptible())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("not lost after a preempted renewal")
	}
	lostAt := time.Now()
	if !errors.Is(l.Err(), ErrPreempted) || !errors.Is(l.Err(), ErrLeaseLost) {
		t.Fatalf("Err() = %v", l.Err())
	}
	select {
	case at := <-released:
		if at.After(l.Deadline()) {
			t.Fatalf("released %v after the deadline", at.Sub(l.Deadline()))
		}
	case <-time.After(2 * time.Second):
		t.Fatal("a preempted lease was not released")
	}
	if lostAt.After(l.Deadline()) {
		t.Fatal("lost at the deadline, not at the preemption")
	}
	if _, err := l.Put(context.Background(), "orders/x", nil); !errors.Is(err, ErrPreempted) {
		t.Fatalf("put after preemption: %v", err)
	}
}

func TestFenceOnAcquire(t *testing.T) {
	s := newSigner("k1")
	election := newFake(t, func(r request) reply {
		switch {
		case r.path == "/v1/jwks":
			return reply{status: 200, body: s.jwks()}
		case strings.HasSuffix(r.path, "/acquire"):
			return reply{status: 200, body: grantJSON("orders", "A", 7, 5000, s)}
		}
		return reply{status: 200, body: map[string]any{"lease": "orders", "released": true, "token": 7}}
	})
	gateway := newFake(t, scripted(reply{status: 200, body: map[string]any{"lease": "orders", "fence": 7}}))
	c := fakeClient(t, Config{Gateway: gateway.URL}, election.URL)
	l, err := c.Acquire(context.Background(), "orders", "A", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	reqs := gateway.all()
	jwt, _ := l.JWT()
	if len(reqs) != 1 || reqs[0].method != "POST" || reqs[0].path != "/v1/fences/orders" ||
		reqs[0].header.Get("authorization") != "Bearer "+jwt {
		t.Fatalf("gateway requests %v", fmtPaths(gateway))
	}

	// A fence refused: the acquire fails and the grant is given back.
	stale := map[string]any{"error": "stale_token", "token": 7, "fence": 9}
	refusing := newFake(t, scripted(reply{status: 409, body: stale}))
	c2 := fakeClient(t, Config{Gateway: refusing.URL}, election.URL)
	before := election.count()
	if _, err := c2.Acquire(context.Background(), "orders", "A", 5*time.Second); !errors.Is(err, ErrFenced) {
		t.Fatalf("err = %v", err)
	}
	for i := 0; i < 100 && !strings.Contains(fmt.Sprint(election.paths()[before:]), "release"); i++ {
		time.Sleep(10 * time.Millisecond)
	}
	if !strings.Contains(fmt.Sprint(election.paths()[before:]), "/v1/leases/orders/release") {
		t.Fatalf("not released after a refused fence: %v", election.paths()[before:])
	}
}

func TestJWTsAreVerifiedAgainstTheJWKS(t *testing.T) {
	s := newSigner("k1")
	rotated := newSigner("k2")
	var jwksFetches atomic.Int32
	var jwt atomic.Value
	jwks := atomic.Value{}
	jwks.Store(s.jwks())
	election := newFake(t, func(r request) reply {
		switch {
		case r.path == "/v1/jwks":
			jwksFetches.Add(1)
			return reply{status: 200, body: jwks.Load()}
		case strings.HasSuffix(r.path, "/acquire"):
			g := grantJSON("orders", "A", 7, 5000, s)
			g["jwt"] = jwt.Load().(string)
			return reply{status: 200, body: g}
		}
		return reply{status: 200, body: map[string]any{"lease": "orders", "released": true, "token": 7}}
	})
	c := fakeClient(t, Config{}, election.URL)
	ctx := context.Background()
	acquire := func(token string) error {
		jwt.Store(token)
		_, err := c.AcquireGrant(ctx, "orders", "A", 5*time.Second)
		return err
	}
	if err := acquire(s.jwt("orders", "A", 7)); err != nil {
		t.Fatalf("a good JWT: %v", err)
	}
	if err := acquire(s.jwt("orders", "A", 7)); err != nil || jwksFetches.Load() != 1 {
		t.Fatalf("err %v; %d JWKS fetches, want 1 (cached)", err, jwksFetches.Load())
	}
	now := time.Now().Unix()
	claims := map[string]any{"iss": "palisade", "sub": "A", "lease": "orders", "token": 7, "iat": now, "exp": now + 10}
	other := newSigner("k1") // same kid, another key: a forged signature
	for name, token := range map[string]string{
		"forged signature": other.jwt("orders", "A", 7),
		"alg none":         s.sign(map[string]any{"alg": "none", "kid": "k1"}, claims),
		"HS256":            s.sign(map[string]any{"alg": "HS256", "kid": "k1"}, claims),
		"no kid":           s.sign(map[string]any{"alg": "EdDSA"}, claims),
		"other token":      s.jwt("orders", "A", 8),
		"other holder":     s.jwt("orders", "B", 7),
		"other lease":      s.jwt("billing", "A", 7),
		"other issuer": s.sign(map[string]any{"alg": "EdDSA", "kid": "k1"},
			map[string]any{"iss": "x", "sub": "A", "lease": "orders", "token": 7, "exp": now + 10}),
		"no exp": s.sign(map[string]any{"alg": "EdDSA", "kid": "k1"},
			map[string]any{"iss": "palisade", "sub": "A", "lease": "orders", "token": 7}),
		"garbage": "a.b",
	} {
		before := election.count()
		err := acquire(token)
		if !errors.Is(err, ErrProtocol) {
			t.Fatalf("%s: err = %v, want ErrProtocol", name, err)
		}
		for i := 0; i < 100 && !strings.Contains(fmt.Sprint(election.paths()[before:]), "release"); i++ {
			time.Sleep(5 * time.Millisecond)
		}
		if !strings.Contains(fmt.Sprint(election.paths()[before:]), "/release") {
			t.Fatalf("%s: the unverified grant was not given back", name)
		}
	}

	// A kid the JWKS never shows: fetched again every 100 ms at most, for
	// about a second, then refused.
	fetches := jwksFetches.Load()
	started := time.Now()
	if err := acquire(rotated.jwt("orders", "A", 7)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a key the JWKS lacks: %v", err)
	}
	elapsed, got := time.Since(started), jwksFetches.Load()-fetches
	if elapsed < 800*time.Millisecond || elapsed > 2*time.Second || got < 2 || got > 11 {
		t.Fatalf("refused after %v and %d fetches; want about 1 s, fetches 100 ms apart", elapsed, got)
	}
	// A key published a moment after the grant (a rotation, a fresh
	// cluster) is waited for, not refused.
	go func() {
		time.Sleep(300 * time.Millisecond)
		jwks.Store(map[string]any{"keys": append(s.jwks()["keys"].([]any), rotated.jwks()["keys"].([]any)...)})
	}()
	if err := acquire(rotated.jwt("orders", "A", 7)); err != nil {
		t.Fatalf("the rotated key published 300 ms later: %v", err)
	}
	// A retired key stops being trusted after the next fetch.
	jwks.Store(rotated.jwks())
	if err := acquire(newSigner("k3").jwt("orders", "A", 7)); !errors.Is(err, ErrProtocol) { // forces fetches
		t.Fatalf("unknown k3: %v", err)
	}
	if err := acquire(s.jwt("orders", "A", 7)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a retired key was trusted: %v", err)
	}
}

func TestAJWKSWithoutTheKeyIsAskedOfTheOtherNodes(t *testing.T) {
	// The node the client prefers has not applied the key yet (a lagging
	// follower); another has.
	s := newSigner("k1")
	lagging := newFake(t, func(r request) reply {
		switch {
		case r.path == "/v1/jwks":
			return reply{status: 200, body: map[string]any{"keys": []any{}}}
		case strings.HasSuffix(r.path, "/acquire"):
			return reply{status: 200, body: grantJSON("orders", "A", 7, 5000, s)}
		}
		return reply{status: 200, body: map[string]any{}}
	})
	current := newFake(t, scripted(reply{status: 200, body: s.jwks()}))
	c := fakeClient(t, Config{}, lagging.URL, current.URL)
	started := time.Now()
	if _, err := c.AcquireGrant(context.Background(), "orders", "A", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if elapsed := time.Since(started); elapsed > 500*time.Millisecond || current.count() != 1 {
		t.Fatalf("took %v, %d requests to the node with the key", elapsed, current.count())
	}
}

func TestBatchedRenewalsAreAnsweredOneByOne(t *testing.T) {
	s := newSigner("k1")
	f := newFake(t, func(r request) reply {
		if r.path == "/v1/jwks" {
			return reply{status: 200, body: s.jwks()}
		}
		return reply{status: 200, body: map[string]any{"results": []any{
			map[string]any{"lease": "a", "status": 200, "grant": grantJSON("a", "H", 3, 2000, s)},
			map[string]any{"lease": "b", "status": 409, "error": "lost", "message": "gone"},
			map[string]any{"lease": "c", "status": 403, "error": "forbidden", "message": "not yours"},
			map[string]any{"lease": "d", "status": 409, "error": "preempted", "message": "by big"},
		}}}
	})
	c := fakeClient(t, Config{}, f.URL)
	until := time.Now().Add(5 * time.Second)
	var batch []*pendingRenewal
	for _, name := range []string{"a", "b", "c", "d"} {
		id := GrantID{Lease: name, Holder: "H", Token: 3, Secret: strings.Repeat("s", 64)}
		batch = append(batch, &pendingRenewal{id: id, until: until, entry: batchEntry(id), reply: make(chan renewResult, 1)})
	}
	c.t.sendBatch(batch)
	results := make([]renewResult, len(batch))
	for i, p := range batch {
		results[i] = <-p.reply
	}
	if results[0].err != nil || results[0].grant.Token != 3 {
		t.Fatalf("a: %+v", results[0])
	}
	if !errors.Is(results[1].err, ErrLeaseLost) || !errors.Is(results[2].err, ErrForbidden) || !errors.Is(results[3].err, ErrPreempted) {
		t.Fatalf("b, c, d: %v / %v / %v", results[1].err, results[2].err, results[3].err)
	}
	var renewReq request
	for _, r := range f.all() {
		if r.path == "/v1/renew" {
			renewReq = r
		}
	}
	entries := renewReq.json(t)["renewals"].([]any)
	if len(entries) != 4 {
		t.Fatalf("batch body %s", renewReq.body)
	}
	first := entries[0].(map[string]any)
	if first["lease"] != "a" || first["holder"] != "H" || first["token"] != float64(3) || first["secret"] != strings.Repeat("s", 64) {
		t.Fatalf("entry %v", first)
	}
}

func TestRenewalsThatFallDueTogetherShareARequest(t *testing.T) {
	// Every request takes 300 ms: with 4 out at once, the leases' renewals
	// queue up and go in batches.
	const leases = 12
	f := newFake(t, func(r request) reply {
		switch {
		case strings.HasSuffix(r.path, "/acquire"):
			doc := r.json(t)
			return reply{status: 200, body: grantJSON(strings.Split(r.path, "/")[3], doc["holder"].(string), 5, 3000, nil)}
		case strings.HasSuffix(r.path, "/renew") && strings.HasPrefix(r.path, "/v1/leases/"):
			return reply{status: 200, body: grantJSON(strings.Split(r.path, "/")[3], "H", 5, 3000, nil), delay: 300 * time.Millisecond}
		case r.path == "/v1/renew":
			var results []any
			for _, e := range r.json(t)["renewals"].([]any) {
				lease := e.(map[string]any)["lease"].(string)
				results = append(results, map[string]any{"lease": lease, "status": 200, "grant": grantJSON(lease, "H", 5, 3000, nil)})
			}
			return reply{status: 200, body: map[string]any{"results": results}, delay: 300 * time.Millisecond}
		}
		return reply{status: 200, body: map[string]any{}}
	})
	c := fakeClient(t, noJWT(), f.URL)
	var held []*Lease
	for i := 0; i < leases; i++ {
		l, err := c.Acquire(context.Background(), "l"+string(rune('a'+i)), "H", 3*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l)
	}
	time.Sleep(2500 * time.Millisecond)
	batches := 0
	for _, r := range f.all() {
		if r.path == "/v1/renew" {
			batches++
		}
	}
	for _, l := range held {
		if !l.IsHeld() {
			t.Fatalf("%s lost: %v", l.Name(), l.Err())
		}
	}
	if batches == 0 {
		t.Fatalf("no batch request: %v", fmtPaths(f))
	}
}

func TestConfigFromEnv(t *testing.T) {
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "admin.key")
	if err := os.WriteFile(keyFile, []byte("pal_fromfile\nsecond line\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PALISADE_ELECTION", " http://a:1 , http://b:2,, ")
	t.Setenv("PALISADE_GATEWAY", "http://gw:3")
	t.Setenv("PALISADE_CA", "")
	t.Setenv("PALISADE_API_KEY", "")
	t.Setenv("PALISADE_API_KEY_FILE", keyFile)
	cfg, err := ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(cfg.Election, ",") != "http://a:1,http://b:2" || cfg.Gateway != "http://gw:3" || cfg.APIKey != "pal_fromfile" {
		t.Fatalf("config %+v (key %q)", cfg, cfg.APIKey)
	}
	t.Setenv("PALISADE_API_KEY", "pal_direct")
	if cfg, _ := ConfigFromEnv(); cfg.APIKey != "pal_direct" {
		t.Fatalf("PALISADE_API_KEY does not win: %q", cfg.APIKey)
	}
	t.Setenv("PALISADE_ELECTION", "")
	t.Setenv("PALISADE_GATEWAY", "")
	if cfg, _ := ConfigFromEnv(); strings.Join(cfg.Election, ",") != DefaultElection || cfg.Gateway != DefaultGateway {
		t.Fatalf("defaults: %+v", cfg)
	}
	t.Setenv("PALISADE_CA", filepath.Join(dir, "missing.pem"))
	if _, err := ConfigFromEnv(); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "missing.pem") {
		t.Fatalf("a missing CA file: %v", err)
	}
	t.Setenv("PALISADE_CA", keyFile)
	if _, err := ConfigFromEnv(); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a CA file without a certificate: %v", err)
	}
	t.Setenv("PALISADE_CA", "")
	t.Setenv("PALISADE_API_KEY", "")
	t.Setenv("PALISADE_API_KEY_FILE", filepath.Join(dir, "nope.key"))
	if _, err := ConfigFromEnv(); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a missing key file: %v", err)
	}
	if _, err := NewClient(Config{Election: []string{"ftp://x"}}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("an ftp:// endpoint: %v", err)
	}
	if _, err := NewClient(Config{}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("no endpoints: %v", err)
	}
}

func TestEncodeKey(t *testing.T) {
	for in, want := range map[string]string{
		"orders/state":    "orders/state",
		"orders/a b/c?d":  "orders/a%20b/c%3Fd",
		"orders/ü/x~y._-": "orders/%C3%BC/x~y._-",
		"orders/%2F":      "orders/%252F",
	} {
		if got := EncodeKey(in); got != want {
			t.Fatalf("EncodeKey(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestErrorsMatchTheirSentinels(t *testing.T) {
	cases := []struct {
		err  error
		is   []error
		isnt []error
	}{
		{&FencedError{Token: 1, Fence: 2}, []error{ErrFenced, ErrLeaseLost}, []error{ErrPreempted, ErrHeld}},
		{&PreemptedError{}, []error{ErrPreempted, ErrLeaseLost}, []error{ErrFenced}},
		{&LeaseLostError{}, []error{ErrLeaseLost}, []error{ErrFenced, ErrPreempted}},
		{&HeldError{}, []error{ErrHeld}, []error{ErrLeaseLost}},
		{&UnavailableError{Err: context.Canceled}, []error{ErrUnavailable, context.Canceled}, []error{ErrLeaseLost}},
		{&RequestError{Status: 401}, []error{ErrUnauthorized}, []error{ErrForbidden, ErrBadRequest}},
		{&LockDelayError{}, []error{ErrLockDelay}, []error{ErrHeld}},
		{fmt.Errorf("wrapped: %w", &FencedError{}), []error{ErrFenced, ErrLeaseLost}, nil},
	}
	for _, tc := range cases {
		for _, target := range tc.is {
			if !errors.Is(tc.err, target) {
				t.Errorf("%v is not %v", tc.err, target)
			}
		}
		for _, target := range tc.isnt {
			if errors.Is(tc.err, target) {
				t.Errorf("%v is %v", tc.err, target)
			}
		}
	}
}
