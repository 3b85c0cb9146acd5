//! Hedged renewals against fake nodes on loopback: a silent node costs one
//! slice, a refusal is passed over at once, a 409 is final, and a
//! follower's leader hint is followed.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

use super::*;
use crate::transport::config::ClientConfig;

/// What a fake node answers a request line: status, extra headers, body;
/// `None`: nothing, ever (a frozen node).
type Answers = Arc<dyn Fn(&str) -> Option<(u16, String, String)> + Send + Sync>;

/// A fake node on loopback answering each request (HTTP/1.1, kept
/// alive) as `answers` says; its URL.
async fn node(answers: Answers) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("address"));
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            tokio::spawn(serve(socket, answers.clone()));
        }
    });
    url
}

async fn serve(mut socket: TcpStream, answers: Answers) {
    let mut buffer = Vec::new();
    loop {
        let Some(head_end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
            let mut chunk = [0u8; 4096];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        while buffer.len() < head_end + 4 + length {
            let mut chunk = [0u8; 4096];
            match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
            }
        }
        let line = head.lines().next().unwrap_or("").to_owned();
        buffer.drain(..head_end + 4 + length);
        let Some((status, headers, body)) = answers(&line) else {
            // Frozen: hold the connection, answer nothing.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        };
        let answer = format!(
            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n{headers}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        if socket.write_all(answer.as_bytes()).await.is_err() {
            return;
        }
    }
}

fn transport(urls: Vec<String>) -> Transport {
    let mut config = ClientConfig::new(urls);
    config.http2 = false;
    Transport::new(config)
}

fn answering(status: u16, body: &'static str) -> Answers {
    Arc::new(move |_| Some((status, String::new(), body.to_owned())))
}

/// The first node is frozen: the renewal is answered by the second after
/// one slice (a third of the 3 s left), not after the request timeout
/// (2 s), and the second is preferred from then on.
#[tokio::test]
async fn a_silent_node_costs_one_slice() {
    let frozen = node(Arc::new(|_| None)).await;
    let live = node(answering(200, r#"{"ok":true}"#)).await;
    let transport = transport(vec![frozen, live]);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(3);
    let (status, body) = renewal(
        &transport,
        None,
        "/v1/renew",
        &serde_json::json!({}),
        deadline,
    )
    .await
    .expect("answered by the live node");
    let took = started.elapsed();
    assert_eq!((status, &body[..]), (200, &br#"{"ok":true}"#[..]));
    assert!(took >= Duration::from_secs(1), "{took:?}");
    assert!(took < Duration::from_millis(1900), "{took:?}");
    assert_eq!(transport.preferred(), 1);
}

/// A 503 is passed over at once; a 409 from the next node is final (no
/// third node is asked).
#[tokio::test]
async fn a_refusal_is_passed_over_and_a_409_is_final() {
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let refusing = node(answering(503, r#"{"error":"no_quorum"}"#)).await;
    let lost = node(answering(409, r#"{"error":"lost","message":"gone"}"#)).await;
    let counted = asked.clone();
    let third = node(Arc::new(move |_| {
        counted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((200, String::new(), "{}".to_owned()))
    }))
    .await;
    let transport = transport(vec![refusing, lost, third]);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(3);
    let (status, _) = renewal(
        &transport,
        None,
        "/v1/renew",
        &serde_json::json!({}),
        deadline,
    )
    .await
    .expect("an answer");
    assert_eq!(status, 409);
    assert!(started.elapsed() < Duration::from_millis(500));
    assert_eq!(asked.load(std::sync::atomic::Ordering::Relaxed), 0);
}

/// A follower's answer names the leader by id (`x-palisade-leader`); once
/// the nodes have told their ids (`GET /v1/cluster`), the leader's
/// endpoint is preferred.
#[tokio::test]
async fn the_leader_a_follower_names_is_asked_next() {
    let cluster = |id: u64| -> Answers {
        Arc::new(move |line: &str| {
            let body = if line.starts_with("get /v1/cluster") {
                format!(r#"{{"node_id":{id}}}"#)
            } else {
                "{}".to_owned()
            };
            // Nodes 1 and 2 follow: they forward, naming node 3.
            let hint = if id == 3 {
                ""
            } else {
                "x-palisade-leader: 3\r\n"
            };
            Some((200, hint.to_owned(), body))
        })
    };
    let urls = vec![
        node(cluster(1)).await,
        node(cluster(2)).await,
        node(cluster(3)).await,
    ];
    let transport = transport(urls);
    let body = serde_json::json!({});
    let mut preferred = Vec::new();
    for _ in 0..20 {
        let deadline = Instant::now() + Duration::from_secs(3);
        renewal(&transport, None, "/v1/renew", &body, deadline)
            .await
            .expect("answered");
        preferred.push(transport.preferred());
        if transport.preferred() == 2 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the leader's endpoint was never preferred: {preferred:?}");
}

/// With every node silent, the renewal gives up at its deadline, not
/// before and not much after.
#[tokio::test]
async fn every_node_silent_ends_at_the_deadline() {
    let urls = vec![
        node(Arc::new(|_| None)).await,
        node(Arc::new(|_| None)).await,
    ];
    let transport = transport(urls);
    let started = Instant::now();
    let deadline = started + Duration::from_millis(800);
    let answer = renewal(
        &transport,
        None,
        "/v1/renew",
        &serde_json::json!({}),
        deadline,
    )
    .await;
    assert!(
        matches!(answer, Err(Error::Unavailable { .. })),
        "{answer:?}"
    );
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(800), "{took:?}");
    assert!(took < Duration::from_millis(1300), "{took:?}");
}

#[test]
fn a_slice_is_a_third_of_the_time_left_within_bounds() {
    let timeout = Duration::from_secs(2);
    assert_eq!(
        slice(timeout, Duration::from_millis(1800)),
        Duration::from_millis(600)
    );
    assert_eq!(slice(timeout, Duration::from_millis(90)), MIN_SLICE);
    assert_eq!(slice(timeout, Duration::from_secs(30)), timeout);
}
