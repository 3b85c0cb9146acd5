package palisade

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The header a follower adds to an answer it forwarded from the leader.
const forwardedByFollower = "x-palisade-leader"

// The largest answer body read (a list page, an object).
const maxAnswerBytes = 64 << 20

// Backoff between retries: 20 ms doubling to 500 ms, with jitter.
const (
	firstBackoff = 20 * time.Millisecond
	maxBackoff   = 500 * time.Millisecond
)

// transport is what a Client and its leases share: the HTTP client, the one
// retry loop for election calls, the gateway calls, the JWT verifier and the
// renewal batcher.
//
// Retry rules (the Rust and Python SDKs'): an election call is retried, on
// the next endpoint, with exponential backoff and jitter, on transport
// failures (connection refused, timeouts, a connection cut mid-call), 503
// and 429, within the retry budget. A 503 or 429 carrying Retry-After keeps
// this client off that endpoint for that long (the other endpoints are
// still tried). Every other answer (409, 401, 403, every other 4xx) is
// returned to the caller after exactly one request. Gateway calls are sent
// once.
//
// A renewal is hedged instead (hedge.go): each attempt may go unanswered
// for a share of the time left to the lease's safe deadline, then the same
// renewal goes to the next node as well, and the first definitive answer
// wins.
type transport struct {
	cfg  Config
	http *http.Client

	// Which node to ask first (the leader, when known), which to avoid.
	endpoints
	// Which node leads each partition (partitions.go): a lease call goes
	// to its partition's leader first, when known.
	parts partitionMap

	mu        sync.Mutex
	notBefore map[int]time.Time // per endpoint, from Retry-After
	rng       *rand.Rand

	verifier *jwtVerifier
	batcher  *renewBatcher

	leasesMu sync.Mutex
	leases   map[*Lease]struct{} // held by this client, until lost or released
	closed   bool

	// renewHook, set by tests only, runs before every renewal a Lease
	// sends; an error fails that renewal as a transport failure would.
	renewHook atomic.Pointer[renewHook]
}

type renewHook func(ctx context.Context, id GrantID) error

// answer is one HTTP answer: status, body and headers.
type answer struct {
	status int
	body   []byte
	header http.Header
}

func (a *answer) err() error { return errorFor(a.status, a.body) }

func (a *answer) message() string { return parseErrorDoc(a.body).message }

// decode parses a 200 answer's JSON into out; maps an error answer.
func (a *answer) decode(out any) error {
	if a.status != 200 {
		return a.err()
	}
	if err := json.Unmarshal(a.body, out); err != nil {
		return &ProtocolError{Status: 200, Message: "the answer does not parse: " + err.Error()}
	}
	return nil
}

func newTransport(cfg Config) (*transport, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	dialTimeout := cfg.RequestTimeout
	if dialTimeout > 500*time.Millisecond {
		dialTimeout = 500 * time.Millisecond
	}
	tlsConfig := &tls.Config{MinVersion: tls.VersionTLS12}
	if cfg.CAFile != "" {
		pool, err := loadCA(cfg.CAFile)
		if err != nil {
			return nil, err
		}
		tlsConfig.RootCAs = pool
	}
	if tlsConfig.Certificates, err = loadClientCert(cfg); err != nil {
		return nil, err
	}
	rt := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: dialTimeout, KeepAlive: 15 * time.Second}).DialContext,
		TLSClientConfig:       tlsConfig,
		TLSHandshakeTimeout:   cfg.RequestTimeout,
		ForceAttemptHTTP2:     true, // https:// speaks HTTP/2 by ALPN
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	t := &transport{
		cfg: cfg,
		http: &http.Client{
			Transport: rt,
			CheckRedirect: func(*http.Request, []*http.Request) error {
				return http.ErrUseLastResponse
			},
		},
		notBefore: map[int]time.Time{},
		leases:    map[*Lease]struct{}{},
		rng:       rand.New(rand.NewSource(time.Now().UnixNano())),
	}
	t.endpoints.init(cfg.Election)
	t.verifier = &jwtVerifier{t: t}
	t.batcher = newRenewBatcher(t)
	return t, nil
}

func (t *transport) logf(format string, args ...any) {
	if t.cfg.Logf != nil {
		t.cfg.Logf(format, args...)
	}
}

// track registers a lease this client renews; false once closed.
func (t *transport) track(l *Lease) bool {
	t.leasesMu.Lock()
	defer t.leasesMu.Unlock()
	if t.closed {
		return false
	}
	t.leases[l] = struct{}{}
	return true
}

func (t *transport) untrack(l *Lease) {
	t.leasesMu.Lock()
	delete(t.leases, l)
	t.leasesMu.Unlock()
}

