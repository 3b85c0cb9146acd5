// Command elector leads a loop only while it holds a lease: run several
// copies (each with its own -id) and exactly one of them writes its
// heartbeat, fenced; stop the leader (Ctrl-C, or kill -STOP it) and
// another takes over within a ttl.
//
// Configured like the CLI (PALISADE_ELECTION, PALISADE_GATEWAY,
// PALISADE_CA, PALISADE_API_KEY or PALISADE_API_KEY_FILE):
//
//	export PALISADE_API_KEY_FILE=<data-dir>/admin.key
//	go run ./examples/elector -id replica-1 &
//	go run ./examples/elector -id replica-2
//
// -for D stops it after D (default: until SIGINT or SIGTERM).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"
	"time"

	"palisade.local/palisade"
)

func main() {
	lease := flag.String("lease", "scheduler", "the lease to lead by (heartbeats go to <lease>/heartbeat)")
	host, _ := os.Hostname()
	id := flag.String("id", fmt.Sprintf("%s-%d", host, os.Getpid()), "this replica's identity")
	ttl := flag.Duration("ttl", 3*time.Second, "the lease's ttl")
	every := flag.Duration("every", 500*time.Millisecond, "how often the leader writes its heartbeat")
	runFor := flag.Duration("for", 0, "stop after this long (0: until SIGINT/SIGTERM)")
	flag.Parse()
	log.SetFlags(log.Ltime | log.Lmicroseconds)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *runFor > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *runFor)
		defer cancel()
	}
	cfg, err := palisade.ConfigFromEnv()
	if err != nil {
		log.Fatal(err)
	}
	client, err := palisade.NewClient(cfg)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()

	elector, err := palisade.NewElector(client, palisade.ElectorConfig{
		Lease:    *lease,
		Identity: *id,
		TTL:      *ttl,
		Callbacks: palisade.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				// ctx is cancelled the moment the lease may be lost.
				l := palisade.LeaseFromContext(ctx)
				log.Printf("%s: started leading (token %d)", *id, l.Token())
				lead(ctx, l, *id, *every)
			},
			OnStoppedLeading: func() { log.Printf("%s: stopped leading", *id) },
			OnNewLeader:      func(leader string) { log.Printf("%s: the leader is %s", *id, leader) },
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := elector.Run(ctx); err != nil {
		log.Fatal(err)
	}
	log.Printf("%s: done (%s)", *id, elector.StopReason())
}

// lead writes a heartbeat every tick until ctx is cancelled or a write is
// refused because another replica leads now.
func lead(ctx context.Context, l *palisade.Lease, id string, every time.Duration) {
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for n := 1; ; n++ {
		_, err := l.Put(ctx, l.Name()+"/heartbeat", []byte(fmt.Sprintf("%s tick %d", id, n)))
		switch {
		case errors.Is(err, palisade.ErrLeaseLost):
			log.Printf("%s: not leading any more: %v", id, err)
			return
		case err != nil && ctx.Err() == nil:
			log.Printf("%s: heartbeat %d failed: %v", id, n, err)
		case err == nil:
			log.Printf("%s: heartbeat %d", id, n)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}
