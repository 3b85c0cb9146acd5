//go:build linux

package palisade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Partitions (issue 46) against real processes: palisade dev
// --partitions 3. Leases spread over the three partitions are acquired and
// kept by background renewal; each partition's renewals go to its leader
// (POST /v1/renew?partition=k, seen by a RoundTripper that records every
// request); a kill -9 of a node leading a partition costs no lease, and the
// other partitions' renewals go on at their leaders meanwhile.

const (
	partTTL   = 5 * time.Second
	partCount = 3
)

func TestPartitionOfIsFNV1a64(t *testing.T) {
	if got := fnv1a64([]byte("a")); got != 0xaf63dc4c8601ec8c {
		t.Fatalf("fnv1a64(a) = %#x", got)
	}
	if got := fnv1a64(nil); got != 0xcbf29ce484222325 {
		t.Fatalf("fnv1a64() = %#x", got)
	}
	if got := PartitionOf("a", 3); got != int(uint64(0xaf63dc4c8601ec8c)%3) {
		t.Fatalf("PartitionOf(a, 3) = %d", got)
	}
	if PartitionOf("anything", 1) != 0 {
		t.Fatal("one partition: 0")
	}
	var m partitionMap
	m.learn([]byte(`{"node_id":2,"partitions":[{"id":0,"leader":1,"term":3},{"id":1,"leader":null},{"id":2,"leader":3,"term":1}]}`))
	if m.size() != 3 || m.leader(0) != 1 || m.leader(1) != 0 || m.leader(2) != 3 {
		t.Fatalf("learned %+v", m.leaders)
	}
	if k := m.ofPath("/v1/leases/a/renew"); k != PartitionOf("a", 3) {
		t.Fatalf("ofPath lease: %d", k)
	}
	if k := m.ofPath("/v1/renew?partition=2"); k != 2 {
		t.Fatalf("ofPath ?partition: %d", k)
	}
	if k := m.ofPath("/v1/leases?prefix=a"); k != -1 {
		t.Fatalf("ofPath list: %d", k)
	}
}

// sent is one request the recorder saw answered.
type sent struct {
	at        time.Time
	method    string
	url       *url.URL
	forwarded bool // the answer names the partition leader that answered
}

type recorder struct {
	inner http.RoundTripper
	mu    sync.Mutex
	seen  []sent
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	at := time.Now()
	resp, err := r.inner.RoundTrip(req)
	if err == nil {
		r.mu.Lock()
		r.seen = append(r.seen, sent{at, req.Method, req.URL, resp.Header.Get(forwardedByFollower) != ""})
		r.mu.Unlock()
	}
	return resp, err
}

// renewals are each partition's renewals sent after since.
func (r *recorder) renewals(since time.Time) map[int][]sent {
	r.mu.Lock()
	defer r.mu.Unlock()
	found := map[int][]sent{}
	for _, s := range r.seen {
		if s.at.Before(since) || s.method != "POST" || s.url.Path != "/v1/renew" {
			continue
		}
		k, err := strconv.Atoi(s.url.Query().Get("partition"))
		if err == nil {
			found[k] = append(found[k], s)
		}
	}
	return found
}

// assertDirect: each partition in ks had atLeast renewals, and most were
// served by the node they were sent to (the partition's leader then: a
// node that does not lead it forwards, and says so). Leadership also
// moves between healthy nodes (to each partition's home node, and by
// elections on a starved machine): a renewal sent just before a move is
// forwarded, and the client follows the leader the answer names.
func assertDirect(t *testing.T, found map[int][]sent, ks []int, atLeast int) {
	t.Helper()
	for _, k := range ks {
		forwarded := 0
		var where []string
		for _, s := range found[k] {
			if s.forwarded {
				forwarded++
			}
			where = append(where, fmt.Sprintf("%s fwd=%v", s.url.Host, s.forwarded))
		}
		if len(found[k]) < atLeast || forwarded*2 > len(found[k]) {
			t.Fatalf("partition %d: %d renewals (at least %d), %d forwarded: %v", k, len(found[k]), atLeast, forwarded, where)
		}
	}
}

// partitionLeadersNow is each partition's leader if every live node names
// the same live one (nil otherwise).
func (d *devCluster) partitionLeadersNow(live []int) []int {
	httpClient := &http.Client{Timeout: time.Second}
	var first []int
	for i, node := range live {
		req, _ := http.NewRequest("GET", d.election[node-1]+"/v1/cluster", nil)
		req.Header.Set(APIKeyHeader, d.apiKey)
		resp, err := httpClient.Do(req)
		if err != nil {
			return nil
		}
		var doc struct {
			Partitions []struct {
				Leader *int `json:"leader"`
			} `json:"partitions"`
		}
		err = json.NewDecoder(resp.Body).Decode(&doc)
		resp.Body.Close()
		if err != nil || len(doc.Partitions) != partCount {
			return nil
		}
		var view []int
		for _, p := range doc.Partitions {
			if p.Leader == nil || !containsInt(live, *p.Leader) {
				return nil
			}
			view = append(view, *p.Leader)
		}
		if i > 0 && fmt.Sprint(view) != fmt.Sprint(first) {
			return nil
		}
		first = view
	}
	return first
}

func containsInt(list []int, x int) bool {
	for _, y := range list {
		if y == x {
			return true
		}
	}
	return false
}

