//! `GET /ui`: a status page, rendered on the server from this node's own
//! state (no script, no external asset): the node, the leader, term and
//! indexes, the members, plots of the last 15 minutes (`plots.rs`, from
//! the samples of `series.rs`), and one page of leases (holder, token,
//! time left as the leader sees it), each linked to its own page
//! (`lease.rs`). It refreshes itself every 2 s (`<meta refresh>`). Every
//! value from a client — lease names, holders — is HTML-escaped, and any
//! bidirectional control in it shown as a visible `<U+202E>`.
//!
//! Under a policy the page needs the `read` right on its `prefix` (as the
//! list does); a browser that cannot send `x-palisade-key` signs in through
//! the form of `login.rs`, which opens a session (`sessions.rs`) whose id
//! alone is its cookie (`cookie.rs`), honoured on the status pages alone
//! (`signed_in.rs`). A principal that may not read every lease sees no
//! cluster-wide figure (the plots, the table's size): only its prefix's
//! leases. Every answer carries the headers of `headers.rs`; the forms
//! are accepted from this node's own origin only (`origin.rs`).

mod cluster;
mod cookie;
pub mod gateway;
pub(super) mod headers;
pub(super) mod lease;
pub(super) mod login;
mod origin;
mod plots;
pub mod sampler;
pub mod sessions;
pub(super) mod signed_in;
pub mod status;

use std::fmt::Write as _;
use std::sync::Arc;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::response::{Html, IntoResponse, Response};
use axum::Extension;
use openraft::async_runtime::WatchReceiver;
use palisade_serve::policy::{Principal, Right};
use serde::Deserialize;

use super::state::ApiState;
use crate::error::ApiError;
use crate::error::ErrorBody;
use crate::lease_table::history::Transition;
use status::StatusPage;

/// Leases on one page.
const PAGE: usize = 200;

/// `GET /ui?prefix=`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub(super) struct UiQuery {
    /// Only leases whose names start with this.
    #[serde(default)]
    prefix: String,
    /// The page after this lease name (the previous page's last row).
    after: Option<String>,
}

