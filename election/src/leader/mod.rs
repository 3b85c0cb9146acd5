//! What the leader alone does: track lease deadlines and expire them
//! ([`lessor`]), place leadership by priority ([`placement`]), retire
//! rotated-out keys ([`retirement`]), and run those on a tick ([`duties`]).
//! etcd's lessor is the model: Promote on taking over, Demote on losing it.

pub mod duties;
pub mod lessor;
pub mod placement;
pub mod retirement;
