package palisade

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

// The gateway as a store against fake servers: listing pages, HEAD,
// conditional writes (412, and 409 whatever the condition), the
// conditions refused before sending, and the lease document's newer
// fields.

// storeClient is a client of a fake election (grants) and the gateway g,
// with a lease held.
func storeClient(t *testing.T, g *fakeServer) (*Client, *Lease) {
	t.Helper()
	election := newFake(t, func(r request) reply {
		if strings.HasSuffix(r.path, "/acquire") || strings.HasSuffix(r.path, "/renew") {
			return reply{status: 200, body: grantJSON("orders", "A", 7, 30000, nil)}
		}
		return reply{status: 200, body: map[string]any{}}
	})
	c := fakeClient(t, Config{NoJWTVerification: true, NoFenceOnAcquire: true, Gateway: g.URL}, election.URL)
	l, err := c.Acquire(context.Background(), "orders", "A", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Release(context.Background()) })
	return c, l
}

func TestListObjectsSendsTheQueryAndTypesThePage(t *testing.T) {
	g := newFake(t, scripted(
		reply{status: 200, body: map[string]any{"objects": []any{
			map[string]any{"key": "orders/a b", "version": 7, "token": 3, "size": 5},
			map[string]any{"key": "orders/b", "version": 9, "token": 4, "size": 0},
		}, "next": "orders/b"}},
		reply{status: 200, body: map[string]any{"objects": []any{}, "next": nil}},
	))
	c, _ := storeClient(t, g)
	ctx := context.Background()
	page, err := c.ListObjects(ctx, ListOptions{Prefix: "orders/a b&c+", After: "orders/0", Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	want := ObjectPage{Objects: []ObjectInfo{{"orders/a b", 7, 3, 5}, {"orders/b", 9, 4, 0}}, Next: "orders/b", More: true}
	if !reflect.DeepEqual(page, want) {
		t.Fatalf("page = %+v, want %+v", page, want)
	}
	last, err := c.ListObjects(ctx, ListOptions{})
	if err != nil || last.More || last.Next != "" || len(last.Objects) != 0 {
		t.Fatalf("last page = %+v, %v", last, err)
	}
	got := g.paths()
	if got[0] != "GET /v1/objects?limit=2&prefix=orders%2Fa%20b%26c%2B&after=orders%2F0" || got[1] != "GET /v1/objects" {
		t.Fatalf("requests: %v", got)
	}
}

func TestListObjectsErrors(t *testing.T) {
	g := newFake(t, scripted(
		reply{status: 400, body: map[string]any{"error": "invalid_request", "message": "limit"}},
		reply{status: 403, body: map[string]any{"error": "forbidden", "message": "no"}},
		reply{status: 200, body: map[string]any{"next": nil}},
	))
	c, _ := storeClient(t, g)
	ctx := context.Background()
	for _, limit := range []int{-1, MaxListLimit + 1} {
		if _, err := c.ListObjects(ctx, ListOptions{Limit: limit}); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("limit %d: %v", limit, err)
		}
	}
	if n := g.count(); n != 0 {
		t.Fatalf("%d requests for bad limits", n)
	}
	if _, err := c.ListObjects(ctx, ListOptions{Limit: 5}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("400: %v", err)
	}
	if _, err := c.ListObjects(ctx, ListOptions{}); !errors.Is(err, ErrForbidden) {
		t.Fatalf("403: %v", err)
	}
	if _, err := c.ListObjects(ctx, ListOptions{}); !errors.Is(err, ErrProtocol) {
		t.Fatalf("no objects: %v", err)
	}
}

func TestHeadObject(t *testing.T) {
	for _, etag := range []string{`"7"`, "7", `W/"7"`} {
		g := newFake(t, scripted(reply{status: 200, body: []byte{},
			header: map[string]string{"ETag": etag, "Fencing-Token": "3", "Content-Length": "5"}}))
		c, _ := storeClient(t, g)
		info, found, err := c.HeadObject(context.Background(), "orders/a b")
		if err != nil || !found || info != (ObjectInfo{"orders/a b", 7, 3, 5}) {
			t.Fatalf("etag %s: %+v %v %v", etag, info, found, err)
		}
		if p := g.paths(); p[0] != "HEAD /v1/objects/orders/a%20b" {
			t.Fatalf("requests: %v", p)
		}
	}
	g := newFake(t, scripted(
		reply{status: 404, body: []byte{}},
		reply{status: 401, body: []byte{}},
		reply{status: 200, body: []byte{}},
	))
	c, _ := storeClient(t, g)
	ctx := context.Background()
	if _, found, err := c.HeadObject(ctx, "orders/x"); found || err != nil {
		t.Fatalf("404: %v %v", found, err)
	}
	if _, _, err := c.HeadObject(ctx, "orders/x"); !errors.Is(err, ErrUnauthorized) {
		t.Fatalf("401: %v", err)
	}
	if _, _, err := c.HeadObject(ctx, "orders/x"); !errors.Is(err, ErrProtocol) {
		t.Fatalf("200 without headers: %v", err)
	}
}

func TestConditionalWritesSendTheirHeaders(t *testing.T) {
	g := newFake(t, scripted(reply{status: 200, body: map[string]any{"key": "orders/a", "version": 8, "token": 7}}))
	_, l := storeClient(t, g)
	ctx := context.Background()
	steps := []func() (*WriteResult, error){
		func() (*WriteResult, error) { return l.PutIf(ctx, "orders/a", []byte("x"), IfMatch(7)) },
		func() (*WriteResult, error) { return l.PutIf(ctx, "orders/a", []byte("x"), IfExists()) },
		func() (*WriteResult, error) { return l.PutIf(ctx, "orders/a", nil, IfAbsent()) },
		func() (*WriteResult, error) { return l.PutIf(ctx, "orders/a", []byte("x"), Precondition{}) },
		func() (*WriteResult, error) { return l.DeleteIf(ctx, "orders/a", IfMatch(8)) },
		func() (*WriteResult, error) { return l.DeleteIf(ctx, "orders/a", IfExists()) },
	}
	for i, step := range steps {
		if res, err := step(); err != nil || res.Version != 8 {
			t.Fatalf("step %d: %+v %v", i, res, err)
		}
	}
	var seen []string
	for _, r := range g.all() {
		if r.header.Get("authorization") != "Bearer not.a.jwt" {
			t.Fatalf("%s %s without the JWT", r.method, r.path)
		}
		seen = append(seen, r.method+" "+r.header.Get("If-Match")+"|"+r.header.Get("If-None-Match"))
	}
	want := []string{"PUT 7|", "PUT *|", "PUT |*", "PUT |", "DELETE 8|", "DELETE *|"}
	if !reflect.DeepEqual(seen, want) {
		t.Fatalf("sent %v, want %v", seen, want)
	}
	if _, err := l.DeleteIf(ctx, "orders/a", IfAbsent()); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("DeleteIf(IfAbsent): %v", err)
	}
	if n := g.count(); n != len(want) {
		t.Fatalf("%d requests, want %d", n, len(want))
	}
}