/// Escapes text for HTML element content and attribute values, and shows
/// a bidirectional control (which would reorder the text around it) as
/// `<U+202E>`: new holders, keys and principal names cannot hold one, but
/// older records and other sources may.
pub(super) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            c if palisade_names::text::is_bidi_control(c) => {
                let _ = write!(out, "&lt;U+{:04X}&gt;", u32::from(c));
            }
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[utoipa::path(get, path = "/ui", tag = "health", params(UiQuery),
    responses((status = 200, body = String, content_type = "text/html", description = "The status page"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub(super) async fn page(
    State(state): State<ApiState>,
    Extension(status): Extension<Arc<StatusPage>>,
    principal: Option<Extension<Principal>>,
    query: Result<Query<UiQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let Query(query) = query.map_err(|e| ApiError::BadRequest(format!("bad query: {e}")))?;
    let sees_all = sees_all(&state, principal.as_ref().map(|p| &p.0));
    let mut html = head(&format!("Palisade node {}", state.config.id));
    let members = cluster::gather(&state).await;
    node_section(&mut html, &state, &members);
    if state.config.policy.is_some() {
        html.push_str(
            "<form id=\"logout\" method=\"post\" action=\"/ui/logout\">\
             <button type=\"submit\">Sign out</button></form>",
        );
    }
    // The leases first, where a screen shows them without scrolling; the
    // plots below.
    let rows = Rows {
        prefix: &query.prefix,
        after: query.after.as_deref(),
        sees_all,
    };
    lease_section(&mut html, &state, &rows);
    cluster::partitions_section(&mut html, &state);
    if sees_all {
        let answered = members.iter().filter(|m| m.answer.is_ok()).count();
        plots::section(
            &mut html,
            &cluster::combined(&members),
            (answered, members.len()),
            crate::signing::unix_ms(),
        );
    }
    if let Some(reader) = &status.gateway {
        gateway_fences(&mut html, reader, &query.prefix).await;
    }
    html.push_str("</body></html>");
    Ok(Html(html).into_response())
}

/// Whether the caller may see cluster-wide figures: with no policy anyone,
/// under one a principal that may read every lease.
fn sees_all(state: &ApiState, principal: Option<&Principal>) -> bool {
    let Some(policy) = &state.config.policy else {
        return true;
    };
    principal.is_some_and(|p| policy.current().allow_prefix(p, Right::Read, "").is_ok())
}

/// A page's head (it refreshes every 2 s), up to the opening `<body>`.
fn head(title: &str) -> String {
    format!(
        "<!doctype html><html><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"2\"><title>{title}</title>\
         <style>{}</style></head><body>",
        headers::PAGE_CSS
    )
}

/// This node's view of Raft (role, leader, term, commit and applied
/// indexes), then every member as it answered: its role and term, how far
/// its applied index is behind the highest commit index any member
/// reported, or why it did not answer.
fn node_section(html: &mut String, state: &ApiState, members: &[cluster::Member]) {
    let metrics = state.group_zero().raft.metrics().borrow_watched().clone();
    let me = state.config.id;
    let role = format!("{:?}", metrics.state);
    let leader = metrics
        .current_leader
        .map_or_else(|| "none".to_owned(), |id| format!("node {id}"));
    let applied = metrics.last_applied.as_ref().map_or(0, |id| id.index);
    let committed = metrics.cluster_committed.as_ref().map_or(0, |id| id.index);
    let now_ms = crate::signing::unix_ms();
    let _ = write!(
        *html,
        "<h1>Palisade election node {me}</h1>\
         <p>role <b id=\"role\">{}</b> · leader <b id=\"leader\">{}</b> · term <b id=\"term\">{}</b> \
         · commit {} · applied {} · at <time>{}</time></p><h2>Members</h2>\
         <table id=\"members\"><tr><th>node</th><th>peer address</th><th>answers</th>\
         <th>role</th><th>term</th><th>applied</th><th>behind</th></tr>",
        escape(&role),
        escape(&leader),
        metrics.current_term,
        committed,
        applied,
        palisade_names::time::rfc3339_ms(now_ms),
    );
    let top = cluster::committed(members);
    for member in members {
        member_row(html, member, top, metrics.current_leader);
    }
    html.push_str("</table>");
}

/// One member's row: `class="up"` or `class="down"` (with the reason).
fn member_row(html: &mut String, member: &cluster::Member, top: u64, leader: Option<u64>) {
    let mut marks = Vec::new();
    if Some(member.id) == leader {
        marks.push("leader");
    }
    if !member.voter {
        marks.push("learner");
    }
    let name = if marks.is_empty() {
        member.id.to_string()
    } else {
        format!("{} ({})", member.id, marks.join(", "))
    };
    match &member.answer {
        Ok(f) => {
            let _ = write!(
                *html,
                "<tr class=\"up\" data-node=\"{id}\"><td>{}</td><td>{}</td><td class=\"answers\">yes</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td class=\"behind\">{}</td></tr>",
                escape(&name),
                escape(&member.addr),
                escape(&f.role),
                f.term,
                f.applied_index,
                top.saturating_sub(f.applied_index),
                id = member.id,
            );
        }
        Err(why) => {
            let _ = write!(
                *html,
                "<tr class=\"down\" data-node=\"{id}\"><td>{}</td><td>{}</td>\
                 <td class=\"answers\" colspan=\"5\">no: {}</td></tr>",
                escape(&name),
                escape(&member.addr),
                escape(why),
                id = member.id,
            );
        }
    }
}

/// Which leases the page lists.
struct Rows<'a> {
    /// Only names starting with this (the caller may read them all).
    prefix: &'a str,
    /// The page after this name.
    after: Option<&'a str>,
    /// Whether to say how many leases the whole table has
    /// ([`sees_all`]).
    sees_all: bool,
}

/// The leases under the prefix: at most [`PAGE`] rows, and (for a caller
/// that may see it) how many the table has in all.
fn lease_section(html: &mut String, state: &ApiState, wanted: &Rows<'_>) {
    let (prefix, after) = (wanted.prefix, wanted.after);
    // One page and one look past it: the work is bounded by the page, never
    // by the number of leases under the prefix.
    let mut rows = Vec::new();
    let mut in_table = 0;
    for group in state.groups() {
        group.applied.read(|s| {
            let start = match after {
                Some(after) if after >= prefix => std::ops::Bound::Excluded(after),
                _ => std::ops::Bound::Included(prefix),
            };
            rows.extend(
                s.table
                    .leases
                    .range::<str, _>((start, std::ops::Bound::Unbounded))
                    .take_while(|(name, _)| name.as_str().starts_with(prefix))
                    .take(PAGE + 1)
                    .map(|(name, record)| (name.clone(), record.clone())),
            );
            in_table += s.table.leases.len();
        });
    }
    // Every partition's first page, in name order: the first of them all.
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let more = rows.len() > PAGE;
    rows.truncate(PAGE);
    let in_table = if wanted.sees_all {
        format!(" (<span id=\"in-table\">{in_table}</span> in the table)")
    } else {
        String::new()
    };
    let _ = write!(
        *html,
        "<h2>Leases</h2><p>{} shown with prefix “{}”{}{in_table}{}</p>\
         <table id=\"leases\"><tr><th>lease</th><th>holder</th><th>token</th><th>time left</th><th>changes</th><th>last change</th></tr>",
        rows.len(),
        escape(prefix),
        after.map_or_else(String::new, |a| format!(" after “{}”", escape(a))),
        if state.groups().iter().all(|g| g.is_leader()) {
            ""
        } else {
            " (time left is known on a lease's leader only)"
        },
    );
    for (name, record) in &rows {
        lease_row(html, state, name, record);
    }
    html.push_str("</table>");
    if let Some((last, _)) = rows.last().filter(|_| more) {
        let _ = write!(
            *html,
            "<p><a id=\"next\" href=\"/ui?prefix={}&amp;after={}\">next page</a></p>",
            query_escape(prefix),
            query_escape(last.as_str()),
        );
    }
}

/// One lease's row.
fn lease_row(
    html: &mut String,
    state: &ApiState,
    name: &palisade_names::LeaseName,
    record: &crate::lease_table::record::LeaseRecord,
) {
    let left = record
        .holder
        .as_ref()
        .and_then(|_| state.group(name).lessor.remaining_ms(name, record.token))
        .map_or_else(String::new, |ms| format!("{:.1} s", ms as f64 / 1000.0));
    let holder = record.holder.as_deref().map_or_else(
        || "<i>free</i>".to_owned(),
        |h| format!("<span class=\"holder\">{}</span>", escape(h)),
    );
    let _ = write!(
        *html,
        "<tr><td class=\"lease\"><a href=\"/ui/leases/{0}\">{0}</a></td><td>{holder}</td>\
         <td>{1}</td><td>{left}</td><td>{2}</td><td class=\"last-change\">{3}</td></tr>",
        escape(name.as_str()),
        record.token,
        record.transitions,
        record.history.back().map_or_else(String::new, last_change),
    );
}

/// A lease's latest transition: `preempt of low (token 5), 3.2 s ago`
/// (`palisade lease history` and `GET /v1/leases/{name}/history` have
/// the rest).
fn last_change(t: &Transition) -> String {
    let holder = t.holder.as_deref().unwrap_or("-");
    let ago = t.at_ms.map_or_else(String::new, |at| {
        format!(", {}", ago(crate::signing::unix_ms(), at))
    });
    format!(
        "{} of {} (token {}){ago}",
        escape(&lease::cause(t)),
        escape(holder),
        t.token
    )
}

/// How long before `now_ms` the time `at_ms` was, and when, in UTC:
/// `3.2 s ago (2026-11-28T00:40:12.345Z)`.
fn ago(now_ms: u64, at_ms: u64) -> String {
    let at = palisade_names::time::rfc3339_ms(at_ms);
    format!(
        "{:.1} s ago (<time datetime=\"{at}\">{at}</time>)",
        now_ms.saturating_sub(at_ms) as f64 / 1000.0
    )
}

/// Percent-encodes `text` for a query string value.
pub(super) fn query_escape(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The gateway's fencing audit for leases under `prefix` (the viewer may
/// read those): who was refused, with which token, from where.
async fn gateway_fences(html: &mut String, reader: &gateway::GatewayReader, prefix: &str) {
    let _ = write!(
        html,
        "<h2>Writes refused by the gateway</h2><p>{}</p>",
        escape(reader.url())
    );
    let Some(fences) = fences_or_problem(html, reader).await else {
        return;
    };
    let shown: Vec<_> = fences
        .into_iter()
        .filter(|f| f["lease"].as_str().is_some_and(|l| l.starts_with(prefix)))
        .collect();
    fence_rows(html, &shown);
}

/// The gateway's fences; `None`, with the reason written to `html`, if
/// they cannot be read.
async fn fences_or_problem(
    html: &mut String,
    reader: &gateway::GatewayReader,
) -> Option<Vec<serde_json::Value>> {
    reader
        .fences()
        .await
        .map_err(|err| {
            let _ = write!(
                html,
                "<p id=\"gateway-error\">cannot read its fences: {}</p>",
                escape(&err)
            );
        })
        .ok()
}

/// A table of the gateway's fences: who was refused, with which token, from
/// where, and when last.
fn fence_rows(html: &mut String, fences: &[serde_json::Value]) {
    html.push_str(
        "<table id=\"fences\"><tr><th>lease</th><th>refused</th><th>last token</th>\
         <th>fence</th><th>holder</th><th>from</th><th>key</th><th>when</th></tr>",
    );
    let now = crate::signing::unix_ms();
    for fence in fences {
        let last = &fence["refused"]["last"];
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::Null => String::new(),
            v => escape(&v.as_str().map_or_else(|| v.to_string(), str::to_owned)),
        };
        let when = last["at_unix_ms"]
            .as_u64()
            .map_or_else(String::new, |at| ago(now, at));
        let _ = write!(
            html,
            "<tr><td class=\"lease\">{}</td><td class=\"refused\">{}</td><td>{}</td><td>{}</td>\
             <td class=\"holder\">{}</td><td>{}</td><td>{}</td><td>{when}</td></tr>",
            text(&fence["lease"]),
            text(&fence["refused"]["count"]),
            text(&last["token"]),
            text(&last["fence"]),
            text(&last["holder"]),
            text(&last["peer"]),
            text(&last["key"]),
        );
    }
    html.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::escape;

    #[test]
    fn markup_is_escaped() {
        assert_eq!(
            escape("<script>alert('x')</script> & \"q\""),
            "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt; &amp; &quot;q&quot;"
        );
    }
}
