//! `palisade fence get|bump`.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;

use super::http::{encode_key, report, GatewayTarget, TokenArgs};

#[derive(Debug, Subcommand)]
pub enum FenceCommand {
    /// Print a lease's fence (0 when never fenced).
    Get {
        /// The lease name.
        lease: String,
        #[command(flatten)]
        target: GatewayTarget,
    },
    /// Raise a lease's fence to the token in the JWT, writing nothing else.
    Bump {
        /// The lease name.
        lease: String,
        #[command(flatten)]
        token: TokenArgs,
        #[command(flatten)]
        target: GatewayTarget,
    },
}

pub async fn run(command: FenceCommand) -> anyhow::Result<ExitCode> {
    let (request, target) = match command {
        FenceCommand::Get { lease, target } => (
            target
                .client()?
                .get(target.url(&format!("/v1/fences/{}", encode_key(&lease)))),
            target,
        ),
        FenceCommand::Bump {
            lease,
            token,
            target,
        } => (
            target
                .client()?
                .post(target.url(&format!("/v1/fences/{}", encode_key(&lease))))
                .header("authorization", token.bearer()?),
            target,
        ),
    };
    let response = request
        .send()
        .await
        .with_context(|| format!("cannot reach the gateway at {}", target.gateway))?;
    report(response, target.json, fence_text).await
}

/// A fence answer as text: the fence, then (from `GET`) the writes refused
/// below it and the last of them.
fn fence_text(b: &serde_json::Value) -> String {
    let mut text = format!("{} fence {}", b["lease"], b["fence"]);
    let refused = &b["refused"];
    if refused.is_null() {
        return text;
    }
    let count = refused["count"].as_u64().unwrap_or(0);
    text.push_str(&format!("\nrefused writes: {count}"));
    let last = &refused["last"];
    if last.is_object() {
        let ago = last["at_unix_ms"]
            .as_u64()
            .map_or(String::new(), |at| format!(", {}", super::seconds_ago(at)));
        text.push_str(&format!(
            "\nlast refused: token {} below fence {}, holder {}, key {}, from {}{ago}",
            last["token"], last["fence"], last["holder"], last["key"], last["peer"]
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::fence_text;
    use serde_json::json;

    #[test]
    fn the_text_shows_the_audit() {
        let plain = json!({"lease": "orders", "fence": 6});
        assert_eq!(fence_text(&plain), "\"orders\" fence 6");
        let audited = json!({"lease": "orders", "fence": 6, "refused": {"count": 3, "last": {
            "token": 4, "fence": 6, "holder": "w1", "key": "orders/x",
            "peer": "127.0.0.1:5555", "at_unix_ms": 1}}});
        let text = fence_text(&audited);
        assert!(text.contains("refused writes: 3"), "{text}");
        assert!(
            text.contains(
                "token 4 below fence 6, holder \"w1\", key \"orders/x\", from \"127.0.0.1:5555\""
            ),
            "{text}"
        );
        let none = json!({"lease": "orders", "fence": 6, "refused": {"count": 0, "last": null}});
        assert_eq!(fence_text(&none), "\"orders\" fence 6\nrefused writes: 0");
    }
}
