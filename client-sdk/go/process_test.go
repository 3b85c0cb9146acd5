//go:build linux

package palisade

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Real processes: a holder SIGSTOPped past its ttl (the test binary run
// again as a child), and an election node SIGKILLed in the middle of a
// blocking acquire.

// sample is one look of the child at its lease: monotonic nanoseconds
// since it acquired, before and after asking.
type sample struct {
	Before int64 `json:"b"`
	After  int64 `json:"a"`
	Held   bool  `json:"h"`
	CtxOK  bool  `json:"c"` // the lease context's Err() was nil
}

type childReport struct {
	Samples []sample `json:"samples"`
	Late    string   `json:"late"`
	DoneSet bool     `json:"done_set"`
	Err     string   `json:"err"`
}

func runChild(role string) int {
	switch role {
	case "paused-holder":
		if err := pausedHolder(); err != nil {
			fmt.Fprintln(os.Stderr, "child:", err)
			return 1
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown child role", role)
	return 2
}

// pausedHolder acquires, writes, then looks at IsHeld (and the lease
// context) every 2 ms until 1 s after it wakes from a pause longer than
// the ttl; then writes again and reports.
func pausedHolder() error {
	name := os.Getenv("PALISADE_GO_TEST_LEASE")
	ttl, err := time.ParseDuration(os.Getenv("PALISADE_GO_TEST_TTL"))
	if err != nil {
		return err
	}
	cfg, err := ConfigFromEnv()
	if err != nil {
		return err
	}
	cfg.RetryBudget = testRetryBudget
	client, err := NewClient(cfg)
	if err != nil {
		return err
	}
	defer client.Close()
	ctx := context.Background()
	lease, err := client.Acquire(ctx, name, "child", ttl, WithWait(30*time.Second))
	if err != nil {
		return err
	}
	if _, err := lease.Put(ctx, name+"/state", []byte("from child")); err != nil {
		return err
	}
	leaderCtx, cancel := lease.Context(ctx)
	defer cancel()
	fmt.Printf("ACQUIRED %d\n", lease.Token())
	start := time.Now()
	var samples []sample
	var woke time.Duration = -1
	for time.Since(start) < 120*time.Second {
		before := time.Since(start)
		held := lease.IsHeld()
		ctxOK := leaderCtx.Err() == nil
		samples = append(samples, sample{Before: int64(before), After: int64(time.Since(start)), Held: held, CtxOK: ctxOK})
		if n := len(samples); n > 1 && woke < 0 && time.Duration(samples[n-1].Before-samples[n-2].Before) > ttl {
			woke = before
		}
		if woke >= 0 && before-woke > time.Second {
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	report := childReport{Samples: samples}
	_, err = lease.Put(ctx, name+"/state", []byte("late child"))
	switch {
	case err == nil:
		report.Late = "written"
	case errors.Is(err, ErrFenced):
		report.Late = "fenced"
	case errors.Is(err, ErrLeaseLost):
		report.Late = "lost"
	default:
		report.Late = "error"
	}
	if err != nil {
		report.Err = err.Error()
	}
	select {
	case <-lease.Done():
		report.DoneSet = true
	default:
	}
	out, _ := json.Marshal(report)
	fmt.Println(string(out))
	_ = lease.Release(ctx)
	return nil
}

// lineWriter hands each complete line written to it to lines.
type lineWriter struct {
	mu    sync.Mutex
	buf   []byte
	lines chan string
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.lines <- string(w.buf[:i])
		w.buf = w.buf[i+1:]
	}
}

func nextLine(t *testing.T, lines <-chan string, timeout time.Duration, stderr func() string) string {
	t.Helper()
	select {
	case line := <-lines:
		return line
	case <-time.After(timeout):
		t.Fatalf("the child said nothing within %v; stderr: %s", timeout, stderr())
		return ""
	}
}

func TestAHolderStoppedPastItsTTLIsNeverHeldAfterWaking(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	name := leaseName("paused")
	const ttl = 3 * time.Second
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	child := exec.Command(exe, "-test.run=^$")
	child.Env = append(dev.env(), childRoleEnv+"=paused-holder",
		"PALISADE_GO_TEST_LEASE="+name, "PALISADE_GO_TEST_TTL="+ttl.String())
	var stderr strings.Builder
	var stderrMu sync.Mutex
	child.Stderr = writerFunc(func(p []byte) (int, error) {
		stderrMu.Lock()
		defer stderrMu.Unlock()
		return stderr.Write(p)
	})
	errText := func() string {
		stderrMu.Lock()
		defer stderrMu.Unlock()
		return stderr.String()
	}
	out := &lineWriter{lines: make(chan string, 16)}
	child.Stdout = out
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = child.Wait(); close(exited) }()
	t.Cleanup(func() {
		select {
		case <-exited:
		default:
			_ = child.Process.Signal(syscall.SIGCONT)
			_ = child.Process.Kill()
			<-exited
		}
	})

	line := nextLine(t, out.lines, 60*time.Second, errText)
	if !strings.HasPrefix(line, "ACQUIRED ") {
		t.Fatalf("child: %q; stderr: %s", line, errText())
	}
	childToken, _ := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(line, "ACQUIRED ")), 10, 64)
	time.Sleep(time.Second)
	if err := child.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stoppedAt := time.Now()
	continued := false
	defer func() {
		if !continued {
			_ = child.Process.Signal(syscall.SIGCONT)
		}
	}()
	// While it sleeps, another holder takes over and writes.
	ctx := context.Background()
	client := dev.client(t)
	// (Under heavy load the Raft leader may change, and each new leader
	// gives the stopped child's grant a full ttl again: wait long enough.)
	lease, err := client.Acquire(ctx, name, "parent", 10*time.Second, WithWait(60*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if lease.Token() <= childToken {
		t.Fatalf("parent token %d, child token %d", lease.Token(), childToken)
	}
	if _, err := lease.Put(ctx, name+"/state", []byte("from parent")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(stoppedAt.Add(ttl + time.Second)))
	if err := child.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	continued = true

	line = nextLine(t, out.lines, 60*time.Second, errText)
	select {
	case <-exited:
	case <-time.After(20 * time.Second):
		t.Fatal("the child did not exit")
	}
	if code := child.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("child exit %d; stderr: %s", code, errText())
	}
	var report childReport
	if err := json.Unmarshal([]byte(line), &report); err != nil {
		t.Fatalf("report %q: %v", line, err)
	}
	samples := report.Samples
	if len(samples) < 2 {
		t.Fatalf("%d samples", len(samples))
	}
	stop := 0
	for i := 1; i < len(samples); i++ {
		if samples[i].Before-samples[i-1].Before > samples[stop+1].Before-samples[stop].Before {
			stop = i - 1
		}
	}
	gap := time.Duration(samples[stop+1].Before - samples[stop].Before)
	if gap <= ttl {
		t.Fatalf("the child was not stopped past its ttl (longest gap %v)", gap)
	}
	heldBefore := false
	for _, s := range samples[:stop+1] {
		heldBefore = heldBefore || s.Held
	}
	after := samples[stop+1:]
	if !heldBefore {
		t.Fatal("the child never held the lease")
	}
	if len(after) == 0 {
		t.Fatal("no samples after waking")
	}
	for _, s := range after {
		if s.Held || s.CtxOK {
			t.Fatalf("after waking: IsHeld %v, lease context Err() nil %v (at %v)", s.Held, s.CtxOK, time.Duration(s.Before))
		}
	}
	if report.Late != "lost" && report.Late != "fenced" {
		t.Fatalf("the late write: %s (%s)", report.Late, report.Err)
	}
	if !report.DoneSet {
		t.Fatal("Done was not closed")
	}
	obj, err := client.GetObject(ctx, name+"/state")
	if err != nil || string(obj.Value) != "from parent" || obj.Token != lease.Token() {
		t.Fatalf("object %+v, err %v", obj, err)
	}
	t.Logf("stopped %v; %d samples after waking, none held; late write: %s (%s)", gap, len(after), report.Late, report.Err)
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestAnElectionNodeKilledDuringABlockingAcquire(t *testing.T) {
	t.Parallel()
	dev := freshDev(t)
	name := leaseName("kill")
	leader := dev.leader(t)
	// The client talks to the leader first.
	order := []int{leader}
	for n := 1; n <= 3; n++ {
		if n != leader {
			order = append(order, n)
		}
	}
	client := dev.client(t, func(c *Config) {
		c.Election = nil
		for _, n := range order {
			c.Election = append(c.Election, dev.election[n-1])
		}
	})
	ctx := context.Background()
	old, err := client.AcquireGrant(ctx, name, "H", 2*time.Second) // never renewed
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		lease *Lease
		err   error
	}
	done := make(chan result, 1)
	started := time.Now()
	go func() {
		l, err := client.Acquire(ctx, name, "C", 5*time.Second, WithWait(40*time.Second))
		done <- result{l, err}
	}()
	time.Sleep(500 * time.Millisecond)
	select {
	case r := <-done:
		t.Fatalf("the acquire ended before the kill: %v %v", r.lease, r.err)
	default:
	}
	if err := syscall.Kill(dev.nodePid(t, leader), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	var r result
	select {
	case r = <-done:
	case <-time.After(50 * time.Second):
		t.Fatal("the acquire did not complete")
	}
	if r.err != nil {
		t.Fatalf("acquire: %v", r.err)
	}
	l := r.lease
	if l.Token() <= old.Token || !l.IsHeld() {
		t.Fatalf("token %d (old %d), held %v", l.Token(), old.Token, l.IsHeld())
	}
	if p := client.t.preferred.Load() % 3; p == 0 {
		t.Fatal("the client still prefers the dead node")
	}
	doc, err := client.Cluster(ctx)
	if err != nil || int(doc["leader"].(float64)) == leader {
		t.Fatalf("cluster after the kill: %v %v", doc, err)
	}
	if _, err := l.Put(ctx, name+"/x", []byte("after the kill")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second) // renewals go on without the dead node
	if !l.IsHeld() {
		t.Fatalf("lost after the kill: %v", l.Err())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	info, err := client.Get(ctx, name)
	if err != nil || info.Holder != "" {
		t.Fatalf("after release: %+v %v", info, err)
	}
	t.Logf("granted %v after the acquire started, %v after the kill", time.Since(started).Round(time.Millisecond), time.Since(killedAt).Round(time.Millisecond))
}
