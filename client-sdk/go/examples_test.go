//go:build linux

package palisade

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The two examples, built and run against the dev cluster as a user would.

var (
	examplesOnce  sync.Once
	examplesDir   string
	examplesBuild error
	examplesOut   []byte
)

func buildExamples(t *testing.T) string {
	examplesOnce.Do(func() {
		dir, err := os.MkdirTemp("", "palisade-go-examples-")
		if err != nil {
			examplesBuild = err
			return
		}
		examplesDir = dir
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goBin); err != nil {
			goBin = "go"
		}
		cmd := exec.Command(goBin, "build", "-o", dir+string(filepath.Separator), "./examples/...")
		cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOPROXY=off", "CGO_ENABLED=0")
		examplesOut, examplesBuild = cmd.CombinedOutput()
	})
	if examplesBuild != nil {
		t.Fatalf("go build ./examples/...: %v\n%s", examplesBuild, examplesOut)
	}
	return examplesDir
}

func runExample(t *testing.T, dev *devCluster, timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(buildExamples(t), name), args...)
	cmd.Env = dev.env()
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.String(), err
}

func TestTheStaleWriterExample(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	name := leaseName("stalewriter")
	buildExamples(t)
	out, err := runExample(t, dev, 120*time.Second, "stalewriter", "-lease", name, "-ttl", "3s")
	if err != nil {
		t.Fatalf("stalewriter: %v\n%s", err, out)
	}
	for _, want := range []string{"A: awake; IsHeld() = false", "refused locally", "refused by the gateway: token", "OK:"} {
		if !strings.Contains(out, want) {
			t.Fatalf("no %q in:\n%s", want, out)
		}
	}
	obj, err := dev.client(t).GetObject(context.Background(), name+"/state")
	if err != nil || string(obj.Value) != "from B" {
		t.Fatalf("object %+v %v", obj, err)
	}
}

func TestTheElectorExample(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	name := leaseName("elector-example")
	buildExamples(t) // before r1 starts, so r2 starts after it
	type result struct {
		out string
		err error
	}
	first := make(chan result, 1)
	go func() {
		out, err := runExample(t, dev, 30*time.Second, "elector", "-lease", name, "-id", "r1", "-ttl", "2s", "-for", "3s")
		first <- result{out, err}
	}()
	time.Sleep(500 * time.Millisecond)
	out2, err2 := runExample(t, dev, 30*time.Second, "elector", "-lease", name, "-id", "r2", "-ttl", "2s", "-for", "6s")
	r1 := <-first
	if r1.err != nil || err2 != nil {
		t.Fatalf("r1: %v\n%s\nr2: %v\n%s", r1.err, r1.out, err2, out2)
	}
	// (r1 may also lose its lease to a starved cluster before its time is
	// up: then it stops leading for that reason, and campaigns again.)
	for _, want := range []string{"r1: started leading", "r1: heartbeat 1", "r1: stopped leading", "r1: done ("} {
		if !strings.Contains(r1.out, want) {
			t.Fatalf("no %q in r1's output:\n%s", want, r1.out)
		}
	}
	for _, want := range []string{"r2: started leading", "r2: heartbeat 1", "r2: the leader is r2"} {
		if !strings.Contains(out2, want) {
			t.Fatalf("no %q in r2's output:\n%s", want, out2)
		}
	}
	obj, err := dev.client(t).GetObject(context.Background(), name+"/heartbeat")
	if err != nil || !strings.HasPrefix(string(obj.Value), "r2 tick ") {
		t.Fatalf("heartbeat %+v %v", obj, err)
	}
}