func TestA412IsAPreconditionErrorAndTheLeaseStaysHeld(t *testing.T) {
	seven := uint64(7)
	for _, current := range []*uint64{&seven, nil} {
		body := map[string]any{"error": "precondition_failed", "message": "not 6", "key": "orders/a", "current_version": nil}
		header := map[string]string{}
		if current != nil {
			body["current_version"] = *current
			header["ETag"] = "7"
		}
		g := newFake(t, scripted(reply{status: 412, body: body, header: header}))
		_, l := storeClient(t, g)
		_, err := l.PutIf(context.Background(), "orders/a", []byte("x"), IfMatch(6))
		var pe *PreconditionError
		if !errors.As(err, &pe) || !errors.Is(err, ErrPreconditionFailed) || errors.Is(err, ErrLeaseLost) || pe.Key != "orders/a" {
			t.Fatalf("err = %#v", err)
		}
		if !reflect.DeepEqual(pe.CurrentVersion, current) {
			t.Fatalf("current version %v, want %v", pe.CurrentVersion, current)
		}
		if _, err := l.DeleteIf(context.Background(), "orders/a", IfExists()); !errors.Is(err, ErrPreconditionFailed) {
			t.Fatalf("delete: %v", err)
		}
		if !l.IsHeld() || l.Err() != nil {
			t.Fatalf("the lease is not held after a 412: %v", l.Err())
		}
	}
}

func TestAStaleTokenIsFencedWhateverTheCondition(t *testing.T) {
	stale := map[string]any{"error": "stale_token", "token": 7, "fence": 9, "message": "stale"}
	g := newFake(t, scripted(reply{status: 409, body: stale}))
	_, l := storeClient(t, g)
	_, err := l.PutIf(context.Background(), "orders/a", []byte("x"), IfAbsent())
	var fenced *FencedError
	if !errors.As(err, &fenced) || fenced.Fence != 9 || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("err = %v", err)
	}
	if l.IsHeld() {
		t.Fatal("held after a fenced conditional write")
	}
}

