//! `palisade`: every server and client command in one binary.
//!
//! `main` parses flags (`cli.rs`; a bad flag is a one-line error and exit
//! code 2) and hands over to one module per command under `commands/`.
//! `logging.rs` sets up the log lines, `output.rs` prints on stdout and stderr (a
//! closed stdout stops a command, a closed stderr drops its lines; neither
//! panics), `shutdown.rs` the
//! signal servers stop on.

mod cli;
mod commands;
mod exit;
mod logging;
mod output;
mod shutdown;

use std::process::ExitCode;

use clap::Parser;

use crate::output::complain;

use cli::Cli;

/// mimalloc gives memory back to the OS once a big table shrinks (see
/// BENCHMARKS.md, "reclamation"); glibc's malloc kept most of it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            use clap::error::ErrorKind;
            if matches!(
                err.kind(),
                ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
            ) {
                let _ = err.print();
                return ExitCode::SUCCESS;
            }
            // `palisade` or `palisade lease` alone did nothing: the help, and
            // a usage error (a script must not read it as done).
            if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = err.print();
                return ExitCode::from(exit::USAGE);
            }
            complain!("{} (see --help)", one_line(&err.render().to_string()));
            return ExitCode::from(exit::USAGE);
        }
    };
    logging::init_tracing(cli.log_format);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(err) => {
            complain!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(code) => code,
        Err(err) => {
            complain!("error: {err:#}");
            // A server that could not be reached in time: retry later.
            let unreachable = err.chain().any(|cause| {
                cause
                    .downcast_ref::<reqwest::Error>()
                    .is_some_and(|e| e.is_connect() || e.is_timeout())
            });
            ExitCode::from(if unreachable {
                exit::UNAVAILABLE
            } else {
                exit::FAILED
            })
        }
    }
}

/// clap's message on one line: its first paragraph, and its `tip:` lines
/// ("a similar subcommand exists: 'acquire'"), which follow a blank line.
fn one_line(rendered: &str) -> String {
    let mut first_paragraph = true;
    let mut kept = Vec::new();
    for line in rendered.lines().map(str::trim) {
        if line.is_empty() {
            first_paragraph = false;
        } else if first_paragraph || line.starts_with("tip:") {
            kept.push(line);
        }
    }
    kept.join(" ")
}
