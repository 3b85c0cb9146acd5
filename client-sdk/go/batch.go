package palisade

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"
)

// Renewals of one client's leases share requests (POST /v1/renew), as in
// the Rust SDK's renew_queue.rs: one goroutine per client takes every renewal
// queued at that moment (up to maxBatch entries and maxBatchBytes of body)
// as one request, with at most maxInFlight requests out at once, so a quiet
// client sends each renewal at once and a busy one sends fewer, bigger
// requests (group commit). Each renewal is answered on its own: one lost
// lease is that lease's ErrLeaseLost, the others renew.
//
// A batch of one goes to /v1/leases/{name}/renew; a server without the
// batch route (404 not_found) gets each renewal of the batch on its own.
const (
	maxBatch      = 256
	maxBatchBytes = 60 * 1024
	maxInFlight   = 4
)

type renewResult struct {
	grant *Grant
	err   error
}

// pendingRenewal is a renewal waiting to be sent: until is when its lease's
// deadline passes (no attempt is worth making after it), reply gets the
// answer (buffered: the sender never blocks on it).
type pendingRenewal struct {
	id    GrantID
	until time.Time
	entry []byte
	reply chan renewResult
}

type renewBatcher struct {
	t       *transport
	mu      sync.Mutex
	queue   []*pendingRenewal
	started bool
	closed  bool
	wake    chan struct{}
	slots   chan struct{}
	done    chan struct{}
}

func newRenewBatcher(t *transport) *renewBatcher {
	return &renewBatcher{
		t:     t,
		wake:  make(chan struct{}, 1),
		slots: make(chan struct{}, maxInFlight),
		done:  make(chan struct{}),
	}
}

func batchEntry(id GrantID) []byte {
	body := grantBody(id, false)
	body["lease"] = id.Lease
	data, _ := json.Marshal(body)
	return data
}

// submit queues a renewal; false when the batcher is closed.
func (b *renewBatcher) submit(p *pendingRenewal) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.queue = append(b.queue, p)
	if !b.started {
		b.started = true
		go b.run()
	}
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
	return true
}

func (b *renewBatcher) close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	queued := b.queue
	b.queue = nil
	b.mu.Unlock()
	close(b.done)
	for _, p := range queued {
		p.reply <- renewResult{err: &UnavailableError{Last: "the client was closed"}}
	}
}

// take removes the next batch from the queue (nil when empty).
func (b *renewBatcher) take() []*pendingRenewal {
	b.mu.Lock()
	defer b.mu.Unlock()
	var batch []*pendingRenewal
	bytes := 0
	for len(b.queue) > 0 && len(batch) < maxBatch {
		p := b.queue[0]
		size := len(p.entry) + 1
		if len(batch) > 0 && bytes+size > maxBatchBytes {
			break
		}
		bytes += size
		batch = append(batch, p)
		b.queue[0] = nil
		b.queue = b.queue[1:]
	}
	return batch
}

func (b *renewBatcher) pending() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) > 0
}

func (b *renewBatcher) run() {
	for {
		if !b.pending() {
			select {
			case <-b.wake:
				continue
			case <-b.done:
				return
			}
		}
		// While all requests are out, renewals gather for the next.
		select {
		case b.slots <- struct{}{}:
		case <-b.done:
			return
		}
		batch := b.take()
		if len(batch) == 0 {
			<-b.slots
			continue
		}
		go func() {
			defer func() { <-b.slots }()
			b.t.sendBatch(batch)
		}()
	}
}

// renew renews id: in the next batch of this client's renewals, or on its
// own when the client does not batch. until bounds the attempts (the
// lease's deadline).
func (t *transport) renew(ctx context.Context, id GrantID, until time.Time) (*Grant, error) {
	if t.cfg.NoBatchRenewals {
		ctx, cancel := context.WithDeadline(ctx, until)
		defer cancel()
		return t.renewGrant(ctx, id)
	}
	p := &pendingRenewal{id: id, until: until, entry: batchEntry(id), reply: make(chan renewResult, 1)}
	if !t.batcher.submit(p) {
		return nil, &UnavailableError{Last: "the client was closed"}
	}
	select {
	case r := <-p.reply:
		return r.grant, r.err
	case <-ctx.Done():
		return nil, &UnavailableError{Last: "the renewal was abandoned", Err: ctx.Err()}
	}
}

