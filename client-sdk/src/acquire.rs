//! An acquire: [`AcquireOptions`], the request body, and the loop that
//! asks for a long wait in slices (`Client::acquire` and
//! `Client::acquire_grant` both run it).

use std::time::Duration;

use palisade_names::{GrantSecret, LeaseName};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::error::Error;
use crate::model::Grant;
use crate::transport::Transport;

/// What an acquire may ask for beyond holder and ttl (the default asks for
/// nothing; README "Leadership semantics").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AcquireOptions {
    /// 0..=1000. A waiting acquire of a higher priority than a preemptible
    /// holder's preempts it; waiters queue by priority. Equal priority
    /// never preempts.
    pub priority: u32,
    /// A waiting acquire of a higher priority may preempt this grant (its
    /// holder gets [`Error::Preempted`] on its next renewal).
    pub preemptible: bool,
    /// After this grant expires (not after a release) the lease stays
    /// unavailable this long (at most 60 s).
    pub lock_delay: Duration,
    /// The grant is renewed for at most this long after it was granted.
    pub max_hold: Option<Duration>,
}

/// Acquires `lease` for `holder`, waiting up to `wait`; the grant and the
/// send time of the request that got it (where its safe deadline starts).
pub(crate) async fn acquire(
    transport: &Transport,
    lease: &str,
    holder: &str,
    ttl: Duration,
    wait: Option<Duration>,
    options: AcquireOptions,
) -> Result<(Grant, Instant), Error> {
    LeaseName::new(lease).map_err(|e| Error::BadRequest(e.to_string()))?;
    // Our own secret, the same for every request of this call, so that a
    // retry (its answer lost, or a slice that timed out here but was
    // granted there) is recognised as the same client: the same grant.
    let secret = new_secret();
    let path = format!("/v1/leases/{lease}/acquire");
    // A long wait is asked for in slices of half a request timeout, each
    // request within one request timeout: a request stuck on a leader
    // that died, froze or was cut off costs one request timeout, as any
    // call, not the whole wait.
    let deadline = Instant::now() + wait.unwrap_or_default();
    loop {
        let slice = deadline
            .saturating_duration_since(Instant::now())
            .min(transport.config.request_timeout / 2);
        let body = acquire_body(holder, ttl, &secret, wait.map(|_| slice), options);
        // Before the first attempt of this slice: if a retry inside it is
        // what gets the answer, the grant may date from the first one.
        // (A grant made for an earlier slice that timed out here comes
        // back extended from this slice's arrival, as a repeat.)
        let sent = Instant::now();
        let answer = transport
            .election_on(
                lease,
                true,
                reqwest::Method::POST,
                &path,
                Some(&body),
                Duration::ZERO,
            )
            .await?;
        match answer.parse::<Grant>() {
            Ok(mut grant) => {
                // A cluster that predates secrets answers none: keep ours.
                grant.secret.get_or_insert(secret);
                return Ok((grant, sent));
            }
            Err(Error::Held { .. }) if Instant::now() < deadline => {}
            // The node waits out a lock-delay only within the slice.
            Err(Error::LockDelay { retry_after }) if Instant::now() < deadline => {
                let until = (Instant::now() + retry_after).min(deadline);
                tokio::time::sleep_until(until).await;
            }
            Err(err) => return Err(err),
        }
    }
}

/// The body of one acquire request; `wait` is this slice of the wait, if
/// the caller waits at all.
fn acquire_body(
    holder: &str,
    ttl: Duration,
    secret: &GrantSecret,
    wait: Option<Duration>,
    options: AcquireOptions,
) -> Value {
    let mut body = json!({
        "holder": holder,
        "ttl_ms": ttl.as_millis() as u64,
        "secret": secret.expose(),
    });
    if let Some(slice) = wait {
        body["wait_ms"] = json!(slice.as_millis() as u64);
    }
    if options.priority > 0 {
        body["priority"] = json!(options.priority);
    }
    if options.preemptible {
        body["preemptible"] = json!(true);
    }
    if !options.lock_delay.is_zero() {
        body["lock_delay_ms"] = json!(options.lock_delay.as_millis() as u64);
    }
    if let Some(max_hold) = options.max_hold {
        body["max_hold_ms"] = json!(max_hold.as_millis() as u64);
    }
    body
}

/// A fresh grant secret: 256 bits from the OS RNG, as 64 hex digits.
fn new_secret() -> GrantSecret {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    GrantSecret::new(&hex).unwrap_or_else(|_| unreachable!("64 hex digits"))
}
