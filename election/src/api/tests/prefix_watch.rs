//! `GET /v1/watch` in process: a reader that falls more than the feed keeps
//! behind gets a last line saying so and where to resume, and the stream
//! ends; the node buffers no more for it than the feed's ring.

use std::time::Duration;

use axum::body::Body;
use futures::StreamExt;
use http::{Request, StatusCode};
use palisade_names::LeaseName;
use serde_json::{json, Value};
use tower::ServiceExt;

use super::{node, node_with, Node};
use crate::raft::feed::{Change, FEED_CAPACITY};

/// The lines of `body` until it ends (bounded in time).
async fn lines(body: Body, wanted: usize) -> Vec<Value> {
    let mut stream = body.into_data_stream();
    let mut text = Vec::new();
    let mut lines = Vec::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(20), stream.next()).await;
        match next.expect("a chunk or the end in time") {
            Some(chunk) => text.extend_from_slice(&chunk.expect("a chunk")),
            None => break,
        }
        while let Some(at) = text.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = text.drain(..=at).collect();
            lines.push(serde_json::from_slice(&line).expect("a JSON line"));
        }
        if lines.len() >= wanted {
            break;
        }
    }
    lines
}

/// Grants `jobs.a`, opens the watch `uri`, and reads its first line (the
/// catch-up's `jobs.a`): that line and the rest of the answer.
async fn watch_after_a_grant(
    node: &Node,
    uri: &str,
) -> (
    Value,
    impl futures::Stream<Item = Result<axum::body::Bytes, axum::Error>>,
) {
    let (status, grant) = node
        .post(
            "/v1/leases/jobs.a/acquire",
            json!({"holder": "a", "ttl_ms": 60000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{grant}");
    let request = Request::get(uri).body(Body::empty()).expect("request");
    let response = node.app.clone().oneshot(request).await.expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    let mut body = response.into_body().into_data_stream();
    let first = tokio::time::timeout(Duration::from_secs(20), body.next())
        .await
        .expect("the catch-up in time")
        .expect("a chunk")
        .expect("bytes");
    let first: Value = serde_json::from_slice(&first).expect("a JSON line");
    assert_eq!(first["lease"]["lease"], "jobs.a", "{first}");
    (first, body)
}

#[tokio::test]
async fn a_reader_that_falls_behind_the_feed_gets_a_last_line_and_the_stream_ends() {
    let node = node().await;
    let (first, body) = watch_after_a_grant(&node, "/v1/watch?prefix=jobs.").await;

    // More changes than the feed keeps arrive while the reader reads
    // nothing (as apply sends them: it never waits for a watcher).
    let state = &node._node.state;
    let lease = LeaseName::new("jobs.a").expect("name");
    let record = state
        .group_zero()
        .applied
        .read(|s| s.table.leases.get(&lease).cloned())
        .expect("the record");
    let from = first["index"].as_u64().expect("index") + 1;
    let flood = (0..FEED_CAPACITY as u64 + 10).map(|i| Change::Lease {
        index: from + i,
        lease: lease.clone(),
        record: Box::new(record.clone()),
    });
    state.group_zero().applied.feed.send(flood.collect());

    let rest = lines(Body::from_stream(body), usize::MAX).await;
    let last = rest.last().expect("a last line");
    assert_eq!(last["error"], "behind", "{last}");
    let delivered = rest[..rest.len() - 1]
        .iter()
        .map(|l| l["index"].as_u64().expect("index"))
        .max()
        .unwrap_or(first["index"].as_u64().expect("index"));
    assert_eq!(
        last["index"], delivered,
        "resume after the last line delivered"
    );
    assert!(
        rest.len() < 16,
        "the node held no backlog for the reader: {} lines",
        rest.len()
    );
}

#[tokio::test]
async fn one_reclaim_of_several_records_is_a_line_for_each_under_the_prefix() {
    let node = node().await;
    // Keep-alives far apart: every line below is the reclaim's.
    let request = Request::get("/v1/watch?prefix=jobs.&keepalive_ms=60000")
        .body(Body::empty())
        .expect("request");
    let response = node.app.clone().oneshot(request).await.expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    // The watch subscribed to the feed before it answered: what is sent
    // now, past the applied index (well past: the leader's duties may
    // append meanwhile), reaches it.
    let state = &node._node.state;
    let index = *state.group_zero().applied.changes.borrow() + 1000;
    let leases = ["jobs.a", "other.x", "jobs.b"].map(|l| LeaseName::new(l).expect("name"));
    let body = response.into_body();
    state
        .group_zero()
        .applied
        .feed
        .send(vec![Change::Reclaimed {
            index,
            leases: leases.to_vec(),
        }]);
    let rest = lines(body, 2).await;
    assert_eq!(
        rest,
        vec![
            json!({"index": index, "lease_name": "jobs.a", "deleted": true}),
            json!({"index": index, "lease_name": "jobs.b", "deleted": true}),
        ]
    );
}

#[tokio::test]
async fn a_watch_of_every_partition_ends_whole_when_one_partition_falls_behind() {
    let node = node_with(|config| config.partitions = 3).await;
    let state = node._node.state.clone();
    for _ in 0..500 {
        if state.groups().iter().all(|group| group.is_leader()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let uri = "/v1/watch?prefix=jobs.&keepalive_ms=60000";
    let (first, body) = watch_after_a_grant(&node, uri).await;
    let home = first["partition"]
        .as_u64()
        .expect("a line names its partition");

    // Partition `other` gets more changes than its feed keeps while the
    // reader reads nothing; the other partitions' watchers are fine.
    let other = (home + 1) % 3;
    let lease = LeaseName::new("jobs.a").expect("name");
    let group = &state.groups()[usize::try_from(other).expect("id")];
    let record = state
        .group(&lease)
        .applied
        .read(|s| s.table.leases.get(&lease).cloned())
        .expect("the record");
    let from = *group.applied.changes.borrow() + 1000;
    let flood = (0..FEED_CAPACITY as u64 + 10).map(|i| Change::Lease {
        index: from + i,
        lease: lease.clone(),
        record: Box::new(record.clone()),
    });
    group.applied.feed.send(flood.collect());

    // The whole stream ends (the body's end, not a timeout in `lines`),
    // its last line naming the partition that fell behind.
    let rest = lines(Body::from_stream(body), usize::MAX).await;
    let last = rest.last().expect("a last line");
    assert_eq!(last["error"], "behind", "{last}");
    assert_eq!(last["partition"], other, "{last}");
}

#[tokio::test]
async fn a_watch_of_every_partition_repeats_no_keep_alive_but_partition_zeros() {
    let node = node_with(|config| config.partitions = 3).await;
    let request = Request::get("/v1/watch?prefix=nothing.here.&keepalive_ms=100")
        .body(Body::empty())
        .expect("request");
    let response = node.app.clone().oneshot(request).await.expect("answer");
    assert_eq!(response.status(), StatusCode::OK);
    let got = lines(response.into_body(), 15).await;
    let mut last = [None::<u64>; 3];
    let mut zeros = 0;
    for line in &got {
        let partition = line["partition"].as_u64().expect("a partition") as usize;
        let index = line["index"].as_u64().expect("an index");
        if partition == 0 {
            zeros += 1;
        } else {
            assert!(
                last[partition].is_none_or(|before| index > before),
                "partition {partition} repeated its keep-alive at {index}: {got:?}"
            );
        }
        last[partition] = Some(index);
    }
    assert!(zeros >= 5, "partition 0 keeps the stream alive: {got:?}");
}