func TestInvalidPreconditionIsBadRequest(t *testing.T) {
	g := newFake(t, scripted(reply{status: 400, body: map[string]any{"error": "invalid_precondition", "message": "both"}}))
	_, l := storeClient(t, g)
	_, err := l.PutIf(context.Background(), "orders/a", []byte("x"), IfMatch(1))
	var re *RequestError
	if !errors.Is(err, ErrBadRequest) || !errors.As(err, &re) || re.Code != "invalid_precondition" || !l.IsHeld() {
		t.Fatalf("err = %v, held %v", err, l.IsHeld())
	}
}

func TestTheLeaseDocumentWithAndWithoutTheNewerFields(t *testing.T) {
	base := map[string]any{"lease": "orders", "holder": "A", "token": 7, "ttl_ms": 5000, "transitions": 1, "modify_index": 12}
	newer := map[string]any{"lease": "orders", "holder": "A", "token": 7, "ttl_ms": 5000, "transitions": 1,
		"modify_index": 12, "expires_in_ms": 4200, "revoked": true,
		"acquire_time": "2026-11-28T01:02:03.456Z", "renew_time": "2026-11-28T01:02:05Z"}
	f := newFake(t, scripted(reply{status: 200, body: base}, reply{status: 200, body: newer}))
	c := fakeClient(t, noJWT(), f.URL)
	old, err := c.Get(context.Background(), "orders")
	if err != nil || old.ExpiresInMillis != nil || old.Revoked || old.AcquireTime != "" || old.RenewTime != "" {
		t.Fatalf("old = %+v, %v", old, err)
	}
	info, err := c.Get(context.Background(), "orders")
	if err != nil || info.ExpiresInMillis == nil || *info.ExpiresInMillis != 4200 || !info.Revoked ||
		info.AcquireTime != "2026-11-28T01:02:03.456Z" || info.RenewTime != "2026-11-28T01:02:05Z" {
		t.Fatalf("info = %+v, %v", info, err)
	}
}

func TestListAllObjectsWalksEveryPageAndStopsWhenNextStalls(t *testing.T) {
	obj := func(k string) map[string]any { return map[string]any{"key": k, "version": 1, "token": 1, "size": 0} }
	g := newFake(t, scripted(
		reply{status: 200, body: map[string]any{"objects": []any{obj("o/a")}, "next": "o/b"}},
		reply{status: 200, body: map[string]any{"objects": []any{}, "next": "o/c"}}, // a short page, next set
		reply{status: 200, body: map[string]any{"objects": []any{obj("o/d")}, "next": nil}},
		reply{status: 200, body: map[string]any{"objects": []any{obj("o/a")}, "next": "o/a"}},
		reply{status: 200, body: map[string]any{"objects": []any{}, "next": "o/a"}}, // next does not move
		reply{status: 200, body: map[string]any{"objects": []any{obj("o/a")}, "next": "o/b"}},
	))
	c, _ := storeClient(t, g)
	ctx := context.Background()
	var keys []string
	collect := func(o ObjectInfo) error { keys = append(keys, o.Key); return nil }
	if err := c.ListAllObjects(ctx, ListOptions{Prefix: "o/", Limit: 1}, collect); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(keys, []string{"o/a", "o/d"}) {
		t.Fatalf("walked %v", keys)
	}
	want := []string{
		"GET /v1/objects?limit=1&prefix=o%2F", "GET /v1/objects?limit=1&prefix=o%2F&after=o%2Fb",
		"GET /v1/objects?limit=1&prefix=o%2F&after=o%2Fc",
	}
	if got := g.paths(); !reflect.DeepEqual(got, want) {
		t.Fatalf("requests: %v", got)
	}
	if err := c.ListAllObjects(ctx, ListOptions{}, collect); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a stalled next: %v", err)
	}
	stop := errors.New("enough")
	if err := c.ListAllObjects(ctx, ListOptions{}, func(ObjectInfo) error { return stop }); err != stop {
		t.Fatalf("fn's error: %v", err)
	}
	if n := g.count(); n != 6 {
		t.Fatalf("%d requests, want 6", n)
	}
}
