package palisade

// A prefix watch (GET /v1/watch): one stream of the changes to every lease
// under a prefix, read as WatchEvents. On a cluster of several partitions
// one stream follows all of them: each event names its partition, and a
// WatchCursor (one index per partition) says where to resume. The Rust
// SDK's PrefixWatch and WatchCursor, in Go.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

const (
	// watchSilentFor: a stream silent this long is taken for dead (the
	// server sends a keep-alive every 10 s by default).
	watchSilentFor = 35 * time.Second
	// watchMaxLine is the longest line accepted.
	watchMaxLine = 1 << 20
	// watchMaxPartitions: a partition number past this in a line is the
	// server's error (a cluster runs at most 64).
	watchMaxPartitions = 4096
)

// WatchKind says what a WatchEvent is.
type WatchKind int

const (
	// WatchChanged: a lease under the prefix changed (Lease is it as the
	// change at Index left it).
	WatchChanged WatchKind = iota
	// WatchDeleted: a free lease's record (LeaseName) was reclaimed.
	WatchDeleted
	// WatchProgress: a keep-alive; every change of Partition up to Index
	// has been sent.
	WatchProgress
)

// WatchEvent is one event of a PrefixWatch.
type WatchEvent struct {
	Kind WatchKind
	// Partition is the partition whose log Index is of (0 on a cluster of
	// one).
	Partition int
	Index     uint64
	// Lease is set for WatchChanged.
	Lease *LeaseInfo
	// LeaseName is set for WatchChanged and WatchDeleted.
	LeaseName string
}

// WatchCursor is where a watch resumes: the last index read of each
// partition, in partition order (empty: from the start). String gives
// "I0,I1,...", the form of GET /v1/watch?indexes=; ParseWatchCursor reads
// it back. A cursor of one index that no partitioned stream moved (a
// cluster of one partition) resumes as index=I, which every node reads.
type WatchCursor struct {
	Indexes     []uint64
	Partitioned bool
}

// ParseWatchCursor reads "I0,I1,..." ("" is from the start).
func ParseWatchCursor(text string) (WatchCursor, error) {
	if strings.TrimSpace(text) == "" {
		return WatchCursor{}, nil
	}
	parts := strings.Split(text, ",")
	indexes := make([]uint64, 0, len(parts))
	for _, part := range parts {
		index, err := strconv.ParseUint(strings.TrimSpace(part), 10, 64)
		if err != nil {
			return WatchCursor{}, badRequest("%q is not a list of indexes like 12,0,7", text)
		}
		indexes = append(indexes, index)
	}
	return WatchCursor{Indexes: indexes, Partitioned: len(indexes) > 1}, nil
}

func (c WatchCursor) String() string {
	parts := make([]string, len(c.Indexes))
	for i, index := range c.Indexes {
		parts[i] = strconv.FormatUint(index, 10)
	}
	return strings.Join(parts, ",")
}

// IndexOf is the last index read of partition (0: none).
func (c WatchCursor) IndexOf(partition int) uint64 {
	if partition < len(c.Indexes) {
		return c.Indexes[partition]
	}
	return 0
}

// query is the query that resumes from here.
func (c WatchCursor) query() string {
	switch {
	case len(c.Indexes) == 0:
		return ""
	case len(c.Indexes) == 1 && !c.Partitioned:
		return fmt.Sprintf("&index=%d", c.Indexes[0])
	default:
		return "&indexes=" + c.String()
	}
}

// advance moves partition on to index (never back).
func (c *WatchCursor) advance(partition int, index uint64, named bool) {
	for len(c.Indexes) <= partition {
		c.Indexes = append(c.Indexes, 0)
	}
	if index > c.Indexes[partition] {
		c.Indexes[partition] = index
	}
	c.Partitioned = c.Partitioned || named || len(c.Indexes) > 1
}

