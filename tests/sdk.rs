//! The SDK against a real cluster and gateway: losing a lease is noticed in
//! every way it can happen, and nothing is written after it.

use crate::support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_client::{CancellationToken, Elector, ElectorEvent, Error};
use support::{acquire, counter, http_client, sdk, spawn_gateway_for, Cluster};

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

/// A client holding many leases renews them in batch requests over its one
/// HTTP/2 connection (renewals falling due together share a request); when one of them is taken away (revoked by an
/// operator), that one is reported lost and the others stay held.
#[tokio::test]
async fn many_leases_renew_in_batches_and_one_lost_lease_stays_alone() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = sdk(&cluster, None);
    let http = http_client();
    let leader = cluster.leader(&http).await;
    let ttl = Duration::from_millis(1500);
    // Acquired together (as a service takes its shards at start), so their
    // renewals fall due together and go out in batches.
    let names: Vec<String> = (0..40).map(|i| format!("shard-{i}")).collect();
    let leases: Vec<_> = futures::future::join_all(
        names
            .iter()
            .map(|name| client.acquire(name, "owner", ttl, None)),
    )
    .await
    .into_iter()
    .map(|lease| lease.expect("acquire"))
    .collect();
    let batches_before = counter(
        &http,
        &cluster.url(leader),
        "palisade_lease_renew_batches_total",
    )
    .await;
    // Two ttls: every lease renews about six times.
    tokio::time::sleep(2 * ttl).await;
    assert!(leases.iter().all(|l| l.is_held()), "all still held");
    let base = cluster.url(cluster.leader(&http).await);
    let batches = counter(&http, &base, "palisade_lease_renew_batches_total").await;
    let renewals = counter(&http, &base, "palisade_lease_renewals_total").await;
    assert!(
        batches > batches_before,
        "renewals went in batches ({batches_before} -> {batches})"
    );
    assert!(
        renewals >= 40.0 * 3.0,
        "every lease renewed several times: {renewals} renewals"
    );

    // The nodes speak h2c: a batch sent over HTTP/2 to a follower is
    // forwarded (over the peers' HTTP/2 connection) and answered per lease.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let leader = cluster.leader(&http).await;
    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let entry = |l: &palisade_client::Lease| {
        let id = l.id();
        serde_json::json!({"lease": id.lease, "holder": id.holder, "token": id.token,
            "secret": id.secret.as_ref().map(|s| s.expose().to_owned())})
    };
    let answer = h2
        .post(format!("{}/v1/renew", cluster.url(follower)))
        .json(&serde_json::json!({"renewals": [entry(&leases[0]), entry(&leases[1])]}))
        .send()
        .await
        .expect("batch over h2");
    assert_eq!(answer.version(), reqwest::Version::HTTP_2);
    assert_eq!(answer.status(), 200);
    let body: serde_json::Value = answer.json().await.expect("json");
    assert_eq!(body["results"][0]["status"], 200, "{body}");
    assert_eq!(body["results"][1]["status"], 200, "{body}");

    // Revoke shard-7: its renewals are refused from now on.
    let victim = &leases[7];
    let (status, body) = support::post_json(
        &http,
        &format!("{base}/v1/leases/shard-7/revoke"),
        serde_json::json!({"token": victim.token()}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let lost = tokio::time::timeout(ttl, victim.lost()).await;
    assert!(lost.is_ok(), "the revoked lease was not reported lost");
    tokio::time::sleep(ttl).await;
    for (i, lease) in leases.iter().enumerate() {
        assert_eq!(lease.is_held(), i != 7, "shard-{i}");
    }
    for lease in leases {
        lease.release().await.ok();
    }
}

/// `palisade run` keeps `PALISADE_JWT_FILE` fresh: a child writing through
/// the gateway with it (the CLI reads the file at each call) keeps
/// succeeding for many ttls, long after the JWT it started with expired.
#[tokio::test]
async fn palisade_run_keeps_the_childs_jwt_file_fresh() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    cluster.leader(&http_client()).await;
    let gateway = spawn_gateway_for(&cluster, &dir.path().join("gw"));
    let log = dir.path().join("writes.log");
    let bin = env!("CARGO_BIN_EXE_palisade");
    // 16 writes 500 ms apart: 8 s, eight ttls of 1 s (a JWT lives two).
    let script = format!(
        "for i in $(seq 1 16); do \
           {bin} object put job/state --value \"$i\" --gateway {gw} >/dev/null 2>>{log}.err; \
           echo $? >> {log}; sleep 0.5; \
         done",
        gw = gateway.url,
        log = log.display(),
    );
    let status = Command::new(bin)
        .args([
            "run",
            "--lease",
            "job",
            "--holder",
            "runner",
            "--ttl-ms",
            "1000",
            "--election",
            &cluster.urls().join(","),
            "--gateway",
            &gateway.url,
            "--",
            "sh",
            "-c",
            &script,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("palisade run");
    assert!(status.success(), "palisade run: {status}");
    let codes = std::fs::read_to_string(&log).expect("log");
    let errors = std::fs::read_to_string(format!("{}.err", log.display())).unwrap_or_default();
    assert_eq!(
        codes.lines().collect::<Vec<_>>(),
        vec!["0"; 16],
        "every write succeeded; errors: {errors}"
    );
}

/// The elector's rule: no `StoppedLeading` without a `StartedLeading`. A
/// replica that campaigns while another holds the lease, then shuts down,
/// hears who leads (`LeaderChanged`) and nothing else.
#[tokio::test]
async fn an_elector_that_never_led_reports_no_stop() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let client = sdk(&cluster, None);
    cluster.leader(&http_client()).await;
    // A long ttl: a loaded machine must not let the holder's lease lapse
    // (the replica would then lead, and rightly report a stop).
    let ttl = Duration::from_secs(10);
    let held = client
        .acquire("contested", "replica-0", ttl, None)
        .await
        .expect("acquire");
    let (events, mut received) = tokio::sync::mpsc::unbounded_channel();
    let shutdown = CancellationToken::new();
    let elector = tokio::spawn({
        let (client, shutdown) = (client.clone(), shutdown.clone());
        async move {
            Elector::new(client, "contested", "replica-1", ttl)
                .run(Some(events), shutdown, |_lease, cancelled| async move {
                    cancelled.cancelled().await;
                })
                .await;
        }
    });
    // Campaigning: it hears who leads (however slowly the machine runs).
    let holder = ElectorEvent::LeaderChanged {
        holder: Some("replica-0".into()),
    };
    let mut seen = Vec::new();
    let heard = tokio::time::timeout(Duration::from_secs(20), async {
        while let Some(event) = received.recv().await {
            let done = event == holder;
            seen.push(event);
            if done {
                return;
            }
        }
    })
    .await;
    assert!(heard.is_ok(), "the replica never heard who leads: {seen:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(15), elector)
        .await
        .expect("elector stops")
        .expect("join");
    while let Ok(event) = received.try_recv() {
        seen.push(event);
    }
    assert!(
        seen.iter()
            .all(|e| matches!(e, ElectorEvent::LeaderChanged { .. })),
        "a replica that never led got {seen:?}"
    );
    assert!(held.is_held());
    held.release().await.expect("release");
}

/// L2: a holder of a 3 s lease keeps it through a 4 s freeze (SIGSTOP) of
/// the Raft leader, five times in a row. The SDK bounds each renewal
/// attempt by a slice of the time the lease has left, then asks another
/// node too (a follower forwards to the new leader), and ends its renewal
/// stream on the frozen node: the freeze costs a slice, not the lease.
#[tokio::test]
async fn a_lease_rides_through_five_freezes_of_the_leader() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let http = http_client();
    let client = sdk(&cluster, None);
    let mut leader = cluster.settled_leader(&http).await;
    let ttl = Duration::from_secs(3);
    let lease = client
        .acquire("frozen-leader", "rider", ttl, Some(Duration::from_secs(10)))
        .await
        .expect("acquire");
    for round in 1..=5 {
        // A few renewals on this leader first (the stream opens on it).
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(lease.is_held(), "round {round}: lost before the freeze");
        cluster.pause(leader).expect("SIGSTOP");
        let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
        // The freeze lasts 4 s (longer than the ttl) whatever happens.
        let (lost, successor) = tokio::join!(
            tokio::time::timeout(Duration::from_secs(4), lease.lost()),
            cluster.leader_among(&http, &others, 60),
        );
        cluster.resume(leader).expect("SIGCONT");
        assert!(
            successor.is_some(),
            "round {round}: no node took over from frozen leader {leader}"
        );
        assert!(
            lost.is_err() && lease.is_held(),
            "round {round}: the lease was lost while leader {leader} was frozen"
        );
        leader = cluster.settled_leader(&http).await;
        assert!(lease.is_held(), "round {round}: lost after the thaw");
    }
    let info = client.get("frozen-leader").await.expect("get");
    assert_eq!(
        (info.holder.as_deref(), info.token),
        (Some("rider"), lease.token()),
        "the same grant all along"
    );
    lease.release().await.expect("release");
}
