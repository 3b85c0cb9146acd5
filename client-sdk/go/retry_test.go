package palisade

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Retry rules against a scripted fake server: transport errors, 503 and 429
// are retried (bounded, on the next endpoint, honouring Retry-After); 409,
// 401, 403 and every other 4xx are not.

var noQuorum = reply{status: 503, body: map[string]any{"error": "no_quorum", "message": "no quorum"}}

func TestA503IsRetriedUntilAnAnswer(t *testing.T) {
	f := newFake(t, scripted(noQuorum, noQuorum, reply{status: 200, body: map[string]any{"leader": 1}}))
	doc, err := fakeClient(t, noJWT(), f.URL).Cluster(context.Background())
	if err != nil || doc["leader"] != float64(1) {
		t.Fatalf("cluster: %v %v", doc, err)
	}
	if f.count() != 3 {
		t.Fatalf("%d requests, want 3", f.count())
	}
}

func TestA429IsRetriedAfterItsRetryAfter(t *testing.T) {
	busy := reply{status: 429, body: map[string]any{"error": "too_many_waiters"}, header: map[string]string{"Retry-After": "1"}}
	f := newFake(t, scripted(busy, reply{status: 200, body: map[string]any{"leader": 2}}))
	doc, err := fakeClient(t, noJWT(), f.URL).Cluster(context.Background())
	if err != nil || doc["leader"] != float64(2) {
		t.Fatalf("cluster: %v %v", doc, err)
	}
	reqs := f.all()
	if len(reqs) != 2 {
		t.Fatalf("%d requests, want 2", len(reqs))
	}
	if gap := reqs[1].at.Sub(reqs[0].at); gap < 950*time.Millisecond {
		t.Fatalf("retried %v after a Retry-After of 1 s", gap)
	}
}

func TestRetryAfterKeepsTheClientOffThatEndpointOnly(t *testing.T) {
	busy := reply{status: 503, body: map[string]any{"error": "overloaded"}, header: map[string]string{"Retry-After": "1"}}
	a := newFake(t, scripted(busy))
	b := newFake(t, scripted(reply{status: 200, body: map[string]any{"leader": 3}}))
	c := fakeClient(t, noJWT(), a.URL, b.URL)
	started := time.Now()
	for i := 0; i < 2; i++ {
		if _, err := c.Cluster(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if elapsed := time.Since(started); elapsed > 500*time.Millisecond {
		t.Fatalf("took %v: the other endpoint should be tried at once", elapsed)
	}
	if a.count() != 1 || b.count() != 2 {
		t.Fatalf("requests: a %d (want 1), b %d (want 2)", a.count(), b.count())
	}
}

func TestARetryAfterBeyondTheBudgetEndsTheCall(t *testing.T) {
	busy := reply{status: 503, body: map[string]any{"error": "no_quorum"}, header: map[string]string{"Retry-After": "30"}}
	f := newFake(t, scripted(busy))
	started := time.Now()
	_, err := fakeClient(t, Config{NoJWTVerification: true, RetryBudget: time.Second}, f.URL).Cluster(context.Background())
	var unavailable *UnavailableError
	if !errors.As(err, &unavailable) || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	if elapsed := time.Since(started); elapsed > 500*time.Millisecond || f.count() != 1 {
		t.Fatalf("%d requests over %v; want 1 and no wait", f.count(), elapsed)
	}
}

func TestAcquireRetriesA503WithTheSameSecret(t *testing.T) {
	f := newFake(t, scripted(noQuorum, reply{status: 200, body: grantJSON("orders", "A", 7, 5000, nil)}))
	g, err := fakeClient(t, noJWT(), f.URL).AcquireGrant(context.Background(), "orders", "A", 5*time.Second)
	if err != nil || g.Token != 7 {
		t.Fatalf("grant %v, err %v", g, err)
	}
	reqs := f.all()
	if len(reqs) != 2 {
		t.Fatalf("%d requests", len(reqs))
	}
	s0, s1 := reqs[0].json(t)["secret"], reqs[1].json(t)["secret"]
	if s0 != s1 || len(s0.(string)) != 64 {
		t.Fatalf("secrets %v %v: want one 64-hex secret", s0, s1)
	}
}

func TestA409IsNotRetried(t *testing.T) {
	f := newFake(t, scripted(reply{status: 409, body: map[string]any{"error": "held", "holder": "B", "token": 9, "message": "held"}}))
	_, err := fakeClient(t, noJWT(), f.URL).AcquireGrant(context.Background(), "orders", "A", 5*time.Second)
	var held *HeldError
	if !errors.As(err, &held) || !errors.Is(err, ErrHeld) || held.Holder != "B" || held.Token != 9 {
		t.Fatalf("err = %#v, want HeldError B/9", err)
	}
	if errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("%v matches the wrong sentinels", err)
	}
	if f.count() != 1 {
		t.Fatalf("%d requests, want 1", f.count())
	}
}

func TestA409LostOnRenewIsLeaseLostAndNotRetried(t *testing.T) {
	f := newFake(t, scripted(reply{status: 409, body: map[string]any{"error": "lost", "message": "no such grant"}}))
	index := uint64(7)
	id := GrantID{Lease: "orders", Holder: "A", Token: 7, GrantIndex: &index, Secret: strings.Repeat("s", 64)}
	_, err := fakeClient(t, noJWT(), f.URL).RenewGrant(context.Background(), id)
	if !errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrFenced) {
		t.Fatalf("err = %v, want ErrLeaseLost", err)
	}
	reqs := f.all()
	if len(reqs) != 1 || reqs[0].path != "/v1/leases/orders/renew" {
		t.Fatalf("requests %v", fmtPaths(f))
	}
	body := reqs[0].json(t)
	if len(body) != 3 || body["holder"] != "A" || body["token"] != float64(7) || body["secret"] != id.Secret {
		t.Fatalf("renew body %v", body)
	}
}

