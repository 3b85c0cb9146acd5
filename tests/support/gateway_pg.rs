//! What the gateway-on-PostgreSQL tests share: plain HTTP writes and reads
//! through a gateway, and the check of a history of concurrent writes to
//! one key against the fence (S1).
#![allow(dead_code)]

use std::time::Duration;

/// One write's answer, with logical invoke and complete times.
#[derive(Debug, Clone)]
pub struct Write {
    pub token: u64,
    pub invoked: u64,
    pub completed: u64,
    pub status: u16,
    /// An accepted write's version.
    pub version: Option<u64>,
}

impl Write {
    pub fn from_answer(token: u64, invoked: u64, completed: u64, status: u16, body: &str) -> Self {
        let version = (status == 200)
            .then(|| serde_json::from_str::<serde_json::Value>(body).ok())
            .flatten()
            .and_then(|v| v["version"].as_u64());
        Self {
            token,
            invoked,
            completed,
            status,
            version,
        }
    }

    fn accepted(&self) -> bool {
        self.status == 200
    }
}

/// PUT `value` at `key` with `jwt`: (status, body); (0, error) when no
/// answer came.
pub async fn put(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    jwt: &str,
    value: &str,
) -> (u16, String) {
    let sent = http
        .put(format!("{url}/v1/objects/{key}"))
        .bearer_auth(jwt)
        .body(value.to_owned())
        .send()
        .await;
    match sent {
        Ok(response) => {
            let status = response.status().as_u16();
            (status, response.text().await.unwrap_or_default())
        }
        Err(err) => (0, err.to_string()),
    }
}

/// GET `key`: (status, body), retried while the answer is a 503 (10 s).
pub async fn get(http: &reqwest::Client, url: &str, key: &str) -> (u16, String) {
    for _ in 0..100 {
        if let Ok(response) = http.get(format!("{url}/v1/objects/{key}")).send().await {
            let status = response.status().as_u16();
            if status != 503 {
                return (status, response.text().await.unwrap_or_default());
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (503, String::new())
}

/// The fence of `lease` at `url`.
pub async fn fence(http: &reqwest::Client, url: &str, lease: &str) -> u64 {
    let body: serde_json::Value = http
        .get(format!("{url}/v1/fences/{lease}"))
        .send()
        .await
        .expect("fence")
        .json()
        .await
        .expect("json");
    body["fence"].as_u64().expect("fence")
}

/// Checks concurrent writes to `key` of `lease` (answers 200 or 409 only):
/// no accepted write carries a token below one accepted before it was
/// invoked; each refusal had a higher accepted token invoked before it
/// ended; in commit (version) order tokens never go down; the final fence
/// is the highest accepted token and the object is the last committed write.
pub async fn check_history(
    http: &reqwest::Client,
    url: &str,
    lease: &str,
    key: &str,
    history: &[Write],
) {
    for w in history {
        assert!(
            w.status == 200 || w.status == 409,
            "unexpected answer {w:?}"
        );
    }
    for a in history.iter().filter(|w| w.accepted()) {
        for b in history
            .iter()
            .filter(|w| w.accepted() && a.completed < w.invoked)
        {
            assert!(b.token >= a.token, "accepted {b:?} after accepted {a:?}");
        }
    }
    for r in history.iter().filter(|w| !w.accepted()) {
        assert!(
            history
                .iter()
                .any(|c| c.accepted() && c.token > r.token && c.invoked < r.completed),
            "{r:?} refused without a higher accepted token"
        );
    }
    let mut accepted: Vec<&Write> = history.iter().filter(|w| w.accepted()).collect();
    accepted.sort_by_key(|w| w.version);
    for pair in accepted.windows(2) {
        assert!(
            pair[1].token >= pair[0].token,
            "in commit order {:?} after {:?}",
            pair[1],
            pair[0]
        );
    }
    let highest = accepted
        .iter()
        .map(|w| w.token)
        .max()
        .expect("some write accepted");
    assert_eq!(fence(http, url, lease).await, highest, "final fence");
    let last = accepted.last().expect("some write accepted");
    let (status, value) = get(http, url, key).await;
    assert_eq!(status, 200);
    assert!(
        value.starts_with(&format!("{}:", last.token)),
        "{value} is not the last commit {last:?}"
    );
}
