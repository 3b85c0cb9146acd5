//! The integration tests that load the machine (floods, power cuts, big
//! tables): one test binary whose tests run one at a time
//! (`support::alone`), never beside another test of this binary. The rest
//! are in `tests/integration/`.

#[path = "../support/mod.rs"]
mod support;

#[path = "../fair_share.rs"]
mod fair_share;
#[path = "../gateway_fairness.rs"]
mod gateway_fairness;
#[path = "../noisy_neighbour.rs"]
mod noisy_neighbour;
#[path = "../partition_flood.rs"]
mod partition_flood;
#[path = "../power_cut.rs"]
mod power_cut;
#[path = "../snapshot_catchup.rs"]
mod snapshot_catchup;
#[path = "../spanning_flood.rs"]
mod spanning_flood;
