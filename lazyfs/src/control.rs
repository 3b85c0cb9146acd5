//! The control socket: a Unix socket beside the mount through which a test
//! cuts the power. One command per connection, one line each way:
//!
//! - `cut` or `cut lose`: every pending change is lost;
//! - `cut tear SEED`: a power cut during one file's last pending write
//!   (the file picked by SEED): what that file had pending before it
//!   reaches the disk, the write itself only up to a sector boundary (also
//!   picked by SEED; never all of it); everything else is lost;
//! - `sync`: every pending change is written (as sync(1));
//! - `stats`: counters, and what is pending now.
//!
//! Answers start with `ok` or `error`. A cut holds the filesystem's lock,
//! so it falls between two requests, never inside one; the filesystem
//! keeps serving after it.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::fs::{lock, CutMode, State};

/// Answers one command line.
pub fn answer(state: &Mutex<State>, line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    let mut state = lock(state);
    match words.as_slice() {
        ["cut"] | ["cut", "lose"] => report(state.cut(CutMode::Lose)),
        ["cut", "tear", seed] => match seed.parse() {
            Ok(seed) => report(state.cut(CutMode::Tear { seed })),
            Err(_) => format!("error bad seed {seed:?}"),
        },
        ["sync"] => match state.sync_all() {
            Ok(files) => format!("ok synced_files={files}"),
            Err(err) => format!("error {err}"),
        },
        ["stats"] => {
            let (s, files, bytes) = state.stats();
            format!(
                "ok writes={} write_bytes={} fsyncs={} fsyncs_with_data={} cuts={} lost_files={} lost_bytes={} pending_files={files} pending_bytes={bytes}",
                s.writes, s.write_bytes, s.fsyncs, s.fsyncs_with_data, s.cuts, s.lost_files, s.lost_bytes
            )
        }
        _ => format!("error unknown command {line:?} (cut [lose|tear SEED], sync, stats)"),
    }
}

fn report(result: std::io::Result<crate::fs::CutReport>) -> String {
    match result {
        Ok(cut) => {
            let torn = match &cut.torn {
                Some((path, t)) => format!(
                    " torn={}@{}:kept={}/{}",
                    path.display(),
                    t.offset,
                    t.kept,
                    t.len
                ),
                None => String::new(),
            };
            format!("ok lost_files={} lost_bytes={}{torn}", cut.files, cut.bytes)
        }
        Err(err) => format!("error {err}"),
    }
}

/// Serves the control socket at `path` on a thread of its own.
///
/// # Errors
/// The socket cannot be bound.
pub fn serve(path: &Path, state: Arc<Mutex<State>>) -> std::io::Result<()> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path)?;
    std::thread::Builder::new()
        .name("lazyfs-control".into())
        .spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let _ = handle(stream, &state);
            }
        })?;
    Ok(())
}

fn handle(stream: UnixStream, state: &Mutex<State>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let mut out = answer(state, line.trim());
    out.push('\n');
    (&stream).write_all(out.as_bytes())
}

/// Sends `command` to the control socket at `path` and returns the answer
/// line (an `error ...` answer is an `Err`).
///
/// # Errors
/// The socket does not answer, or answers `error`.
pub fn request(path: &Path, command: &str) -> std::io::Result<String> {
    let stream = UnixStream::connect(path)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    (&stream).write_all(format!("{command}\n").as_bytes())?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let line = line.trim().to_owned();
    if line.starts_with("ok") {
        Ok(line)
    } else {
        Err(std::io::Error::other(format!("lazyfs {command}: {line}")))
    }
}
