package palisade

import (
	"context"
	"fmt"
	"net/http"
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
	version, _ := strconv.ParseUint(strings.Trim(ans.header.Get("etag"), `"W/`), 10, 64)
	token, _ := strconv.ParseUint(ans.header.Get("fencing-token"), 10, 64)
	return &Object{Value: ans.body, Version: version, Token: token}, nil
}

// gatewayWrite is one fenced gateway request stamped with jwt; the answer
// on 200, the mapped error otherwise.
func (t *transport) gatewayWrite(ctx context.Context, jwt, method, path string, content []byte) (*answer, error) {
	gw, err := t.gateway()
	if err != nil {
		return nil, err
	}
	url := gw + path
	started := time.Now()
	header := http.Header{}
	header.Set("authorization", "Bearer "+jwt)
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
