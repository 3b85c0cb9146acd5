//! A job that runs exactly once across replicas.
//!
//! Three replicas start at the same moment; each tries the lease for today's
//! run. The holder checks a marker object at the gateway, runs the job if the
//! marker is absent, and writes the marker with its fencing token; the others
//! see the lease held (or the marker) and skip. Exits non-zero unless the job
//! ran exactly once.
//!
//! Run against `palisade dev`:
//! `cargo run -p palisade-client --example exactly_once`
//! (`PALISADE_ELECTION`, `PALISADE_GATEWAY` override the endpoints;
//! `PALISADE_API_KEY` or `PALISADE_API_KEY_FILE` is the API key dev printed).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use palisade_client::{Client, ClientConfig, Error};

fn client() -> Client {
    Client::new(ClientConfig::from_env().expect("PALISADE_CA / PALISADE_API_KEY_FILE are usable"))
}

async fn replica(name: String, run_id: String, runs: Arc<AtomicU32>) -> anyhow::Result<()> {
    let client = client();
    let lease = match client
        .acquire("nightly", &name, Duration::from_secs(5), None)
        .await
    {
        Ok(lease) => lease,
        Err(Error::Held { holder, .. }) => {
            println!("{name}: {holder} holds the lease; skipping");
            return Ok(());
        }
        Err(err) => return Err(err.into()),
    };
    let marker = format!("nightly/done/{run_id}");
    if lease.get(&marker).await?.is_some() {
        println!("{name}: already done; skipping");
    } else {
        runs.fetch_add(1, Ordering::SeqCst);
        println!("{name}: running the job with token {}", lease.token());
        tokio::time::sleep(Duration::from_millis(200)).await;
        // The marker write is fenced: had we lost the lease meanwhile, this
        // would fail and the next holder would run the job instead.
        lease.put(&marker, format!("done by {name}")).await?;
    }
    lease.release().await?;
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let run_id = format!(
        "{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_nanos()
    );
    let runs = Arc::new(AtomicU32::new(0));
    // Two rounds: the second finds the marker and must not run the job again.
    for _ in 0..2 {
        let replicas: Vec<_> = (1..=3)
            .map(|i| {
                tokio::spawn(replica(
                    format!("replica-{i}"),
                    run_id.clone(),
                    runs.clone(),
                ))
            })
            .collect();
        for replica in replicas {
            replica.await??;
        }
    }
    let runs = runs.load(Ordering::SeqCst);
    println!("the job ran {runs} time(s)");
    anyhow::ensure!(runs == 1, "expected exactly one run, got {runs}");
    Ok(())
}
