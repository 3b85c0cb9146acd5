//! [`NodeIds`]: which node each endpoint is. A follower that forwards a
//! call to the leader names it by id in the answer (`x-palisade-leader`),
//! while a client knows its endpoints by URL; `GET /v1/cluster` on an
//! endpoint answers its `node_id`. With both, a client that asked any live
//! node learns where the leader is, and asks it directly next time.
//! The same answers list every partition's leader: [`NodeIds`] keeps them
//! in its [`PartitionMap`], asked again while it is stale.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use palisade_plumbing::sync::lock;
use serde_json::Value;

use super::partitions::PartitionMap;

/// At most one round of questions this often (a node that did not answer
/// is asked again in the next round).
const ASK_EVERY: Duration = Duration::from_secs(1);

/// The node id of each endpoint, as far as known.
#[derive(Debug)]
pub(crate) struct NodeIds {
    /// By endpoint index; `None` until that endpoint told its id.
    ids: Mutex<Vec<Option<u64>>>,
    /// When the last round of questions started.
    asked: Mutex<Option<Instant>>,
    /// The partitions and their leaders, from the same answers.
    pub(crate) map: PartitionMap,
}

impl NodeIds {
    /// Nothing known yet about `count` endpoints.
    pub(crate) fn new(count: usize) -> Arc<Self> {
        Arc::new(Self {
            ids: Mutex::new(vec![None; count]),
            asked: Mutex::new(None),
            map: PartitionMap::default(),
        })
    }

    /// The endpoint that is node `id`, if known.
    pub(crate) fn endpoint_of(&self, id: u64) -> Option<usize> {
        lock(&self.ids).iter().position(|known| *known == Some(id))
    }

    /// Which node endpoint `index` is, if known.
    pub(crate) fn id_of(&self, index: usize) -> Option<u64> {
        lock(&self.ids).get(index).copied().flatten()
    }

    /// Forgets what endpoint `index` is (it answered as another node).
    pub(crate) fn forget(&self, index: usize) {
        if let Some(known) = lock(&self.ids).get_mut(index) {
            *known = None;
        }
    }

    /// Asks every endpoint whose id is unknown for it (every endpoint,
    /// while the partition map is stale), in the background (each for at
    /// most `timeout`), unless a round started less than [`ASK_EVERY`] ago
    /// or there is no runtime to run it on.
    pub(crate) fn learn(
        self: &Arc<Self>,
        http: &reqwest::Client,
        endpoints: &[String],
        timeout: Duration,
    ) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        {
            let mut asked = lock(&self.asked);
            if asked.is_some_and(|at| at.elapsed() < ASK_EVERY) {
                return;
            }
            *asked = Some(Instant::now());
        }
        let every = self.map.is_stale();
        let unknown: Vec<(usize, String)> = lock(&self.ids)
            .iter()
            .zip(endpoints)
            .enumerate()
            .filter(|(_, (known, _))| every || known.is_none())
            .map(|(index, (_, url))| (index, url.trim_end_matches('/').to_owned()))
            .collect();
        let (this, http) = (self.clone(), http.clone());
        runtime.spawn(async move {
            let asks = unknown.into_iter().map(|(index, url)| {
                let http = &http;
                async move { (index, cluster(http, &url, timeout).await) }
            });
            for (index, answer) in futures::future::join_all(asks).await {
                let Some(answer) = answer else { continue };
                this.map.learn(&answer);
                let id = answer["node_id"].as_u64();
                if let (Some(id), Some(known)) = (id, lock(&this.ids).get_mut(index)) {
                    *known = Some(id);
                }
            }
        });
    }
}

/// What the node at `url` answers to `GET /v1/cluster` (its `node_id`,
/// its view of every partition), if it answers in time.
async fn cluster(http: &reqwest::Client, url: &str, timeout: Duration) -> Option<Value> {
    let answer = http
        .get(format!("{url}/v1/cluster"))
        .timeout(timeout)
        .send()
        .await
        .ok()?;
    if !answer.status().is_success() {
        return None;
    }
    answer.json::<Value>().await.ok()
}
