//! S1 and S4 for the gateway across kill -9: the real `palisade gateway`
//! process takes concurrent fenced writes, is killed mid-stream, restarts on
//! the same data dir; every acknowledged write must be readable and every
//! fence at least the highest acknowledged token. Twenty rounds per run.

use crate::support;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::{spawn_gateway, TestKey};

const ROUNDS: usize = 20;
const WRITERS: usize = 8;
const LEASES: u64 = 3;

#[derive(Debug, Clone)]
struct Acked {
    key: String,
    value: String,
    lease: u64,
    token: u64,
    version: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_and_fences_survive_kill_9() {
    let dir = tempfile::tempdir().expect("tempdir");
    let key = Arc::new(TestKey::new(dir.path()));
    let data = dir.path().join("data");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    // Tokens keep rising across rounds, as a real election cluster's do.
    let next_token: Arc<Vec<AtomicU64>> =
        Arc::new((0..LEASES).map(|_| AtomicU64::new(1)).collect());
    let mut all_acked: Vec<Acked> = Vec::new();
    let mut total_refused = 0u64;

    for round in 0..ROUNDS {
        let mut gateway = spawn_gateway(&data, &key);
        let url = gateway.url.clone();

        // Everything acknowledged before this restart must still be there.
        verify(&client, &url, &all_acked).await;

        let acked = Arc::new(Mutex::new(Vec::new()));
        let refused = Arc::new(AtomicU64::new(0));
        let mut writers = Vec::new();
        for writer in 0..WRITERS {
            let (client, url, key, acked, refused, next_token) = (
                client.clone(),
                url.clone(),
                key.clone(),
                acked.clone(),
                refused.clone(),
                next_token.clone(),
            );
            writers.push(tokio::spawn(async move {
                for seq in 0.. {
                    let lease = (writer as u64 + seq) % LEASES;
                    let token = next_token[lease as usize].fetch_add(1, Ordering::SeqCst);
                    let object_key = format!("l{lease}/r{round}/w{writer}/{seq}");
                    let value = format!("{object_key}@{token}");
                    let response = client
                        .put(format!("{url}/v1/objects/{object_key}"))
                        .bearer_auth(key.jwt(&format!("l{lease}"), token))
                        .body(value.clone())
                        .send()
                        .await;
                    match response {
                        Ok(r) if r.status() == 200 => {
                            // Killed between the status and the body: the
                            // outcome is unknown, as for a lost connection.
                            let Ok(answer) = r.json::<serde_json::Value>().await else {
                                return;
                            };
                            acked.lock().expect("lock").push(Acked {
                                key: object_key,
                                value,
                                lease,
                                token,
                                version: answer["version"].as_u64().expect("version"),
                            });
                        }
                        Ok(r) if r.status() == 409 => {
                            refused.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => panic!("unexpected status {}", r.status()),
                        // The gateway was killed: stop this writer.
                        Err(_) => return,
                    }
                }
            }));
        }
        let run_for = Duration::from_millis(100 + rand::random::<u64>() % 300);
        tokio::time::sleep(run_for).await;
        // Kill mid-stream, but not before a first acknowledgement: a slow
        // fsync on a busy disk can take longer than `run_for` (bounded).
        for _ in 0..100 {
            if !acked.lock().expect("lock").is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        gateway.kill();
        for writer in writers {
            writer.await.expect("writer task");
        }
        let acked = acked.lock().expect("lock").clone();
        assert!(
            !acked.is_empty(),
            "round {round}: no write was acknowledged"
        );
        // Versions keep rising across restarts (they order commits).
        let before = all_acked.iter().map(|a| a.version).max().unwrap_or(0);
        let first = acked.iter().map(|a| a.version).min().unwrap_or(u64::MAX);
        assert!(
            first > before,
            "round {round}: version {first} after a restart is not above {before}"
        );
        all_acked.extend(acked);
        total_refused += refused.load(Ordering::Relaxed);
    }

    let gateway = spawn_gateway(&data, &key);
    verify(&client, &gateway.url, &all_acked).await;
    eprintln!(
        "{ROUNDS} kill -9 rounds: {} acknowledged writes all present, {total_refused} stale writes refused",
        all_acked.len()
    );
}

async fn verify(client: &reqwest::Client, url: &str, acked: &[Acked]) {
    let mut highest: HashMap<u64, u64> = HashMap::new();
    for write in acked {
        let response = client
            .get(format!("{url}/v1/objects/{}", write.key))
            .send()
            .await
            .expect("get");
        assert_eq!(
            response.status(),
            200,
            "acknowledged write {write:?} is lost"
        );
        let fencing_token = response.headers()["fencing-token"]
            .to_str()
            .expect("header")
            .to_owned();
        assert_eq!(fencing_token, write.token.to_string());
        assert_eq!(
            response.headers()["etag"].to_str().expect("header"),
            write.version.to_string()
        );
        assert_eq!(response.text().await.expect("body"), write.value);
        let entry = highest.entry(write.lease).or_default();
        *entry = (*entry).max(write.token);
    }
    for (lease, token) in highest {
        let fence: serde_json::Value = client
            .get(format!("{url}/v1/fences/l{lease}"))
            .send()
            .await
            .expect("fence")
            .json()
            .await
            .expect("json");
        let fence = fence["fence"].as_u64().expect("fence");
        assert!(
            fence >= token,
            "fence of l{lease} is {fence}, below acknowledged token {token}"
        );
    }
}
