package palisade

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// Grant is a grant as the cluster answers an acquire or a renewal.
type Grant struct {
	// Lease is the lease name.
	Lease string `json:"lease"`
	// Holder is the holder it was granted to.
	Holder string `json:"holder"`
	// Token is the fencing token.
	Token uint64 `json:"token"`
	// TTLMillis is the granted ttl in milliseconds (a renewal answers the
	// grant's ttl, which a repeated acquire may have lengthened).
	TTLMillis uint64 `json:"ttl_ms"`
	// JWT is the signed lease token for the gateway.
	JWT string `json:"jwt"`
	// Kid is the id of the key that signed JWT.
	Kid string `json:"kid,omitempty"`
	// GrantIndex says which acquire this grant answers (a release naming an
	// older one frees nothing); nil from clusters that predate it.
	GrantIndex *uint64 `json:"grant_index,omitempty"`
	// Secret opens the grant (renew, release, a repeated acquire). Only an
	// acquire answers it. String and GoString never show it.
	Secret string `json:"secret,omitempty"`
}

// TTL is the granted ttl.
func (g *Grant) TTL() time.Duration { return time.Duration(g.TTLMillis) * time.Millisecond }

// ID is what names this grant in renew, release and handover.
func (g *Grant) ID() GrantID {
	return GrantID{Lease: g.Lease, Holder: g.Holder, Token: g.Token, GrantIndex: g.GrantIndex, Secret: g.Secret}
}

// String shows the grant without its secret or JWT.
func (g Grant) String() string {
	return fmt.Sprintf("Grant{Lease:%q Holder:%q Token:%d TTL:%v Kid:%q}", g.Lease, g.Holder, g.Token, g.TTL(), g.Kid)
}

// GoString is String: the secret and JWT never show in %#v either.
func (g Grant) GoString() string { return g.String() }

// GrantID names one grant, with the secret that opens it: what RenewGrant,
// ReleaseGrant and HandoverGrant need. Whoever has it can renew and release
// the grant; keep it like a password (String and GoString hide the secret).
type GrantID struct {
	Lease      string
	Holder     string
	Token      uint64
	GrantIndex *uint64
	Secret     string
}

// String shows the id without its secret.
func (id GrantID) String() string {
	index := "none"
	if id.GrantIndex != nil {
		index = fmt.Sprint(*id.GrantIndex)
	}
	return fmt.Sprintf("GrantID{Lease:%q Holder:%q Token:%d GrantIndex:%s Secret:<redacted>}", id.Lease, id.Holder, id.Token, index)
}

// GoString is String.
func (id GrantID) GoString() string { return id.String() }

// Transition is one entry of a lease's history (Client.History).
type Transition struct {
	// Index is the log index of the entry that made it.
	Index uint64 `json:"index"`
	// AtMs is when it was proposed, on the proposer's clock (ms since the
	// Unix epoch); 0 for entries older than stamps.
	AtMs uint64 `json:"at_ms"`
	// Cause is acquire, claim, handover, release, expire, preempt or revoke.
	Cause string `json:"cause"`
	// Holder and Token name the grant it is about: the new one (acquire,
	// claim, handover) or the one that ended or was revoked.
	Holder string `json:"holder"`
	Token  uint64 `json:"token"`
}

// LeaseInfo is a lease as the cluster reports it (GET /v1/leases/{name}).
type LeaseInfo struct {
	Lease string `json:"lease"`
	// Holder is "" when the lease is free.
	Holder      string `json:"holder"`
	Token       uint64 `json:"token"`
	TTLMillis   uint64 `json:"ttl_ms"`
	Transitions uint64 `json:"transitions"`
	// ModifyIndex is the log index of the last change (for Watch).
	ModifyIndex uint64 `json:"modify_index"`
	// ExpiresInMillis is the time left in the leader's view (nil when not
	// answered: a follower, or a free lease).
	ExpiresInMillis *uint64 `json:"expires_in_ms,omitempty"`
	Revoked         bool    `json:"revoked,omitempty"`
	Priority        uint64  `json:"priority,omitempty"`
	Preemptible     bool    `json:"preemptible,omitempty"`
	PreemptedBy     string  `json:"preempted_by,omitempty"`
	Reserved        bool    `json:"reserved,omitempty"`
	LockDelayMillis uint64  `json:"lock_delay_ms,omitempty"`
	MaxHoldMillis   uint64  `json:"max_hold_ms,omitempty"`
	LockDelayed     bool    `json:"lock_delayed,omitempty"`
	// AcquireTime is when the current holder acquired the lease and
	// RenewTime when its grant was last renewed (RFC 3339), as Kubernetes
	// shows them; "" from clusters that do not send them yet.
	AcquireTime string `json:"acquire_time,omitempty"`
	RenewTime   string `json:"renew_time,omitempty"`
	// Partition is the partition the lease belongs to on a cluster of
	// several (palisade dev --partitions N); nil with one partition.
	Partition *int `json:"partition,omitempty"`
}

// Object is a stored object read through the gateway.
type Object struct {
	// Value is the bytes.
	Value []byte
	// Version is the object's version (its ETag).
	Version uint64
	// Token is the fencing token of the write that stored it.
	Token uint64
}

// WriteResult is the gateway's answer to a fenced write.
type WriteResult struct {
	Key     string `json:"key"`
	Version uint64 `json:"version,omitempty"`
	Token   uint64 `json:"token"`
	// Deleted is set by Delete: whether there was an object.
	Deleted bool `json:"deleted,omitempty"`
}

// EncodeKey percent-encodes each segment of an object key, keeping the "/"
// between them (as the Rust and Python SDKs do): only A-Z a-z 0-9 - . _ ~
// stay as they are.
func EncodeKey(key string) string {
	segments := strings.Split(key, "/")
	for i, s := range segments {
		var b strings.Builder
		for j := 0; j < len(s); j++ {
			c := s[j]
			if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' ||
				c == '-' || c == '.' || c == '_' || c == '~' {
				b.WriteByte(c)
			} else {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		}
		segments[i] = b.String()
	}
	return strings.Join(segments, "/")
}

// parseGrant parses a Grant document and checks what the SDK relies on.
func parseGrant(body []byte) (*Grant, error) {
	var g Grant
	if err := json.Unmarshal(body, &g); err != nil {
		return nil, &ProtocolError{Status: 200, Message: "the grant does not parse: " + err.Error()}
	}
	if g.Lease == "" || g.Holder == "" || g.JWT == "" || g.TTLMillis == 0 || g.Token == 0 {
		return nil, &ProtocolError{Status: 200, Message: "the grant lacks lease, holder, token, ttl_ms or jwt"}
	}
	return &g, nil
}

func parseLeaseInfo(body []byte) (*LeaseInfo, error) {
	var info LeaseInfo
	if err := json.Unmarshal(body, &info); err != nil {
		return nil, &ProtocolError{Status: 200, Message: "the lease does not parse: " + err.Error()}
	}
	return &info, nil
}
