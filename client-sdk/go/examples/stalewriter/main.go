//go:build unix

// Command stalewriter walks through the stale writer, the story fencing
// exists for:
//
//  1. A holds the lease and writes.
//  2. A stops (SIGSTOP: a long GC pause, a frozen VM) past its ttl.
//  3. B takes the lease over (the gateway fence moves to B's token) and
//     writes.
//  4. A wakes and writes late: the SDK refuses it locally (A's safe
//     deadline has passed), and the same write sent anyway with A's old JWT
//     is refused by the gateway (409 stale_token). The object holds B's
//     value.
//
// A is this program run again as a child process, so it can really be
// stopped. Run it against palisade dev, configured like the CLI
// (PALISADE_ELECTION, PALISADE_GATEWAY, PALISADE_CA, PALISADE_API_KEY or
// PALISADE_API_KEY_FILE):
//
//	export PALISADE_API_KEY_FILE=<data-dir>/admin.key
//	go run ./examples/stalewriter [-lease orders] [-ttl 2s]
//
// It exits 0 when every step went as fencing promises, 1 otherwise.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"palisade.local/palisade"
)

const roleEnv = "PALISADE_STALEWRITER_ROLE"

func main() {
	lease := flag.String("lease", "orders", "the lease name (the object is <lease>/state)")
	ttl := flag.Duration("ttl", 2*time.Second, "A's ttl")
	flag.Parse()
	log.SetFlags(0)
	if os.Getenv(roleEnv) == "A" {
		if err := holderA(*lease, *ttl); err != nil {
			log.Fatalf("A: %v", err)
		}
		return
	}
	if err := walkthrough(*lease, *ttl); err != nil {
		log.Fatalf("stalewriter: %v", err)
	}
}

func client() (*palisade.Client, error) {
	cfg, err := palisade.ConfigFromEnv()
	if err != nil {
		return nil, err
	}
	return palisade.NewClient(cfg)
}

// holderA is process A: acquire, write, say READY, wait for "write" on
// stdin (it is stopped in between), then write late, twice.
func holderA(name string, ttl time.Duration) error {
	c, err := client()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx := context.Background()
	key := name + "/state"
	lease, err := c.Acquire(ctx, name, "A", ttl, palisade.WithWait(30*time.Second))
	if err != nil {
		return err
	}
	if _, err := lease.Put(ctx, key, []byte("from A")); err != nil {
		return err
	}
	jwt, err := lease.JWT()
	if err != nil {
		return err
	}
	fmt.Printf("A: holds %s with token %d and wrote %q\n", name, lease.Token(), "from A")
	fmt.Println("READY")
	line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
	if strings.TrimSpace(line) != "write" {
		return fmt.Errorf("expected \"write\", got %q", line)
	}
	fmt.Printf("A: awake; IsHeld() = %v\n", lease.IsHeld())
	// The SDK's own check: the safe deadline passed while A was stopped.
	_, err = lease.Put(ctx, key, []byte("late A"))
	switch {
	case errors.Is(err, palisade.ErrFenced):
		fmt.Printf("A: late write refused by the gateway: %v\n", err)
	case errors.Is(err, palisade.ErrLeaseLost):
		fmt.Printf("A: late write refused locally, nothing sent: %v\n", err)
	case err == nil:
		fmt.Println("A: LATE WRITE ACCEPTED")
		return errors.New("a stale write was accepted")
	default:
		return err
	}
	// The same write sent anyway with A's old JWT, as a client without the
	// SDK's deadline would: the gateway's fence refuses it.
	_, err = c.PutWithJWT(ctx, jwt, key, []byte("late A, raw"))
	var fenced *palisade.FencedError
	if !errors.As(err, &fenced) {
		fmt.Printf("A: RAW LATE WRITE NOT FENCED: %v\n", err)
		return errors.New("a stale write was not fenced")
	}
	fmt.Printf("A: the raw late write is refused by the gateway: token %d is below the fence %d\n", fenced.Token, fenced.Fence)
	fmt.Println("A: DONE")
	return nil
}

// startA starts A, a child process running this program as role A, and
// waits until it holds the lease: its stdin (where "write" makes it write
// late) and its stdout.
func startA() (*exec.Cmd, io.WriteCloser, *bufio.Scanner, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, nil, nil, err
	}
	a := exec.Command(exe, os.Args[1:]...)
	a.Env = append(os.Environ(), roleEnv+"=A")
	a.Stderr = os.Stderr
	stdin, err := a.StdinPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	stdout, err := a.StdoutPipe()
	if err != nil {
		return nil, nil, nil, err
	}
	if err := a.Start(); err != nil {
		return nil, nil, nil, err
	}
	out := bufio.NewScanner(stdout)
	for out.Scan() && out.Text() != "READY" {
		fmt.Println(out.Text())
	}
	if out.Err() != nil || out.Text() != "READY" {
		_ = a.Wait()
		return nil, nil, nil, fmt.Errorf("A did not get the lease")
	}
	return a, stdin, out, nil
}

func walkthrough(name string, ttl time.Duration) error {
	ctx := context.Background()
	key := name + "/state"
	a, stdin, out, err := startA()
	if err != nil {
		return err
	}
	defer func() {
		_ = a.Process.Signal(syscall.SIGCONT)
		_ = a.Process.Kill()
	}()

	fmt.Printf("-- A is paused (SIGSTOP) for more than its ttl of %v\n", ttl)
	if err := a.Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	stopped := time.Now()

	c, err := client()
	if err != nil {
		return err
	}
	defer c.Close()
	b, err := c.Acquire(ctx, name, "B", 10*time.Second, palisade.WithWait(30*time.Second))
	if err != nil {
		return fmt.Errorf("B: %w", err)
	}
	defer b.Release(ctx)
	fmt.Printf("B: took %s over with token %d (the gateway fence is at it now)\n", name, b.Token())
	if _, err := b.Put(ctx, key, []byte("from B")); err != nil {
		return fmt.Errorf("B: %w", err)
	}
	fmt.Printf("B: wrote %q\n", "from B")
	time.Sleep(time.Until(stopped.Add(ttl + 500*time.Millisecond)))

	fmt.Println("-- A wakes up (SIGCONT) and writes")
	if err := a.Process.Signal(syscall.SIGCONT); err != nil {
		return err
	}
	if _, err := fmt.Fprintln(stdin, "write"); err != nil {
		return err
	}
	done := false
	for out.Scan() {
		fmt.Println(out.Text())
		done = done || out.Text() == "A: DONE"
	}
	if err := a.Wait(); err != nil || !done {
		return fmt.Errorf("A failed: %v", err)
	}
	obj, err := c.GetObject(ctx, key)
	if err != nil {
		return err
	}
	fmt.Printf("%s = %q (written with token %d)\n", key, obj.Value, obj.Token)
	if string(obj.Value) != "from B" || obj.Token != b.Token() {
		return errors.New("the object does not hold B's write")
	}
	fmt.Println("OK: the paused leader's late writes were refused")
	return nil
}
