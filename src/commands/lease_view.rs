//! How the lease commands print: a lease, its history and a grant
//! (readable, or `--json`), and a refusal on stderr with what to do
//! about it.

use crate::output::{complain, say};
use std::process::ExitCode;

use palisade_client::Error;

pub(crate) fn fail(err: &Error) -> ExitCode {
    complain!("error: {err}");
    crate::exit::of(err)
}

/// As [`fail`], for an acquire of `lease` as `holder`: a lease held says
/// what to do about it.
pub(crate) fn fail_acquire(err: &Error, lease: &str, holder: &str) -> ExitCode {
    complain!("error: {err}");
    if let Some(hint) = held_hint(err, lease, holder) {
        complain!("hint: {hint}");
    }
    crate::exit::of(err)
}

/// What to do about an acquire of `lease` as `holder` refused with `err`
/// because the lease is held.
fn held_hint(err: &Error, lease: &str, holder: &str) -> Option<String> {
    let Error::Held {
        holder: current,
        token,
    } = err
    else {
        return None;
    };
    Some(if current == holder {
        format!(
            "{holder:?} is the holder you asked for, but the grant was made to another \
             acquire (another process, or an earlier acquire: each has its own secret), so \
             this one is refused. If it is yours, release it with the secret that acquire \
             printed: palisade lease release {lease} --holder {holder} --token {token} \
             --secret SECRET --grant-index INDEX; or wait for it with --wait-ms MS"
        )
    } else {
        format!(
            "wait for it with --wait-ms MS: a waiting acquire gets it as soon as \
             {current:?} releases it or stops renewing (after its ttl)"
        )
    })
}

pub(crate) fn print(json: bool, value: &serde_json::Value, readable: String) {
    if json {
        say!("{value}");
    } else {
        say!("{readable}");
    }
}

/// One line per transition:
/// `index 41  acquire   w1 (token 41)  2026-11-28T00:40:12.345Z (3.2 s ago)`.
pub(crate) fn describe_history(lease: &str, history: &[palisade_client::Transition]) -> String {
    if history.is_empty() {
        return format!("{lease}: no transitions recorded");
    }
    let lines: Vec<String> = history
        .iter()
        .map(|t| {
            let holder = t.holder.as_deref().unwrap_or("-");
            let when = t
                .at_ms
                .map_or(String::new(), |at| format!("  {}", super::when(at)));
            format!(
                "index {}  {:<8}  {holder} (token {}){when}",
                t.index, t.cause, t.token
            )
        })
        .collect();
    format!("{lease}:\n{}", lines.join("\n"))
}

pub(crate) fn describe(info: &palisade_client::LeaseInfo) -> String {
    match &info.holder {
        Some(holder) => {
            format!(
                "{} held by {holder} (token {}, ttl {} ms, {}{}{} transitions, index {}){}",
                info.lease,
                info.token,
                info.ttl_ms,
                info.expires_in_ms
                    .map_or(String::new(), |ms| format!("expires in {ms} ms, ")),
                if info.revoked {
                    "revoked: ends at its deadline, "
                } else {
                    ""
                },
                info.transitions,
                info.modify_index,
                grant_times(info)
            ) + &terms(info)
        }
        None => {
            format!(
                "{} free (last token {}, {} transitions, index {})",
                info.lease, info.token, info.transitions, info.modify_index
            ) + &terms(info)
        }
    }
}

/// What else the server said of the lease, as sentences: a reservation
/// (a handover's successor that has not taken it yet), priority and
/// preemption, lock-delay, max-hold, the partition.
fn terms(info: &palisade_client::LeaseInfo) -> String {
    let more = &info.more;
    let number = |name: &str| more.get(name).and_then(serde_json::Value::as_u64);
    let flag = |name: &str| more.get(name).and_then(serde_json::Value::as_bool) == Some(true);
    let mut said = Vec::new();
    if flag("reserved") {
        let holder = info.holder.as_deref().unwrap_or("?");
        said.push(format!(
            "reserved for {holder}: a handover's successor that has not taken it yet"
        ));
    }
    if let Some(by) = more.get("preempted_by").and_then(serde_json::Value::as_str) {
        said.push(format!("preempted by {by}"));
    }
    match (number("priority"), flag("preemptible")) {
        (Some(p), true) => said.push(format!("priority {p}, preemptible")),
        (Some(p), false) => said.push(format!("priority {p}")),
        (None, true) => said.push("preemptible".to_owned()),
        (None, false) => {}
    }
    if let Some(ms) = number("lock_delay_ms") {
        said.push(format!("lock-delay {ms} ms"));
    }
    if flag("lock_delayed") {
        said.push("held back by a lock-delay".to_owned());
    }
    if let Some(ms) = number("max_hold_ms") {
        said.push(format!("max-hold {ms} ms"));
    }
    if let Some(k) = number("partition") {
        said.push(format!("partition {k}"));
    }
    said.iter().map(|s| format!("\n  {s}")).collect()
}

/// `; acquired <when>; renewed <when> ...`, for the times the answer
/// carries. The renewal time is the leader's record (its last renewal, or
/// when that leader took the grant over), on the leader's clock: said so,
/// as it is not the holder's own renew time.
fn grant_times(info: &palisade_client::LeaseInfo) -> String {
    let at = |label: &str, time: &Option<String>| {
        time.as_deref().map_or(
            String::new(),
            |text| match palisade_names::time::parse_rfc3339_ms(text) {
                Some(ms) => format!("; {label} {}", super::when(ms)),
                None => format!("; {label} {text}"),
            },
        )
    };
    let renewed = at("renewed", &info.renew_time);
    let whose = if renewed.is_empty() {
        ""
    } else {
        " as the leader records it (its last renewal, or its takeover)"
    };
    format!("{}{renewed}{whose}", at("acquired", &info.acquire_time))
}

pub(crate) fn info_json(info: &palisade_client::LeaseInfo) -> serde_json::Value {
    serde_json::to_value(info).unwrap_or_default()
}

/// Prints a grant: readable (`verb` says what happened) or as JSON.
pub(crate) fn print_grant(json: bool, grant: &palisade_client::Grant, verb: &str) {
    print_grant_fenced(json, grant, verb, None);
}

/// [`print_grant`], with what raising the gateway's fence gave (`None`: no
/// gateway was named): `"fence"` in JSON (null when it was not raised), a
/// line in text.
pub(crate) fn print_grant_fenced(
    json: bool,
    grant: &palisade_client::Grant,
    verb: &str,
    fence: Option<&Result<u64, palisade_client::Error>>,
) {
    let mut value = serde_json::to_value(grant).unwrap_or_default();
    if let Some(fence) = fence {
        value["fence"] = fence.as_ref().ok().copied().into();
    }
    let mut readable = format!(
        "{verb} {} for {} with token {}\njwt: {}",
        grant.lease, grant.holder, grant.token, grant.jwt
    );
    if let Some(secret) = &grant.secret {
        // What `lease renew` and `lease release` need.
        readable.push_str(&format!(
            "\nsecret: {}\ngrant_index: {}",
            secret.expose(),
            grant.grant_index.unwrap_or_default()
        ));
    }
    match fence {
        Some(Ok(fence)) => readable.push_str(&format!("\ngateway fence raised to {fence}")),
        Some(Err(err)) => readable.push_str(&format!("\ngateway fence NOT raised: {err}")),
        None => {}
    }
    print(json, &value, readable);
}