func TestOtherErrorsAreNotRetried(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   error
	}{
		{400, ErrBadRequest}, {401, ErrUnauthorized}, {403, ErrForbidden},
		{404, ErrNotFound}, {413, ErrBadRequest}, {500, ErrProtocol},
		{409, ErrProtocol}, // a 409 with a code this client does not know
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			f := newFake(t, scripted(reply{status: tc.status, body: map[string]any{"error": "x", "message": "nope"}}))
			_, err := fakeClient(t, noJWT(), f.URL).Get(context.Background(), "orders")
			if !errors.Is(err, tc.want) || errors.Is(err, ErrUnavailable) {
				t.Fatalf("err = %v, want %v", err, tc.want)
			}
			if f.count() != 1 {
				t.Fatalf("%d requests, want 1", f.count())
			}
		})
	}
}

func TestRetriesAreBoundedByTheBudget(t *testing.T) {
	f := newFake(t, scripted(noQuorum))
	started := time.Now()
	_, err := fakeClient(t, Config{NoJWTVerification: true, RetryBudget: 600 * time.Millisecond}, f.URL).Cluster(context.Background())
	elapsed := time.Since(started)
	var unavailable *UnavailableError
	if !errors.As(err, &unavailable) {
		t.Fatalf("err = %v", err)
	}
	if elapsed < 200*time.Millisecond || elapsed > 3*time.Second {
		t.Fatalf("gave up after %v", elapsed)
	}
	if unavailable.Attempts != f.count() || f.count() < 3 || !strings.Contains(unavailable.Last, "503") {
		t.Fatalf("%d attempts, %d requests, last %q", unavailable.Attempts, f.count(), unavailable.Last)
	}
}

func TestTheContextEndsTheRetries(t *testing.T) {
	f := newFake(t, scripted(noQuorum))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	started := time.Now()
	_, err := fakeClient(t, Config{NoJWTVerification: true, RetryBudget: 10 * time.Second}, f.URL).Cluster(ctx)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
	if elapsed := time.Since(started); elapsed > time.Second {
		t.Fatalf("took %v past a 300 ms context", elapsed)
	}
}

