//! The session table on tokio's paused clock: expiry (idle and absolute),
//! sign-out, the caps, and a reload of the policy that drops a principal.

use std::time::Duration;

use palisade_serve::policy::{key_digest, Policy, Principal};

use super::Sessions;
use crate::config::UiAccess;

const KEY_A: &str = "pal_sessions_test_key_a_00000000000001";
const KEY_B: &str = "pal_sessions_test_key_b_00000000000001";

fn policy(principals: &[(&str, &str)]) -> Policy {
    let entries: Vec<String> = principals
        .iter()
        .map(|(name, key)| {
            format!(
                r#""{name}": {{"keys": ["{}"], "read": [""]}}"#,
                key_digest(key)
            )
        })
        .collect();
    Policy::parse(&format!(r#"{{"principals": {{{}}}}}"#, entries.join(","))).expect("policy")
}

fn limits() -> UiAccess {
    UiAccess {
        idle: Duration::from_secs(30 * 60),
        lifetime: Duration::from_secs(8 * 3600),
        max_sessions: 4,
        max_per_principal: 3,
        ..UiAccess::default()
    }
}

/// Signs `key` in against `policy`, as `login.rs` does.
fn sign_in(sessions: &Sessions, policy: &Policy, key: &str) -> String {
    let (principal, digest) = policy.authenticate_key(key).expect("known key");
    sessions.open(principal, digest)
}

#[tokio::test(start_paused = true)]
async fn a_session_ends_after_its_idle_time_and_its_lifetime() {
    let policy = policy(&[("a", KEY_A)]);
    let sessions = Sessions::new(limits());
    let id = sign_in(&sessions, &policy, KEY_A);
    assert_eq!(id.len(), 64, "256 bits, hex");
    assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(sessions.check(&id, &policy), Some(Principal("a".into())));
    // Used every 29 minutes, it outlives its idle limit...
    for _ in 0..16 {
        tokio::time::advance(Duration::from_secs(29 * 60)).await;
        assert!(sessions.check(&id, &policy).is_some());
    }
    // ...but not its lifetime (8 h after sign-in).
    tokio::time::advance(Duration::from_secs(16 * 60)).await;
    assert_eq!(sessions.check(&id, &policy), None, "past 8 h");
    assert!(sessions.is_empty(), "an expired session is dropped");

    let idle = sign_in(&sessions, &policy, KEY_A);
    tokio::time::advance(Duration::from_secs(30 * 60 - 1)).await;
    assert!(sessions.check(&idle, &policy).is_some(), "just within");
    tokio::time::advance(Duration::from_secs(30 * 60)).await;
    assert_eq!(sessions.check(&idle, &policy), None, "30 min unused");
    assert_eq!(sessions.check(&idle, &policy), None, "and stays ended");
}

#[tokio::test(start_paused = true)]
async fn sign_out_ends_a_session_and_unknown_ids_are_refused() {
    let policy = policy(&[("a", KEY_A)]);
    let sessions = Sessions::new(limits());
    let id = sign_in(&sessions, &policy, KEY_A);
    let other = sign_in(&sessions, &policy, KEY_A);
    assert_ne!(id, other, "fresh ids");
    sessions.close(&id);
    assert_eq!(sessions.check(&id, &policy), None);
    assert!(sessions.check(&other, &policy).is_some(), "only that one");
    assert_eq!(sessions.check("", &policy), None);
    assert_eq!(sessions.check(KEY_A, &policy), None, "a key is no session");
    sessions.close("no-such-session");
}

/// A reload that removes the principal, or only the key it signed in
/// with, ends its sessions; a reload that keeps both does not.
#[tokio::test(start_paused = true)]
async fn a_principal_or_key_removed_from_the_policy_ends_its_sessions() {
    let before = policy(&[("a", KEY_A), ("b", KEY_B)]);
    let sessions = Sessions::new(limits());
    let a = sign_in(&sessions, &before, KEY_A);
    let b = sign_in(&sessions, &before, KEY_B);
    let after = policy(&[("b", KEY_B)]);
    assert_eq!(sessions.check(&a, &after), None, "a removed");
    assert_eq!(sessions.check(&b, &after), Some(Principal("b".into())));
    let rotated = policy(&[("b", KEY_A)]);
    assert_eq!(
        sessions.check(&b, &rotated),
        None,
        "b's key removed (and another principal's now: still not b)"
    );
}

/// A flood of sign-ins keeps the table at its caps: a principal's own
/// oldest session goes first, then the node's oldest.
#[tokio::test(start_paused = true)]
async fn the_table_is_bounded_and_evicts_the_oldest() {
    let policy = policy(&[("a", KEY_A), ("b", KEY_B)]);
    let sessions = Sessions::new(limits());
    let b = sign_in(&sessions, &policy, KEY_B);
    let flood: Vec<String> = (0..1000)
        .map(|_| sign_in(&sessions, &policy, KEY_A))
        .collect();
    assert_eq!(sessions.len(), 4, "3 of a's, b's");
    assert!(
        sessions.check(&b, &policy).is_some(),
        "a's flood ended only a's"
    );
    assert!(flood[..997]
        .iter()
        .all(|id| sessions.check(id, &policy).is_none()));
    assert!(flood[997..]
        .iter()
        .all(|id| sessions.check(id, &policy).is_some()));
    // Full: b's next sign-in ends the node's oldest session.
    let b2 = sign_in(&sessions, &policy, KEY_B);
    assert_eq!(sessions.len(), 4);
    assert!(sessions.check(&b, &policy).is_none(), "b's was the oldest");
    assert!(sessions.check(&b2, &policy).is_some());
}
