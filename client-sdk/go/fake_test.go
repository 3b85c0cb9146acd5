package palisade

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// reply is what the fake server answers: a status and a JSON body, with
// headers; delay first; cut closes the connection without answering.
type reply struct {
	status int
	body   any
	header map[string]string
	delay  time.Duration
	cut    bool
}

type request struct {
	method string
	path   string
	body   []byte
	header http.Header
	at     time.Time
}

func (r request) json(t *testing.T) map[string]any {
	t.Helper()
	var doc map[string]any
	if err := json.Unmarshal(r.body, &doc); err != nil {
		t.Fatalf("request body %q: %v", r.body, err)
	}
	return doc
}

// fakeServer is a scriptable HTTP server on loopback that records every
// request; answers come from route.
type fakeServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests []request
	route    func(request) reply
}

func newFake(t *testing.T, route func(request) reply) *fakeServer {
	t.Helper()
	f := &fakeServer{route: route}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req := request{method: r.Method, path: r.URL.RequestURI(), body: body, header: r.Header.Clone(), at: time.Now()}
		f.mu.Lock()
		f.requests = append(f.requests, req)
		f.mu.Unlock()
		rep := f.route(req)
		if rep.delay > 0 {
			select {
			case <-time.After(rep.delay):
			case <-r.Context().Done():
				return
			}
		}
		if rep.cut {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				if tcp, ok := conn.(*net.TCPConn); ok {
					_ = tcp.SetLinger(0)
				}
				conn.Close()
			}
			return
		}
		for k, v := range rep.header {
			w.Header().Set(k, v)
		}
		w.Header().Set("content-type", "application/json")
		w.WriteHeader(rep.status)
		if raw, ok := rep.body.([]byte); ok {
			_, _ = w.Write(raw)
		} else {
			_ = json.NewEncoder(w).Encode(rep.body)
		}
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeServer) all() []request {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]request(nil), f.requests...)
}

func (f *fakeServer) count() int { return len(f.all()) }

func (f *fakeServer) paths() []string {
	var paths []string
	for _, r := range f.all() {
		paths = append(paths, r.method+" "+r.path)
	}
	return paths
}

// scripted answers replies in order, repeating the last.
func scripted(replies ...reply) func(request) reply {
	var mu sync.Mutex
	i := 0
	return func(request) reply {
		mu.Lock()
		defer mu.Unlock()
		r := replies[min(i, len(replies)-1)]
		i++
		return r
	}
}

func min(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// closedURL is a loopback URL nothing listens on (connection refused).
func closedURL(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	l.Close()
	return url
}

// signer makes lease JWTs as the cluster does (EdDSA, kid) for the fakes.
type signer struct {
	kid  string
	priv ed25519.PrivateKey
	pub  ed25519.PublicKey
}

func newSigner(kid string) *signer {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic(err)
	}
	return &signer{kid: kid, priv: priv, pub: pub}
}

func (s *signer) jwks() map[string]any {
	return map[string]any{"keys": []any{map[string]any{
		"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": s.kid,
		"x": base64.RawURLEncoding.EncodeToString(s.pub),
	}}}
}

func (s *signer) sign(header, claims map[string]any) string {
	h, _ := json.Marshal(header)
	c, _ := json.Marshal(claims)
	input := base64.RawURLEncoding.EncodeToString(h) + "." + base64.RawURLEncoding.EncodeToString(c)
	return input + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(s.priv, []byte(input)))
}

func (s *signer) jwt(lease, holder string, token uint64) string {
	now := time.Now().Unix()
	return s.sign(map[string]any{"alg": "EdDSA", "kid": s.kid, "typ": "JWT"},
		map[string]any{"iss": "palisade", "sub": holder, "lease": lease, "token": token, "iat": now, "exp": now + 10})
}

// grantJSON is a grant document; with a signer its JWT verifies.
func grantJSON(lease, holder string, token uint64, ttlMs uint64, s *signer) map[string]any {
	jwt := "not.a.jwt"
	kid := "k"
	if s != nil {
		jwt = s.jwt(lease, holder, token)
		kid = s.kid
	}
	return map[string]any{
		"lease": lease, "holder": holder, "token": token, "ttl_ms": ttlMs,
		"jwt": jwt, "kid": kid, "grant_index": token, "secret": strings.Repeat("s", 64),
	}
}

// fakeClient is a client of fake servers: JWT verification off unless
// asked, a short retry budget.
func fakeClient(t *testing.T, cfg Config, urls ...string) *Client {
	t.Helper()
	cfg.Election = urls
	if cfg.RetryBudget == 0 {
		cfg.RetryBudget = 2 * time.Second
	}
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func noJWT() Config { return Config{NoJWTVerification: true} }

func fmtPaths(f *fakeServer) string { return fmt.Sprint(f.paths()) }
