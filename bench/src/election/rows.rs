//! The election benchmark's load rows at one concurrency: acquire+release
//! cycles, renewals (HTTP/2, HTTP/1.1, the SDK's stream and requests,
//! batches) and a mix, each run only if `--only` wants it.

use std::sync::Arc;
use std::time::Duration;

use palisade_local_cluster::Cluster;
use serde_json::{json, Value};

use super::partitions::{node_cpu, Map};
use super::requests::{
    batch_leases, call, cycle, grant_id, holder_token, post, renew, renew_batch, renew_lease,
    sdk_client,
};
use crate::load::{load, Figures};

/// What every row of one run shares.
pub(super) struct Rows<'a> {
    /// Speaks HTTP/2 (by ALPN over TLS).
    pub client: &'a reqwest::Client,
    /// Speaks HTTP/1.1 (none with `--secure-clients`).
    pub http1: Option<&'a reqwest::Client>,
    pub cluster: &'a Cluster,
    /// Where each lease's calls go: its partition's leader.
    pub map: &'a Map,
    /// How long each row runs.
    pub duration: Duration,
    /// `--only`: the prefix of the rows to run.
    pub only: Option<&'a str>,
    /// `--batch`: leases per batch renewal.
    pub batch: usize,
    /// Whether the SDK rows run (not against `--secure-clients`).
    pub sdk: bool,
}

