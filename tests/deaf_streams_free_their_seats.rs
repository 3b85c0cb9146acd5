//! Renewal-stream seats come back from clients that never read (issue 43):
//! two principals fill every seat of the leader's stream pool with streams
//! whose answers they never take (an HTTP/2 window of 0), one frame each,
//! and keep their connections up. A third principal must open a stream
//! within the body deadline of those frames, told when by `Retry-After`.
//! Before, each such stream held its seat until its 120 s idle timeout,
//! and every 429 meanwhile said `Retry-After: 1`.

use crate::support;

use std::time::{Duration, Instant};

use palisade_serve::policy::{add, KEY_HEADER};
use serde_json::json;
use support::{node_setup, Access, Cluster};

/// The test's body deadline (`--body-deadline-ms`), short.
const DEADLINE: Duration = Duration::from_millis(2000);

/// A renewal stream's frames (its request body) and its answer.
type OpenStream = (tokio::sync::mpsc::Sender<Vec<u8>>, reqwest::Response);

/// An HTTP/2 client of the cluster's CA; `deaf` ones give an answer no
/// window at all, so not a byte of it can be sent.
fn h2_client(access: &Access, deaf: bool) -> reqwest::Client {
    let pem = std::fs::read(&access.ca).expect("ca.pem");
    let mut builder = reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(60))
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"));
    if deaf {
        builder = builder.http2_initial_stream_window_size(0);
    }
    builder.build().expect("client")
}

/// Opens one renewal stream as `who` on `base`: the stream, or the 429's
/// `Retry-After` in seconds.
async fn open(
    client: &reqwest::Client,
    access: &Access,
    who: &str,
    base: &str,
) -> Result<OpenStream, u64> {
    let (frames, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let body = futures::stream::unfold(rx, |mut rx| async move {
        let frame = rx.recv().await?;
        Some((Ok::<_, std::io::Error>(frame), rx))
    });
    let answer = client
        .post(format!("{base}/v1/renew/stream"))
        .header(KEY_HEADER, access.key(who))
        .header("content-type", "application/x-ndjson")
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await
        .expect("an answer to the open");
    match answer.status().as_u16() {
        200 => Ok((frames, answer)),
        429 => {
            let retry_after = answer
                .headers()
                .get("retry-after")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .expect("a 429 says Retry-After in seconds");
            Err(retry_after)
        }
        other => panic!(
            "opening a stream answered {other}: {:?}",
            answer.text().await
        ),
    }
}

/// Streams `who` opens until refused.
async fn fill(client: &reqwest::Client, access: &Access, who: &str, base: &str) -> Vec<OpenStream> {
    let mut open_streams = Vec::new();
    while let Ok(stream) = open(client, access, who, base).await {
        open_streams.push(stream);
        assert!(open_streams.len() < 100, "{who} was never refused");
    }
    open_streams
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_that_take_no_answer_give_their_seats_back_within_the_body_deadline() {
    let dir = tempfile::tempdir().expect("tempdir");
    // `--max-requests 64`: a stream pool of 4 seats.
    let setups = (1..=3)
        .map(|id| {
            let mut setup = node_setup(dir.path(), id, "127.0.0.1");
            setup.args = ["--max-requests", "64", "--body-deadline-ms"]
                .into_iter()
                .map(str::to_owned)
                .chain([DEADLINE.as_millis().to_string()])
                .collect();
            setup
        })
        .collect();
    let (cluster, access) = Cluster::start_secure_edited(dir.path(), setups, |access| {
        let accomplice = palisade_serve::policy::Rules {
            acquire: vec!["orders.".into()],
            ..Default::default()
        };
        add(&access.keys, "accomplice", &accomplice).expect("policy: accomplice");
    });
    let admin = access.http("admin");
    let base = cluster.url(cluster.settled_leader(&admin).await);

    // The two principals take every seat; `orders` is refused.
    let deaf = h2_client(&access, true);
    let mut hogs = fill(&deaf, &access, "intruder", &base).await;
    hogs.extend(fill(&deaf, &access, "accomplice", &base).await);
    let innocent = h2_client(&access, false);
    assert!(
        open(&innocent, &access, "orders", &base).await.is_err(),
        "{} streams of two principals left a seat free",
        hogs.len()
    );
    // One frame on each: one answer line each, which cannot be sent.
    let frames_before = support::counter(&admin, &base, "palisade_lease_renew_batches_total").await;
    for (i, (frames, _)) in hogs.iter().enumerate() {
        let renewal = json!({"lease": "orders.nothing", "holder": "svc", "token": 1,
                             "secret": support::test_secret("svc")});
        let frame = json!({"id": i, "renewals": [renewal]});
        frames
            .send(format!("{frame}\n").into_bytes())
            .await
            .expect("send a frame");
    }
    let sent = Instant::now();
    // Every frame answered (its line on its way out) before the innocent asks.
    let want = frames_before + hogs.len() as f64;
    let mut answered = 0.0;
    for _ in 0..100 {
        answered = support::counter(&admin, &base, "palisade_lease_renew_batches_total").await;
        if answered >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        answered >= want,
        "the frames were answered: {answered} of {want}"
    );

    // The innocent follows Retry-After; it must get a seat within the body
    // deadline of the frames (and the time it takes to ask).
    let mut told = Vec::new();
    let opened = loop {
        match open(&innocent, &access, "orders", &base).await {
            Ok(stream) => break Some(stream),
            Err(retry_after) => told.push(retry_after),
        }
        if sent.elapsed() > DEADLINE + Duration::from_secs(10) {
            break None;
        }
        let wait = Duration::from_secs(*told.last().unwrap_or(&1));
        tokio::time::sleep(wait.min(DEADLINE + Duration::from_secs(10))).await;
    };
    let after = sent.elapsed();
    eprintln!(
        "{} hog streams; orders opened one {after:?} after their frames, told Retry-After {told:?}",
        hogs.len()
    );
    assert!(
        opened.is_some(),
        "orders had no stream seat {after:?} after the hogs' frames (told {told:?})"
    );
    let bound = u64::try_from(DEADLINE.as_millis().div_ceil(1000)).expect("secs");
    assert!(
        told.iter().all(|secs| *secs <= bound),
        "Retry-After said more than the body deadline: {told:?}"
    );
    assert!(
        after < DEADLINE + Duration::from_secs(3),
        "orders waited {after:?} for a seat (body deadline {DEADLINE:?})"
    );
    drop(hogs);
}