// sendBatch sends one batch and answers each of its renewals. On a cluster
// of several partitions (once the client knows) the batch is split by
// partition, each part sent at once as POST /v1/renew?partition=k to that
// partition's leader first: a partition failing over holds up only its
// own part. Else it goes whole to /v1/renew (any node splits it).
func (t *transport) sendBatch(batch []*pendingRenewal) {
	count := t.parts.size()
	if count <= 1 {
		t.sendRenewals(batch, -1)
		return
	}
	groups := map[int][]*pendingRenewal{}
	for _, p := range batch {
		k := PartitionOf(p.id.Lease, count)
		groups[k] = append(groups[k], p)
	}
	var wg sync.WaitGroup
	for k, group := range groups {
		wg.Add(1)
		go func(k int, group []*pendingRenewal) {
			defer wg.Done()
			t.sendRenewals(group, k)
		}(k, group)
	}
	wg.Wait()
}

// sendRenewals sends renewals of partition k (-1: of any) as one request
// and answers each of them. Its attempts end at the earliest deadline
// among its leases.
func (t *transport) sendRenewals(batch []*pendingRenewal, k int) {
	path := "/v1/renew"
	if k >= 0 {
		path = fmt.Sprintf("/v1/renew?partition=%d", k)
	}
	until := batch[0].until
	for _, p := range batch[1:] {
		if p.until.Before(until) {
			until = p.until
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), until)
	defer cancel()
	answerAll := func(err error) {
		for _, p := range batch {
			p.reply <- renewResult{err: err}
		}
	}
	if len(batch) == 1 && k < 0 {
		g, err := t.renewGrant(ctx, batch[0].id)
		batch[0].reply <- renewResult{grant: g, err: err}
		return
	}
	entries := make([]json.RawMessage, len(batch))
	for i, p := range batch {
		entries[i] = p.entry
	}
	payload, err := json.Marshal(map[string]any{"renewals": entries})
	if err != nil {
		answerAll(badRequest("the request body does not encode: %v", err))
		return
	}
	ans, err := t.hedged(ctx, "POST", path, payload)
	if err != nil {
		answerAll(err)
		return
	}
	if ans.status == 404 && parseErrorDoc(ans.body).code == "not_found" {
		// An older node without the batch route: one by one.
		for _, p := range batch {
			g, err := t.renewGrant(ctx, p.id)
			p.reply <- renewResult{grant: g, err: err}
		}
		return
	}
	var doc struct {
		Results []json.RawMessage `json:"results"`
	}
	if err := ans.decode(&doc); err != nil {
		answerAll(err)
		return
	}
	if len(doc.Results) != len(batch) {
		answerAll(&ProtocolError{Status: 200, Message: "a batch renewal answered the wrong number of results"})
		return
	}
	t.answerRenewals(ctx, batch, doc.Results, k)
}

// answerRenewals answers each renewal of a batch with its result. A 503
// among a partition's results (its leader stopped leading) forgets that
// leader: the retries go the usual way until it is learned again.
func (t *transport) answerRenewals(ctx context.Context, batch []*pendingRenewal, results []json.RawMessage, k int) {
	forgot := false
	for i, p := range batch {
		var result struct {
			Status int             `json:"status"`
			Grant  json.RawMessage `json:"grant"`
		}
		if err := json.Unmarshal(results[i], &result); err != nil {
			p.reply <- renewResult{err: &ProtocolError{Status: 200, Message: "a batch result does not parse: " + err.Error()}}
			continue
		}
		if result.Status == 200 {
			g, err := t.grantFrom(ctx, 200, result.Grant)
			if err == nil {
				err = checkRenewal(p.id, g)
			}
			p.reply <- renewResult{grant: g, err: err}
		} else {
			if result.Status == 503 && k >= 0 && !forgot {
				forgot = true
				t.parts.setLeader(k, 0)
				t.identify(t.nodeView)
			}
			p.reply <- renewResult{err: errorFor(result.Status, results[i])}
		}
	}
}
