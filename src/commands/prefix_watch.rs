//! `palisade lease watch --prefix P`: every lease under a prefix as it is
//! now, then every change to one, over one stream (`GET /v1/watch`), until
//! a signal or a closed stdout. A stream that ends (the node went away, or
//! this client fell behind) is opened again from the last index seen.

use crate::output::complain;
use std::process::ExitCode;
use std::time::Duration;

use palisade_client::{Error, WatchEvent};

use super::endpoints::Endpoints;
use super::lease_view::{describe, fail, info_json, print};

/// How long to wait before opening a stream again after one ended.
const REOPEN_AFTER: Duration = Duration::from_millis(500);

/// Watches `prefix` from `index` (see the module's doc).
pub(crate) async fn run(
    prefix: &str,
    index: u64,
    endpoints: &Endpoints,
) -> anyhow::Result<ExitCode> {
    let client = endpoints.client()?;
    let shutdown = crate::shutdown::shutdown_signal();
    tokio::pin!(shutdown);
    let mut index = index;
    loop {
        let opened = tokio::select! {
            () = &mut shutdown => return Ok(ExitCode::SUCCESS),
            opened = client.watch_prefix(prefix, index) => opened,
        };
        let mut watch = match opened {
            Ok(watch) => watch,
            Err(err) if refused(&err) => return Ok(fail(&err)),
            Err(err) => {
                complain!("warning: {err}; trying again");
                tokio::time::sleep(REOPEN_AFTER).await;
                continue;
            }
        };
        loop {
            let next = tokio::select! {
                () = &mut shutdown => return Ok(ExitCode::SUCCESS),
                next = watch.next() => next,
            };
            match next {
                Some(Ok(event)) => show(endpoints.json, &event),
                Some(Err(err)) if refused(&err) => return Ok(fail(&err)),
                Some(Err(err)) => {
                    complain!("warning: {err}; resuming from index {}", watch.index());
                    break;
                }
                None => break,
            }
        }
        index = watch.index();
        tokio::time::sleep(REOPEN_AFTER).await;
    }
}

/// Whether `err` will not go away by asking again.
fn refused(err: &Error) -> bool {
    matches!(
        err,
        Error::BadRequest(_) | Error::Unauthorized(_) | Error::Forbidden(_)
    )
}

/// One line per change (keep-alives are not shown).
fn show(json: bool, event: &WatchEvent) {
    match event {
        WatchEvent::Changed { index, lease } => {
            let value = serde_json::json!({ "index": index, "lease": info_json(lease) });
            print(json, &value, describe(lease));
        }
        WatchEvent::Deleted { index, lease } => {
            let value = serde_json::json!({ "index": index, "lease_name": lease, "deleted": true });
            print(
                json,
                &value,
                format!("{lease} forgotten (free, record reclaimed; index {index})"),
            );
        }
        WatchEvent::Progress { .. } => {}
    }
}