// partitionLeaders waits (up to a minute) for partition leaders every live
// node agrees on, unchanged for a second; for the first spreadWithin only
// leaders spread over the live nodes will do.
func (d *devCluster) partitionLeaders(t *testing.T, live []int, spreadWithin time.Duration) []int {
	t.Helper()
	started := time.Now()
	var last []int
	since := started
	for time.Since(started) < time.Minute {
		now := d.partitionLeadersNow(live)
		distinct := map[int]bool{}
		for _, l := range now {
			distinct[l] = true
		}
		spread := len(distinct) == len(live) || len(distinct) == partCount
		if now == nil || fmt.Sprint(now) != fmt.Sprint(last) {
			last, since = now, time.Now()
		} else if time.Since(since) >= time.Second && (spread || time.Since(started) > spreadWithin) {
			return now
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the live nodes %v did not settle partition leaders: %v", live, last)
	return nil
}

// spreadNames are lease names, perPartition in each partition.
func spreadNames(prefix string, perPartition int) []string {
	var names []string
	counts := make([]int, partCount)
	for i := 0; len(names) < perPartition*partCount; i++ {
		name := fmt.Sprintf("%s-%d", prefix, i)
		if k := PartitionOf(name, partCount); counts[k] < perPartition {
			counts[k]++
			names = append(names, name)
		}
	}
	return names
}

func TestLeasesOverThreePartitionsRenewAtTheirLeadersThroughALeaderKill(t *testing.T) {
	d := startDevWith(t, devOptions{partitions: partCount})
	t.Cleanup(d.stop)
	ctx := context.Background()
	leaders := d.partitionLeaders(t, []int{1, 2, 3}, 15*time.Second)
	c := d.client(t)
	rec := &recorder{inner: c.t.http.Transport}
	c.t.http.Transport = rec
	if _, err := c.Cluster(ctx); err != nil || c.t.parts.size() != partCount {
		t.Fatalf("cluster: %v; partitions learned: %d", err, c.t.parts.size())
	}
	names := spreadNames(leaseName("go-part"), 2)
	var leases []*Lease
	for _, name := range names {
		l, err := c.Acquire(ctx, name, "keeper", partTTL)
		if err != nil {
			t.Fatalf("acquire %s: %v", name, err)
		}
		defer l.Release(ctx) //nolint:errcheck
		leases = append(leases, l)
		info, err := c.Get(ctx, name)
		if err != nil || info.Partition == nil || *info.Partition != PartitionOf(name, partCount) {
			t.Fatalf("get %s: %+v, %v", name, info, err)
		}
	}
	checkFirsts(t, c, names)

	// Steady state: each partition's renewals go to its leader.
	since := time.Now()
	time.Sleep(2 * partTTL)
	assertDirect(t, rec.renewals(since), []int{0, 1, 2}, 6)

	// kill -9 a node leading a partition (the fewest, when they are not
	// spread): every lease is kept, and the partitions it did not lead
	// renew on at their leaders meanwhile. (palisade dev restarts the node
	// half a second later; its partition has failed over by then, and
	// comes back to it, its home, a few seconds later.) Leaders spread over
	// their homes first, if they get there within 20 s: a partition away
	// from its home may move while the node is away.
	leaders = d.partitionLeaders(t, []int{1, 2, 3}, 20*time.Second)
	victim := fewest(leaders)
	if err := syscall.Kill(d.nodePid(t, victim), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	time.Sleep(3 * partTTL) // three ttls: held now means renewed past the kill
	assertHeld(t, leases)
	var untouched []int
	for k, l := range leaders {
		if l != victim {
			untouched = append(untouched, k)
		}
	}
	assertDirect(t, rec.renewals(killed), untouched, 12)

	// The failed-over partitions' renewals have found their new leader.
	since = time.Now()
	time.Sleep(partTTL)
	assertDirect(t, rec.renewals(since), []int{0, 1, 2}, 2)
	assertHeld(t, leases)
	for _, l := range leases {
		info, err := c.Get(ctx, l.Name())
		if err != nil || info.Holder != "keeper" || info.Token != l.Token() {
			t.Fatalf("%s: %+v, %v", l.Name(), info, err)
		}
	}
}

// checkFirsts: every lease call goes first to the endpoint of the node its
// partition's leader is known to be (the map filled in by the background
// identify: a bounded wait).
func checkFirsts(t *testing.T, c *Client, names []string) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ok := true
		for _, name := range names {
			leader := c.t.parts.leader(PartitionOf(name, partCount))
			if first := c.t.first("/v1/leases/" + name); first < 0 || uint64(first+1) != leader {
				ok = false
			}
		}
		if ok {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("lease calls do not go to their partition leaders first: %v", c.t.parts.leaders)
		}
	}
}

func fewest(leaders []int) int {
	count := map[int]int{}
	for _, l := range leaders {
		count[l]++
	}
	best := leaders[0]
	for l, n := range count {
		if n < count[best] {
			best = l
		}
	}
	return best
}

func assertHeld(t *testing.T, leases []*Lease) {
	t.Helper()
	for _, l := range leases {
		if !l.IsHeld() {
			t.Fatalf("lease %s lost: %v", l.Name(), l.Err())
		}
	}
}
