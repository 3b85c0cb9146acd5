//! `palisade lease watch NAME`: the lease at every change, until a signal
//! or a closed stdout (`--prefix` is `prefix_watch.rs`).

use crate::output::complain;
use std::process::ExitCode;
use std::time::Duration;

use palisade_client::Error;

use super::endpoints::Endpoints;
use super::lease_view::{describe, fail, info_json, print};

/// `palisade lease watch`: prints the lease at every change until a
/// signal (or a closed stdout). A lease never granted is waited for, and
/// stderr says so at once; a name that can never exist is refused.
pub(crate) async fn watch(lease: &str, endpoints: &Endpoints) -> anyhow::Result<ExitCode> {
    let client = endpoints.client()?;
    let mut index = 0;
    // A watch of a lease never granted waits (up to its wait) before it
    // answers 404: a read says at once whether there is one.
    let mut said_missing = false;
    match client.get(lease).await {
        Err(Error::NotFound(_)) => {
            say_missing(lease);
            said_missing = true;
        }
        Err(err @ (Error::BadRequest(_) | Error::Unauthorized(_) | Error::Forbidden(_))) => {
            return Ok(fail(&err));
        }
        _ => {}
    }
    let shutdown = crate::shutdown::shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let next = tokio::select! {
            () = &mut shutdown => return Ok(ExitCode::SUCCESS),
            next = client.watch(lease, index, Duration::from_secs(30)) => next,
        };
        match next {
            Ok(info) if info.modify_index > index => {
                index = info.modify_index;
                print(endpoints.json, &info_json(&info), describe(&info));
            }
            Ok(_) => {}
            Err(Error::NotFound(_)) => {
                if !said_missing {
                    say_missing(lease);
                    said_missing = true;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(err @ (Error::BadRequest(_) | Error::Unauthorized(_) | Error::Forbidden(_))) => {
                return Ok(fail(&err));
            }
            Err(err) => {
                complain!("warning: {err}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
}

fn say_missing(lease: &str) {
    complain!(
        "lease {lease} does not exist yet (never granted, or forgotten since its release); \
         waiting for its first grant (Ctrl-C stops)"
    );
}
