package palisade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// nextChange is the next event that is not a keep-alive (the watch's own
// 35 s silence bound ends a hung stream).
func nextChange(t *testing.T, w *PrefixWatch) WatchEvent {
	t.Helper()
	for {
		event, err := w.Next()
		if err != nil {
			t.Fatalf("the watch ended: %v", err)
		}
		if event.Kind != WatchProgress {
			return event
		}
	}
}

// One prefix watch follows every partition of palisade dev --partitions 3,
// and its cursor resumes each partition from its own index.
func TestOnePrefixWatchFollowsEveryPartitionAndResumesFromItsCursor(t *testing.T) {
	d := startDevWith(t, devOptions{partitions: partCount})
	t.Cleanup(d.stop)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := d.client(t)
	prefix := leaseName("go-watch")
	names := spreadNames(prefix, 2)
	grants := map[string]*Grant{}
	for _, name := range append([]string{"other-" + prefix}, names...) {
		g, err := c.AcquireGrant(ctx, name, "watcher", 10*time.Minute)
		if err != nil {
			t.Fatalf("acquire %s: %v", name, err)
		}
		grants[name] = g
	}
	w, err := c.WatchPrefix(ctx, prefix, WatchCursor{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for len(seen) < len(names) {
		event := nextChange(t, w)
		if event.Kind != WatchChanged || !strings.HasPrefix(event.LeaseName, prefix) {
			t.Fatalf("only changes under the prefix: %+v", event)
		}
		if event.Partition != PartitionOf(event.LeaseName, partCount) || event.Index != event.Lease.ModifyIndex {
			t.Fatalf("%s in partition %d at %d: %+v", event.LeaseName, event.Partition, event.Index, event.Lease)
		}
		seen[event.LeaseName] = true
	}
	cursor := w.Cursor()
	w.Close()
	if len(cursor.Indexes) != partCount || !cursor.Partitioned {
		t.Fatalf("a cursor of every partition: %+v", cursor)
	}

	// While no stream is open: a grant in one partition, a release in
	// another; resumed, the stream brings those two and nothing older.
	fresh := spreadNames(prefix+"-late", 1)[0]
	if _, err := c.AcquireGrant(ctx, fresh, "watcher", 10*time.Minute); err != nil {
		t.Fatal(err)
	}
	freed := ""
	for _, name := range names {
		if PartitionOf(name, partCount) != PartitionOf(fresh, partCount) {
			freed = name
		}
	}
	if err := c.ReleaseGrant(ctx, grants[freed].ID()); err != nil {
		t.Fatal(err)
	}
	w, err = c.WatchPrefix(ctx, prefix, cursor)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	after := map[string]bool{}
	for len(after) < 2 {
		event := nextChange(t, w)
		if event.LeaseName != fresh && event.LeaseName != freed {
			t.Fatalf("only what changed after %v: %+v", cursor, event)
		}
		after[event.LeaseName] = true
	}

	// A cursor of more partitions than the cluster has is refused.
	_, err = c.WatchPrefix(ctx, prefix, WatchCursor{Indexes: []uint64{0, 0, 0, 0}, Partitioned: true})
	if !errors.Is(err, ErrBadRequest) {
		t.Fatalf("four indexes on three partitions: %v", err)
	}
}

func TestWatchCursorTextAndQuery(t *testing.T) {
	c, err := ParseWatchCursor("9,3,6")
	if err != nil || c.String() != "9,3,6" || c.query() != "&indexes=9,3,6" {
		t.Fatalf("9,3,6: %+v %v", c, err)
	}
	if one, _ := ParseWatchCursor("7"); one.query() != "&index=7" {
		t.Fatalf("one index: %q", one.query())
	}
	if empty, _ := ParseWatchCursor(""); empty.query() != "" {
		t.Fatalf("empty: %q", empty.query())
	}
	if _, err := ParseWatchCursor("9,x"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("9,x: %v", err)
	}
	var moved WatchCursor
	moved.advance(2, 5, true)
	moved.advance(2, 4, true)
	if moved.String() != "0,0,5" || moved.query() != "&indexes=0,0,5" {
		t.Fatalf("advanced: %+v", moved)
	}
}

// streamOnce serves one NDJSON answer of lines, then blocks until the
// client goes away (or closes at once with end).
func streamOnce(t *testing.T, end bool, lines ...string) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("content-type", "application/x-ndjson")
		for _, line := range lines {
			fmt.Fprintln(w, line)
		}
		w.(http.Flusher).Flush()
		if !end {
			select {
			case <-r.Context().Done():
			case <-time.After(30 * time.Second):
			}
		}
	}))
	t.Cleanup(srv.Close)
	c, err := NewClient(Config{Election: []string{srv.URL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func TestWatchLinesMoveTheCursorOnlyPastWhatWasRead(t *testing.T) {
	ctx := context.Background()
	c := streamOnce(t, true,
		`{"index":4,"partition":1,"lease":{"lease":"jobs.a","token":4,"modify_index":4}}`,
		`{"index":6,"partition":1,"lease":{"lease":7}}`)
	w, err := c.WatchPrefix(ctx, "jobs.", WatchCursor{})
	if err != nil {
		t.Fatal(err)
	}
	if event, err := w.Next(); err != nil || event.Kind != WatchChanged || w.Cursor().String() != "0,4" {
		t.Fatalf("first line: %+v, %v, cursor %v", event, err, w.Cursor())
	}
	if _, err := w.Next(); !errors.Is(err, ErrProtocol) || w.Cursor().String() != "0,4" {
		t.Fatalf("a malformed lease: %v, cursor %v", err, w.Cursor())
	}

	c = streamOnce(t, true, `{"index":9,"partition":2,"error":"behind","message":"m"}`)
	w, err = c.WatchPrefix(ctx, "jobs.", WatchCursor{})
	if err != nil {
		t.Fatal(err)
	}
	var unavailable *UnavailableError
	if _, err := w.Next(); !errors.As(err, &unavailable) || w.Cursor().String() != "0,0,9" {
		t.Fatalf("behind: %v, cursor %v", err, w.Cursor())
	}
	if _, err := w.Next(); err != io.EOF {
		t.Fatalf("after the last line: %v", err)
	}
}

func TestWatchClosedWhileReadingEndsWithEOF(t *testing.T) {
	c := streamOnce(t, false, `{"index":1}`)
	w, err := c.WatchPrefix(context.Background(), "", WatchCursor{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Next(); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		w.Close()
	}()
	if _, err := w.Next(); err != io.EOF {
		t.Fatalf("closed while reading: %v", err)
	}
}