func (t *transport) isClosed() bool {
	t.leasesMu.Lock()
	defer t.leasesMu.Unlock()
	return t.closed
}

// close releases the leases still held (in parallel, bounded by a request
// timeout and the retry budget), stops the batcher and closes idle
// connections.
func (t *transport) close() {
	t.leasesMu.Lock()
	t.closed = true
	leases := make([]*Lease, 0, len(t.leases))
	for l := range t.leases {
		leases = append(leases, l)
	}
	t.leasesMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), t.cfg.RequestTimeout+t.cfg.RetryBudget)
	defer cancel()
	var wg sync.WaitGroup
	for _, l := range leases {
		wg.Add(1)
		go func(l *Lease) {
			defer wg.Done()
			if err := l.Release(ctx); err != nil {
				t.logf("palisade: release of %s on close failed: %v", l.id.Lease, err)
			}
		}(l)
	}
	wg.Wait()
	t.batcher.close()
	t.http.CloseIdleConnections()
}

// do sends one request with a timeout; the answer, or the transport error.
func (t *transport) do(ctx context.Context, method, url string, payload []byte, contentType string,
	header http.Header, timeout time.Duration) (*answer, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var body io.Reader
	if payload != nil {
		body = bytes.NewReader(payload)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return nil, badRequest("%s: %v", url, err)
	}
	for name, values := range header {
		req.Header[name] = values
	}
	if len(payload) > 0 && contentType != "" {
		req.Header.Set("content-type", contentType)
	}
	if t.cfg.APIKey != "" {
		req.Header.Set(APIKeyHeader, t.cfg.APIKey)
	}
	resp, err := t.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return nil, err
	}
	return &answer{status: resp.StatusCode, body: data, header: resp.Header}, nil
}

func (t *transport) jitter(backoff time.Duration) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return time.Duration(t.rng.Int63n(int64(backoff) + 1))
}

// retryAfter parses a Retry-After header: seconds, or an HTTP date.
func retryAfter(value string) time.Duration {
	value = strings.TrimSpace(value)
	if value == "" {
		return 0
	}
	if secs, err := strconv.ParseFloat(value, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > 3600 {
			secs = 3600
		}
		return time.Duration(secs * float64(time.Second))
	}
	if at, err := http.ParseTime(value); err == nil {
		return time.Until(at)
	}
	return 0
}

// election sends one election request, retrying transport failures, 503s
// and 429s on the next endpoint with backoff and jitter within the retry
// budget, lengthened by extra for calls that wait on purpose (as is each
// attempt's timeout). The context's deadline ends the retries earlier and
// cuts each attempt's timeout to it. Every other answer is returned as is.
func (t *transport) election(ctx context.Context, method, path string, body any, extra time.Duration) (*answer, error) {
	return t.electionWithin(ctx, method, path, body, extra, t.cfg.RetryBudget)
}

// electionWithin is election with a retry budget of its own (a waiting
// acquire keeps retrying until its wait ends, not only the budget).
func (t *transport) electionWithin(ctx context.Context, method, path string, body any, extra, budget time.Duration) (*answer, error) {
	var payload []byte
	if body != nil {
		var err error
		if payload, err = json.Marshal(body); err != nil {
			return nil, badRequest("the request body does not encode: %v", err)
		}
	}
	started := time.Now()
	attempts := 0
	backoff := firstBackoff
	last := "no attempt made: the context had ended"
	unavailable := func(err error) error {
		return &UnavailableError{Attempts: attempts, Elapsed: time.Since(started), Last: last, Err: err}
	}
	order := t.orderFrom(t.first(path))
	for {
		if err := ctx.Err(); err != nil {
			return nil, unavailable(err)
		}
		timeout := t.cfg.RequestTimeout + extra
		deadline, hasDeadline := ctx.Deadline()
		if hasDeadline {
			left := time.Until(deadline)
			if left <= 0 {
				return nil, unavailable(context.DeadlineExceeded)
			}
			if left < timeout {
				timeout = left
			}
		}
		index := order[attempts%len(order)]
		url := t.urls[index] + path
		attempts++
		ans, err := t.do(ctx, method, url, payload, "application/json", nil, timeout)
		switch {
		case err == nil && ans.status != 503 && ans.status != 429:
			t.learnFrom(index, path, ans, false)
			return ans, nil
		case err != nil:
			if ctx.Err() != nil {
				return nil, unavailable(ctx.Err())
			}
			if re, ok := err.(*RequestError); ok {
				return nil, re
			}
			last = fmt.Sprintf("%s: %v", url, err)
		default:
			last = fmt.Sprintf("%s: %d %s", url, ans.status, ans.message())
			if wait := retryAfter(ans.header.Get("Retry-After")); wait > 0 {
				t.mu.Lock()
				t.notBefore[index] = time.Now().Add(wait)
				t.mu.Unlock()
			}
		}
		t.moveOff(index)
		t.missed(path, index)
		wait := t.retryWait(order[attempts%len(order)], backoff)
		if time.Since(started)+wait > budget+extra || (hasDeadline && time.Now().Add(wait).After(deadline)) {
			return nil, unavailable(nil)
		}
		t.logf("palisade: retrying %s %s in %v after %s", method, path, wait.Round(time.Millisecond), last)
		timer := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil, unavailable(ctx.Err())
		case <-timer.C:
		}
		backoff *= 2
		if backoff > maxBackoff {
			backoff = maxBackoff
		}
	}
}

