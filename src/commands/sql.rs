//! `palisade sql install|guard|unguard`: the fence schema in your own
//! PostgreSQL (`palisade_client::postgres`).

use std::process::ExitCode;

use anyhow::anyhow;
use clap::{Args, Subcommand};
use palisade_client::postgres::{self, tokio_postgres};

#[derive(Debug, Subcommand)]
pub enum SqlCommand {
    /// Install the fence schema (`palisade.fence`); installing the same
    /// version again changes nothing.
    Install {
        #[command(flatten)]
        db: Database,
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
    #[arg(long, env = "DATABASE_URL")]
    url: String,
}

impl Database {
    /// A connection, its driver task spawned.
    async fn connect(&self) -> anyhow::Result<tokio_postgres::Client> {
        let (client, connection) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls)
            .await
            .map_err(|e| anyhow!("cannot connect to the database: {}", one_line(&e)))?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(%err, "database connection ended");
            }
        });
        Ok(client)
    }
}

/// A driver error on one line (its sources joined).
fn one_line(err: &tokio_postgres::Error) -> String {
    let mut line = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        line.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    line.replace('\n', " ")
}

pub async fn run(command: SqlCommand) -> anyhow::Result<ExitCode> {
    let done = match command {
        SqlCommand::Install { db } => {
            let client = db.connect().await?;
            let version = postgres::install(&client).await?;
            format!("palisade fence schema version {version} installed")
        }
        SqlCommand::Guard {
            db,
            table,
            lease_column,
            lease,
        } => {
            let client = db.connect().await?;
            match (lease_column, lease) {
                (Some(column), _) => {
                    postgres::guard(&client, &table, &column).await?;
                    format!("{table} guarded: writes need a fence for the lease in column {column}")
                }
                (None, Some(lease)) => {
                    postgres::guard_table(&client, &table, &lease).await?;
                    format!("{table} guarded: writes need a fence for lease {lease}")
                }
                (None, None) => return Err(anyhow!("give --lease-column or --lease")),
            }
        }
        SqlCommand::Unguard { db, table } => {
            let client = db.connect().await?;
            postgres::unguard(&client, &table).await?;
            format!("{table} unguarded")
        }
    };
    println!("{done}");
    Ok(ExitCode::SUCCESS)
}
