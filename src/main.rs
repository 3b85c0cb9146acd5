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
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = err.print();
                return ExitCode::SUCCESS;
            }
            let rendered = err.render().to_string();
            // clap's message runs until the first blank line; keep it on one line.
            let line: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            complain!("{} (see --help)", line.join(" "));
            return ExitCode::from(2);
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
            ExitCode::FAILURE
        }
    }
}
