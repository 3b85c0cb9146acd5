package palisade

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"
)

// jwksRefetchEvery is how often, at most, the JWKS is fetched again for a
// token signed by a key this client does not know (the Python SDK's and the
// gateway's --jwks-refetch-ms), and jwksWait how long a verification waits
// for a JWKS with its key (the gateway's --jwks-wait-ms).
const (
	jwksRefetchEvery = 100 * time.Millisecond
	jwksWait         = time.Second
)

// Claims are a lease JWT's claims.
type Claims struct {
	Issuer   string `json:"iss"`
	Subject  string `json:"sub"`
	Lease    string `json:"lease"`
	Token    uint64 `json:"token"`
	IssuedAt int64  `json:"iat"`
	Expiry   int64  `json:"exp"`
}

// jwtVerifier verifies lease JWTs (EdDSA, Ed25519) against the cluster's
// /v1/jwks: fetched on first use, and again when a token names a kid it
// does not know (after a key rotation, or the first key of a fresh
// cluster). Fetches start at most every 100 ms; an unknown kid is never
// refused on the strength of a fetch that started before the token
// arrived: it waits (up to 1 s) for fresh ones, each asking the node the
// client prefers and, when that node's set lacks the kid (a follower that
// has not applied the key yet), every other node once. Each fetch replaces
// the key set, so a retired key stops being trusted.
type jwtVerifier struct {
	t         *transport
	mu        sync.Mutex
	keys      map[string]ed25519.PublicKey
	lastStart time.Time
}

func protocolf(format string, args ...any) error {
	return &ProtocolError{Message: fmt.Sprintf(format, args...)}
}

// parseJWKS returns the Ed25519 keys of a JWKS document by kid.
func (v *jwtVerifier) parseJWKS(ans *answer) (map[string]ed25519.PublicKey, error) {
	var doc struct {
		Keys []struct {
			Kty string `json:"kty"`
			Crv string `json:"crv"`
			Kid string `json:"kid"`
			X   string `json:"x"`
			Alg string `json:"alg"`
		} `json:"keys"`
	}
	if err := ans.decode(&doc); err != nil {
		return nil, err
	}
	keys := map[string]ed25519.PublicKey{}
	for _, k := range doc.Keys {
		if k.Kid == "" || k.Kty != "OKP" || k.Crv != "Ed25519" || (k.Alg != "" && k.Alg != "EdDSA") {
			continue
		}
		x, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(k.X, "="))
		if err != nil || len(x) != ed25519.PublicKeySize {
			v.t.logf("palisade: ignoring JWKS key %s: not an Ed25519 public key", k.Kid)
			continue
		}
		keys[k.Kid] = ed25519.PublicKey(x)
	}
	return keys, nil
}

// fetch gets the JWKS through the retry loop and, if it lacks kid, from
// every other endpoint once; it keeps the set that has kid, else the first
// one (an empty set changes nothing).
func (v *jwtVerifier) fetch(ctx context.Context, kid string) error {
	v.lastStart = time.Now()
	ans, err := v.t.election(ctx, "GET", "/v1/jwks", nil, 0)
	if err != nil {
		return err
	}
	keys, err := v.parseJWKS(ans)
	if err != nil {
		return err
	}
	if _, ok := keys[kid]; !ok {
		first := int(v.t.preferred.Load() % uint64(len(v.t.cfg.Election)))
		for i := 1; i < len(v.t.cfg.Election); i++ {
			url := v.t.cfg.Election[(first+i)%len(v.t.cfg.Election)] + "/v1/jwks"
			other, err := v.t.do(ctx, "GET", url, nil, "", nil, v.t.cfg.RequestTimeout)
			if err != nil || other.status != 200 {
				continue
			}
			if set, err := v.parseJWKS(other); err == nil {
				if _, ok := set[kid]; ok {
					keys = set
					break
				}
			}
		}
	}
	if len(keys) > 0 {
		v.keys = keys
	}
	return nil
}

