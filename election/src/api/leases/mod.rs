//! The calls that change who holds a lease: acquire, renew, release,
//! handover, revoke — one file per call, the bodies they share
//! (`bodies.rs`), the queue of waiting acquires (`queue.rs`), the renewal
//! rule (`extend.rs`) and the answer side of a renewal stream (`outbox.rs`).
//!
//! An acquire proposes `Acquire` and, once it applies, starts the grant's
//! deadline in the lessor and signs the JWT. A renewal writes nothing: it
//! confirms leadership with a quorum, then extends the deadline. A repeated
//! acquire by the holder extends like a renewal. Release proposes `Release`.

pub mod acquire;
mod answer;
pub mod batch;
pub mod bodies;
mod extend;
pub mod handover;
mod outbox;
mod queue;
pub mod release;
pub mod renew;
pub mod revoke;
pub mod stream;
