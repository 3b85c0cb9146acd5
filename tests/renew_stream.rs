//! The renewal stream (`POST /v1/renew/stream`) against a real cluster:
//! frames answered as a batch request would be, refusals that change
//! nothing, a deposed leader that renews nothing on a stream it still
//! holds open, and the SDK renewing over it, across the leader's death.

use crate::support;

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{acquire, counter, http_client, sdk, test_secret, Cluster};
use tokio::sync::mpsc;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One open stream, as a test drives it: frames out, answer lines in.
struct Stream {
    frames: Option<mpsc::Sender<Vec<u8>>>,
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Stream {
    /// Opens a stream on `base`: the stream, or the refusal's status and body.
    async fn open(base: &str) -> Result<Self, (u16, Value)> {
        let (frames, rx) = mpsc::channel::<Vec<u8>>(16);
        let body = futures::stream::unfold(rx, |mut rx| async move {
            let frame = rx.recv().await?;
            Some((Ok::<_, std::io::Error>(frame), rx))
        });
        let response = h2()
            .post(format!("{base}/v1/renew/stream"))
            .header("content-type", "application/x-ndjson")
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await
            .expect("open the stream");
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        if response.status() != 200 {
            let status = response.status().as_u16();
            return Err((status, response.json().await.unwrap_or(Value::Null)));
        }
        Ok(Self {
            frames: Some(frames),
            response,
            buffer: Vec::new(),
        })
    }

    async fn send(&self, line: &str) {
        let frames = self.frames.as_ref().expect("open");
        frames
            .send(format!("{line}\n").into_bytes())
            .await
            .expect("send a frame");
    }

    /// The next answer line, or `None` once the answer ends.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buffer.drain(..=at).collect();
                return Some(serde_json::from_slice(&line).expect("an answer line is JSON"));
            }
            let chunk = tokio::time::timeout(Duration::from_secs(10), self.response.chunk())
                .await
                .expect("an answer within 10 s");
            match chunk {
                Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }
}

fn h2() -> reqwest::Client {
    reqwest::Client::builder()
        .http2_prior_knowledge()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// One renewal entry for `lease` held by `holder` with `token`.
fn entry(lease: &str, holder: &str, token: u64) -> Value {
    json!({"lease": lease, "holder": holder, "token": token, "secret": test_secret(holder)})
}

/// The leader and a stream open on it (leadership may move just after the
/// start, between finding the leader and opening).
async fn open_on_leader(cluster: &Cluster, http: &reqwest::Client) -> (u64, Stream) {
    for _ in 0..10 {
        let leader = cluster.settled_leader(http).await;
        if let Ok(stream) = Stream::open(&cluster.url(leader)).await {
            return (leader, stream);
        }
    }
    panic!("no leader kept leading long enough to open a stream");
}

/// Frames are answered, each with its id, exactly as the batch route
/// answers the same renewals; a frame outside the rules is refused alone;
/// an unreadable line ends the stream with a last line naming it; a
/// follower and a wrong media type refuse to open one.
#[tokio::test]
async fn a_stream_answers_each_frame_as_a_batch_would() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let http = http_client();
    // Acquired through any node (forwarded); leadership may still move
    // once after the start, and then a stream is opened again.
    let (_, a) = acquire(&http, &cluster.url(1), "stream-a", "svc", 10_000).await;
    let (_, b) = acquire(&http, &cluster.url(1), "stream-b", "svc", 10_000).await;
    let (ta, tb) = (
        a["token"].as_u64().expect("token"),
        b["token"].as_u64().expect("token"),
    );
    let frame =
        json!({"id": 1, "renewals": [entry("stream-a", "svc", ta), entry("stream-b", "svc", tb)]});
    let mut opened = None;
    for _ in 0..5 {
        let (leader, mut stream) = open_on_leader(&cluster, &http).await;
        stream.send(&frame.to_string()).await;
        let answer = stream.next().await.expect("an answer");
        if answer["status"] == 503 {
            continue;
        }
        assert_eq!(answer["id"], 1, "{answer}");
        assert_eq!(answer["status"], 200, "{answer}");
        for (i, token) in [ta, tb].into_iter().enumerate() {
            assert_eq!(answer["results"][i]["status"], 200, "{answer}");
            assert_eq!(answer["results"][i]["grant"]["token"], token, "{answer}");
        }
        opened = Some((leader, stream));
        break;
    }
    let (leader, mut stream) = opened.expect("a stream that renewed within 5 tries");
    let base = cluster.url(leader);

    // A stale token: the same refusal the batch route gives, in the frame.
    let stale = json!({"id": 2, "renewals": [entry("stream-a", "svc", ta - 1)]});
    stream.send(&stale.to_string()).await;
    let answer = stream.next().await.expect("an answer");
    let (_, batch) = support::post_json(
        &http,
        &format!("{base}/v1/renew"),
        json!({"renewals": [entry("stream-a", "svc", ta - 1)]}),
    )
    .await;
    assert_eq!(answer["id"], 2, "{answer}");
    assert_eq!(
        answer["results"][0]["status"],
        batch["results"][0]["status"]
    );
    assert_eq!(answer["results"][0]["error"], batch["results"][0]["error"]);
    assert_ne!(answer["results"][0]["status"], 200, "{answer}");

    // Outside the rules: that frame alone is refused, the stream goes on.
    stream.send(r#"{"id": 3, "renewals": []}"#).await;
    let answer = stream.next().await.expect("an answer");
    assert_eq!(
        (answer["id"].clone(), answer["status"].clone()),
        (json!(3), json!(400))
    );
    stream
        .send(&json!({"id": 4, "renewals": [entry("stream-b", "svc", tb)]}).to_string())
        .await;
    let answer = stream.next().await.expect("an answer");
    assert_eq!(answer["results"][0]["status"], 200, "{answer}");

    // An unreadable line: a last line without an id, then the end.
    stream.send("this is not json").await;
    let last = stream.next().await.expect("a last line");
    assert_eq!(last["status"], 400, "{last}");
    assert!(last.get("id").is_none(), "{last}");
    assert!(stream.next().await.is_none(), "the stream ended");

    let follower = (1..=3).find(|id| *id != leader).expect("a follower");
    let refused = Stream::open(&cluster.url(follower))
        .await
        .err()
        .expect("refused");
    assert_eq!(refused.0, 503, "{refused:?}");
    assert_eq!(refused.1["error"], "no_quorum", "{refused:?}");
    let wrong_type = h2()
        .post(format!("{base}/v1/renew/stream"))
        .json(&json!({"id": 1, "renewals": []}))
        .send()
        .await
        .expect("answer");
    assert_eq!(wrong_type.status(), 400);
    // Both leases are still held by svc: nothing above released them.
    stream.frames.take();
}

/// The attack a stream invites: a leader paused with a stream open, deposed
/// meanwhile, wakes up and is sent a renewal on the stream it still holds.
/// It must not renew: the frame waits for a quorum round, which the
/// followers, now on a newer term, refuse.
#[tokio::test]
async fn a_deposed_leader_renews_nothing_on_its_open_stream() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = Cluster::start(dir.path());
    let http = http_client();
    let (leader, mut stream) = open_on_leader(&cluster, &http).await;
    let base = cluster.url(leader);
    let (_, grant) = acquire(&http, &base, "paused", "svc", 30_000).await;
    let token = grant["token"].as_u64().expect("token");
    let frame =
        |id: u64| json!({"id": id, "renewals": [entry("paused", "svc", token)]}).to_string();
    stream.send(&frame(1)).await;
    assert_eq!(stream.next().await.expect("answer")["status"], 200);

    cluster.pause(leader).expect("SIGSTOP");
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let new_leader = cluster.leader_among(&http, &others, 300).await;
    cluster.resume(leader).expect("SIGCONT");
    assert!(new_leader.is_some(), "no other node took over in 15 s");
    let sent = Instant::now();
    stream.send(&frame(2)).await;
    let answer = stream.next().await;
    eprintln!(
        "the deposed leader answered in {:?}: {answer:?}",
        sent.elapsed()
    );
    if let Some(answer) = &answer {
        assert_eq!(answer["status"], 503, "{answer}");
        assert!(answer["results"].is_null(), "{answer}");
    }
}

