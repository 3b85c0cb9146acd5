//! `palisade sql install|keys|guard|unguard`: the fence schema in your own
//! PostgreSQL (`palisade_client::postgres`).

use crate::output::say;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::anyhow;
use clap::{Args, Subcommand};
use palisade_client::postgres::{self, tokio_postgres};

use super::endpoints::Endpoints;

#[derive(Debug, Subcommand)]
pub enum SqlCommand {
    /// Install the fence schema (`palisade.fence`; installing the same
    /// version again changes nothing), then the cluster's signing keys (as
    /// `palisade sql keys`), and let the `--grant` roles fence.
    Install {
        #[command(flatten)]
        db: Database,
        /// A role that may fence with proof (`palisade.fence`); repeat for
        /// more. No other role can call anything in the schema.
        #[arg(long = "grant", value_name = "ROLE")]
        grant: Vec<String>,
        /// A role that may also fence without proof
        /// (`palisade.fence_unverified`): it can write past any guard and
        /// raise any fence. Only roles trusted as much as the cluster.
        #[arg(long = "trust", value_name = "ROLE")]
        trust: Vec<String>,
        /// Install the schema without the cluster's keys (no fence with
        /// proof passes until `palisade sql keys` runs).
        #[arg(long)]
        no_keys: bool,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Install the cluster's signing keys (`GET /v1/jwks`) as the keys
    /// proofs are checked against; keys the cluster retired are removed.
    /// Run after every `palisade cluster rotate-key` (and retirement), or
    /// keep it running with `--follow`.
    Keys {
        #[command(flatten)]
        db: Database,
        /// Keep the database's keys current: read the cluster's every
        /// `--every-ms` and install them when they change, until stopped.
        #[arg(long)]
        follow: bool,
        #[arg(long, default_value_t = 5_000, requires = "follow")]
        every_ms: u64,
        /// Install the cluster's keys even over a newer key set (a higher
        /// index: a cluster rebuilt from scratch or restored): the old
        /// cluster's keys go, and every JWT they signed is refused.
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        endpoints: Endpoints,
    },
    /// Make a table refuse writes from transactions that did not call
    /// `palisade.fence` for the lease (the row's, or the table's).
    Guard {
        #[command(flatten)]
        db: Database,
        /// The table (`orders`, `app.orders`, `"Orders"`).
        #[arg(long)]
        table: String,
        /// The column naming each row's lease.
        #[arg(long, required_unless_present = "lease", conflicts_with = "lease")]
        lease_column: Option<String>,
        /// One lease for the whole table.
        #[arg(long)]
        lease: Option<String>,
    },
    /// Remove a table's guard (if any).
    Unguard {
        #[command(flatten)]
        db: Database,
        /// The table.
        #[arg(long)]
        table: String,
    },
}

#[derive(Debug, Args)]
pub struct Database {
    /// The database (`postgres://user@host:port/db` or `host=... dbname=...`).
    #[arg(long, env = "DATABASE_URL", required_unless_present = "url_file")]
    url: Option<String>,
    /// `--url` read from a file (its first line), so a password is not on
    /// the command line or in the environment (both readable in /proc).
    #[arg(long, env = "DATABASE_URL_FILE", conflicts_with = "url")]
    url_file: Option<std::path::PathBuf>,
    /// The CA (PEM) that signed the database's certificate: connect over
    /// TLS only, verifying the certificate and the host name (a URL with
    /// `sslmode=require` needs it; nothing is trusted unverified).
    #[arg(long, env = "PGSSLROOTCERT")]
    db_ca: Option<std::path::PathBuf>,
}

impl Database {
    /// A connection, its driver task spawned.
    async fn connect(&self) -> anyhow::Result<tokio_postgres::Client> {
        let url = match (&self.url, &self.url_file) {
            (Some(url), _) => url.clone(),
            (None, Some(file)) => super::first_line_of(file, "--url-file")?,
            (None, None) => return Err(anyhow!("give --url or --url-file (or DATABASE_URL)")),
        };
        let ca = match &self.db_ca {
            Some(path) => Some(
                std::fs::read(path)
                    .map_err(|e| anyhow!("cannot read --db-ca {}: {e}", path.display()))?,
            ),
            None => None,
        };
        let client = palisade_store::connect_postgres(&url, ca.as_deref(), "--db-ca")
            .await
            .map_err(|e| anyhow!("cannot connect to the database: {e}"))?;
        Ok(client)
    }
}

pub async fn run(command: SqlCommand) -> anyhow::Result<ExitCode> {
    match command {
        SqlCommand::Install {
            db,
            grant,
            trust,
            no_keys,
            endpoints,
        } => install(&db, &grant, &trust, (!no_keys).then_some(&endpoints)).await?,
        SqlCommand::Keys {
            db,
            follow,
            every_ms,
            replace,
            endpoints,
        } => {
            keys(
                &db,
                &endpoints,
                follow.then(|| Duration::from_millis(every_ms.max(100))),
                replace,
            )
            .await?
        }
        SqlCommand::Guard {
            db,
            table,
            lease_column,
            lease,
        } => guard(&db, &table, lease_column, lease).await?,
        SqlCommand::Unguard { db, table } => {
            postgres::unguard(&db.connect().await?, &table).await?;
            say!("{table} unguarded");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `palisade sql install`: the schema, then the keys, then the grants.
async fn install(
    db: &Database,
    grant: &[String],
    trust: &[String],
    keys_from: Option<&Endpoints>,
) -> anyhow::Result<()> {
    let client = db.connect().await?;
    let version = postgres::install(&client).await?;
    say!("palisade fence schema version {version} installed");
    if let Some(endpoints) = keys_from {
        let jwks = cluster_keys(endpoints).await?;
        let count = postgres::set_keys(&client, &jwks).await?;
        say!("{}", keys_line(count, &jwks)?);
    }
    for role in grant {
        postgres::allow(&client, role).await?;
        say!("{role} may fence with proof (palisade.fence)");
    }
    for role in trust {
        postgres::trust(&client, role).await?;
        say!("{role} may fence without proof (palisade.fence_unverified): it is trusted as the cluster is");
    }
    Ok(())
}

/// `palisade sql keys [--follow]`.
async fn keys(
    db: &Database,
    endpoints: &Endpoints,
    every: Option<Duration>,
    mut replace: bool,
) -> anyhow::Result<()> {
    let mut client = Some(db.connect().await?);
    let mut installed: Option<serde_json::Value> = None;
    loop {
        // Following, a database or cluster that does not answer for a
        // while is waited for (the session is opened again: a restarted
        // database ends it); a single run reports it.
        let outcome = match cluster_keys(endpoints).await {
            Ok(jwks) if installed.as_ref() != Some(&jwks) => {
                let session = match client.take() {
                    Some(session) => Ok(session),
                    None => db.connect().await,
                };
                match session {
                    Ok(session) => {
                        let set = match replace {
                            // Once: what follows is this cluster's own.
                            true => replace_keys(&session, &jwks).await,
                            false => postgres::set_keys(&session, &jwks)
                                .await
                                .map_err(Into::into),
                        };
                        if !session.is_closed() {
                            client = Some(session);
                        }
                        set.and_then(|count| {
                            // An older set is reported once, not every poll.
                            let line = keys_line(count, &jwks);
                            installed = Some(jwks);
                            replace = false;
                            say!("{}", line?);
                            Ok(())
                        })
                    }
                    Err(err) => Err(err),
                }
            }
            Ok(_) => Ok(()),
            Err(err) => Err(err),
        };
        match outcome {
            Ok(()) => {}
            Err(err) if every.is_some() => {
                tracing::warn!(err = %format!("{err:#}"), "cannot install the cluster's keys yet; retrying");
            }
            Err(err) => return Err(err),
        }
        let Some(every) = every else {
            return Ok(());
        };
        tokio::time::sleep(every).await;
    }
}

/// The cluster's JWKS.
async fn cluster_keys(endpoints: &Endpoints) -> anyhow::Result<serde_json::Value> {
    let client = endpoints.client()?;
    client
        .jwks()
        .await
        .map_err(|e| anyhow!("cannot read the cluster's keys (GET /v1/jwks): {e}"))
}

/// Installs `jwks` whatever the index of the set installed (`--replace`):
/// the index is forgotten and the set installed in one transaction, so a
/// failed install leaves the old set and its index as they were.
async fn replace_keys(
    client: &tokio_postgres::Client,
    jwks: &serde_json::Value,
) -> anyhow::Result<i32> {
    client
        .batch_execute("BEGIN; UPDATE palisade.settings SET keys_index = 0")
        .await
        .map_err(|e| anyhow!("cannot reset the database's key set index: {e}"))?;
    match postgres::set_keys(client, jwks).await {
        Ok(count) => {
            client
                .batch_execute("COMMIT")
                .await
                .map_err(|e| anyhow!("cannot commit the key set: {e}"))?;
            Ok(count)
        }
        Err(err) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(err.into())
        }
    }
}

/// What `set_keys` did, on one line; an error when it changed nothing.
fn keys_line(count: i32, jwks: &serde_json::Value) -> anyhow::Result<String> {
    let index = &jwks["applied_index"];
    if count == 0 {
        return Err(anyhow!(
            "the database holds a newer key set than the cluster's (index {index}), so its keys \
             are unchanged: if this cluster was rebuilt or restored, run `palisade sql keys \
             --replace` to install its keys in place of the old cluster's"
        ));
    }
    let kids: Vec<&str> = jwks["keys"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|k| k["kid"].as_str())
        .collect();
    Ok(format!(
        "{count} signing key(s) installed (index {index}): {}",
        kids.join(", ")
    ))
}

/// `palisade sql guard`.
async fn guard(
    db: &Database,
    table: &str,
    lease_column: Option<String>,
    lease: Option<String>,
) -> anyhow::Result<()> {
    let client = db.connect().await?;
    match (lease_column, lease) {
        (Some(column), _) => {
            postgres::guard(&client, table, &column).await?;
            say!("{table} guarded: writes need a fence for the lease in column {column}");
        }
        (None, Some(lease)) => {
            postgres::guard_table(&client, table, &lease).await?;
            say!("{table} guarded: writes need a fence for lease {lease}");
        }
        (None, None) => return Err(anyhow!("give --lease-column or --lease")),
    }
    Ok(())
}
