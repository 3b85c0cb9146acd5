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

/// Why a stream did not open.
#[derive(Debug)]
enum Refused {
    /// 429, with its `Retry-After` in seconds.
    OverShare(u64),
    /// 503: the node does not lead (leadership moved).
    NotLeading,
}

/// Opens one renewal stream as `who` on `base`.
async fn open(
    client: &reqwest::Client,
    access: &Access,
    who: &str,
    base: &str,
) -> Result<OpenStream, Refused> {
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
            Err(Refused::OverShare(retry_after))
        }
        503 => Err(Refused::NotLeading),
        other => panic!(
            "opening a stream answered {other}: {:?}",
            answer.text().await
        ),
    }
}

/// Why a round proves nothing: leadership moved during it.
type Void = String;

/// Streams `who` opens until refused.
async fn fill(
    client: &reqwest::Client,
    access: &Access,
    who: &str,
    base: &str,
) -> Result<Vec<OpenStream>, Void> {
    let mut open_streams = Vec::new();
    loop {
        match open(client, access, who, base).await {
            Ok(stream) => open_streams.push(stream),
            Err(Refused::OverShare(_)) => return Ok(open_streams),
            Err(Refused::NotLeading) => return Err(format!("{who}'s streams: 503")),
        }
        assert!(open_streams.len() < 100, "{who} was never refused");
    }
}

/// What a round saw: the innocent's stream opened (or not) how long after
/// the hogs' frames, and the `Retry-After`s it was told meanwhile.
struct Seen {
    opened: bool,
    after: Duration,
    told: Vec<u64>,
    hogs: usize,
}

/// One round on the leader at `base`: the two principals take every seat
/// with deaf streams and send a frame on each; `orders`, refused, follows
/// `Retry-After` until it opens a stream (or gives up 10 s past the body
/// deadline).
async fn round(access: &Access, admin: &reqwest::Client, base: &str) -> Result<Seen, Void> {
    // The two principals take every seat; `orders` is refused.
    let deaf = h2_client(access, true);
    let mut hogs = fill(&deaf, access, "intruder", base).await?;
    hogs.extend(fill(&deaf, access, "accomplice", base).await?);
    let innocent = h2_client(access, false);
    match open(&innocent, access, "orders", base).await {
        Err(Refused::OverShare(_)) => {}
        Err(Refused::NotLeading) => return Err("orders' first open: 503".into()),
        Ok(_) => panic!("{} streams of two principals left a seat free", hogs.len()),
    }
    // One frame on each: one answer line each, which cannot be sent.
    let batches = "palisade_lease_renew_batches_total";
    let frames_before = support::counter(admin, base, batches).await;
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
    // Every frame answered (its line on its way out) before orders asks.
    let want = frames_before + hogs.len() as f64;
    let mut answered = 0.0;
    for _ in 0..100 {
        answered = support::counter(admin, base, batches).await;
        if answered >= want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if answered < want {
        return Err(format!(
            "the frames were not answered: {answered} of {want}"
        ));
    }

    // orders follows Retry-After.
    let give_up = DEADLINE + Duration::from_secs(10);
    let mut told = Vec::new();
    let opened = loop {
        match open(&innocent, access, "orders", base).await {
            Ok(stream) => break Some(stream),
            Err(Refused::OverShare(retry_after)) => told.push(retry_after),
            Err(Refused::NotLeading) => return Err("orders' stream: 503".into()),
        }
        if sent.elapsed() > give_up {
            break None;
        }
        let wait = Duration::from_secs(*told.last().unwrap_or(&1));
        tokio::time::sleep(wait.min(give_up)).await;
    };
    Ok(Seen {
        opened: opened.is_some(),
        after: sent.elapsed(),
        told,
        hogs: hogs.len(),
    })
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
                .chain(support::STEADY_LEADER.map(str::to_owned))
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
    // A round during which leadership moves proves nothing (streams open
    // only on the leader): it is played again on the new leader.
    let mut seen = None;
    for n in 1..=5 {
        let base = cluster.url(cluster.settled_leader(&admin).await);
        match round(&access, &admin, &base).await {
            Ok(round) => {
                seen = Some(round);
                break;
            }
            Err(void) => eprintln!("round {n} is void: {void}"),
        }
    }
    let Seen {
        opened,
        after,
        told,
        hogs,
    } = seen.expect("leadership moved during each of 5 rounds");
    eprintln!(
        "{hogs} hog streams; orders opened one {after:?} after their frames, told Retry-After {told:?}"
    );
    assert!(
        opened,
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
}
