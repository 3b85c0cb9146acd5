package palisade

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// APIKeyHeader is the request header that carries a client's API key.
const APIKeyHeader = "x-palisade-key"

// The palisade dev endpoints, the defaults of ConfigFromEnv.
const (
	DefaultElection = "http://127.0.0.1:7001,http://127.0.0.1:7002,http://127.0.0.1:7003"
	DefaultGateway  = "http://127.0.0.1:8080"
)

// Config says how a Client behaves. The zero value of every field but
// Election means its default.
type Config struct {
	// Election lists the election nodes' base URLs (http://host:port or
	// https://...); any node will do.
	Election []string
	// Gateway is the storage gateway's base URL, for fenced writes and
	// reads ("" for none).
	Gateway string
	// CAFile is a PEM file: the only CA trusted for https:// URLs (without
	// it, the system's roots).
	CAFile string
	// ClientCertFile and ClientKeyFile (PEM, both or neither) are presented
	// over client TLS: a certificate a policy names is that principal, no
	// API key needed.
	ClientCertFile string
	ClientKeyFile  string
	// APIKey is sent as x-palisade-key on every request (String never shows
	// it).
	APIKey string
	// RequestTimeout bounds one HTTP request. Default 2 s. A renewal
	// attempt gets less when its lease cannot afford it: a third of the
	// time left to the safe deadline (at least 100 ms), then the renewal
	// is sent to the next node too (hedge.go).
	RequestTimeout time.Duration
	// RetryBudget bounds how long one election call retries transient
	// failures. Default 5 s.
	RetryBudget time.Duration
	// DriftMarginRatio: the safe deadline is send time + ttl - ttl *
	// DriftMarginRatio (at least 1 ms). Default 0.1.
	DriftMarginRatio float64
	// RenewRatio: renew every ttl * RenewRatio (clamped to 0.05..0.9).
	// Default 1/3.
	RenewRatio float64
	// NoFenceOnAcquire turns off raising the gateway fence right after an
	// acquire (on by default when a Gateway is set).
	NoFenceOnAcquire bool
	// NoJWTVerification turns off checking every grant's JWT against the
	// cluster's /v1/jwks (on by default).
	NoJWTVerification bool
	// NoBatchRenewals sends each renewal on its own instead of gathering
	// the renewals that fall due together into POST /v1/renew.
	NoBatchRenewals bool
	// Logf, when set, receives the client's log lines (lease losses,
	// retries). Nil: silent.
	Logf func(format string, args ...any)
}

// String shows the configuration without the API key.
func (c Config) String() string {
	key := "none"
	if c.APIKey != "" {
		key = "<redacted>"
	}
	return fmt.Sprintf("Config{Election:%q Gateway:%q CAFile:%q ClientCertFile:%q APIKey:%s RequestTimeout:%v RetryBudget:%v}",
		c.Election, c.Gateway, c.CAFile, c.ClientCertFile, key, c.RequestTimeout, c.RetryBudget)
}

// GoString is String: the key never shows in %#v either.
func (c Config) GoString() string { return c.String() }

// withDefaults fills in the defaults and checks the configuration.
func (c Config) withDefaults() (Config, error) {
	var endpoints []string
	for _, e := range c.Election {
		if e = strings.TrimSpace(e); e != "" {
			endpoints = append(endpoints, strings.TrimRight(e, "/"))
		}
	}
	if len(endpoints) == 0 {
		return c, badRequest("no election endpoints configured")
	}
	c.Election = endpoints
	c.Gateway = strings.TrimRight(strings.TrimSpace(c.Gateway), "/")
	for _, u := range append(append([]string(nil), endpoints...), c.Gateway) {
		if u != "" && !strings.HasPrefix(u, "http://") && !strings.HasPrefix(u, "https://") {
			return c, badRequest("%s: not an http:// or https:// URL", u)
		}
	}
	if c.APIKey != "" {
		key, err := checkAPIKey(c.APIKey)
		if err != nil {
			return c, err
		}
		c.APIKey = key
	}
	if c.RequestTimeout < 0 || c.RetryBudget < 0 {
		return c, badRequest("bad timeouts: request timeout %v, retry budget %v", c.RequestTimeout, c.RetryBudget)
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 2 * time.Second
	}
	if c.RetryBudget == 0 {
		c.RetryBudget = 5 * time.Second
	}
	if c.DriftMarginRatio == 0 {
		c.DriftMarginRatio = 0.1
	}
	if c.RenewRatio == 0 {
		c.RenewRatio = 1.0 / 3.0
	}
	if c.DriftMarginRatio < 0 || c.DriftMarginRatio > 0.9 || c.RenewRatio < 0 {
		return c, badRequest("bad ratios: drift margin %v (0..0.9), renew %v", c.DriftMarginRatio, c.RenewRatio)
	}
	return c, nil
}

