//! What the status page reads from the gateway named by `--ui-gateway`:
//! its fencing audit (`GET /v1/fences`) and its refused-writes counter
//! (`GET /metrics`), each with an 800 ms bound so a slow gateway slows no
//! page by more than that, through one client the node builds at start
//! ([`GatewayReader`]: no file read, no new connection pool per page).

use crate::config::UiGateway;

/// The gateway the pages read, and the client they read it with (or why
/// there is none: its CA did not load).
#[derive(Debug)]
pub struct GatewayReader {
    gateway: UiGateway,
    http: Result<reqwest::Client, String>,
}

impl GatewayReader {
    /// A reader of `gateway`, its client built once.
    pub fn new(gateway: UiGateway) -> Self {
        let http = client(&gateway);
        if let Err(problem) = &http {
            tracing::warn!(%problem, "the status page cannot read the gateway");
        }
        Self { gateway, http }
    }

    /// The gateway's URL.
    pub(super) fn url(&self) -> &str {
        &self.gateway.url
    }

    /// `GET path` on the gateway with its key.
    async fn get(&self, path: &str) -> Result<reqwest::Response, String> {
        get(
            self.http.as_ref().map_err(String::clone)?,
            &self.gateway,
            path,
        )
        .await
    }

    /// The gateway's fencing audit: a JSON object per lease with a fence.
    pub(super) async fn fences(&self) -> Result<Vec<serde_json::Value>, String> {
        let answer = self.get("/v1/fences").await?;
        let body: serde_json::Value = answer.json().await.map_err(|e| e.to_string())?;
        Ok(body["fences"].as_array().cloned().unwrap_or_default())
    }

    /// Writes the gateway refused for a stale token since it started (the
    /// sum of `palisade_gateway_writes_total{result="stale_token"}` over
    /// ops).
    pub(super) async fn refused_writes(&self) -> Result<u64, String> {
        let text = self
            .get("/metrics")
            .await?
            .text()
            .await
            .map_err(|e| e.to_string())?;
        Ok(stale_token_writes(&text))
    }
}

/// A client for `gateway`: its CA trusted if it has one.
fn client(gateway: &UiGateway) -> Result<reqwest::Client, String> {
    let mut client = reqwest::Client::builder().timeout(std::time::Duration::from_millis(800));
    if let Some(ca) = &gateway.ca {
        let pem = std::fs::read(ca).map_err(|e| format!("{}: {e}", ca.display()))?;
        let ca = reqwest::Certificate::from_pem(&pem).map_err(|e| e.to_string())?;
        client = client.add_root_certificate(ca);
    }
    client.build().map_err(|e| e.to_string())
}

/// `GET path` on the gateway with its key; the body if it answered 2xx.
async fn get(
    client: &reqwest::Client,
    gateway: &UiGateway,
    path: &str,
) -> Result<reqwest::Response, String> {
    let mut request = client.get(format!("{}{path}", gateway.url.trim_end_matches('/')));
    if let Some(key) = &gateway.key {
        request = request.header(palisade_serve::policy::KEY_HEADER, key);
    }
    let answer = request.send().await.map_err(|e| e.to_string())?;
    if !answer.status().is_success() {
        return Err(format!("the gateway answered {}", answer.status()));
    }
    Ok(answer)
}

/// The sum of the stale-token write counters in a Prometheus text body.
fn stale_token_writes(text: &str) -> u64 {
    text.lines()
        .filter(|line| {
            line.starts_with("palisade_gateway_writes_total{")
                && line.contains("result=\"stale_token\"")
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|count| count as u64)
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn stale_token_writes_are_summed_over_ops_and_nothing_else() {
        let text = "# HELP palisade_gateway_writes Fenced writes\n\
            palisade_gateway_writes_total{op=\"put\",result=\"stale_token\"} 3\n\
            palisade_gateway_writes_total{op=\"delete\",result=\"stale_token\"} 2\n\
            palisade_gateway_writes_total{op=\"put\",result=\"ok\"} 40\n\
            palisade_gateway_fence_raises_total 7\n";
        assert_eq!(super::stale_token_writes(text), 5);
        assert_eq!(super::stale_token_writes(""), 0);
    }
}