// PrefixWatch is an open prefix watch (Client.WatchPrefix). Read it with
// Next; once it ends (io.EOF, or an error), open another from Cursor to
// resume where it stopped. Close it when done.
type PrefixWatch struct {
	body   io.ReadCloser
	lines  *bufio.Scanner
	cancel context.CancelFunc
	// silence cuts the stream when a read waits watchSilentFor; it runs
	// only while Next reads.
	silence *time.Timer
	silent  atomic.Bool
	cursor  WatchCursor
	// ended is set by Close (from any goroutine) and at the stream's end.
	ended atomic.Bool
}

// WatchPrefix opens one stream of the changes to every lease whose name
// starts with prefix: first each such lease as it is now (after cursor; the
// zero WatchCursor: all of them), then every change, and a keep-alive per
// partition. Any node serves it; the first that answers is used. On a
// cluster of several partitions one stream follows all of them. The stream
// lives until Close, ctx's end, or the server ends it.
func (c *Client) WatchPrefix(ctx context.Context, prefix string, cursor WatchCursor) (*PrefixWatch, error) {
	start := WatchCursor{Indexes: append([]uint64(nil), cursor.Indexes...), Partitioned: cursor.Partitioned}
	path := "/v1/watch?prefix=" + url.QueryEscape(prefix) + start.query()
	t := c.t
	started := time.Now()
	last := "no node answered"
	order := t.orderFrom(-1)
	for _, index := range order {
		streamCtx, cancel := context.WithCancel(ctx)
		resp, err := t.openStream(streamCtx, cancel, t.urls[index]+path)
		switch {
		case err != nil:
			cancel()
			last = fmt.Sprintf("%s: %v", t.urls[index], err)
		case resp.StatusCode == 200:
			return newPrefixWatch(resp.Body, cancel, start), nil
		default:
			data, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
			resp.Body.Close()
			cancel()
			if resp.StatusCode != 503 && resp.StatusCode != 429 {
				return nil, errorFor(resp.StatusCode, data)
			}
			last = fmt.Sprintf("%s: %d", t.urls[index], resp.StatusCode)
		}
		if ctx.Err() != nil {
			return nil, &UnavailableError{Attempts: 1, Elapsed: time.Since(started), Last: last, Err: ctx.Err()}
		}
		t.moveOff(index)
	}
	return nil, &UnavailableError{Attempts: len(order), Elapsed: time.Since(started), Last: last}
}

// openStream sends GET target under ctx; the answer's headers must come
// within the request timeout, or cancel ends the request.
func (t *transport) openStream(ctx context.Context, cancel context.CancelFunc, target string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", target, nil)
	if err != nil {
		return nil, badRequest("%s: %v", target, err)
	}
	if t.cfg.APIKey != "" {
		req.Header.Set(APIKeyHeader, t.cfg.APIKey)
	}
	headers := time.AfterFunc(t.cfg.RequestTimeout, cancel)
	resp, err := t.http.Do(req)
	if !headers.Stop() && err == nil {
		// The timer fired as the headers came: the body is cut already.
		resp.Body.Close()
		return nil, fmt.Errorf("no answer within %v", t.cfg.RequestTimeout)
	}
	return resp, err
}

func newPrefixWatch(body io.ReadCloser, cancel context.CancelFunc, cursor WatchCursor) *PrefixWatch {
	w := &PrefixWatch{body: body, cancel: cancel, cursor: cursor}
	w.lines = bufio.NewScanner(body)
	w.lines.Buffer(make([]byte, 0, 64*1024), watchMaxLine)
	w.silence = time.AfterFunc(watchSilentFor, func() {
		w.silent.Store(true)
		cancel()
	})
	w.silence.Stop()
	return w
}

// Cursor is where a new watch resumes: the last index read of each
// partition.
func (w *PrefixWatch) Cursor() WatchCursor {
	return WatchCursor{Indexes: append([]uint64(nil), w.cursor.Indexes...), Partitioned: w.cursor.Partitioned}
}

