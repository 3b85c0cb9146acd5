//! The SDK against a real cluster and gateway: losing a lease is noticed in
//! every way it can happen, and nothing is written after it.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_client::{CancellationToken, Elector, ElectorEvent, Error};
use support::{acquire, http_client, sdk, spawn_gateway_for, Cluster};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Renewals that fail (every election node frozen) end in a lost lease at
/// the safe deadline: `is_held` turns false and `lost()` resolves.
#[tokio::test]
async fn the_lease_is_lost_when_renewals_fail() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = sdk(&cluster, None);
    cluster.leader(&http_client()).await;
    let lease = client
        .acquire(
            "renewals",
            "h",
            Duration::from_millis(1000),
            Some(Duration::from_secs(5)),
        )
        .await
        .expect("acquire");
    assert!(lease.is_held());
    let deadline = lease.deadline();
    for id in 1..=3 {
        cluster.pause(id).expect("SIGSTOP");
    }
    let lost = tokio::time::timeout(Duration::from_secs(3), lease.lost()).await;
    let at = tokio::time::Instant::now();
    for id in 1..=3 {
        cluster.resume(id).expect("SIGCONT");
    }
    assert!(lost.is_ok(), "lost() did not fire");
    assert!(!lease.is_held());
    assert!(at >= deadline, "lost before the deadline");
    assert!(
        at - deadline < Duration::from_millis(300),
        "lost {:?} after the deadline",
        at - deadline
    );
    let refused = lease.put("renewals/x", "late").await;
    assert!(matches!(refused, Err(Error::LeaseLost(_))), "{refused:?}");
}

/// Renewals follow the ttl the leader answers, not the one first asked
/// for: after the holder re-acquires its grant with a longer ttl (same
/// secret), the SDK's next renewal moves the safe deadline by the longer
/// ttl.
#[tokio::test]
async fn renewals_use_the_ttl_the_leader_answers() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = sdk(&cluster, None);
    let http = http_client();
    let leader = cluster.leader(&http).await;
    let lease = client
        .acquire("ttl-follow", "h", Duration::from_millis(1000), None)
        .await
        .expect("acquire");
    let before = lease.deadline() - tokio::time::Instant::now();
    assert!(before <= Duration::from_millis(1000), "{before:?}");
    let secret = lease.id().secret.expect("a secret");
    let (status, grant) = support::post_json(
        &http,
        &format!("{}/v1/leases/ttl-follow/acquire", cluster.url(leader)),
        serde_json::json!({"holder": "h", "ttl_ms": 8000, "secret": secret.expose()}),
    )
    .await;
    assert_eq!(status, 200, "{grant}");
    assert_eq!(grant["ttl_ms"], 8000);
    assert_eq!(grant["token"], lease.token(), "the same grant");
    // Renewals run every ttl/3 (333 ms); the first after the re-acquire
    // answers 8 s.
    let started = Instant::now();
    let mut left = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(3) {
        left = lease.deadline() - tokio::time::Instant::now();
        if left > Duration::from_secs(5) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        left > Duration::from_secs(5),
        "the deadline still follows the 1 s ttl: {left:?} left"
    );
    assert!(lease.is_held());
    // (No release through this handle: the raw re-acquire replaced it as
    // the grant's latest handle, so its release frees nothing, by design.)
}

/// S3: dropping a lease (which releases it in the background) and acquiring
/// it again at once under the same holder never leaves the new handle
/// believing in a grant the late release freed. Without the SDK's release
/// gate the acquire can be granted the same token again (acquire by the
/// holder is idempotent) and the release then frees it.
#[tokio::test]
async fn a_dropped_lease_never_releases_the_next_grant() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = sdk(&cluster, None);
    let http = http_client();
    cluster.leader(&http).await;
    for round in 0..20 {
        let ttl = Duration::from_millis(2000);
        let first = client
            .acquire("again", "h", ttl, Some(Duration::from_secs(5)))
            .await
            .expect("acquire");
        drop(first);
        let second = client
            .acquire("again", "h", ttl, Some(Duration::from_secs(5)))
            .await
            .expect("acquire again");
        // Give a late release time to land, then ask the cluster.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let info = client.get("again").await.expect("get");
        assert!(second.is_held());
        assert_eq!(
            (info.holder.as_deref(), info.token),
            (Some("h"), second.token()),
            "round {round}: the cluster freed the grant the new handle holds"
        );
        second.release().await.expect("release");
    }
}