impl Rows<'_> {
    fn wanted(&self, what: &str) -> bool {
        self.only
            .is_none_or(|only| only.split(',').any(|p| what.starts_with(p)))
    }

    /// Runs every wanted row at `concurrency`, appending to `results`,
    /// each with every node's CPU over it.
    pub async fn run(&self, concurrency: usize, results: &mut Vec<Figures>) -> anyhow::Result<()> {
        if self.wanted("acquire+release cycle") {
            results.push(self.measured(self.cycles(concurrency)).await);
        }
        // Renew (and the mix): one held lease per task.
        let grants = Arc::new(self.hold_renew_leases(concurrency).await);
        if self.wanted("renew") {
            let row = self.renewals("renew", self.client, concurrency, &grants);
            results.push(self.measured(row).await);
        }
        if let Some(http1) = self.http1.filter(|_| self.wanted("renew http/1.1")) {
            let row = self.renewals("renew http/1.1", http1, concurrency, &grants);
            results.push(self.measured(row).await);
        }
        self.sdk_renewals(concurrency, &grants, results).await;
        let what = format!("renew batch x{}", self.batch);
        if self.wanted(&what) {
            let base = self.cluster.url(self.map.leaders[0]);
            let batches = batch_leases(self.client, &base, concurrency, self.batch).await?;
            let row = self.batch_renewals(&what, concurrency, base, batches);
            results.push(self.measured(row).await);
        }
        if self.wanted("mix") {
            results.push(self.measured(self.mix(concurrency, &grants)).await);
        }
        Ok(())
    }

    /// `row`'s figures with each node's CPU while it ran.
    async fn measured(&self, row: impl std::future::Future<Output = Figures>) -> Figures {
        let (before, started) = (node_cpu(self.cluster), std::time::Instant::now());
        let figures = row.await;
        let wall = started.elapsed();
        figures.with_process_cpu(&before, &node_cpu(self.cluster), wall)
    }

    async fn cycles(&self, concurrency: usize) -> Figures {
        let (c, map) = (self.client.clone(), self.bases());
        load(
            "acquire+release cycle",
            concurrency,
            self.duration,
            move |task, i| {
                let (c, map) = (c.clone(), map.clone());
                async move {
                    let lease = format!("cycle-{task}-{}", i % 64);
                    cycle(&c, map.base(&lease), &lease).await
                }
            },
        )
        .await
    }

    /// The map, to move into the tasks.
    fn bases(&self) -> Arc<Map> {
        Arc::new(Map {
            leaders: self.map.leaders.clone(),
            bases: self.map.bases.clone(),
        })
    }

    /// Acquires each task's [`renew_lease`]: its [`holder_token`] (null if
    /// the acquire failed).
    async fn hold_renew_leases(&self, concurrency: usize) -> Vec<Value> {
        let mut grants = Vec::new();
        for task in 0..concurrency {
            let lease = renew_lease(concurrency, task);
            let grant = post(
                self.client,
                &format!("{}/v1/leases/{lease}/acquire", self.map.base(&lease)),
                &json!({"holder": "bench", "ttl_ms": 60_000}),
            )
            .await;
            grants.push(grant.as_ref().map_or(Value::Null, holder_token));
        }
        grants
    }

    async fn renewals(
        &self,
        what: &str,
        client: &reqwest::Client,
        concurrency: usize,
        grants: &Arc<Vec<Value>>,
    ) -> Figures {
        let (c, map, held) = (client.clone(), self.bases(), grants.clone());
        load(what, concurrency, self.duration, move |task, _| {
            let (c, map, held) = (c.clone(), map.clone(), held.clone());
            let lease = renew_lease(concurrency, task);
            async move { renew(&c, map.base(&lease), &lease, &held[task]).await }
        })
        .await
    }

    /// The SDK's own renewal path: each task renews its lease through one
    /// `Client`, which batches what falls due together: over its renewal
    /// stream (the default), and as requests.
    async fn sdk_renewals(&self, concurrency: usize, grants: &[Value], results: &mut Vec<Figures>) {
        let ids = Arc::new(
            grants
                .iter()
                .enumerate()
                .map(|(task, held)| grant_id(&renew_lease(concurrency, task), held))
                .collect::<Vec<_>>(),
        );
        for (what, stream) in [
            ("renew sdk (stream)", true),
            ("renew sdk (requests)", false),
        ] {
            if !self.sdk || !self.wanted(what) {
                continue;
            }
            let sdk = Arc::new(sdk_client(self.cluster, stream));
            let ids = ids.clone();
            let row = load(what, concurrency, self.duration, move |task, _| {
                let (sdk, ids) = (sdk.clone(), ids.clone());
                async move {
                    sdk.renew_grant(&ids[task])
                        .await
                        .map(drop)
                        .map_err(|e| format!("sdk {e}").chars().take(60).collect())
                }
            });
            results.push(self.measured(row).await);
        }
    }

    /// Batches of `--batch` leases through the node at `base`, which asks
    /// each partition's leader for its part.
    async fn batch_renewals(
        &self,
        what: &str,
        concurrency: usize,
        base: String,
        batches: Vec<Value>,
    ) -> Figures {
        let (c, batches) = (self.client.clone(), Arc::new(batches));
        load(what, concurrency, self.duration, move |task, _| {
            let (c, base, batches) = (c.clone(), base.clone(), batches.clone());
            async move { renew_batch(&c, &base, &batches[task]).await }
        })
        .await
        .per_op(self.batch as u64)
    }

    async fn mix(&self, concurrency: usize, grants: &Arc<Vec<Value>>) -> Figures {
        let (c, map, held) = (self.client.clone(), self.bases(), grants.clone());
        load(
            "mix 70% renew/20% cycle/10% get",
            concurrency,
            self.duration,
            move |task, i| {
                let (c, map, held) = (c.clone(), map.clone(), held.clone());
                let lease = renew_lease(concurrency, task);
                async move {
                    let base = map.base(&lease);
                    match i % 10 {
                        0..=6 => renew(&c, base, &lease, &held[task]).await,
                        7 | 8 => {
                            let other = format!("mix-{task}-{}", i % 64);
                            cycle(&c, map.base(&other), &other).await
                        }
                        _ => call(
                            &c,
                            reqwest::Method::GET,
                            &format!("{base}/v1/leases/{lease}"),
                            None,
                        )
                        .await
                        .map(drop),
                    }
                }
            },
        )
        .await
    }
}
