package palisade

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// Hedged renewals against scripted fakes: an attempt gets its slice of the
// time left, then the next node is asked too; a 409 is final; Retry-After
// is honoured within the lease's time; a leader named by a follower is
// asked first once the client knows which endpoint it is.

func renewalID() GrantID {
	index := uint64(7)
	return GrantID{Lease: "orders", Holder: "A", Token: 7, GrantIndex: &index, Secret: strings.Repeat("s", 64)}
}

// renewWithin renews with a deadline left from now; the error and how long
// it took.
func renewWithin(c *Client, left time.Duration) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), left)
	defer cancel()
	started := time.Now()
	_, err := c.RenewGrant(ctx, renewalID())
	return time.Since(started), err
}

func renewPaths(f *fakeServer) int {
	n := 0
	for _, r := range f.all() {
		if strings.HasSuffix(r.path, "/renew") {
			n++
		}
	}
	return n
}

func TestARenewalStuckOnAHungNodeGoesToTheNextWithinItsSlice(t *testing.T) {
	grant := reply{status: 200, body: grantJSON("orders", "A", 7, 3000, nil)}
	hung := grant
	hung.delay = 5 * time.Second
	h := newFake(t, scripted(hung))
	g := newFake(t, scripted(grant))
	// The default request timeout (2 s) is longer than the 1.5 s left.
	c := fakeClient(t, noJWT(), h.URL, g.URL)
	took, err := renewWithin(c, 1500*time.Millisecond)
	if err != nil {
		t.Fatalf("renewal: %v (after %v)", err, took)
	}
	if h.count() != 1 || g.count() != 1 {
		t.Fatalf("hung %d, good %d requests", h.count(), g.count())
	}
	// The hung node is tried last now: the next renewal goes to the other.
	if _, err := renewWithin(c, 1500*time.Millisecond); err != nil || h.count() != 1 || g.count() != 2 {
		t.Fatalf("second renewal: %v; hung %d, good %d requests", err, h.count(), g.count())
	}
	t.Logf("answered by the second node after %v", took)
}

func TestA409LostIsFinalEvenWhenHedged(t *testing.T) {
	hung := reply{status: 200, body: grantJSON("orders", "A", 7, 3000, nil), delay: 5 * time.Second}
	h := newFake(t, scripted(hung))
	l := newFake(t, scripted(reply{status: 409, body: map[string]any{"error": "lost", "message": "no such grant"}}))
	c := fakeClient(t, noJWT(), h.URL, l.URL)
	if _, err := renewWithin(c, 1500*time.Millisecond); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("err = %v, want ErrLeaseLost", err)
	}
	time.Sleep(300 * time.Millisecond)
	if h.count() != 1 || l.count() != 1 {
		t.Fatalf("hung %d, lost %d requests: a 409 must end the renewal", h.count(), l.count())
	}
}

func TestRetryAfterOnARenewalIsHonouredWithinTheLeaseBudget(t *testing.T) {
	busy := reply{status: 503, body: map[string]any{"error": "no_quorum"}, header: map[string]string{"Retry-After": "30"}}
	f := newFake(t, scripted(busy, reply{status: 200, body: grantJSON("orders", "A", 7, 3000, nil)}))
	c := fakeClient(t, noJWT(), f.URL)
	// 30 s asked, 1.5 s left: asked again within the lease's time.
	took, err := renewWithin(c, 1500*time.Millisecond)
	if err != nil || f.count() != 2 {
		t.Fatalf("renewal: %v after %v, %d requests", err, took, f.count())
	}
	reqs := f.all()
	if gap := reqs[1].at.Sub(reqs[0].at); gap < 100*time.Millisecond {
		t.Fatalf("asked again %v after a Retry-After: want a pause", gap)
	}
}

func TestTheLeaderAFollowerNamesIsAskedFirst(t *testing.T) {
	node := func(id int, forwarded bool) *fakeServer {
		return newFake(t, func(r request) reply {
			if r.path == "/v1/cluster" {
				return reply{status: 200, body: map[string]any{"node_id": id, "leader": 2}}
			}
			rep := reply{status: 200, body: grantJSON("orders", "A", 7, 3000, nil)}
			if forwarded {
				rep.header = map[string]string{"x-palisade-leader": "2"}
			}
			return rep
		})
	}
	f, x, l := node(1, true), node(3, true), node(2, false)
	c := fakeClient(t, noJWT(), f.URL, x.URL, l.URL)
	if _, err := renewWithin(c, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	// The answer named node 2; the client asks the nodes who they are.
	for end := time.Now().Add(5 * time.Second); c.t.preferred.Load()%3 != 2 && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	if c.t.preferred.Load()%3 != 2 {
		t.Fatalf("preferred %d, want the leader's endpoint 2", c.t.preferred.Load()%3)
	}
	if _, err := renewWithin(c, 2*time.Second); err != nil {
		t.Fatal(err)
	}
	if renewPaths(f) != 1 || renewPaths(x) != 0 || renewPaths(l) != 1 {
		t.Fatalf("renewals: follower %d, other follower %d, leader %d", renewPaths(f), renewPaths(x), renewPaths(l))
	}
}
