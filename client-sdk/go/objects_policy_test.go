//go:build linux

package palisade

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// Listing under a policy, against a real palisade dev whose policy has a
// second principal, reader, that may read only the leases golist-a and
// golist-c: listing a prefix that spans golist-b too shows only its own
// objects, pages may be short (or empty) while Next is set, and Next still
// walks the whole prefix.

var policyKeys = []string{"golist-a/1", "golist-a/2", "golist-b/1", "golist-b/2", "golist-b/3", "golist-c/1"}

func policyWithAReader(t testing.TB, data string) {
	bin := palisadeBin(t)
	for _, args := range [][]string{
		{"policy", "init", "--dir", data},
		{"policy", "add", "--dir", data, "reader", "--read", "golist-a,golist-c"},
	} {
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			t.Fatalf("palisade %v: %v\n%s", args, err, out)
		}
	}
}

// listPages lists prefix page by page (limit a page) as the caller sees it.
func listPages(t *testing.T, c *Client, prefix string, limit int) []ObjectPage {
	t.Helper()
	var pages []ObjectPage
	opts := ListOptions{Prefix: prefix, Limit: limit}
	for {
		page, err := c.ListObjects(context.Background(), opts)
		if err != nil || len(pages) > len(policyKeys) {
			t.Fatalf("page %d: %+v %v", len(pages), page, err)
		}
		pages = append(pages, page)
		if !page.More {
			return pages
		}
		opts.After = page.Next
	}
}

func keysOf(pages []ObjectPage) []string {
	var keys []string
	for _, p := range pages {
		for _, o := range p.Objects {
			keys = append(keys, o.Key)
		}
	}
	return keys
}

func TestAReaderListsOnlyItsLeasesAndNextWalksTheWholePrefix(t *testing.T) {
	d := startDevWith(t, devOptions{prepare: policyWithAReader})
	t.Cleanup(d.stop)
	ctx := context.Background()
	admin := d.client(t)
	for _, lease := range []string{"golist-a", "golist-b", "golist-c"} {
		l, err := admin.Acquire(ctx, lease, "writer", 10*time.Second, WithWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range policyKeys {
			if strings.HasPrefix(k, lease+"/") {
				if _, err := l.Put(ctx, k, []byte(k)); err != nil {
					t.Fatal(err)
				}
			}
		}
		_ = l.Release(ctx)
	}
	key, err := os.ReadFile(filepath.Join(d.data, "reader.key"))
	if err != nil {
		t.Fatal(err)
	}
	reader := d.client(t, func(c *Config) { c.APIKey = strings.TrimSpace(string(key)) })

	mine := []string{"golist-a/1", "golist-a/2", "golist-c/1"}
	pages := listPages(t, reader, "golist-", 2)
	if got := keysOf(pages); !reflect.DeepEqual(got, mine) {
		t.Fatalf("the reader listed %v, want %v", got, mine)
	}
	// The scan is confined to what the reader may read: no Next names a
	// key of golist-b, the lease it may not read.
	for _, p := range pages {
		if strings.HasPrefix(p.Next, "golist-b/") {
			t.Fatalf("Next names a key the reader may not read: %+v", pages)
		}
	}
	every := listPages(t, admin, "golist-", 2)
	if got := keysOf(every); !reflect.DeepEqual(got, policyKeys) || len(every) <= len(pages) {
		t.Fatalf("the admin listed %v in %d pages (the reader's: %d)", got, len(every), len(pages))
	}

	var walked []string
	collect := func(o ObjectInfo) error { walked = append(walked, o.Key); return nil }
	if err := reader.ListAllObjects(ctx, ListOptions{Prefix: "golist-", Limit: 2}, collect); err != nil || !reflect.DeepEqual(walked, mine) {
		t.Fatalf("ListAllObjects: %v %v", walked, err)
	}
	walked = nil
	if err := reader.ListAllObjects(ctx, ListOptions{Prefix: "golist-b/"}, collect); err != nil || len(walked) != 0 {
		t.Fatalf("a lease it may not read: %v %v", walked, err)
	}
	if _, _, err := reader.HeadObject(ctx, "golist-b/1"); !errors.Is(err, ErrForbidden) {
		t.Fatalf("HEAD of a lease it may not read: %v", err)
	}
	if info, found, err := reader.HeadObject(ctx, "golist-a/1"); err != nil || !found || info.Size != uint64(len("golist-a/1")) {
		t.Fatalf("HEAD of its own: %+v %v %v", info, found, err)
	}
}
