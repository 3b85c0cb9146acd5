//! [`say!`]: every line a command prints on stdout goes through here;
//! [`complain!`]: every line it prints on stderr.
//!
//! A closed stdout is not a crash: when the reader goes away
//! (`palisade lease watch orders | head -1`), the first write that finds
//! the pipe closed marks stdout closed, later writes are dropped, and
//! [`closed`] resolves. [`crate::shutdown::shutdown_signal`] treats that
//! like Ctrl-C, so a command that runs until stopped stops the way it does
//! on a signal (a held lease is released) and exits 0, as `yes | head -1`
//! does from the reader's point of view. (Rust ignores SIGPIPE, so
//! `println!` would panic with "failed printing to stdout: Broken pipe".)

use std::io::Write;
use std::sync::OnceLock;

use tokio::sync::watch;

/// Prints one line on stdout through [`line`]: `say!("held {name}")`.
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}
pub(crate) use say;

/// Prints one line on stderr through [`stderr_line`]:
/// `complain!("error: {err}")`.
macro_rules! complain {
    ($($arg:tt)*) => {
        $crate::output::stderr_line(format_args!($($arg)*))
    };
}
pub(crate) use complain;

/// Writes `text` and a newline on stderr. A stderr whose reader went away
/// (`palisade lease get x 2>&1 | head -0`) drops the line: the command
/// goes on, and ends with the exit code it meant (`eprintln!` would panic
/// and exit 101 instead).
pub fn stderr_line(text: impl std::fmt::Display) {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{text}");
}

/// Flips to true once, when a write to stdout failed.
fn state() -> &'static watch::Sender<bool> {
    static CLOSED: OnceLock<watch::Sender<bool>> = OnceLock::new();
    CLOSED.get_or_init(|| watch::channel(false).0)
}

/// Writes `text` and a newline on stdout, unless stdout is closed.
pub fn line(text: impl std::fmt::Display) {
    write_with(|out| writeln!(out, "{text}"));
}

/// Writes `bytes` as they are on stdout, unless stdout is closed.
pub fn bytes(bytes: &[u8]) {
    write_with(|out| out.write_all(bytes));
}

fn write_with(write: impl FnOnce(&mut std::io::StdoutLock<'static>) -> std::io::Result<()>) {
    if *state().borrow() {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(err) = write(&mut out).and_then(|()| out.flush()) {
        if err.kind() != std::io::ErrorKind::BrokenPipe {
            // A full disk or a revoked terminal: said once, then stop
            // as for a closed pipe.
            stderr_line(format_args!("error: cannot write to stdout: {err}"));
        }
        state().send_replace(true);
    }
}

/// Resolves once a write to stdout has failed (the reader went away).
pub async fn closed() {
    let mut closed = state().subscribe();
    let _ = closed.wait_for(|&c| c).await;
}
