package palisade

import (
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Which election node to ask first, and how long one attempt may take.
//
// Every node answers every call (a follower forwards to the leader), but a
// renewal answered by the leader itself takes one hop less, and a renewal
// stuck on a frozen or cut-off node must not eat the lease's time. So the
// client keeps, per endpoint:
//
//   - which one to try first (preferred): the one that served the last call
//     itself; after an answer a follower forwarded (x-palisade-leader: <node
//     id>), the leader it names if the client knows which endpoint that node
//     is (node ids are learned from GET /v1/cluster's node_id), else the
//     next endpoint;
//   - which ones to try last for a while (avoid): one that left an attempt
//     unanswered for its whole slice, or refused with Retry-After.
//
// attemptSlice is the rule for how long one attempt may go unanswered
// before the same call is sent to the next node.

const (
	// sliceFloor: no attempt is given less than this before the next node
	// is tried too (unless less than this is left before the deadline).
	sliceFloor = 100 * time.Millisecond
	// identifyEvery: node ids are asked of the endpoints at most this often.
	identifyEvery = 5 * time.Second
)

// attemptSlice is how long one attempt may go unanswered, left before the
// deadline: a third of it (at least sliceFloor), at most a request timeout,
// never past the deadline.
func attemptSlice(left, requestTimeout time.Duration) time.Duration {
	s := left / 3
	if s < sliceFloor {
		s = sliceFloor
	}
	if s > requestTimeout {
		s = requestTimeout
	}
	if s > left {
		s = left
	}
	if s < 0 {
		s = 0
	}
	return s
}

// leaderHint is the node id an x-palisade-leader header names (ok false
// when there is none).
func leaderHint(value string) (uint64, bool) {
	id, err := strconv.ParseUint(strings.TrimSpace(value), 10, 64)
	return id, err == nil
}

// endpoints are the election endpoints and what the client learned of them.
type endpoints struct {
	urls []string
	// The endpoint tried first (modulo their number).
	preferred atomic.Uint64

	epMu        sync.Mutex
	avoidUntil  map[int]time.Time
	ids         map[uint64]int // node id -> endpoint index
	wanted      uint64         // a leader named, not yet placed (0: none)
	identified  time.Time
	identifying bool
}

func (e *endpoints) init(urls []string) {
	e.urls, e.avoidUntil, e.ids = urls, map[int]time.Time{}, map[uint64]int{}
}

// order is every endpoint index in the order to try them: from the
// preferred one round the ring, the avoided ones last (the one avoided
// longest last of all).
func (e *endpoints) order() []int { return e.orderFrom(-1) }

// orderFrom is order starting from first (a partition leader's endpoint)
// instead of the preferred one; -1: the preferred one.
func (e *endpoints) orderFrom(first int) []int {
	n := len(e.urls)
	start := int(e.preferred.Load() % uint64(n))
	if first >= 0 {
		start = first % n
	}
	now := time.Now()
	e.epMu.Lock()
	defer e.epMu.Unlock()
	var good, bad []int
	for i := 0; i < n; i++ {
		index := (start + i) % n
		if e.avoidUntil[index].After(now) {
			bad = append(bad, index)
		} else {
			good = append(good, index)
		}
	}
	sort.SliceStable(bad, func(a, b int) bool { return e.avoidUntil[bad[a]].Before(e.avoidUntil[bad[b]]) })
	return append(good, bad...)
}

// indexOf is the endpoint of node id, if the client knows it.
func (e *endpoints) indexOf(id uint64) (int, bool) {
	e.epMu.Lock()
	defer e.epMu.Unlock()
	index, ok := e.ids[id]
	return index, ok
}

// nodeAt is the node id of endpoint index, if the client knows it.
func (e *endpoints) nodeAt(index int) (uint64, bool) {
	e.epMu.Lock()
	defer e.epMu.Unlock()
	for id, at := range e.ids {
		if at == index {
			return id, true
		}
	}
	return 0, false
}

// avoided reports whether index is tried last for now.
func (e *endpoints) avoided(index int) bool {
	e.epMu.Lock()
	defer e.epMu.Unlock()
	return e.avoidUntil[index].After(time.Now())
}

// moveOff prefers the endpoint after index, if index was the preferred one.
func (e *endpoints) moveOff(index int) {
	n := uint64(len(e.urls))
	p := e.preferred.Load()
	if p%n == uint64(index)%n {
		e.preferred.CompareAndSwap(p, uint64(index+1))
	}
}

// answered records a definitive answer from index; header is its
// x-palisade-leader ("" when it served the call itself). It reports
// whether the leader named is a node the client cannot place yet (then
// identify is worth calling).
func (e *endpoints) answered(index int, header string) bool {
	e.epMu.Lock()
	delete(e.avoidUntil, index)
	leader, named := leaderHint(header)
	if !named {
		e.epMu.Unlock()
		e.preferred.Store(uint64(index))
		return false
	}
	placed, known := e.ids[leader]
	if !known {
		e.wanted = leader
	}
	e.epMu.Unlock()
	if known {
		e.preferred.Store(uint64(placed))
		return false
	}
	// A follower forwarded it: try the next node next time, until the
	// leader itself answers (no hop, and no follower relaying every call).
	e.moveOff(index)
	return true
}

// heard records that index answered (in time or late, if only with a
// 503): it is not tried last for having stalled.
func (e *endpoints) heard(index int) {
	e.epMu.Lock()
	delete(e.avoidUntil, index)
	e.epMu.Unlock()
}

// avoid tries index last for d (a stalled node, or one that asked to be
// left alone with Retry-After).
func (e *endpoints) avoid(index int, d time.Duration) {
	until := time.Now().Add(d)
	e.epMu.Lock()
	if until.After(e.avoidUntil[index]) {
		e.avoidUntil[index] = until
	}
	e.epMu.Unlock()
	e.moveOff(index)
}

// learn records that endpoint index is node id (its /v1/cluster said so);
// a leader named earlier and placed now is preferred.
func (e *endpoints) learn(index int, id uint64) {
	e.epMu.Lock()
	defer e.epMu.Unlock()
	for other, at := range e.ids {
		if at == index && other != id {
			delete(e.ids, other)
		}
	}
	e.ids[id] = index
	if e.wanted == id {
		e.wanted = 0
		if !e.avoidUntil[index].After(time.Now()) {
			e.preferred.Store(uint64(index))
		}
	}
}

// follow prefers node leader's endpoint, if the client knows it (and it is
// not avoided); else it waits to learn it.
func (e *endpoints) follow(leader uint64) {
	e.epMu.Lock()
	defer e.epMu.Unlock()
	placed, known := e.ids[leader]
	if !known {
		e.wanted = leader
	} else if !e.avoidUntil[placed].After(time.Now()) {
		e.preferred.Store(uint64(placed))
	}
}

// nodeView is what one node says in /v1/cluster: its id and the leader it
// knows (0: none), ok false when it did not answer.
type nodeView struct {
	id, leader uint64
	ok         bool
}

// identify learns the node id of every endpoint and the leader they name,
// view(index) (one GET /v1/cluster each), on goroutines of its own, and
// prefers the leader most of them name; at most one round at a time, and
// at most every identifyEvery.
func (e *endpoints) identify(view func(index int) nodeView) {
	e.epMu.Lock()
	if e.identifying || (!e.identified.IsZero() && time.Since(e.identified) < identifyEvery) {
		e.epMu.Unlock()
		return
	}
	e.identifying, e.identified = true, time.Now()
	e.epMu.Unlock()
	go func() {
		views := make([]nodeView, len(e.urls))
		var wg sync.WaitGroup
		for i := range e.urls {
			wg.Add(1)
			go func(i int) {
				defer wg.Done()
				views[i] = view(i)
			}(i)
		}
		wg.Wait()
		named := map[uint64]int{}
		var leader uint64
		for i, v := range views {
			if v.ok {
				e.learn(i, v.id)
			}
			if v.leader > 0 {
				if named[v.leader]++; named[v.leader] > named[leader] {
					leader = v.leader
				}
			}
		}
		if leader > 0 {
			e.follow(leader)
		}
		e.epMu.Lock()
		e.identifying = false
		e.epMu.Unlock()
	}()
}
