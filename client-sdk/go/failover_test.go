//go:build linux

package palisade

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// L2 against real processes: a holder keeps its lease through a frozen
// Raft leader (SIGSTOP longer than the ttl, then SIGCONT), round after
// round. A renewal stuck on the frozen leader may take only its slice of
// the time left to the safe deadline; then it goes to the other nodes too
// (one of which leads within an election timeout), and the client follows
// the leader the answers name. Without that, a 3 s lease was lost to a 4 s
// freeze (the renewal waited out its whole time on the frozen node).

const (
	failoverTTL    = 3 * time.Second
	failoverFreeze = 4 * time.Second
	failoverRounds = 5
)

// settledLeader is the leader every node names once all three are ready
// (/readyz: a leader known, everything committed applied); it waits up to
// limit.
func (d *devCluster) settledLeader(t *testing.T, limit time.Duration) int {
	t.Helper()
	httpClient := &http.Client{Timeout: time.Second}
	var seen []any
	for end := time.Now().Add(limit); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		seen = seen[:0]
		for _, url := range d.election {
			var doc struct {
				Leader any `json:"leader"`
			}
			resp, err := httpClient.Get(url + "/readyz")
			if err == nil {
				if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&doc) != nil {
					doc.Leader = nil
				}
				resp.Body.Close()
			}
			seen = append(seen, doc.Leader)
		}
		first, ok := seen[0].(float64)
		agreed := ok && first > 0
		for _, s := range seen {
			agreed = agreed && s == seen[0]
		}
		if agreed {
			return int(first)
		}
	}
	t.Fatalf("the nodes did not settle on a leader within %v: %v", limit, seen)
	return 0
}

// logTails is the last lines of each election node's log (for a failure).
func (d *devCluster) logTails(lines int) string {
	var b strings.Builder
	for n := 1; n <= 3; n++ {
		text, err := os.ReadFile(filepath.Join(d.data, fmt.Sprintf("election-%d.log", n)))
		all := strings.Split(strings.TrimRight(string(text), "\n"), "\n")
		if len(all) > lines {
			all = all[len(all)-lines:]
		}
		fmt.Fprintf(&b, "--- node %d %v\n%s\n", n, err, strings.Join(all, "\n"))
	}
	return b.String()
}

// sleepToPhase sleeps until phase after the send time of l's last renewal
// (renewals go every ttl/3), at least 50 ms from now.
func sleepToPhase(l *Lease, phase time.Duration) {
	sent := l.Deadline().Add(-failoverTTL * 9 / 10) // deadline = send time + ttl - 10%
	at := sent.Add(phase)
	for at.Before(time.Now().Add(50 * time.Millisecond)) {
		at = at.Add(failoverTTL / 3)
	}
	time.Sleep(time.Until(at))
}

// freezeLeader SIGSTOPs node for failoverFreeze, then SIGCONTs it (also
// when the test fails); whether every lease was held at the end of the
// freeze.
func freezeLeader(t *testing.T, dev *devCluster, node int, leases []*Lease) (bool, string) {
	pid := dev.nodePid(t, node)
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
			t.Errorf("SIGCONT %d: %v", pid, err)
		}
	}()
	time.Sleep(failoverFreeze)
	// Past the ttl: held now means renewed through another node.
	held, why := true, ""
	for _, l := range leases {
		if !l.IsHeld() {
			held = false
			why += fmt.Sprintf(" %s: %v;", l.Name(), l.Err())
		}
	}
	return held, why
}

func TestALeaseRidesOutAFrozenLeaderFiveTimes(t *testing.T) {
	t.Parallel()
	dev := freshDev(t)
	ctx := context.Background()
	name := leaseName("freeze")
	// The default request timeout (2 s), batched renewals and one by one.
	// The clients' log lines show on failure; none after the test ends.
	var ended atomic.Bool
	t.Cleanup(func() { ended.Store(true) }) // runs after the clients' Close
	logf := func(c *Config) {
		c.Logf = func(format string, args ...any) {
			if !ended.Load() {
				t.Logf(format, args...)
			}
		}
	}
	batched := dev.client(t, logf)
	single := dev.client(t, logf, func(c *Config) { c.NoBatchRenewals = true })
	var leases []*Lease
	for i, c := range []*Client{batched, batched, single} {
		l, err := c.Acquire(ctx, fmt.Sprintf("%s-%d", name, i), "rider", failoverTTL)
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	for round := 0; round < failoverRounds; round++ {
		leader := dev.settledLeader(t, 30*time.Second)
		sleepToPhase(leases[round%len(leases)], 100*time.Millisecond+time.Duration(round)*200*time.Millisecond)
		if held, why := freezeLeader(t, dev, leader, leases); !held {
			t.Fatalf("round %d (node %d frozen %v): lost:%s\n%s", round+1, leader, failoverFreeze, why, dev.logTails(15))
		}
	}
	dev.settledLeader(t, 30*time.Second)
	for _, l := range leases {
		info, err := batched.Get(ctx, l.Name())
		if err != nil || !l.IsHeld() || info.Holder != "rider" || info.Token != l.Token() {
			t.Fatalf("%s after the freezes: held %v, %+v %v", l.Name(), l.IsHeld(), info, err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
