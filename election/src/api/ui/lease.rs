//! `GET /ui/leases/{name}`: one lease's page — its holder, token and time
//! left, its history (every kept transition, newest first, with cause and
//! time), and the writes the gateway refused for it. Read from this node's
//! applied table, as the status page is; every client value is escaped.

use std::fmt::Write as _;

use std::sync::Arc;

use axum::extract::State;
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use palisade_names::LeaseName;

use super::status::StatusPage;
use super::{escape, head};
use crate::api::extract::LeasePath;
use crate::api::schema::LeaseNameParam;
use crate::api::state::ApiState;
use crate::error::ErrorBody;
use crate::lease_table::history::{Transition, HISTORY_LEN};
use crate::lease_table::record::LeaseRecord;

#[utoipa::path(get, path = "/ui/leases/{name}", tag = "health",
    params(("name" = LeaseNameParam, Path, description = "The lease")),
    responses((status = 200, body = String, content_type = "text/html", description = "The lease's page"),
        (status = 404, body = String, content_type = "text/html", description = "No record of the lease"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 429, body = ErrorBody)))]
pub(in crate::api) async fn page(
    State(state): State<ApiState>,
    Extension(status): Extension<Arc<StatusPage>>,
    LeasePath(lease): LeasePath,
) -> Response {
    let record = state
        .group(&lease)
        .applied
        .read(|s| s.table.leases.get(&lease).cloned());
    let mut html = head(&format!("Palisade lease {}", escape(lease.as_str())));
    let _ = write!(
        html,
        "<p><a id=\"back\" href=\"/ui\">← status page</a></p><h1>Lease <span id=\"lease\">{}</span></h1>",
        escape(lease.as_str())
    );
    let Some(record) = record else {
        html.push_str(
            "<p id=\"missing\">No record: never granted, or free and reclaimed (its history \
             goes with it).</p></body></html>",
        );
        return (http::StatusCode::NOT_FOUND, Html(html)).into_response();
    };
    standing(&mut html, &state, &lease, &record);
    history(&mut html, &record);
    if let Some(reader) = &status.gateway {
        refused(&mut html, reader, &lease).await;
    }
    html.push_str("</body></html>");
    Html(html).into_response()
}

/// Who holds it, with which token, and for how long yet.
fn standing(html: &mut String, state: &ApiState, lease: &LeaseName, record: &LeaseRecord) {
    let holder = record.holder.as_deref().map_or_else(
        || "<i>free</i>".to_owned(),
        |h| format!("<b class=\"holder\">{}</b>", escape(h)),
    );
    let group = state.group(lease);
    let left = match (&record.holder, group.is_leader()) {
        (None, _) => String::new(),
        (Some(_), false) => " · time left is known on the leader only".to_owned(),
        (Some(_), true) => {
            group
                .lessor
                .remaining_ms(lease, record.token)
                .map_or_else(String::new, |ms| {
                    format!(
                        " · <span id=\"left\">{:.1} s</span> left",
                        ms as f64 / 1000.0
                    )
                })
        }
    };
    let flags = [
        (record.revoked, "revoked"),
        (record.reserved, "reserved for a successor"),
    ]
    .iter()
    .filter(|(on, _)| *on)
    .map(|(_, what)| format!(" · {what}"))
    .collect::<String>();
    let _ = write!(
        html,
        "<p id=\"standing\">{holder} · token <b id=\"token\">{}</b> · ttl {} ms{left}{flags} · \
         {} changes in all</p>",
        record.token, record.ttl_ms, record.transitions,
    );
}

/// The kept transitions, newest first.
fn history(html: &mut String, record: &LeaseRecord) {
    let _ = write!(
        html,
        "<h2>History</h2><p>the last transitions are kept (the leader's --history-len, \
         default {HISTORY_LEN}), in the replicated \
         record: the same on every node, through failovers and restarts</p>\
         <table id=\"history\"><tr><th>log index</th><th>when</th><th>cause</th><th>holder</th><th>token</th></tr>"
    );
    let now = crate::signing::unix_ms();
    for t in record.history.iter().rev() {
        let _ = write!(
            html,
            "<tr><td>{}</td><td>{}</td><td class=\"cause\">{}</td><td class=\"holder\">{}</td><td>{}</td></tr>",
            t.index,
            when(t, now),
            escape(&cause(t)),
            escape(t.holder.as_deref().unwrap_or("-")),
            t.token,
        );
    }
    html.push_str("</table>");
}

/// A transition's cause as the API spells it (`acquire`, `expire`, …).
pub(super) fn cause(t: &Transition) -> String {
    serde_json::to_value(t.cause)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "?".to_owned())
}

/// How long ago `t` was proposed, on the proposer's clock.
fn when(t: &Transition, now_ms: u64) -> String {
    t.at_ms
        .map_or_else(|| "before stamps".to_owned(), |at| super::ago(now_ms, at))
}

/// The gateway's refused writes for this lease.
async fn refused(html: &mut String, reader: &super::gateway::GatewayReader, lease: &LeaseName) {
    html.push_str("<h2>Writes refused by the gateway</h2>");
    let Some(fences) = super::fences_or_problem(html, reader).await else {
        return;
    };
    let Some(fence) = fences.iter().find(|f| f["lease"] == lease.as_str()) else {
        html.push_str("<p id=\"no-fence\">no write for this lease has reached the gateway</p>");
        return;
    };
    super::fence_rows(html, std::slice::from_ref(fence));
}