// Close ends the stream; a Next in progress or after it answers io.EOF.
func (w *PrefixWatch) Close() {
	w.ended.Store(true)
	w.silence.Stop()
	w.cancel()
	w.body.Close()
}

// Next is the next event; io.EOF once the server closed the stream. A
// stream the server ends early (it fell behind: *UnavailableError; a
// policy reload took the right away: a *RequestError matching
// ErrUnauthorized or ErrForbidden) answers that error once, then io.EOF.
// Nothing for 35 s, not even a keep-alive, is an *UnavailableError.
func (w *PrefixWatch) Next() (WatchEvent, error) {
	for !w.ended.Load() {
		w.silence.Reset(watchSilentFor)
		scanned := w.lines.Scan()
		w.silence.Stop()
		if !scanned {
			err := w.lines.Err()
			silent, closed := w.silent.Load(), w.ended.Load()
			w.Close()
			switch {
			case closed:
				return WatchEvent{}, io.EOF
			case silent:
				return WatchEvent{}, &UnavailableError{Attempts: 1, Elapsed: watchSilentFor,
					Last: fmt.Sprintf("the watch sent nothing, not even a keep-alive, for %v", watchSilentFor)}
			case err == nil:
				return WatchEvent{}, io.EOF
			case errors.Is(err, bufio.ErrTooLong):
				return WatchEvent{}, &ProtocolError{Status: 200, Message: "a watch line longer than 1 MiB"}
			default:
				return WatchEvent{}, &UnavailableError{Attempts: 1, Last: "the watch was cut: " + err.Error(), Err: err}
			}
		}
		line := w.lines.Bytes()
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		event, err := w.event(line)
		if err != nil {
			w.Close()
		}
		return event, err
	}
	return WatchEvent{}, io.EOF
}

// watchLine is one line of the stream.
type watchLine struct {
	Index     *uint64         `json:"index"`
	Partition *int64          `json:"partition"`
	Lease     json.RawMessage `json:"lease"`
	LeaseName string          `json:"lease_name"`
	Deleted   bool            `json:"deleted"`
	Error     string          `json:"error"`
	Message   string          `json:"message"`
}

// event is one line as an event, or the error the stream ends with.
func (w *PrefixWatch) event(line []byte) (WatchEvent, error) {
	var doc watchLine
	if err := json.Unmarshal(line, &doc); err != nil {
		return WatchEvent{}, &ProtocolError{Status: 200, Message: "a watch line that is not JSON: " + err.Error()}
	}
	if doc.Index == nil {
		return WatchEvent{}, &ProtocolError{Status: 200, Message: "a watch line without an index"}
	}
	partition := 0
	if doc.Partition != nil {
		if *doc.Partition < 0 || *doc.Partition >= watchMaxPartitions {
			return WatchEvent{}, &ProtocolError{Status: 200, Message: fmt.Sprintf("a watch line whose partition is %d", *doc.Partition)}
		}
		partition = int(*doc.Partition)
	}
	event := WatchEvent{Kind: WatchProgress, Partition: partition, Index: *doc.Index}
	switch {
	case doc.Deleted:
		event.Kind, event.LeaseName = WatchDeleted, doc.LeaseName
	case len(doc.Lease) > 0 && string(doc.Lease) != "null":
		info, err := parseLeaseInfo(doc.Lease)
		if err != nil {
			// The cursor stays before a line it could not read.
			return WatchEvent{}, err
		}
		event.Kind, event.Lease, event.LeaseName = WatchChanged, info, info.Lease
	}
	w.cursor.advance(partition, event.Index, doc.Partition != nil)
	switch doc.Error {
	case "":
		return event, nil
	case "unauthorized", "forbidden":
		status := map[string]int{"unauthorized": 401, "forbidden": 403}[doc.Error]
		return WatchEvent{}, &RequestError{Status: status, Code: doc.Error, Message: doc.Message}
	default:
		return WatchEvent{}, &UnavailableError{Attempts: 1, Last: doc.Error + ": " + doc.Message}
	}
}
