//! Node-to-node traffic: the outgoing side (dialing peers, openraft's
//! network client, forwarding client requests to the leader) and the
//! incoming side (the peer listener's gate and `/raft` handlers), with what
//! both sides share: who a peer is, its incarnation, its standing, and the
//! snapshot frame.
//!
//! **Architecture Invariant:** nothing here reaches the client API (`api/`):
//! the peer listener is handed the API's router to serve forwarded calls,
//! it never names its handlers.

pub mod acquaint;
pub mod beats;
pub mod client;
pub mod dialer;
pub mod figures;
pub mod gate;
pub mod incarnation;
pub mod reachability;
pub mod server;
pub mod settings;
pub mod snapshot_frame;
pub mod standing;