/// A holder process frozen past its deadline reports the lease not held the
/// moment it resumes, even before any renewal attempt (S3 from the holder's
/// side), while another holder has taken over.
#[tokio::test]
async fn a_frozen_holder_sees_not_held_when_it_wakes() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let http = http_client();
    cluster.leader(&http).await;
    let mut holder = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "lease",
            "acquire",
            "frozen",
            "--holder",
            "sleepy",
            "--ttl-ms",
            "1000",
            "--wait-ms",
            "5000",
            "--hold",
            "--status-ms",
            "20",
            "--election",
            &cluster.urls().join(","),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn holder");
    let lines: Arc<Mutex<Vec<(Instant, String)>>> = Arc::default();
    let reader = {
        let lines = lines.clone();
        let stdout = holder.stdout.take().expect("stdout");
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                lines.lock().expect("lock").push((Instant::now(), line));
            }
        })
    };
    let wait_for = |needle: &str| {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(10) {
            if lines
                .lock()
                .expect("lock")
                .iter()
                .any(|(_, l)| l.contains(needle))
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("holder never printed {needle:?}");
    };
    wait_for("status held=true");
    let pid = holder.id().to_string();
    Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .expect("stop");
    let stopped = Instant::now();
    // While it is frozen, the lease expires and another holder takes it.
    let (status, grant) = loop {
        let (status, grant) = acquire(&http, &cluster.url(1), "frozen", "awake", 5000).await;
        if status == 200 || stopped.elapsed() > Duration::from_secs(5) {
            break (status, grant);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status, 200, "{grant}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let resumed = Instant::now();
    Command::new("kill")
        .args(["-CONT", &pid])
        .status()
        .expect("cont");
    wait_for("lost");
    let _ = holder.kill();
    let _ = holder.wait();
    let _ = reader.join();
    let after: Vec<String> = lines
        .lock()
        .expect("lock")
        .iter()
        .filter(|(at, _)| *at > resumed)
        .map(|(_, l)| l.clone())
        .collect();
    assert!(!after.is_empty());
    assert!(
        after.iter().all(|l| !l.contains("held=true")),
        "the woken holder claimed the lease: {after:?}"
    );
}

/// A write fenced at the gateway surfaces as a lost lease.
#[tokio::test]
async fn a_fenced_write_surfaces_as_lease_lost() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let gateway = spawn_gateway_for(&cluster, &dir.path().join("gateway"));
    let client = sdk(&cluster, Some(&gateway));
    cluster.leader(&http_client()).await;
    let a = loop {
        match client
            .acquire(
                "fenced",
                "A",
                Duration::from_secs(10),
                Some(Duration::from_secs(5)),
            )
            .await
        {
            Ok(lease) => break lease,
            // The gateway may still be loading the JWKS.
            Err(Error::Protocol { status: 401, .. }) => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(err) => panic!("{err}"),
        }
    };
    a.put("fenced/x", "from A").await.expect("A writes");
    // Behind A's back (with A's own grant id: a bug in A's process) the
    // grant is released and B takes over (and fences).
    client.release_grant(&a.id()).await.expect("release");
    let b = client
        .acquire("fenced", "B", Duration::from_secs(10), None)
        .await
        .expect("B acquires");
    assert!(b.token() > a.token());
    assert!(
        a.is_held(),
        "A's SDK has not noticed yet (its deadline is ahead)"
    );
    let refused = a.put("fenced/x", "late A").await;
    assert!(matches!(refused, Err(Error::Fenced { .. })), "{refused:?}");
    assert!(refused.expect_err("fenced").is_lease_lost());
    assert!(!a.is_held(), "a fenced write marks the lease lost");
    let stored = b.get("fenced/x").await.expect("get").expect("object");
    assert_eq!(stored.value, "from A", "the refused write changed nothing");
    b.put("fenced/x", "from B").await.expect("B writes");
}

/// The elector cancels the user's task within one renew interval of losing
/// the lease, reports it, and campaigns again.
#[tokio::test]
async fn the_elector_cancels_the_task_when_leadership_is_lost() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = sdk(&cluster, None);
    cluster.leader(&http_client()).await;
    let (events, mut received) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let cancelled_at: Arc<Mutex<Option<tokio::time::Instant>>> = Arc::default();
    let elector = tokio::spawn({
        let (client, shutdown, cancelled_at) =
            (client.clone(), shutdown.clone(), cancelled_at.clone());
        async move {
            Elector::new(client, "elected", "replica-1", Duration::from_millis(1500))
                .run(Some(events), shutdown, move |_lease, cancelled| {
                    let cancelled_at = cancelled_at.clone();
                    async move {
                        cancelled.cancelled().await;
                        *cancelled_at.lock().expect("lock") = Some(tokio::time::Instant::now());
                    }
                })
                .await;
        }
    });
    let token = loop {
        match tokio::time::timeout(Duration::from_secs(10), received.recv()).await {
            Ok(Some(ElectorEvent::StartedLeading { token })) => break token,
            Ok(Some(_)) => {}
            other => panic!("no StartedLeading: {other:?}"),
        }
    };
    let revoked = tokio::time::Instant::now();
    // An operator revokes the grant: the holder learns it on its next renewal.
    client.revoke("elected", token).await.expect("revoke");
    loop {
        match tokio::time::timeout(Duration::from_secs(5), received.recv()).await {
            Ok(Some(ElectorEvent::StoppedLeading { .. })) => break,
            Ok(Some(_)) => {}
            other => panic!("no StoppedLeading: {other:?}"),
        }
    }
    let at = cancelled_at
        .lock()
        .expect("lock")
        .expect("task was cancelled");
    let renew_interval = Duration::from_millis(500);
    assert!(
        at - revoked <= renew_interval + Duration::from_millis(300),
        "cancelled after {:?}",
        at - revoked
    );
    // It campaigns again and leads with a higher token.
    loop {
        match tokio::time::timeout(Duration::from_secs(10), received.recv()).await {
            Ok(Some(ElectorEvent::StartedLeading { token: again })) => {
                assert!(again > token);
                break;
            }
            Ok(Some(_)) => {}
            other => panic!("no second StartedLeading: {other:?}"),
        }
    }
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(5), elector)
        .await
        .expect("elector stops")
        .expect("join");
}

