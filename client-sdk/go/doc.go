// Package palisade is the Go client of Palisade, a lease and fencing
// service: leases that are safe to build on.
//
// A Client talks to the election cluster (any node; bounded retries with
// backoff and jitter on transport errors, 503 and 429 — honouring
// Retry-After — never on 409, 401, 403 or any other 4xx) and to a storage
// gateway. Client.Acquire gives a Lease that:
//
//   - raises the gateway fence to its token before it is returned
//     (fence-on-acquire), so the previous holder's late writes are refused;
//   - renews itself in the background every third of the ttl the leader
//     answered, gathering the client's due renewals into POST /v1/renew;
//   - keeps a safe deadline on the monotonic clock from the SEND time of
//     the last acknowledged acquire or renew (+ ttl - a 10% drift margin),
//     compared with the clock on every IsHeld call;
//   - stamps its JWT on every write (Put, Delete), refuses writes locally
//     once not held, and marks itself lost on a gateway 409 stale_token;
//   - closes Done on loss.
//
// The gateway is a store too: Client.ListObjects pages through a prefix,
// Client.HeadObject reads a version without the bytes, and Lease.PutIf /
// Lease.DeleteIf write under a Precondition (IfMatch, IfExists, IfAbsent),
// failing with a *PreconditionError (ErrPreconditionFailed) on 412.
//
// Every grant's JWT is verified against the cluster's /v1/jwks (EdDSA,
// Ed25519, by kid). An Elector runs work only while leading, with
// client-go shaped callbacks.
//
// Errors match sentinels with errors.Is: ErrLeaseLost (ErrFenced and
// ErrPreempted are kinds of it), ErrHeld, ErrUnavailable, ErrLockDelay,
// ErrBadRequest, ErrUnauthorized, ErrForbidden, ErrNotFound,
// ErrPreconditionFailed, ErrProtocol;
// errors.As gives the typed error with the details (*HeldError,
// *FencedError, ...).
//
// Standard library only.
package palisade
