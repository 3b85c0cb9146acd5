package palisade

import (
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"sync"
)

// The partition map (issue 46): which partition a lease is in, and which
// node leads each partition, as far as the client knows.
//
// A cluster started with --partitions N runs N Raft groups, each with its
// own leader; a lease belongs to partition fnv1a64(name) % N. Any node
// serves every call (it forwards to the partition's leader), but a call
// sent to the partition's leader takes one hop less, and a partition's
// failover then touches only its own leases' calls.
//
// The map is learned from GET /v1/cluster answers ("partitions": one entry
// per partition, with its leader and term) and from the x-palisade-leader
// header of lease calls. With one partition (or before anything is
// learned) it routes nothing: the client behaves as without it.

const (
	fnvOffset = 0xcbf29ce484222325
	fnvPrime  = 0x100000001b3
	leasePath = "/v1/leases/"
)

// fnv1a64 is the 64-bit FNV-1a hash of data.
func fnv1a64(data []byte) uint64 {
	h := uint64(fnvOffset)
	for _, b := range data {
		h ^= uint64(b)
		h *= fnvPrime
	}
	return h
}

// PartitionOf is the partition of lease name on a cluster of count
// partitions (palisade dev --partitions count): FNV-1a 64 of the name's
// UTF-8 bytes, modulo count.
func PartitionOf(name string, count int) int {
	if count <= 1 {
		return 0
	}
	return int(fnv1a64([]byte(name)) % uint64(count))
}

// leaseInPath is the lease a call on /v1/leases/{name}[/...] is about.
func leaseInPath(path string) string {
	if !strings.HasPrefix(path, leasePath) {
		return ""
	}
	rest := path[len(leasePath):]
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// partitionMap is the partition count and each partition's leader.
type partitionMap struct {
	mu      sync.Mutex
	count   int      // 0: not learned yet
	leaders []uint64 // 0: not known
	terms   []uint64
}

// size is the partition count, 0 before a /v1/cluster said.
func (m *partitionMap) size() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.count
}

// ofPath is the partition a call is for (?partition=k, or the lease of a
// /v1/leases/{name} call); -1 with one partition or none learned.
func (m *partitionMap) ofPath(path string) int {
	count := m.size()
	if count <= 1 {
		return -1
	}
	if i := strings.IndexByte(path, '?'); i >= 0 {
		if q, err := url.ParseQuery(path[i+1:]); err == nil && q.Get("partition") != "" {
			if k, err := strconv.Atoi(q.Get("partition")); err == nil && k >= 0 && k < count {
				return k
			}
		}
	}
	if name := leaseInPath(path); name != "" {
		return PartitionOf(name, count)
	}
	return -1
}

// leader is the node leading partition k (0: not known).
func (m *partitionMap) leader(k int) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k < 0 || k >= len(m.leaders) {
		return 0
	}
	return m.leaders[k]
}

// setLeader records that node leads partition k (an answer said so); 0:
// its leader failed, unknown until learned again.
func (m *partitionMap) setLeader(k int, node uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if k >= 0 && k < len(m.leaders) {
		m.leaders[k] = node
	}
}

// learn learns from one node's /v1/cluster answer: the count (one without
// "partitions"), and each partition's leader when the node names one in a
// newer term than known (or none is known).
func (m *partitionMap) learn(body []byte) {
	var doc struct {
		NodeID     *uint64 `json:"node_id"`
		Partitions []struct {
			ID     *int    `json:"id"`
			Leader *uint64 `json:"leader"`
			Term   uint64  `json:"term"`
		} `json:"partitions"`
	}
	if json.Unmarshal(body, &doc) != nil || (doc.NodeID == nil && len(doc.Partitions) == 0) {
		return
	}
	count := len(doc.Partitions)
	if count == 0 {
		count = 1
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.count != count {
		m.count, m.leaders, m.terms = count, make([]uint64, count), make([]uint64, count)
	}
	for _, p := range doc.Partitions {
		if p.ID == nil || *p.ID < 0 || *p.ID >= count || p.Leader == nil || *p.Leader == 0 {
			continue
		}
		k := *p.ID
		if m.leaders[k] == 0 || p.Term > m.terms[k] {
			m.leaders[k] = *p.Leader
			if p.Term > m.terms[k] {
				m.terms[k] = p.Term
			}
		}
	}
}

// first is the endpoint to try first for a call: its partition leader's,
// when the cluster has several partitions and the client knows it; else
// -1 (the usual order).
func (t *transport) first(path string) int {
	k := t.parts.ofPath(path)
	if k < 0 {
		return -1
	}
	leader := t.parts.leader(k)
	if leader == 0 {
		return -1
	}
	index, ok := t.indexOf(leader)
	if !ok {
		t.identify(t.nodeView)
		return -1
	}
	return index
}

// missed: a call for a partition got no definitive answer from index; if
// that is the partition's leader it is forgotten (the next call tries the
// usual order) and the map is asked for again.
func (t *transport) missed(path string, index int) {
	k := t.parts.ofPath(path)
	if k < 0 {
		return
	}
	if at, ok := t.indexOf(t.parts.leader(k)); ok && at == index {
		t.parts.setLeader(k, 0)
		t.identify(t.nodeView)
	}
}

// learnPartitionLeader learns from a definitive answer of index to a call
// for partition k: the leader its x-palisade-leader header names, else
// (it served the call itself) the node at index. Only that partition's
// leader changes: the client's preferred endpoint is left as it was.
func (t *transport) learnPartitionLeader(k, index int, header string) {
	t.heard(index)
	leader, named := leaderHint(header)
	if !named {
		leader, named = t.nodeAt(index)
	}
	if named && leader > 0 {
		t.parts.setLeader(k, leader)
	}
	if _, placed := t.indexOf(leader); !named || !placed {
		t.identify(t.nodeView)
	}
}
