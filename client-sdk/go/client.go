package palisade

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"time"
)

// Client talks to the election cluster (any node; bounded retries) and to a
// storage gateway. It is safe for concurrent use; share one per process and
// Close it at the end.
type Client struct {
	t *transport
}

// NewClient returns a client with cfg. It fails with ErrBadRequest for no
// election endpoints, a URL that is not http:// or https://, an unusable
// API key or CA file, or negative timeouts.
func NewClient(cfg Config) (*Client, error) {
	t, err := newTransport(cfg)
	if err != nil {
		return nil, err
	}
	return &Client{t: t}, nil
}

// NewClientFromEnv is NewClient(ConfigFromEnv()).
func NewClientFromEnv() (*Client, error) {
	cfg, err := ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return NewClient(cfg)
}

// Config is the configuration, with defaults filled in.
func (c *Client) Config() Config { return c.t.cfg }

// Close releases the leases of this client still held (waiting at most a
// request timeout plus the retry budget), stops renewing and closes idle
// connections. Acquire fails afterwards; other calls still work.
func (c *Client) Close() { c.t.close() }

// newSecret is a fresh grant secret: 256 bits from the OS RNG, as 64 hex
// digits.
func newSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("palisade: no randomness for a grant secret: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// Acquire acquires lease for holder with ttl (WithWait to wait for it to be
// free; other options ask for a priority, preemptibility, a lock-delay or a
// max-hold). It raises the gateway fence to the new token first, when a
// gateway is configured (fence-on-acquire), and returns a Lease that renews
// itself in the background until released or lost.
//
// Errors: a *HeldError (ErrHeld) if someone else holds it after the wait;
// a *LockDelayError (ErrLockDelay) if a lock-delay outlasts the wait;
// ErrUnavailable if no quorum answered or ctx ended; ErrBadRequest for a bad
// name, holder, ttl or option (nothing is sent); ErrUnauthorized or
// ErrForbidden under a policy; ErrProtocol for a JWT that does not verify.
func (c *Client) Acquire(ctx context.Context, lease, holder string, ttl time.Duration, opts ...AcquireOption) (*Lease, error) {
	if c.t.isClosed() {
		return nil, badRequest("the client is closed")
	}
	grant, sent, err := c.acquire(ctx, lease, holder, ttl, opts)
	if err != nil {
		return nil, err
	}
	var asked acquireOptions
	for _, opt := range opts {
		opt(&asked)
	}
	l := startLease(c.t, grant, sent, asked.lockDelay > 0)
	if err := l.Err(); err != nil { // closed meanwhile
		c.t.releaseInBackground(l.id)
		return nil, err
	}
	if !c.t.cfg.NoFenceOnAcquire && c.t.cfg.Gateway != "" {
		if _, err := l.Fence(ctx); err != nil {
			// Give the lease back: the caller never saw it.
			l.markLost(&LeaseLostError{Reason: reasonReleased}, true)
			l.mu.Lock()
			l.released = true
			l.mu.Unlock()
			c.t.releaseInBackground(l.id)
			return nil, err
		}
	}
	return l, nil
}

// AcquireGrant is one acquire (with its wait, if any), without a renewing
// handle or a fence: for tools that manage renewals themselves. Errors as
// Acquire.
func (c *Client) AcquireGrant(ctx context.Context, lease, holder string, ttl time.Duration, opts ...AcquireOption) (*Grant, error) {
	grant, _, err := c.acquire(ctx, lease, holder, ttl, opts)
	return grant, err
}

// acquire acquires, waiting up to the wait; the grant and the send time of
// the request that got it (where its safe deadline starts).
func (c *Client) acquire(ctx context.Context, lease, holder string, ttl time.Duration, opts []AcquireOption) (*Grant, time.Time, error) {
	a, err := newAcquireCall(lease, holder, ttl, opts)
	if err != nil {
		return nil, time.Time{}, err
	}
	repeats := 0
	for {
		body := a.body(c.t.cfg.RequestTimeout)
		// Before the first attempt: if a retry is what gets the answer, the
		// grant may date from the first one.
		sent := time.Now()
		ans, err := c.t.electionWithin(ctx, "POST", a.path, body, 0, a.budget(c.t.cfg.RetryBudget))
		if err != nil {
			return nil, time.Time{}, err
		}
		if ans.status != 200 {
			if err := a.waitOut(ctx, ans.err()); err != nil {
				return nil, time.Time{}, err
			}
			continue
		}
		grant, err := c.acceptGrant(ctx, ans, a.secret)
		if err != nil {
			return nil, time.Time{}, err
		}
		// The answer took so long (retries through a failover, a slow
		// node) that the safe deadline counted from the send time has
		// (almost) passed: ask again with the same secret. The leader
		// extends the same grant like a renewal, or, if its own
		// deadline passed meanwhile, grants afresh.
		margin := marginFor(c.t.cfg.DriftMarginRatio, grant.TTL())
		if time.Until(sent.Add(grant.TTL()-2*margin)) <= 0 && repeats < 3 {
			repeats++
			continue
		}
		return grant, sent, nil
	}
}

// acceptGrant parses an acquire's grant and verifies its JWT (a grant that
// does not verify is released).
func (c *Client) acceptGrant(ctx context.Context, ans *answer, secret string) (*Grant, error) {
	grant, err := parseGrant(ans.body)
	if err != nil {
		return nil, err
	}
	if grant.Secret == "" { // a cluster that predates secrets
		grant.Secret = secret
	}
	if err := c.t.verifyGrant(ctx, grant); err != nil {
		c.t.releaseInBackground(grant.ID())
		return nil, err
	}
	return grant, nil
}

// acquireCall is one Acquire: what each of its requests sends, and until
// when it waits.
type acquireCall struct {
	path, holder, secret string
	ttl                  time.Duration
	o                    acquireOptions
	terms                map[string]any
	deadline             time.Time
}

// newAcquireCall checks the arguments (nothing is sent for bad ones) and
// draws the call's secret.
func newAcquireCall(lease, holder string, ttl time.Duration, opts []AcquireOption) (*acquireCall, error) {
	if err := CheckLeaseName(lease); err != nil {
		return nil, err
	}
	if err := checkHolder(holder); err != nil {
		return nil, err
	}
	if ttl < time.Millisecond {
		return nil, badRequest("bad ttl %v", ttl)
	}
	a := &acquireCall{path: "/v1/leases/" + lease + "/acquire", holder: holder, ttl: ttl}
	for _, opt := range opts {
		opt(&a.o)
	}
	terms, err := a.o.body()
	if err != nil {
		return nil, err
	}
	a.terms = terms
	// Our own secret, the same for every request of this call, so that a
	// retry (its answer lost, or a slice that timed out here but was granted
	// there) is recognised as the same client: the same grant.
	if a.secret, err = newSecret(); err != nil {
		return nil, err
	}
	a.deadline = time.Now().Add(a.o.wait)
	return a, nil
}

// body is one request's body. A long wait is asked for in slices of half a
// request timeout, so each request (timeout: a request timeout) stuck on a
// leader that died or froze costs one request timeout, not the whole wait.
func (a *acquireCall) body(requestTimeout time.Duration) map[string]any {
	body := map[string]any{"holder": a.holder, "ttl_ms": millis(a.ttl), "secret": a.secret}
	for k, v := range a.terms {
		body[k] = v
	}
	if a.o.waitSet {
		slice := time.Until(a.deadline)
		if slice < 0 {
			slice = 0
		}
		if half := requestTimeout / 2; slice > half {
			slice = half
		}
		body["wait_ms"] = uint64(slice / time.Millisecond)
	}
	return body
}

// budget is how long one request's transient failures are retried: the
// retry budget, or until the wait ends if that is later: a waiting acquire
// rides out an outage as long as its caller is willing to wait.
func (a *acquireCall) budget(retryBudget time.Duration) time.Duration {
	if left := time.Until(a.deadline); left > retryBudget {
		return left
	}
	return retryBudget
}

// waitOut decides on a refusal: nil to ask again (the lease is held, or
// held back by a lock-delay, and the wait has not ended: a lock-delay is
// slept out here, since the node waits one out only within the slice), or
// the error to return.
func (a *acquireCall) waitOut(ctx context.Context, err error) error {
	var lockDelay *LockDelayError
	switch {
	case errors.Is(err, ErrHeld) && time.Now().Before(a.deadline):
		return nil
	case errors.As(err, &lockDelay) && time.Now().Before(a.deadline):
		wait := lockDelay.RetryAfter
		if left := time.Until(a.deadline); wait > left {
			wait = left
		}
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return &UnavailableError{Attempts: 1, Last: "waiting out a lock-delay", Err: ctx.Err()}
		case <-timer.C:
		}
		return nil
	}
	return err
}