/// `palisade run` stops its child when the lease is lost.
#[tokio::test]
async fn palisade_run_kills_its_child_on_loss() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = sdk(&cluster, None);
    cluster.leader(&http_client()).await;
    let marker = dir.path().join("child.pid");
    let mut run = Command::new(env!("CARGO_BIN_EXE_palisade"))
        .args([
            "run",
            "--lease",
            "job",
            "--holder",
            "runner",
            "--ttl-ms",
            "1500",
            "--grace-ms",
            "500",
            "--election",
            &cluster.urls().join(","),
            "--",
            "sh",
            "-c",
            &format!(
                "echo $$ > {}; echo $PALISADE_TOKEN >> {}; exec sleep 60",
                marker.display(),
                marker.display()
            ),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn run");
    let started = Instant::now();
    let contents = loop {
        if let Ok(text) = std::fs::read_to_string(&marker) {
            if text.lines().count() >= 2 {
                break text;
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "child never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut lines = contents.lines();
    let child_pid = lines.next().expect("pid").trim().to_owned();
    let token: u64 = lines
        .next()
        .expect("token")
        .trim()
        .parse()
        .expect("token in env");
    client.revoke("job", token).await.expect("revoke");
    let revoked = Instant::now();
    let status = loop {
        if let Some(status) = run.try_wait().expect("wait") {
            break status;
        }
        assert!(
            revoked.elapsed() < Duration::from_secs(5),
            "palisade run did not stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(status.code(), Some(3), "exit code 3 means lease lost");
    let alive = Command::new("kill")
        .args(["-0", &child_pid])
        .output()
        .expect("kill -0");
    assert!(!alive.status.success(), "the child is still running");
}