// retryWait is how long to wait before retrying on endpoint next: the
// backoff with jitter, or longer to honour next's Retry-After.
func (t *transport) retryWait(next int, backoff time.Duration) time.Duration {
	wait := backoff/2 + t.jitter(backoff)/2
	t.mu.Lock()
	defer t.mu.Unlock()
	if until := time.Until(t.notBefore[next]); until > wait {
		wait = until
	}
	return wait
}

// grantBody is the body of a renew (withIndex false) or release naming id.
func grantBody(id GrantID, withIndex bool) map[string]any {
	body := map[string]any{"holder": id.Holder, "token": id.Token}
	if id.Secret != "" {
		body["secret"] = id.Secret
	}
	if withIndex && id.GrantIndex != nil {
		body["grant_index"] = *id.GrantIndex
	}
	return body
}

// verifyGrant checks the grant's JWT against the cluster's JWKS (unless
// turned off).
func (t *transport) verifyGrant(ctx context.Context, g *Grant) error {
	if t.cfg.NoJWTVerification {
		return nil
	}
	_, err := t.verifier.verify(ctx, g)
	return err
}

// renewGrant is one renewal (hedged across the nodes until ctx's deadline,
// else the retry budget).
func (t *transport) renewGrant(ctx context.Context, id GrantID) (*Grant, error) {
	payload, err := json.Marshal(grantBody(id, false))
	if err != nil {
		return nil, badRequest("the request body does not encode: %v", err)
	}
	ans, err := t.hedged(ctx, "POST", "/v1/leases/"+id.Lease+"/renew", payload)
	if err != nil {
		return nil, err
	}
	g, err := t.grantFrom(ctx, ans.status, ans.body)
	if err != nil {
		return nil, err
	}
	return g, checkRenewal(id, g)
}

// checkRenewal checks that a renewal answered the grant it renewed.
func checkRenewal(id GrantID, g *Grant) error {
	if g.Lease != id.Lease || g.Holder != id.Holder || g.Token != id.Token {
		return &ProtocolError{Status: 200, Message: "a renewal answered another grant: " + g.String()}
	}
	return nil
}

// grantFrom parses and verifies a renewal's answer.
func (t *transport) grantFrom(ctx context.Context, status int, body []byte) (*Grant, error) {
	if status != 200 {
		return nil, errorFor(status, body)
	}
	g, err := parseGrant(body)
	if err != nil {
		return nil, err
	}
	if err := t.verifyGrant(ctx, g); err != nil {
		return nil, err
	}
	return g, nil
}

// releaseGrant is one release call, naming the grant's index when known.
func (t *transport) releaseGrant(ctx context.Context, id GrantID) error {
	ans, err := t.election(ctx, "POST", "/v1/leases/"+id.Lease+"/release", grantBody(id, true), 0)
	if err != nil {
		return err
	}
	if ans.status != 200 {
		return ans.err()
	}
	return nil
}

// releaseInBackground releases id on its own goroutine, with a context of
// its own (the caller's may be ending).
func (t *transport) releaseInBackground(id GrantID) {
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), t.cfg.RequestTimeout+t.cfg.RetryBudget)
		defer cancel()
		if err := t.releaseGrant(ctx, id); err != nil {
			t.logf("palisade: release of %s (token %d) failed: %v", id.Lease, id.Token, err)
		}
	}()
}

// handover is one handover call; the successor's token.
func (t *transport) handover(ctx context.Context, id GrantID, successor string) (uint64, error) {
	body := grantBody(id, false)
	body["to"] = successor
	ans, err := t.election(ctx, "POST", "/v1/leases/"+id.Lease+"/handover", body, 0)
	if err != nil {
		return 0, err
	}
	var handed struct {
		Token *uint64 `json:"token"`
	}
	if err := ans.decode(&handed); err != nil {
		return 0, err
	}
	if handed.Token == nil {
		return 0, &ProtocolError{Status: 200, Message: "a handover answered no token"}
	}
	return *handed.Token, nil
}
