package palisade

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Sentinel errors, for errors.Is. Every error this package returns matches
// at most a few of them; the typed errors below carry the details.
//
// The ones that mean "stop acting as leader" all match ErrLeaseLost:
// ErrFenced and ErrPreempted are kinds of ErrLeaseLost (as in the Python
// SDK, where Fenced and Preempted subclass LeaseLost).
var (
	// ErrLeaseLost: this holder no longer holds the lease (a renewal was
	// refused, the safe deadline passed, the lease was released, handed
	// over, preempted, or a write was fenced). Stop acting as leader.
	ErrLeaseLost = errors.New("palisade: lease lost")
	// ErrFenced: the gateway refused a write (409 stale_token) because a
	// newer token has been used on the lease. Also matches ErrLeaseLost.
	ErrFenced = errors.New("palisade: fenced")
	// ErrPreempted: a waiting acquire of a higher priority preempted this
	// (preemptible) grant (409 preempted). Also matches ErrLeaseLost.
	ErrPreempted = errors.New("palisade: preempted")
	// ErrHeld: someone else holds the lease (an acquire without a wait, or
	// the wait ran out). Never retried.
	ErrHeld = errors.New("palisade: lease held by another holder")
	// ErrLockDelay: the lease is free but held back by the lock-delay of a
	// grant that expired, longer than the acquire's wait.
	ErrLockDelay = errors.New("palisade: lease held back by a lock-delay")
	// ErrUnavailable: no node answered usefully within the retry budget
	// (connection refused, timeouts, 503, 429), the caller's context ended
	// first, or one gateway request failed in transport. Safe to retry later.
	ErrUnavailable = errors.New("palisade: unavailable")
	// ErrBadRequest: the request is malformed (400/413 from a server, or
	// refused here before anything was sent); retrying will not help.
	ErrBadRequest = errors.New("palisade: bad request")
	// ErrUnauthorized: 401, the API key is missing or unknown, or the
	// gateway could not verify a lease JWT. Never retried.
	ErrUnauthorized = errors.New("palisade: unauthorized")
	// ErrForbidden: 403, the API key's principal may not do this to this
	// lease. Never retried.
	ErrForbidden = errors.New("palisade: forbidden")
	// ErrNotFound: 404, nothing there (a lease without a record, an object
	// that does not exist).
	ErrNotFound = errors.New("palisade: not found")
	// ErrPreconditionFailed: 412, a conditional write's condition did not
	// hold and nothing was changed (the lease is still held). Never
	// retried.
	ErrPreconditionFailed = errors.New("palisade: precondition failed")
	// ErrProtocol: the server answered something this client does not
	// understand, or a lease JWT that does not verify against /v1/jwks.
	ErrProtocol = errors.New("palisade: protocol error")
)

// HeldError is returned when someone else holds the lease. It matches
// ErrHeld.
type HeldError struct {
	// Holder is the current holder.
	Holder string
	// Token is its fencing token.
	Token uint64
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("palisade: lease is held by %q (token %d)", e.Holder, e.Token)
}

// Is reports whether target is ErrHeld.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// LeaseLostError says why a lease is not held any more. It matches
// ErrLeaseLost.
type LeaseLostError struct {
	// Reason is why the lease was lost, e.g. "the safe deadline has passed".
	Reason string
}

func (e *LeaseLostError) Error() string { return "palisade: lease lost: " + e.Reason }

// Is reports whether target is ErrLeaseLost.
func (e *LeaseLostError) Is(target error) bool { return target == ErrLeaseLost }

// FencedError is the gateway's 409 stale_token: the write carried Token,
// below the lease's fence Fence. It matches ErrFenced and ErrLeaseLost; the
// lease that sent the write is marked lost.
type FencedError struct {
	// Token is the token the refused write carried.
	Token uint64
	// Fence is the fence that refused it.
	Fence uint64
}

func (e *FencedError) Error() string {
	return fmt.Sprintf("palisade: fenced: token %d is below the fence %d", e.Token, e.Fence)
}

// Is reports whether target is ErrFenced or ErrLeaseLost.
func (e *FencedError) Is(target error) bool { return target == ErrFenced || target == ErrLeaseLost }

// PreemptedError is a renewal refused with 409 preempted. It matches
// ErrPreempted and ErrLeaseLost. The SDK releases a preempted lease at once.
type PreemptedError struct {
	// Reason is the server's message.
	Reason string
}

func (e *PreemptedError) Error() string { return "palisade: preempted: " + e.Reason }

// Is reports whether target is ErrPreempted or ErrLeaseLost.
func (e *PreemptedError) Is(target error) bool {
	return target == ErrPreempted || target == ErrLeaseLost
}

// LockDelayError is 409 lock_delay: the lease is held back RetryAfter more.
// It matches ErrLockDelay.
type LockDelayError struct {
	// RetryAfter is how long the lock-delay lasts yet.
	RetryAfter time.Duration
	// Message is the server's message.
	Message string
}

func (e *LockDelayError) Error() string {
	return fmt.Sprintf("palisade: lease is held back by a lock-delay for %v", e.RetryAfter)
}

// Is reports whether target is ErrLockDelay.
func (e *LockDelayError) Is(target error) bool { return target == ErrLockDelay }

// UnavailableError is returned when no node answered usefully. It matches
// ErrUnavailable and unwraps to Err (the caller's context error, when the
// context ended the call).
type UnavailableError struct {
	// Attempts is the number of requests sent.
	Attempts int
	// Elapsed is the time spent.
	Elapsed time.Duration
	// Last describes the last failure.
	Last string
	// Err is the context's error when the caller's context ended the call.
	Err error
}

