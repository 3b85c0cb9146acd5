//! A counter that several workers increment through the gateway without ever
//! losing an update.
//!
//! Each worker, with its own client, loops: acquire the lease (waiting), read
//! the counter, write it plus one — a fenced write — and release. Fencing makes
//! the read-modify-write safe even if a worker stalls past its lease: its
//! late write is refused, not applied over a newer value. Exits non-zero
//! unless the final value is exactly workers x increments.
//!
//! Run against `palisade dev`:
//! `cargo run -p palisade-client --example fenced_counter`
//! (`ClientConfig::from_env`: `PALISADE_API_KEY` is the API key dev printed).

use std::time::Duration;

use palisade_client::{Client, ClientConfig};

const WORKERS: u64 = 4;
const INCREMENTS: u64 = 10;

fn client() -> Client {
    Client::new(ClientConfig::from_env().expect("PALISADE_CA / PALISADE_API_KEY_FILE are usable"))
}

async fn read(lease: &palisade_client::Lease, key: &str) -> anyhow::Result<u64> {
    Ok(match lease.get(key).await? {
        Some(object) => std::str::from_utf8(&object.value)?.parse()?,
        None => 0,
    })
}

async fn worker(id: u64, key: String) -> anyhow::Result<u64> {
    let client = client();
    let mut done = 0;
    while done < INCREMENTS {
        let lease = client
            .acquire(
                "counter",
                &format!("worker-{id}"),
                Duration::from_secs(2),
                Some(Duration::from_secs(30)),
            )
            .await?;
        let value = read(&lease, &key).await?;
        match lease.put(&key, (value + 1).to_string()).await {
            Ok(_) => done += 1,
            // Lost the lease between read and write: the write was refused,
            // so nothing is lost; try again.
            Err(err) if err.is_lease_lost() => continue,
            Err(err) => return Err(err.into()),
        }
        lease.release().await?;
    }
    Ok(done)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let key = format!(
        "counter/run-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
    );
    let workers: Vec<_> = (1..=WORKERS)
        .map(|id| tokio::spawn(worker(id, key.clone())))
        .collect();
    for worker in workers {
        worker.await??;
    }
    let client = client();
    let lease = client
        .acquire(
            "counter",
            "checker",
            Duration::from_secs(2),
            Some(Duration::from_secs(30)),
        )
        .await?;
    let total = read(&lease, &key).await?;
    lease.release().await?;
    println!("counter = {total} (expected {})", WORKERS * INCREMENTS);
    anyhow::ensure!(
        total == WORKERS * INCREMENTS,
        "lost updates: {total} != {}",
        WORKERS * INCREMENTS
    );
    Ok(())
}