// RenewGrant renews a grant once (a Lease does it by itself); in the next
// batch of this client's renewals. ErrLeaseLost if the grant is gone,
// revoked, or id lacks its secret.
func (c *Client) RenewGrant(ctx context.Context, id GrantID) (*Grant, error) {
	until := time.Now().Add(c.t.cfg.RetryBudget + c.t.cfg.RequestTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(until) {
		until = d
	}
	return c.t.renew(ctx, id, until)
}

// ReleaseGrant releases a grant (id carries the secret and grant index, so
// a late release never frees a newer grant). ErrLeaseLost if id does not
// name the current grant.
func (c *Client) ReleaseGrant(ctx context.Context, id GrantID) error {
	return c.t.releaseGrant(ctx, id)
}

// HandoverGrant hands a grant to successor (Lease.HandoverTo is the way for
// a held lease); the successor's token.
func (c *Client) HandoverGrant(ctx context.Context, id GrantID, successor string) (uint64, error) {
	return c.t.handover(ctx, id, successor)
}

// Revoke ends lease's grant token without its secret (an operator's call):
// renewals stop at once, and the lease is free when the grant's current
// deadline passes, never earlier. ErrLeaseLost if token is not the current
// grant.
func (c *Client) Revoke(ctx context.Context, lease string, token uint64) error {
	if err := CheckLeaseName(lease); err != nil {
		return err
	}
	ans, err := c.t.election(ctx, "POST", "/v1/leases/"+lease+"/revoke", map[string]any{"token": token}, 0)
	if err != nil {
		return err
	}
	if ans.status != 200 {
		return ans.err()
	}
	return nil
}

// Get is the lease as the leader sees it. ErrNotFound if it has no record.
func (c *Client) Get(ctx context.Context, lease string) (*LeaseInfo, error) {
	if err := CheckLeaseName(lease); err != nil {
		return nil, err
	}
	ans, err := c.t.election(ctx, "GET", "/v1/leases/"+lease, nil, 0)
	if err != nil {
		return nil, err
	}
	if ans.status != 200 {
		return nil, ans.err()
	}
	return parseLeaseInfo(ans.body)
}

// History is the lease's last transitions, oldest first (the cluster keeps
// a few per lease). ErrNotFound if the lease has no record.
func (c *Client) History(ctx context.Context, lease string) ([]Transition, error) {
	if err := CheckLeaseName(lease); err != nil {
		return nil, err
	}
	ans, err := c.t.election(ctx, "GET", "/v1/leases/"+lease+"/history", nil, 0)
	if err != nil {
		return nil, err
	}
	if ans.status != 200 {
		return nil, ans.err()
	}
	var doc struct {
		History []Transition `json:"history"`
	}
	if err := json.Unmarshal(ans.body, &doc); err != nil {
		return nil, &ProtocolError{Status: 200, Message: "the history does not parse: " + err.Error()}
	}
	return doc.History, nil
}

// List returns every lease under prefix ("" for all) in name order, fetched
// page by page.
func (c *Client) List(ctx context.Context, prefix string) ([]LeaseInfo, error) {
	var leases []LeaseInfo
	after := ""
	for {
		q := url.Values{}
		if prefix != "" {
			q.Set("prefix", prefix)
		}
		if after != "" {
			q.Set("after", after)
		}
		path := "/v1/leases"
		if len(q) > 0 {
			path += "?" + q.Encode()
		}
		ans, err := c.t.election(ctx, "GET", path, nil, 0)
		if err != nil {
			return nil, err
		}
		var page struct {
			Leases []LeaseInfo `json:"leases"`
			Next   *string     `json:"next"`
		}
		if err := ans.decode(&page); err != nil {
			return nil, err
		}
		leases = append(leases, page.Leases...)
		if page.Next == nil || *page.Next == "" || *page.Next == after {
			return leases, nil
		}
		after = *page.Next
	}
}

// Watch waits (up to wait) for lease to change after index and returns its
// state; pass the returned ModifyIndex as the next index. ErrNotFound if it
// has no record.
func (c *Client) Watch(ctx context.Context, lease string, index uint64, wait time.Duration) (*LeaseInfo, error) {
	if err := CheckLeaseName(lease); err != nil {
		return nil, err
	}
	path := fmt.Sprintf("/v1/leases/%s/watch?index=%d&wait_ms=%d", lease, index, wait.Milliseconds())
	ans, err := c.t.election(ctx, "GET", path, nil, wait)
	if err != nil {
		return nil, err
	}
	if ans.status != 200 {
		return nil, ans.err()
	}
	return parseLeaseInfo(ans.body)
}

func (c *Client) getJSON(ctx context.Context, method, path string, body any, extra time.Duration) (map[string]any, error) {
	ans, err := c.t.election(ctx, method, path, body, extra)
	if err != nil {
		return nil, err
	}
	var doc map[string]any
	if err := ans.decode(&doc); err != nil {
		return nil, err
	}
	return doc, nil
}

// Cluster is /v1/cluster of the first node that answers.
func (c *Client) Cluster(ctx context.Context) (map[string]any, error) {
	return c.getJSON(ctx, "GET", "/v1/cluster", nil, 0)
}

// JWKS is the cluster's JWKS (/v1/jwks).
func (c *Client) JWKS(ctx context.Context) (map[string]any, error) {
	return c.getJSON(ctx, "GET", "/v1/jwks", nil, 0)
}

// VerifyJWT verifies a grant's JWT against the JWKS (EdDSA signature by the
// key its kid names, iss, and lease, sub and token equal to the grant's);
// its claims. ErrProtocol when it does not verify.
func (c *Client) VerifyJWT(ctx context.Context, g *Grant) (*Claims, error) {
	return c.t.verifier.verify(ctx, g)
}

// RotateKey rotates the cluster's signing key; the new key's id.
func (c *Client) RotateKey(ctx context.Context) (string, error) {
	doc, err := c.getJSON(ctx, "POST", "/v1/cluster/rotate-key", map[string]any{}, 0)
	if err != nil {
		return "", err
	}
	kid, _ := doc["kid"].(string)
	return kid, nil
}

// AddMember adds node id (peer address addr): a learner until caught up,
// then a voter. Waits up to a minute.
func (c *Client) AddMember(ctx context.Context, id uint64, addr string) (map[string]any, error) {
	return c.getJSON(ctx, "POST", "/v1/cluster/members", map[string]any{"id": id, "addr": addr}, time.Minute)
}

// RemoveMember removes node id from the cluster (never the last voter).
func (c *Client) RemoveMember(ctx context.Context, id uint64) (map[string]any, error) {
	return c.getJSON(ctx, "DELETE", fmt.Sprintf("/v1/cluster/members/%d", id), nil, 10*time.Second)
}

// GetObject reads key through the gateway (one request). Reads are not
// fenced and need no lease. ErrNotFound when there is no object.
func (c *Client) GetObject(ctx context.Context, key string) (*Object, error) {
	return c.t.getObject(ctx, key)
}

// PutWithJWT writes value at key stamped with jwt, without a Lease and
// without the local deadline check: for tools that manage grants
// themselves (AcquireGrant). A *FencedError when the gateway refuses the
// token as stale.
func (c *Client) PutWithJWT(ctx context.Context, jwt, key string, value []byte) (*WriteResult, error) {
	if value == nil {
		value = []byte{}
	}
	ans, err := c.t.gatewayWrite(ctx, jwt, "PUT", "/v1/objects/"+EncodeKey(key), value, Precondition{})
	if err != nil {
		return nil, err
	}
	var res WriteResult
	if err := ans.decode(&res); err != nil {
		return nil, err
	}
	return &res, nil
}