func checkAPIKey(key string) (string, error) {
	key = strings.TrimSpace(key)
	if key == "" {
		return "", badRequest("an API key must be non-empty visible ASCII")
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return "", badRequest("an API key must be non-empty visible ASCII")
		}
	}
	return key, nil
}

func loadCA(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, badRequest("%s: %v", path, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, badRequest("%s: no PEM certificate in it", path)
	}
	return pool, nil
}

// loadClientCert loads cfg's client certificate, if it has one.
func loadClientCert(cfg Config) ([]tls.Certificate, error) {
	if (cfg.ClientCertFile == "") != (cfg.ClientKeyFile == "") {
		return nil, badRequest("ClientCertFile and ClientKeyFile go together: give both or neither")
	}
	if cfg.ClientCertFile == "" {
		return nil, nil
	}
	pair, err := tls.LoadX509KeyPair(cfg.ClientCertFile, cfg.ClientKeyFile)
	if err != nil {
		return nil, badRequest("%s: %v", cfg.ClientCertFile, err)
	}
	return []tls.Certificate{pair}, nil
}

// ConfigFromEnv is the configuration the environment describes, as the CLI
// and the other SDKs read it: PALISADE_ELECTION (comma-separated URLs;
// default the palisade dev nodes on 127.0.0.1:7001-7003), PALISADE_GATEWAY
// (default http://127.0.0.1:8080), PALISADE_CA (a PEM CA file),
// PALISADE_CLIENT_CERT and PALISADE_CLIENT_KEY (a client certificate),
// PALISADE_API_KEY or PALISADE_API_KEY_FILE (the key is the first line; with
// both set the key wins, as in the CLI and the Rust and Python SDKs; a Config
// field set after this call beats both).
// It fails with ErrBadRequest when the CA or key file is unusable.
func ConfigFromEnv() (Config, error) {
	v := func(name string) string { return strings.TrimSpace(os.Getenv(name)) }
	cfg := Config{Gateway: DefaultGateway}
	election := v("PALISADE_ELECTION")
	if election == "" {
		election = DefaultElection
	}
	for _, e := range strings.Split(election, ",") {
		if e = strings.TrimSpace(e); e != "" {
			cfg.Election = append(cfg.Election, e)
		}
	}
	if gw := v("PALISADE_GATEWAY"); gw != "" {
		cfg.Gateway = gw
	}
	if ca := v("PALISADE_CA"); ca != "" {
		if _, err := loadCA(ca); err != nil {
			return cfg, err
		}
		cfg.CAFile = ca
	}
	cfg.ClientCertFile, cfg.ClientKeyFile = v("PALISADE_CLIENT_CERT"), v("PALISADE_CLIENT_KEY")
	if _, err := loadClientCert(cfg); err != nil {
		return cfg, err
	}
	key := v("PALISADE_API_KEY")
	if key == "" {
		if path := v("PALISADE_API_KEY_FILE"); path != "" {
			data, err := os.ReadFile(path)
			if err != nil {
				return cfg, badRequest("%s: %v", path, err)
			}
			key = string(data)
		}
	}
	if key != "" {
		first, _, _ := strings.Cut(key, "\n")
		checked, err := checkAPIKey(first)
		if err != nil {
			return cfg, err
		}
		cfg.APIKey = checked
	}
	return cfg, nil
}

var leaseNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

// CheckLeaseName returns an ErrBadRequest error unless name is a valid
// lease name: [A-Za-z0-9._-]{1,128}, not "." or "..".
func CheckLeaseName(name string) error {
	if !leaseNameRE.MatchString(name) || name == "." || name == ".." {
		return badRequest("invalid lease name %q: [A-Za-z0-9._-]{1,128}, not . or ..", name)
	}
	return nil
}

func checkHolder(holder string) error {
	n := utf8.RuneCountInString(holder)
	if n == 0 || n > 256 || !utf8.ValidString(holder) {
		return badRequest("the holder must be 1..=256 characters, not %q", holder)
	}
	for _, r := range holder {
		if unicode.IsControl(r) {
			return badRequest("the holder %q has a control character", holder)
		}
	}
	return nil
}

// AcquireOption asks an acquire for more than holder and ttl.
type AcquireOption func(*acquireOptions)

type acquireOptions struct {
	wait        time.Duration
	waitSet     bool
	priority    int
	preemptible bool
	lockDelay   time.Duration
	maxHold     time.Duration
	maxHoldSet  bool
}

// WithWait waits up to d for the lease to be free (asked for in slices of
// half a request timeout, all with one grant secret). Without it an
// acquire tries once.
func WithWait(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.wait, o.waitSet = d, true }
}

// WithPriority asks for a priority in 0..=1000: a waiting acquire of a
// higher priority than a preemptible holder's preempts it; waiters queue by
// priority; equal priority never preempts.
func WithPriority(p int) AcquireOption { return func(o *acquireOptions) { o.priority = p } }

// WithPreemptible lets a waiting acquire of a higher priority preempt this
// grant (its renewals then fail with ErrPreempted, and the SDK releases it).
func WithPreemptible() AcquireOption { return func(o *acquireOptions) { o.preemptible = true } }

// WithLockDelay keeps the lease unavailable for d (0..=60 s) after this
// grant expires (not after a release), so a crashed holder's writes in
// flight drain first.
func WithLockDelay(d time.Duration) AcquireOption { return func(o *acquireOptions) { o.lockDelay = d } }

// WithMaxHold caps how long the grant is renewed (1 ms..=24 h): a renewal
// past it is refused and the lease is lost at its deadline.
func WithMaxHold(d time.Duration) AcquireOption {
	return func(o *acquireOptions) { o.maxHold, o.maxHoldSet = d, true }
}

func millis(d time.Duration) uint64 { return uint64((d + time.Millisecond/2) / time.Millisecond) }

// body checks the options and returns the acquire body's fields for them
// (none for defaults), the bounds of the Python SDK's AcquireOptions.
func (o *acquireOptions) body() (map[string]any, error) {
	if o.priority < 0 || o.priority > 1000 {
		return nil, badRequest("the priority must be in 0..=1000, not %d", o.priority)
	}
	if o.lockDelay < 0 || o.lockDelay > 60*time.Second {
		return nil, badRequest("the lock-delay must be 0..=60s, not %v", o.lockDelay)
	}
	if o.maxHoldSet && (o.maxHold < time.Millisecond || o.maxHold > 24*time.Hour) {
		return nil, badRequest("the max-hold must be 1ms..=24h, not %v", o.maxHold)
	}
	if o.waitSet && o.wait < 0 {
		return nil, badRequest("the wait must not be negative, not %v", o.wait)
	}
	fields := map[string]any{}
	if o.priority > 0 {
		fields["priority"] = o.priority
	}
	if o.preemptible {
		fields["preemptible"] = true
	}
	if o.lockDelay > 0 {
		fields["lock_delay_ms"] = millis(o.lockDelay)
	}
	if o.maxHoldSet {
		fields["max_hold_ms"] = millis(o.maxHold)
	}
	return fields, nil
}