func TestConnectionRefusedMovesToTheNextEndpoint(t *testing.T) {
	f := newFake(t, scripted(reply{status: 200, body: map[string]any{"leader": 3}}))
	c := fakeClient(t, noJWT(), closedURL(t), f.URL)
	for i := 0; i < 2; i++ { // the endpoint that answered is kept
		if doc, err := c.Cluster(context.Background()); err != nil || doc["leader"] != float64(3) {
			t.Fatalf("cluster: %v %v", doc, err)
		}
	}
	if f.count() != 2 {
		t.Fatalf("%d requests, want 2", f.count())
	}
}

func TestAConnectionCutMidCallIsRetried(t *testing.T) {
	f := newFake(t, scripted(reply{cut: true}, reply{status: 200, body: map[string]any{"leader": 1}}))
	if _, err := fakeClient(t, noJWT(), f.URL).Cluster(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.count() != 2 {
		t.Fatalf("%d requests, want 2", f.count())
	}
}

func TestAHungNodeCostsOneRequestTimeout(t *testing.T) {
	hung := newFake(t, scripted(reply{status: 200, body: map[string]any{"leader": 9}, delay: 3 * time.Second}))
	good := newFake(t, scripted(reply{status: 200, body: map[string]any{"leader": 1}}))
	started := time.Now()
	doc, err := fakeClient(t, Config{NoJWTVerification: true, RequestTimeout: 300 * time.Millisecond}, hung.URL, good.URL).Cluster(context.Background())
	if err != nil || doc["leader"] != float64(1) {
		t.Fatalf("cluster: %v %v", doc, err)
	}
	if elapsed := time.Since(started); elapsed > 2*time.Second {
		t.Fatalf("took %v", elapsed)
	}
}

func TestAForwardedAnswerMovesToTheNextEndpoint(t *testing.T) {
	follower := newFake(t, scripted(reply{status: 200, body: map[string]any{"leader": 2}, header: map[string]string{"x-palisade-leader": "2"}}))
	leader := newFake(t, scripted(reply{status: 200, body: map[string]any{"leader": 2}}))
	c := fakeClient(t, noJWT(), follower.URL, leader.URL)
	for i := 0; i < 3; i++ {
		if _, err := c.Cluster(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if follower.count() != 1 || leader.count() != 2 {
		t.Fatalf("follower %d, leader %d requests", follower.count(), leader.count())
	}
}

func TestTheAPIKeyIsSentOnEveryRequest(t *testing.T) {
	election := newFake(t, scripted(reply{status: 200, body: grantJSON("orders", "A", 7, 5000, nil)}))
	gateway := newFake(t, scripted(reply{status: 200, body: map[string]any{"lease": "orders", "fence": 7}}))
	c := fakeClient(t, Config{NoJWTVerification: true, APIKey: " pal_abc\n", Gateway: gateway.URL}, election.URL)
	l, err := c.Acquire(context.Background(), "orders", "A", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	for _, r := range append(election.all(), gateway.all()...) {
		if got := r.header.Get("x-palisade-key"); got != "pal_abc" {
			t.Fatalf("%s %s carried key %q", r.method, r.path, got)
		}
	}
	if s := fmt.Sprintf("%v %+v %#v", c.Config(), c.Config(), c.Config()); strings.Contains(s, "pal_abc") {
		t.Fatalf("the key shows: %s", s)
	}
	if _, err := NewClient(Config{Election: []string{election.URL}, APIKey: "bad key"}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a key with a space: %v", err)
	}
}

func TestGatewayWritesAreSentOnce(t *testing.T) {
	election := newFake(t, scripted(reply{status: 200, body: grantJSON("orders", "A", 7, 5000, nil)}))
	gateway := newFake(t, scripted(reply{status: 503, body: map[string]any{"error": "unavailable"}, header: map[string]string{"Retry-After": "1"}}))
	c := fakeClient(t, Config{NoJWTVerification: true, NoFenceOnAcquire: true, Gateway: gateway.URL}, election.URL)
	l, err := c.Acquire(context.Background(), "orders", "A", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(context.Background())
	if _, err := l.Put(context.Background(), "orders/x", []byte("v")); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("err = %v", err)
	}
	if gateway.count() != 1 || !l.IsHeld() {
		t.Fatalf("%d gateway requests; held %v", gateway.count(), l.IsHeld())
	}
}