func (e *UnavailableError) Error() string {
	msg := fmt.Sprintf("palisade: unavailable after %d attempts over %v: %s",
		e.Attempts, e.Elapsed.Round(time.Millisecond), e.Last)
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

// Is reports whether target is ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the context error that ended the call, if any.
func (e *UnavailableError) Unwrap() error { return e.Err }

// RequestError is a refusal by a server (400, 401, 403, 404, 413) or, with
// Status 0, a request refused here before anything was sent. It matches
// ErrBadRequest (400, 413, 0), ErrUnauthorized (401), ErrForbidden (403) or
// ErrNotFound (404).
type RequestError struct {
	// Status is the HTTP status, 0 when refused locally.
	Status int
	// Code is the error code of the answer ("bad_request", "forbidden", ...).
	Code string
	// Message is the server's (or this package's) explanation.
	Message string
}

func (e *RequestError) Error() string {
	kind := "bad request"
	switch e.Status {
	case 401:
		kind = "unauthorized"
	case 403:
		kind = "forbidden"
	case 404:
		kind = "not found"
	}
	if e.Status == 0 {
		return "palisade: " + kind + ": " + e.Message
	}
	return fmt.Sprintf("palisade: %s (%d %s): %s", kind, e.Status, e.Code, e.Message)
}

// Is reports whether target is the sentinel of the status.
func (e *RequestError) Is(target error) bool {
	switch e.Status {
	case 0, 400, 413:
		return target == ErrBadRequest
	case 401:
		return target == ErrUnauthorized
	case 403:
		return target == ErrForbidden
	case 404:
		return target == ErrNotFound
	}
	return false
}

// PreconditionError is 412 precondition_failed: a PutIf or DeleteIf whose
// condition did not hold; nothing was changed. It matches
// ErrPreconditionFailed (not ErrLeaseLost: the lease is still held).
type PreconditionError struct {
	// Key is the key written.
	Key string
	// CurrentVersion is the object's version now; nil when there is none.
	CurrentVersion *uint64
	// Message is the gateway's message.
	Message string
}

func (e *PreconditionError) Error() string {
	now := "no object"
	if e.CurrentVersion != nil {
		now = fmt.Sprintf("version %d", *e.CurrentVersion)
	}
	msg := fmt.Sprintf("palisade: precondition failed on %q (%s)", e.Key, now)
	if e.Message != "" {
		msg += ": " + e.Message
	}
	return msg
}

// Is reports whether target is ErrPreconditionFailed.
func (e *PreconditionError) Is(target error) bool { return target == ErrPreconditionFailed }

// ProtocolError is an answer this client does not understand, or a lease
// JWT that does not verify. It matches ErrProtocol.
type ProtocolError struct {
	// Status is the HTTP status (0 when the problem is not a status).
	Status int
	// Message says what was wrong.
	Message string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("palisade: unexpected answer %d: %s", e.Status, e.Message)
}

// Is reports whether target is ErrProtocol.
func (e *ProtocolError) Is(target error) bool { return target == ErrProtocol }

func badRequest(format string, args ...any) error {
	return &RequestError{Code: "bad_request", Message: fmt.Sprintf(format, args...)}
}

// errorDoc is the error document the servers answer: {"error","message",...}.
type errorDoc struct {
	code, message string
	fields        map[string]json.RawMessage
}

func parseErrorDoc(body []byte) errorDoc {
	doc := errorDoc{}
	if json.Unmarshal(body, &doc.fields) != nil {
		doc.fields = nil
	}
	doc.code = doc.str("error")
	doc.message = doc.str("message")
	return doc
}

func (d errorDoc) str(name string) string {
	var s string
	if raw, ok := d.fields[name]; ok && json.Unmarshal(raw, &s) == nil {
		return s
	}
	return ""
}

func (d errorDoc) u64(name string) uint64 {
	var n uint64
	if raw, ok := d.fields[name]; ok && json.Unmarshal(raw, &n) == nil {
		return n
	}
	return 0
}

// optU64 is the named number; nil when it is absent, null or not one.
func (d errorDoc) optU64(name string) *uint64 {
	var n *uint64
	if raw, ok := d.fields[name]; ok && json.Unmarshal(raw, &n) == nil {
		return n
	}
	return nil
}

// errorFor maps an error answer to an error (the Rust and Python SDKs'
// mapping).
func errorFor(status int, body []byte) error {
	doc := parseErrorDoc(body)
	if status == 409 {
		switch doc.code {
		case "held":
			return &HeldError{Holder: doc.str("holder"), Token: doc.u64("token")}
		case "lost", "max_hold":
			return &LeaseLostError{Reason: doc.message}
		case "preempted":
			return &PreemptedError{Reason: doc.message}
		case "lock_delay":
			return &LockDelayError{
				RetryAfter: time.Duration(doc.u64("retry_after_ms")) * time.Millisecond,
				Message:    doc.message,
			}
		case "stale_token":
			return &FencedError{Token: doc.u64("token"), Fence: doc.u64("fence")}
		}
	}
	if status == 412 {
		return &PreconditionError{Key: doc.str("key"), CurrentVersion: doc.optU64("current_version"), Message: doc.message}
	}
	switch status {
	case 400, 401, 403, 404, 413:
		return &RequestError{Status: status, Code: doc.code, Message: doc.message}
	}
	message := doc.message
	if message == "" {
		message = doc.code
	}
	return &ProtocolError{Status: status, Message: message}
}
