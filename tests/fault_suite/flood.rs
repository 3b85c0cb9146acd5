//! The noisy-neighbour fault: for a while, the `intruder` principal (the
//! same rights as the workers' `orders`) floods every election node with
//! more long watches than its share of the node's seats for calls that
//! wait, sends one node renewals whose bodies never come, and opens
//! connections that never say a word. The workers' leases must live
//! through it (the checker's L1 and S1-S4 over the whole run), and the
//! flood must have been over its share: refused, not served.

use std::time::Duration;

use futures::StreamExt;
use tokio::task::JoinSet;

use super::support::Access;

/// Watches per node: over the intruder's part of a default node's seats
/// for calls that wait (512, of which one flow takes at most 384).
const WATCHES_PER_NODE: usize = 600;
/// HTTP/2 streams per connection the servers allow.
const STREAMS: usize = 200;
/// Renewals with a body that never comes, on the first node.
const STALLED_BODIES: usize = 200;
/// TCP connections per node that send nothing.
const SILENT: usize = 100;

/// What the flood met.
#[derive(Debug, Default)]
pub struct Flooded {
    /// Watches answered 429 (over the intruder's share).
    pub refused: usize,
    /// Watches served (within its share).
    pub served: usize,
    /// Watches that got another answer or none, and the first of them.
    pub other: usize,
    pub first_other: Option<String>,
}

/// Floods `urls` as `intruder` for `duration`, then stops every request and
/// closes every connection it opened.
pub async fn noisy_neighbour(access: &Access, urls: &[String], duration: Duration) -> Flooded {
    // One HTTP/2 connection per client, opened before the flood starts (so
    // the flood is requests, not thousands of TLS handshakes).
    let mut clients = Vec::new();
    for url in urls {
        for _ in 0..WATCHES_PER_NODE.div_ceil(STREAMS) {
            let client = access.http_with_timeout("intruder", Duration::from_secs(40));
            let _ = client.get(format!("{url}/livez")).send().await;
            clients.push((url.clone(), client));
        }
    }
    let deadline = tokio::time::Instant::now() + duration;
    let mut flood = JoinSet::new();
    for (url, client) in clients {
        let watch = format!("{url}/v1/leases/orders.quiet/watch?index=1000000000&wait_ms=30000");
        for _ in 0..STREAMS {
            flood.spawn(watch_until(client.clone(), watch.clone(), deadline));
        }
    }
    for url in urls {
        let addr = url
            .split("://")
            .nth(1)
            .unwrap_or(url)
            .trim_end_matches('/')
            .to_owned();
        for _ in 0..SILENT {
            let addr = addr.clone();
            flood.spawn(async move {
                // Connected and silent until the flood ends.
                let _stream = tokio::net::TcpStream::connect(addr).await;
                tokio::time::sleep_until(deadline).await;
                Flooded::default()
            });
        }
    }
    let stalled = access.http_with_timeout("intruder", Duration::from_secs(40));
    let _ = stalled.get(format!("{}/livez", urls[0])).send().await;
    for _ in 0..STALLED_BODIES {
        let (client, url) = (stalled.clone(), format!("{}/v1/renew", urls[0]));
        flood.spawn(async move {
            let first: Result<Vec<u8>, std::io::Error> = Ok(b"{\"renewals\":".to_vec());
            let never = futures::stream::iter([first]).chain(futures::stream::pending());
            let send = client
                .post(url)
                .header("content-type", "application/json")
                .body(reqwest::Body::wrap_stream(never))
                .send();
            let _ = tokio::time::timeout_at(deadline, send).await;
            Flooded::default()
        });
    }
    tokio::time::sleep_until(deadline).await;
    let mut total = Flooded::default();
    // Every task ends by the deadline; what has not is cut off.
    let cutoff = tokio::time::Instant::now() + Duration::from_secs(2);
    while let Ok(Some(done)) = tokio::time::timeout_at(cutoff, flood.join_next()).await {
        if let Ok(seen) = done {
            total.refused += seen.refused;
            total.served += seen.served;
            total.other += seen.other;
            total.first_other = total.first_other.or(seen.first_other);
        }
    }
    flood.abort_all();
    total
}

/// Keeps one watch open until `deadline`: one that ends is sent again at
/// once, a refused one after a short pause.
async fn watch_until(
    client: reqwest::Client,
    url: String,
    deadline: tokio::time::Instant,
) -> Flooded {
    let mut seen = Flooded::default();
    while tokio::time::Instant::now() < deadline {
        let status = match tokio::time::timeout_at(deadline, client.get(&url).send()).await {
            Ok(Ok(response)) => Ok(response.status().as_u16()),
            Ok(Err(err)) => Err(err.to_string()),
            Err(_) => break,
        };
        match &status {
            Ok(429) => seen.refused += 1,
            Ok(200) => seen.served += 1,
            other => {
                seen.other += 1;
                seen.first_other.get_or_insert(format!("{other:?}"));
            }
        }
        let status = status.unwrap_or(0);
        if status != 200 {
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
    seen
}
