package palisade

import (
	"context"
	"fmt"
	"strconv"
)

// The gateway as a store: listing, HEAD and conditional writes.

// MaxListLimit is the most objects one ListObjects page may ask for.
const MaxListLimit = 1000

// ObjectInfo is what the gateway says of a stored object without its
// bytes: an entry of ListObjects, or HeadObject.
type ObjectInfo struct {
	// Key is the object key.
	Key string `json:"key"`
	// Version is its version (what IfMatch names; the ETag).
	Version uint64 `json:"version"`
	// Token is the fencing token of the write that stored it.
	Token uint64 `json:"token"`
	// Size is its length in bytes.
	Size uint64 `json:"size"`
}

// ObjectPage is one page of ListObjects.
type ObjectPage struct {
	// Objects are in byte order of their keys. Under a policy, objects of
	// leases the caller may not read are left out, so a page may hold fewer
	// than the limit while More is true.
	Objects []ObjectInfo
	// Next is the key to pass as ListOptions.After for the next page; ""
	// when More is false.
	Next string
	// More is true when more keys may follow (the server's "next" is not
	// null).
	More bool
}

// ListOptions selects a page of ListObjects.
type ListOptions struct {
	// Prefix is a plain string prefix of the keys (it may span leases);
	// "" lists every key.
	Prefix string
	// After is the key the page starts after (exclusive); "" from the
	// first key.
	After string
	// Limit is at most how many objects the page holds: 1..=MaxListLimit,
	// 0 for the server's default (100).
	Limit int
}

// Precondition is the condition of a conditional write (PutIf, DeleteIf),
// checked by the gateway in the same step as the fence. Make one with
// IfMatch, IfExists or IfAbsent; the zero Precondition is no condition.
type Precondition struct {
	header, value string
}

// IfMatch holds when the object exists with version v (If-Match: v).
func IfMatch(v uint64) Precondition {
	return Precondition{header: "If-Match", value: strconv.FormatUint(v, 10)}
}

// IfExists holds when the object exists, whatever its version (If-Match: *).
func IfExists() Precondition { return Precondition{header: "If-Match", value: "*"} }

// IfAbsent holds when there is no object (If-None-Match: *). PutIf only.
func IfAbsent() Precondition { return Precondition{header: "If-None-Match", value: "*"} }

// String shows the condition as its header.
func (p Precondition) String() string {
	if p.header == "" {
		return "no condition"
	}
	return p.header + ": " + p.value
}

// ListObjects is one page of the objects whose keys start with
// opts.Prefix, after opts.After, in byte order of the keys. While the
// page's More is true, pass its Next as After for the next page. Under a
// policy the API key needs the read right on each object's lease; objects
// it may not read are left out. ErrBadRequest for a bad limit (refused
// here before sending, or 400 invalid_request).
func (c *Client) ListObjects(ctx context.Context, opts ListOptions) (ObjectPage, error) {
	return c.t.listObjects(ctx, opts)
}

// HeadObject is key's version, token and size without its bytes (HEAD);
// found is false, with a nil error, when there is no object.
func (c *Client) HeadObject(ctx context.Context, key string) (info ObjectInfo, found bool, err error) {
	return c.t.headObject(ctx, key)
}

// PutIf is Put under a condition: IfMatch(version), IfExists() or
// IfAbsent(). When it does not hold the gateway changes nothing and the
// error is a *PreconditionError (ErrPreconditionFailed; the lease is still
// held). A stale token is a *FencedError whatever the condition, and the
// lease is marked lost. Other errors as Put.
func (l *Lease) PutIf(ctx context.Context, key string, value []byte, cond Precondition) (*WriteResult, error) {
	if value == nil {
		value = []byte{}
	}
	return l.writeResult(l.write(ctx, "PUT", "/v1/objects/"+EncodeKey(key), value, cond))
}

// DeleteIf is Delete under a condition: IfMatch(version) or IfExists()
// (IfAbsent is refused here with ErrBadRequest, before sending). Errors as
// PutIf.
func (l *Lease) DeleteIf(ctx context.Context, key string, cond Precondition) (*WriteResult, error) {
	if cond.header == "If-None-Match" {
		return nil, badRequest("a delete takes IfMatch or IfExists, not IfAbsent")
	}
	return l.writeResult(l.write(ctx, "DELETE", "/v1/objects/"+EncodeKey(key), nil, cond))
}

// ListAllObjects calls fn with every object whose key starts with
// opts.Prefix (after opts.After, if set), in byte order of the keys, page
// by page (opts.Limit objects a page; 0: the server's default), until the
// last page. It stops at the first error: fn's (returned as is), a page's
// (as ListObjects), ctx's, or an *ProtocolError (ErrProtocol) when a
// page's Next does not move past the key the page started after, so a
// misbehaving server cannot make it loop. Under a policy, objects the key
// may not read are left out, as in ListObjects, and the walk still covers
// the whole prefix.
func (c *Client) ListAllObjects(ctx context.Context, opts ListOptions, fn func(ObjectInfo) error) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		page, err := c.ListObjects(ctx, opts)
		if err != nil {
			return err
		}
		for _, o := range page.Objects {
			if err := fn(o); err != nil {
				return err
			}
		}
		if !page.More {
			return nil
		}
		if page.Next <= opts.After { // "" too: Next must move forward
			return &ProtocolError{Status: 200,
				Message: fmt.Sprintf("a listing's next %q does not move past %q", page.Next, opts.After)}
		}
		opts.After = page.Next
	}
}
