//go:build linux

package palisade

import (
	"context"
	"fmt"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// A real `palisade dev` cluster (3 election nodes and a gateway, with a
// policy) started by the tests from $PALISADE_BIN (default
// ../../target/debug/palisade), on free loopback ports in a temp dir.

const childRoleEnv = "PALISADE_GO_TEST_CHILD"

func TestMain(m *testing.M) {
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role))
	}
	code := m.Run()
	sharedMu.Lock()
	if shared != nil {
		shared.stop()
	}
	sharedMu.Unlock()
	if examplesDir != "" {
		os.RemoveAll(examplesDir)
	}
	os.Exit(code)
}

func palisadeBin(t testing.TB) string {
	bin := os.Getenv("PALISADE_BIN")
	if bin == "" {
		bin = filepath.Join("..", "..", "target", "debug", "palisade")
	}
	abs, err := filepath.Abs(bin)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := os.Stat(abs); err != nil || info.IsDir() || info.Mode()&0o111 == 0 {
		t.Fatalf("no palisade binary at %s (build it, or set PALISADE_BIN)", abs)
	}
	return abs
}

type devCluster struct {
	dir      string
	data     string
	cmd      *exec.Cmd
	exited   chan struct{}
	base     int
	gwPort   int
	election []string
	gateway  string
	keyFile  string
	apiKey   string
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// pickPorts is an election base port P (P..P+2 and the peer ports
// P+100..P+102 free) and a free gateway port, in 30000-31800.
func pickPorts(t testing.TB) (int, int) {
	rng := rand.New(rand.NewSource(time.Now().UnixNano() + int64(os.Getpid())))
	for i := 0; i < 200; i++ {
		base := 30000 + rng.Intn(1800-110)
		gw := 30000 + rng.Intn(1800)
		if gw >= base && gw <= base+102 {
			continue
		}
		ok := portFree(gw)
		for _, p := range []int{base, base + 1, base + 2, base + 100, base + 101, base + 102} {
			ok = ok && portFree(p)
		}
		if ok {
			return base, gw
		}
	}
	t.Fatal("no free ports in 30000-31800")
	return 0, 0
}

func startDev(t testing.TB) *devCluster {
	return startDevWith(t, devOptions{})
}

// devOptions: tls runs palisade dev --tls (https, client TLS, the CA in
// certs/ca.pem); prepare runs on the data dir before the first start (a
// policy of the test's own, say).
type devOptions struct {
	tls     bool
	prepare func(t testing.TB, data string)
	// partitions > 1 runs palisade dev --partitions N.
	partitions int
}

func startDevWith(t testing.TB, opts devOptions) *devCluster {
	bin := palisadeBin(t)
	dir, err := os.MkdirTemp("", "palisade-gotest-")
	if err != nil {
		t.Fatal(err)
	}
	last := ""
	for attempt := 0; attempt < 3; attempt++ { // ports can be taken between the check and the bind
		d := &devCluster{dir: dir, exited: make(chan struct{})}
		d.base, d.gwPort = pickPorts(t)
		d.data = filepath.Join(dir, fmt.Sprintf("data-%d", d.base))
		logPath := filepath.Join(dir, fmt.Sprintf("dev-%d.out", d.base))
		out, err := os.Create(logPath)
		if err != nil {
			t.Fatal(err)
		}
		if opts.prepare != nil {
			if err := os.MkdirAll(d.data, 0o700); err != nil {
				t.Fatal(err)
			}
			opts.prepare(t, d.data)
		}
		args := []string{"dev", "--data-dir", d.data,
			"--election-port", strconv.Itoa(d.base), "--gateway-port", strconv.Itoa(d.gwPort)}
		scheme := "http"
		if opts.partitions > 1 {
			// Steady elections: at dev's 60..120 ms timeout a loaded
			// machine moved partition leaders every few seconds.
			args = append(args, "--partitions", strconv.Itoa(opts.partitions), "--slow-elections")
		}
		if opts.tls {
			args, scheme = append(args, "--tls"), "https"
		}
		d.cmd = exec.Command(bin, args...)
		d.cmd.Stdout, d.cmd.Stderr = out, out
		// Its own process group (so nothing is left behind), and SIGTERM
		// if this test process dies first.
		d.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
		if err := d.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { _ = d.cmd.Wait(); close(d.exited); out.Close() }()
		deadline := time.Now().Add(60 * time.Second)
		up := false
		for time.Now().Before(deadline) && !up {
			select {
			case <-d.exited:
				deadline = time.Now()
			case <-time.After(50 * time.Millisecond):
			}
			text, _ := os.ReadFile(logPath)
			up = strings.Contains(string(text), "cluster is up")
		}
		if up {
			for i := 0; i < 3; i++ {
				d.election = append(d.election, fmt.Sprintf("%s://127.0.0.1:%d", scheme, d.base+i))
			}
			d.gateway = fmt.Sprintf("%s://127.0.0.1:%d", scheme, d.gwPort)
			d.keyFile = filepath.Join(d.data, "admin.key")
			key, err := os.ReadFile(d.keyFile)
			if err != nil {
				d.stop()
				t.Fatal(err)
			}
			d.apiKey = strings.TrimSpace(string(key))
			return d
		}
		text, _ := os.ReadFile(logPath)
		last = string(text)
		d.stopProcesses()
	}
	os.RemoveAll(dir)
	t.Fatalf("palisade dev did not come up:\n%s", last)
	return nil
}

var (
	sharedMu sync.Mutex
	shared   *devCluster
)

// sharedDev is one cluster for the tests that do not kill nodes, started on
// first use and stopped by TestMain.
func sharedDev(t testing.TB) *devCluster {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared == nil {
		shared = startDev(t)
	}
	return shared
}

// freshDev is a cluster of its own, for a test that kills nodes.
func freshDev(t testing.TB) *devCluster {
	d := startDev(t)
	t.Cleanup(d.stop)
	return d
}

// children are (pid, command line) of the live children of the dev process.
func (d *devCluster) children() map[int]string {
	found := map[int]string{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(stat)
		fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(fields) < 2 || fields[1] != strconv.Itoa(d.cmd.Process.Pid) {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		found[pid] = strings.ReplaceAll(string(cmdline), "\x00", " ")
	}
	return found
}

// nodePid is the pid of election node n (1..3).
func (d *devCluster) nodePid(t testing.TB, n int) int {
	needle := fmt.Sprintf("--listen 127.0.0.1:%d ", d.base+n-1)
	for pid, cmdline := range d.children() {
		if strings.Contains(cmdline+" ", needle) && strings.Contains(cmdline, " election ") {
			return pid
		}
	}
	t.Fatalf("election node %d is not running", n)
	return 0
}

// leader is the id of the current Raft leader (waits up to 10 s for one).
func (d *devCluster) leader(t testing.TB) int {
	c := d.client(t)
	for i := 0; i < 100; i++ {
		doc, err := c.Cluster(context.Background())
		if err == nil {
			if leader, ok := doc["leader"].(float64); ok && leader > 0 {
				return int(leader)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatal("no leader")
	return 0
}

// config is a client configuration for the cluster. Its retry budget is
// long: on a loaded machine the cluster may be without a leader for
// seconds, and these tests are about safety, not about how fast it heals.
func (d *devCluster) config() Config {
	return Config{Election: append([]string(nil), d.election...), Gateway: d.gateway, APIKey: d.apiKey,
		RetryBudget: testRetryBudget}
}

const testRetryBudget = 20 * time.Second

// client is a client of the cluster, closed at the end of the test.
func (d *devCluster) client(t testing.TB, adjust ...func(*Config)) *Client {
	cfg := d.config()
	for _, f := range adjust {
		f(&cfg)
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// env is the environment a client process needs (ConfigFromEnv).
func (d *devCluster) env() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PALISADE_") || strings.HasPrefix(kv, "PALISADE_BIN=") {
			env = append(env, kv)
		}
	}
	return append(env,
		"PALISADE_ELECTION="+strings.Join(d.election, ","),
		"PALISADE_GATEWAY="+d.gateway,
		"PALISADE_API_KEY_FILE="+d.keyFile)
}

// stopProcesses: SIGTERM, then SIGKILL to the whole process group after
// 10 s; then any child still alive.
func (d *devCluster) stopProcesses() {
	if d.cmd == nil || d.cmd.Process == nil {
		return
	}
	children := d.children()
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-d.cmd.Process.Pid, syscall.SIGKILL)
		<-d.exited
	}
	for pid := range children { // never left behind, even if dev was killed
		if cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); err == nil &&
			strings.Contains(string(cmdline), d.dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	d.cmd = nil
}

func (d *devCluster) stop() {
	d.stopProcesses()
	os.RemoveAll(d.dir)
}

var nameSeq struct {
	sync.Mutex
	n int
}

// leaseName is a lease name no other test (or run) uses.
func leaseName(prefix string) string {
	nameSeq.Lock()
	defer nameSeq.Unlock()
	nameSeq.n++
	return fmt.Sprintf("go-%s-%d-%d-%d", prefix, os.Getpid(), time.Now().UnixNano()%1_000_000, nameSeq.n)
}