/// The SDK renews a client's leases over one stream to the leader. When the
/// leader is killed, the frames out go again as requests and the client
/// opens a stream on the new leader; when that one is frozen (SIGSTOP: the
/// stream stays open, nothing answers), the unanswered frame ends the
/// stream after the request timeout and the renewals move on. No lease is
/// lost either time.
#[tokio::test]
async fn the_sdk_renews_over_a_stream_through_a_killed_and_a_frozen_leader() {
    let _serial = SERIAL.lock().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::start(dir.path());
    let http = http_client();
    let leader = cluster.settled_leader(&http).await;
    let client = sdk(&cluster, None);
    let ttl = Duration::from_millis(6000);
    let names: Vec<String> = (0..20).map(|i| format!("streamed-{i}")).collect();
    let leases: Vec<_> =
        futures::future::join_all(names.iter().map(|n| client.acquire(n, "owner", ttl, None)))
            .await
            .into_iter()
            .map(|lease| lease.expect("acquire"))
            .collect();
    tokio::time::sleep(ttl).await;
    let streams = counter(
        &http,
        &cluster.url(leader),
        "palisade_lease_renew_streams_total",
    )
    .await;
    assert!(streams >= 1.0, "the client opened a stream on the leader");

    cluster.kill(leader);
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let second = cluster
        .leader_among(&http, &others, 300)
        .await
        .expect("a new leader");
    tokio::time::sleep(ttl).await;
    let held = |leases: &[palisade_client::Lease]| {
        leases
            .iter()
            .filter(|l| !l.is_held())
            .map(|l| l.id().lease.clone())
            .collect::<Vec<_>>()
    };
    assert!(
        held(&leases).is_empty(),
        "lost after the kill: {:?}",
        held(&leases)
    );
    let streams = counter(
        &http,
        &cluster.url(second),
        "palisade_lease_renew_streams_total",
    )
    .await;
    assert!(
        streams >= 1.0,
        "the client opened a stream on the new leader"
    );

    // Bring the killed node back so that a quorum outlives the freeze.
    cluster.start_node(leader).expect("restart");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let frozen = cluster.leader(&http).await;
    cluster.pause(frozen).expect("SIGSTOP");
    let others: Vec<u64> = (1..=3).filter(|id| *id != frozen).collect();
    let third = cluster.leader_among(&http, &others, 300).await;
    tokio::time::sleep(ttl).await;
    let lost = held(&leases);
    cluster.resume(frozen).expect("SIGCONT");
    assert!(third.is_some(), "no other node took over in 15 s");
    assert!(
        lost.is_empty(),
        "lost while the leader was frozen: {lost:?}"
    );
    for lease in leases {
        lease.release().await.ok();
    }
}
