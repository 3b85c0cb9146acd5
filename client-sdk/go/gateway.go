package palisade

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// The gateway calls: each sent once.

func (t *transport) gateway() (string, error) {
	if t.cfg.Gateway == "" {
		return "", badRequest("no gateway configured")
	}
	return t.cfg.Gateway, nil
}

// getObject reads key through the gateway (one request); ErrNotFound if
// there is no object.
func (t *transport) getObject(ctx context.Context, key string) (*Object, error) {
	gw, err := t.gateway()
	if err != nil {
		return nil, err
	}
	url := gw + "/v1/objects/" + EncodeKey(key)
	started := time.Now()
	ans, err := t.do(ctx, "GET", url, nil, "", nil, t.cfg.RequestTimeout)
	if err != nil {
		return nil, &UnavailableError{Attempts: 1, Elapsed: time.Since(started), Last: fmt.Sprintf("%s: %v", url, err), Err: ctx.Err()}
	}
	if ans.status != 200 {
		return nil, gatewayError(url, ans, started)
	}
	version, _ := versionOf(ans.header.Get("etag"))
	token, _ := strconv.ParseUint(ans.header.Get("fencing-token"), 10, 64)
	return &Object{Value: ans.body, Version: version, Token: token}, nil
}

// gatewayWrite is one fenced gateway request stamped with jwt, with the
// headers of cond (a precondition; none for the zero Precondition); the
// answer on 200, the mapped error otherwise (412: a *PreconditionError).
func (t *transport) gatewayWrite(ctx context.Context, jwt, method, path string, content []byte, cond Precondition) (*answer, error) {
	gw, err := t.gateway()
	if err != nil {
		return nil, err
	}
	url := gw + path
	started := time.Now()
	header := http.Header{}
	header.Set("authorization", "Bearer "+jwt)
	if cond.header != "" {
		header.Set(cond.header, cond.value)
	}
	ans, err := t.do(ctx, method, url, content, "application/octet-stream", header, t.cfg.RequestTimeout)
	if err != nil {
		return nil, &UnavailableError{Attempts: 1, Elapsed: time.Since(started), Last: fmt.Sprintf("%s: %v", url, err), Err: ctx.Err()}
	}
	if ans.status != 200 {
		return nil, gatewayError(url, ans, started)
	}
	return ans, nil
}

// gatewayError maps a gateway's error answer: 503 and 429 (no election node
// answered its key fetch, overload) are ErrUnavailable, the rest as any
// answer.
func gatewayError(url string, ans *answer, started time.Time) error {
	if ans.status == 503 || ans.status == 429 {
		return &UnavailableError{Attempts: 1, Elapsed: time.Since(started),
			Last: fmt.Sprintf("%s: %d %s", url, ans.status, ans.message())}
	}
	return ans.err()
}

// gatewayRead is one gateway request without a body; the answer whatever
// its status (ErrUnavailable on a transport failure).
func (t *transport) gatewayRead(ctx context.Context, method, path string) (*answer, string, time.Time, error) {
	gw, err := t.gateway()
	if err != nil {
		return nil, "", time.Time{}, err
	}
	url := gw + path
	started := time.Now()
	ans, err := t.do(ctx, method, url, nil, "", nil, t.cfg.RequestTimeout)
	if err != nil {
		return nil, url, started, &UnavailableError{Attempts: 1, Elapsed: time.Since(started), Last: fmt.Sprintf("%s: %v", url, err), Err: ctx.Err()}
	}
	return ans, url, started, nil
}

// headObject is HEAD of key: its version, token and size; found false on
// 404.
func (t *transport) headObject(ctx context.Context, key string) (ObjectInfo, bool, error) {
	ans, url, started, err := t.gatewayRead(ctx, "HEAD", "/v1/objects/"+EncodeKey(key))
	if err != nil {
		return ObjectInfo{}, false, err
	}
	switch ans.status {
	case 200:
	case 404:
		return ObjectInfo{}, false, nil
	default:
		return ObjectInfo{}, false, gatewayError(url, ans, started)
	}
	version, okV := versionOf(ans.header.Get("etag"))
	token, errT := strconv.ParseUint(ans.header.Get("fencing-token"), 10, 64)
	size, errS := strconv.ParseUint(ans.header.Get("content-length"), 10, 64)
	if !okV || errT != nil || errS != nil {
		return ObjectInfo{}, false, &ProtocolError{Status: 200, Message: "a HEAD answer without ETag, Fencing-Token or Content-Length"}
	}
	return ObjectInfo{Key: key, Version: version, Token: token, Size: size}, true, nil
}

// listObjects is one page of GET /v1/objects.
func (t *transport) listObjects(ctx context.Context, opts ListOptions) (ObjectPage, error) {
	if opts.Limit < 0 || opts.Limit > MaxListLimit {
		return ObjectPage{}, badRequest("the limit must be 1..=%d (0: the default), not %d", MaxListLimit, opts.Limit)
	}
	var query []string
	if opts.Limit > 0 {
		query = append(query, "limit="+strconv.Itoa(opts.Limit))
	}
	if opts.Prefix != "" {
		query = append(query, "prefix="+queryEscape(opts.Prefix))
	}
	if opts.After != "" {
		query = append(query, "after="+queryEscape(opts.After))
	}
	path := "/v1/objects"
	if len(query) > 0 {
		path += "?" + strings.Join(query, "&")
	}
	ans, url, started, err := t.gatewayRead(ctx, "GET", path)
	if err != nil {
		return ObjectPage{}, err
	}
	if ans.status != 200 {
		return ObjectPage{}, gatewayError(url, ans, started)
	}
	return parseObjectPage(ans)
}

func parseObjectPage(ans *answer) (ObjectPage, error) {
	var doc struct {
		Objects *[]ObjectInfo `json:"objects"`
		Next    *string       `json:"next"`
	}
	if err := ans.decode(&doc); err != nil {
		return ObjectPage{}, err
	}
	if doc.Objects == nil {
		return ObjectPage{}, &ProtocolError{Status: 200, Message: "a listing without its objects"}
	}
	page := ObjectPage{Objects: *doc.Objects}
	if doc.Next != nil {
		page.Next, page.More = *doc.Next, true
	}
	return page, nil
}

// queryEscape escapes s for a query value ("%20" for a space, not "+").
func queryEscape(s string) string {
	return strings.ReplaceAll(url.QueryEscape(s), "+", "%20")
}

// versionOf is the version an ETag names: a decimal, quoted or not (W/
// allowed).
func versionOf(etag string) (uint64, bool) {
	etag = strings.TrimPrefix(strings.TrimSpace(etag), "W/")
	if len(etag) >= 2 && etag[0] == '"' && etag[len(etag)-1] == '"' {
		etag = etag[1 : len(etag)-1]
	}
	v, err := strconv.ParseUint(etag, 10, 64)
	return v, err == nil
}