func (v *jwtVerifier) key(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	arrived := time.Now()
	v.mu.Lock()
	defer v.mu.Unlock()
	for {
		if key, ok := v.keys[kid]; ok {
			return key, nil
		}
		if !v.lastStart.IsZero() && time.Since(arrived)+jwksRefetchEvery > jwksWait && v.lastStart.After(arrived) {
			return nil, protocolf("the lease JWT is signed by unknown key %q", kid)
		}
		if wait := time.Until(v.lastStart.Add(jwksRefetchEvery)); wait > 0 && !v.lastStart.IsZero() {
			if !sleepCtx(ctx, wait) {
				return nil, &UnavailableError{Last: "waiting for the JWKS", Err: ctx.Err()}
			}
		}
		if err := v.fetch(ctx, kid); err != nil {
			return nil, err
		}
	}
}

func decodeSegment(segment string, what string) ([]byte, error) {
	data, err := base64.RawURLEncoding.DecodeString(segment)
	if err != nil {
		return nil, protocolf("the lease JWT's %s is not base64url: %v", what, err)
	}
	return data, nil
}

// verify checks g.JWT: alg EdDSA with a kid, an Ed25519 signature by that
// JWKS key, iss "palisade", sub and exp present, and lease, sub and token
// equal to the grant's. exp is not compared with the clock here (it is on
// the wall clock; the lease's safe deadline is kept on the monotonic clock
// instead), as in the Python SDK.
func (v *jwtVerifier) verify(ctx context.Context, g *Grant) (*Claims, error) {
	parts := strings.Split(g.JWT, ".")
	if len(parts) != 3 {
		return nil, protocolf("the lease JWT does not parse: %d segments", len(parts))
	}
	rawHeader, err := decodeSegment(parts[0], "header")
	if err != nil {
		return nil, err
	}
	var header struct {
		Alg string `json:"alg"`
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(rawHeader, &header); err != nil {
		return nil, protocolf("the lease JWT's header does not parse: %v", err)
	}
	if header.Alg != "EdDSA" || header.Kid == "" {
		return nil, protocolf("the lease JWT is not EdDSA with a kid (alg %q)", header.Alg)
	}
	signature, err := decodeSegment(parts[2], "signature")
	if err != nil {
		return nil, err
	}
	key, err := v.key(ctx, header.Kid)
	if err != nil {
		return nil, err
	}
	if len(signature) != ed25519.SignatureSize || !ed25519.Verify(key, []byte(parts[0]+"."+parts[1]), signature) {
		return nil, protocolf("the lease JWT's signature does not verify with key %q", header.Kid)
	}
	rawClaims, err := decodeSegment(parts[1], "claims")
	if err != nil {
		return nil, err
	}
	var present map[string]json.RawMessage
	if err := json.Unmarshal(rawClaims, &present); err != nil {
		return nil, protocolf("the lease JWT's claims do not parse: %v", err)
	}
	var claims Claims
	decoder := json.NewDecoder(bytes.NewReader(rawClaims))
	if err := decoder.Decode(&claims); err != nil {
		return nil, protocolf("the lease JWT's claims do not parse: %v", err)
	}
	for _, name := range []string{"iss", "sub", "exp", "lease", "token"} {
		if _, ok := present[name]; !ok {
			return nil, protocolf("the lease JWT has no %q claim", name)
		}
	}
	switch {
	case claims.Issuer != "palisade":
		return nil, protocolf("the lease JWT's iss is %q, not \"palisade\"", claims.Issuer)
	case claims.Lease != g.Lease:
		return nil, protocolf("the lease JWT's lease is %q, not %q", claims.Lease, g.Lease)
	case claims.Subject != g.Holder:
		return nil, protocolf("the lease JWT's sub is %q, not %q", claims.Subject, g.Holder)
	case claims.Token != g.Token:
		return nil, protocolf("the lease JWT's token is %d, not %d", claims.Token, g.Token)
	}
	return &claims, nil
}
