//go:build linux

package palisade

import (
	"context"
	"errors"
	"testing"
	"time"
)

// The gateway as a store against a real palisade dev cluster: conditional
// writes (412 changing nothing, the lease still held; a stale token 409
// whatever the condition), HEAD, listing pages, the lease's newer fields.

func TestConditionalWritesHeadAndListingOnACluster(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	ctx := context.Background()
	name := leaseName("store")
	c := dev.client(t)
	l, err := c.Acquire(ctx, name, "A", 10*time.Second, WithWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	key := name + "/a"

	first, err := l.PutIf(ctx, key, []byte("one"), IfAbsent())
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.PutIf(ctx, key, []byte("two"), IfAbsent())
	var pe *PreconditionError
	if !errors.As(err, &pe) || pe.CurrentVersion == nil || *pe.CurrentVersion != first.Version || pe.Key != key {
		t.Fatalf("IfAbsent over an object: %v", err)
	}
	second, err := l.PutIf(ctx, key, []byte("three"), IfMatch(first.Version))
	if err != nil || second.Version <= first.Version {
		t.Fatalf("IfMatch(current): %+v %v", second, err)
	}
	if _, err := l.PutIf(ctx, key, []byte("four"), IfMatch(first.Version)); !errors.Is(err, ErrPreconditionFailed) {
		t.Fatalf("IfMatch(old): %v", err)
	}
	if _, err := l.PutIf(ctx, name+"/none", []byte("x"), IfExists()); !errors.As(err, &pe) || pe.CurrentVersion != nil {
		t.Fatalf("IfExists over nothing: %v", err)
	}
	if !l.IsHeld() {
		t.Fatal("a 412 cost the lease")
	}

	info, found, err := c.HeadObject(ctx, key)
	if err != nil || !found || info != (ObjectInfo{Key: key, Version: second.Version, Token: l.Token(), Size: 5}) {
		t.Fatalf("HEAD: %+v %v %v", info, found, err)
	}
	if obj, err := c.GetObject(ctx, key); err != nil || string(obj.Value) != "three" {
		t.Fatalf("a refused write changed the object: %v %v", obj, err)
	}
	if _, found, err := c.HeadObject(ctx, name+"/none"); found || err != nil {
		t.Fatalf("HEAD of nothing: %v %v", found, err)
	}

	for _, k := range []string{"c", "b", "d"} {
		if _, err := l.Put(ctx, name+"/"+k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	var keys []string
	opts := ListOptions{Prefix: name + "/", Limit: 2}
	for pages := 0; ; pages++ {
		page, err := c.ListObjects(ctx, opts)
		if err != nil || pages > 3 || len(page.Objects) > 2 {
			t.Fatalf("page %d: %+v %v", pages, page, err)
		}
		for _, o := range page.Objects {
			keys = append(keys, o.Key)
		}
		if !page.More {
			break
		}
		opts.After = page.Next
	}
	want := []string{name + "/a", name + "/b", name + "/c", name + "/d"}
	if len(keys) != len(want) || keys[0] != want[0] || keys[1] != want[1] || keys[2] != want[2] || keys[3] != want[3] {
		t.Fatalf("listed %v, want %v", keys, want)
	}
	if _, err := c.ListObjects(ctx, ListOptions{Limit: MaxListLimit + 1}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("limit 1001: %v", err)
	}

	if _, err := l.DeleteIf(ctx, key, IfMatch(first.Version)); !errors.Is(err, ErrPreconditionFailed) {
		t.Fatalf("DeleteIf(old): %v", err)
	}
	if res, err := l.DeleteIf(ctx, key, IfMatch(second.Version)); err != nil || !res.Deleted {
		t.Fatalf("DeleteIf(current): %+v %v", res, err)
	}
	if _, err := l.DeleteIf(ctx, key, IfExists()); !errors.As(err, &pe) || pe.CurrentVersion != nil {
		t.Fatalf("DeleteIf(IfExists) of nothing: %v", err)
	}

	lease, err := c.Get(ctx, name)
	if err != nil || lease.ExpiresInMillis == nil || lease.Revoked {
		t.Fatalf("lease: %+v %v", lease, err)
	}
}

func TestAStaleTokenIsRefusedWhateverTheConditionOnACluster(t *testing.T) {
	t.Parallel()
	dev := sharedDev(t)
	ctx := context.Background()
	name := leaseName("store-stale")
	key := name + "/state"
	c := dev.client(t)
	a, err := c.Acquire(ctx, name, "A", 10*time.Second, WithWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	written, err := a.Put(ctx, key, []byte("from A"))
	if err != nil {
		t.Fatal(err)
	}
	oldJWT, _ := a.JWT()
	if _, err := a.HandoverTo(ctx, "B"); err != nil {
		t.Fatal(err)
	}
	b, err := c.Acquire(ctx, name, "B", 10*time.Second, WithWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Release(ctx)
	for _, cond := range []Precondition{IfMatch(written.Version), IfExists(), IfAbsent()} {
		_, err := c.t.gatewayWrite(ctx, oldJWT, "PUT", "/v1/objects/"+EncodeKey(key), []byte("late"), cond)
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("%v with A's token: %v, want ErrFenced", cond, err)
		}
	}
	if obj, err := c.GetObject(ctx, key); err != nil || string(obj.Value) != "from A" {
		t.Fatalf("object: %v %v", obj, err)
	}
}
