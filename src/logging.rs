//! Where log lines go and how they look ([`LogFormat`]).

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable; ANSI colour only when stderr is a terminal.
    Text,
    /// One JSON object per line.
    Json,
}

/// openraft's warnings that repeat for every attempt at a peer that is
/// down (one per heartbeat: ~50 a second, each a long line): errors only,
/// unless `RUST_LOG` names openraft itself. The election node says once
/// that a peer is unreachable, sums it up once a minute, and says when it
/// is back (`election/src/peer/reachability.rs`).
const PER_ATTEMPT: [&str; 3] = [
    "openraft::core::heartbeat=error",
    "openraft::replication=error",
    "openraft::engine::handler::replication_handler=error",
];

/// Logs go to stderr, filtered by `RUST_LOG` (default `info`, openraft's
/// per-attempt warnings left out: [`PER_ATTEMPT`]), as `format` says.
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    let asked = std::env::var("RUST_LOG").ok();
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if !asked.is_some_and(|asked| asked.contains("openraft")) {
        for directive in PER_ATTEMPT {
            if let Ok(directive) = directive.parse() {
                filter = filter.add_directive(directive);
            }
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().with_ansi(false).try_init(),
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
    };
}
