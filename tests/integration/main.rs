//! The integration tests, one test binary: each module is one file of
//! `tests/` (they run on the real `palisade` binary through `support`).
//! One binary links the workspace once instead of once per file (27 links
//! made up most of CI's build time; TESTING.md). Tests that load the
//! machine's two cores run alone in `tests/load/`.

#[path = "../support/mod.rs"]
mod support;
// Shared by several modules below (`use crate::netns`), declared once.
#[path = "../support/gateway_pg.rs"]
mod gateway_pg;
#[path = "../fault_suite/netns.rs"]
mod netns;
#[path = "../support/partitioned_dev.rs"]
mod partitioned_dev;

#[path = "../cert_principals.rs"]
mod cert_principals;
#[path = "../cli.rs"]
mod cli;
#[path = "../client_trust.rs"]
mod client_trust;
#[path = "../deaf_streams_free_their_seats.rs"]
mod deaf_streams_free_their_seats;
#[path = "../election_cluster.rs"]
mod election_cluster;
#[path = "../end_to_end.rs"]
mod end_to_end;
#[path = "../first_day.rs"]
mod first_day;
#[path = "../gateway_crash.rs"]
mod gateway_crash;
#[path = "../gateway_postgres.rs"]
mod gateway_postgres;
#[path = "../gateway_postgres_failover.rs"]
mod gateway_postgres_failover;
#[path = "../gateway_postgres_tls.rs"]
mod gateway_postgres_tls;
#[path = "../impersonation.rs"]
mod impersonation;
#[path = "../key_rotation.rs"]
mod key_rotation;
#[path = "../leader_lease.rs"]
mod leader_lease;
#[path = "../lease_history.rs"]
mod lease_history;
#[path = "../membership.rs"]
mod membership;
#[path = "../mismatched_settings.rs"]
mod mismatched_settings;
#[path = "../observability.rs"]
mod observability;
#[path = "../old_data_dir.rs"]
mod old_data_dir;
#[path = "../partitioned_watch.rs"]
mod partitioned_watch;
#[path = "../partitions.rs"]
mod partitions;
#[path = "../peer_trust.rs"]
mod peer_trust;
#[path = "../policy_reload.rs"]
mod policy_reload;
#[path = "../postgres_fence.rs"]
mod postgres_fence;
#[path = "../postgres_trust.rs"]
mod postgres_trust;
#[path = "../prefix_watch.rs"]
mod prefix_watch;
#[path = "../renew_stream.rs"]
mod renew_stream;
#[path = "../retired_key_lag.rs"]
mod retired_key_lag;
#[path = "../revocation_reaches_open_calls.rs"]
mod revocation_reaches_open_calls;
#[path = "../sdk.rs"]
mod sdk;
#[path = "../sdk_partitions.rs"]
mod sdk_partitions;
#[path = "../seed_semantics.rs"]
mod seed_semantics;
#[path = "../sql_keys_follow.rs"]
mod sql_keys_follow;
#[path = "../status_page.rs"]
mod status_page;
#[path = "../ui_sessions.rs"]
mod ui_sessions;
