//! The renewal lease's arithmetic, on tokio's paused clock.

use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::*;

const RULE: RenewLease = RenewLease {
    lease: Duration::from_millis(60),
    margin: Duration::from_millis(6),
    patience: Duration::from_millis(1000),
    first_ack: Duration::from_millis(120),
};

/// A leader's state as a test sets it: the last acknowledgement as a point
/// on the (paused) clock.
#[derive(Debug, Clone, Copy)]
struct Node {
    leads: bool,
    sole_voter: bool,
    applied_in_term: bool,
    acked_at: Option<Instant>,
    handing_to: Option<NodeId>,
}

impl Node {
    fn leader_acked_at(at: Instant) -> Self {
        Self {
            leads: true,
            sole_voter: false,
            applied_in_term: true,
            acked_at: Some(at),
            handing_to: None,
        }
    }
}

struct Fake(watch::Receiver<Node>);

impl FactSource for Fake {
    fn facts(&self) -> Facts {
        let node = *self.0.borrow();
        Facts {
            leads: node.leads,
            sole_voter: node.sole_voter,
            applied_in_term: node.applied_in_term,
            ack_age: node.acked_at.map(|at| at.elapsed()),
            handing_to: node.handing_to,
        }
    }

    async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

fn facts(ack_age: Option<Duration>) -> Facts {
    Facts {
        leads: true,
        sole_voter: false,
        applied_in_term: true,
        ack_age,
        handing_to: None,
    }
}

#[test]
fn a_renewal_is_answered_only_inside_the_lease_less_the_margin() {
    let ms = Duration::from_millis;
    assert_eq!(RULE.usable(), ms(54));
    assert_eq!(RULE.judge(facts(Some(ms(0)))), Standing::Holds);
    assert_eq!(RULE.judge(facts(Some(ms(53)))), Standing::Holds);
    // Stale: inside openraft's lease, but not with the margin: wait.
    assert_eq!(
        RULE.judge(facts(Some(ms(54)))),
        Standing::Waits { at_most: ms(946) }
    );
    assert_eq!(
        RULE.judge(facts(Some(ms(999)))),
        Standing::Waits { at_most: ms(1) }
    );
    // Past the patience: refused at once.
    assert_eq!(
        RULE.judge(facts(Some(ms(1000)))),
        Standing::Refused(Refusal::Lapsed {
            since: Some(ms(1000))
        })
    );
    // No acknowledgement yet this term: wait for the first.
    assert_eq!(
        RULE.judge(facts(None)),
        Standing::Waits { at_most: ms(120) }
    );
}

#[test]
fn a_follower_a_handoff_or_an_unapplied_term_answer_nothing_at_once() {
    let fresh = facts(Some(Duration::ZERO));
    let follower = Facts {
        leads: false,
        ..fresh
    };
    assert_eq!(RULE.judge(follower), Standing::Refused(Refusal::Follows));
    let handing = Facts {
        handing_to: Some(3),
        ..fresh
    };
    assert_eq!(
        RULE.judge(handing),
        Standing::Refused(Refusal::HandingOff { to: 3 }),
        "a fresh ack does not outweigh a transfer"
    );
    let unapplied = Facts {
        applied_in_term: false,
        ..fresh
    };
    assert!(matches!(RULE.judge(unapplied), Standing::Waits { .. }));
    let sole = Facts {
        sole_voter: true,
        ack_age: None,
        ..fresh
    };
    assert_eq!(
        RULE.judge(sole),
        Standing::Holds,
        "its own log is the quorum"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stale_ack_waits_for_the_next_heartbeat_and_no_longer() {
    let start = Instant::now();
    let (acks, rx) = watch::channel(Node::leader_acked_at(start));
    tokio::time::advance(Duration::from_millis(70)).await;
    let waiting = tokio::spawn(async move {
        let began = Instant::now();
        let outcome = confirm(|| RULE, &mut Fake(rx)).await;
        (outcome, began.elapsed())
    });
    // The renewal arrives (the task runs until it waits).
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(15)).await;
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "a stale ack answers nothing");
    // The next heartbeat's acknowledgement, sent just now.
    acks.send_replace(Node::leader_acked_at(Instant::now()));
    let (outcome, waited) = waiting.await.expect("join");
    assert_eq!(outcome, Ok(()));
    assert_eq!(waited, Duration::from_millis(15), "answered on that ack");
}

#[tokio::test(start_paused = true)]
async fn a_leader_no_quorum_acknowledges_is_refused_at_its_patience() {
    let start = Instant::now();
    let (acks, rx) = watch::channel(Node::leader_acked_at(start));
    tokio::time::advance(Duration::from_millis(400)).await;
    let began = Instant::now();
    // Changes that bring no acknowledgement (a log append the followers
    // never answer) do not extend the wait.
    let noise = tokio::spawn(async move {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(50)).await;
            acks.send_modify(|_| {});
        }
        acks
    });
    let outcome = confirm(|| RULE, &mut Fake(rx)).await;
    assert_eq!(
        outcome,
        Err(Refusal::Lapsed {
            since: Some(Duration::from_millis(1000))
        })
    );
    assert_eq!(began.elapsed(), Duration::from_millis(600));
    // Past the patience, refused at once.
    let acks = noise.await.expect("join");
    let mut late = Fake(acks.subscribe());
    let began = Instant::now();
    assert!(matches!(
        confirm(|| RULE, &mut late).await,
        Err(Refusal::Lapsed { .. })
    ));
    assert_eq!(began.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn a_handoff_begun_while_a_renewal_waits_refuses_it() {
    let (node, rx) = watch::channel(Node::leader_acked_at(Instant::now()));
    tokio::time::advance(Duration::from_millis(60)).await;
    let waiting = tokio::spawn(async move { confirm(|| RULE, &mut Fake(rx)).await });
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(5)).await;
    tokio::task::yield_now().await;
    assert!(!waiting.is_finished(), "stale: it waits");
    node.send_modify(|n| {
        n.acked_at = Some(Instant::now());
        n.handing_to = Some(2);
    });
    assert_eq!(
        waiting.await.expect("join"),
        Err(Refusal::HandingOff { to: 2 })
    );
}

#[test]
fn a_handoff_lasts_for_the_term_it_began_in() {
    let handoff = Handoff::default();
    assert_eq!(handoff.during(4), None);
    handoff.begin(4, 2);
    assert_eq!(handoff.during(4), Some(2));
    assert_eq!(handoff.during(5), None, "a new term starts clean");
}
