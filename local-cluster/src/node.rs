use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

use crate::error::Error;
use crate::spec::{Logs, NodeSpec};

/// One running `palisade` server: a child process, killed (SIGKILL) when
/// dropped.
#[derive(Debug)]
pub struct Node {
    /// How it was started.
    spec: NodeSpec,
    child: Child,
    /// The URL of every `listening on` line, from a thread that drains the
    /// node's stdout (so the node never blocks writing to it); disconnected
    /// once the node closes stdout.
    listening: Receiver<String>,
    /// The URL it printed, once read.
    url: Option<String>,
    /// Set once the child is killed and reaped: its pid may belong to
    /// another process by then, so it is never signalled again.
    reaped: bool,
}

impl Node {
    /// Starts `binary` as `spec` says. Returns at once; see
    /// [`Node::wait_listening`].
    ///
    /// # Errors
    /// [`Error::Spawn`] if the log file or the process cannot be created.
    pub fn start(binary: &Path, spec: NodeSpec) -> Result<Self, Error> {
        let spawn_error = |source| Error::Spawn {
            name: spec.name(),
            source,
        };
        let stderr = match &spec.logs {
            Logs::Discard => Stdio::null(),
            Logs::Inherit => Stdio::inherit(),
            Logs::File(path) => std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(spawn_error)?
                .into(),
        };
        let mut child = Command::new(binary)
            .args(spec.command_line())
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(spawn_error)?;
        let (sender, listening) = std::sync::mpsc::channel();
        if let Some(stdout) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if let Some(url) = listening_url(&line) {
                        let _ = sender.send(url.to_owned());
                    }
                }
            });
        }
        Ok(Self {
            spec,
            child,
            listening,
            url: None,
            reaped: false,
        })
    }

    /// Waits up to `timeout` for the node's `listening on <url>` line, and
    /// returns the URL (at once if it was already read).
    ///
    /// # Errors
    /// [`Error::NotListening`] on timeout, [`Error::ExitedEarly`] if the node
    /// closed its stdout first.
    pub fn wait_listening(&mut self, timeout: Duration) -> Result<String, Error> {
        if let Some(url) = &self.url {
            return Ok(url.clone());
        }
        match self.listening.recv_timeout(timeout) {
            Ok(url) => {
                self.url = Some(url.clone());
                Ok(url)
            }
            Err(RecvTimeoutError::Timeout) => Err(Error::NotListening {
                name: self.spec.name(),
                timeout,
            }),
            Err(RecvTimeoutError::Disconnected) => Err(Error::ExitedEarly {
                name: self.spec.name(),
            }),
        }
    }

    /// How it was started.
    pub fn spec(&self) -> &NodeSpec {
        &self.spec
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// SIGSTOP: the node freezes, as a long GC pause or a stopped VM would.
    ///
    /// # Errors
    /// [`Error::NotRunning`] after [`Node::kill`]; [`Error::Signal`] if
    /// the signal cannot be sent.
    pub fn pause(&self) -> Result<(), Error> {
        self.signal(Signal::STOP)
    }

    /// SIGCONT after [`Node::pause`].
    ///
    /// # Errors
    /// As [`Node::pause`].
    pub fn resume(&self) -> Result<(), Error> {
        self.signal(Signal::CONT)
    }

    /// SIGKILL (kill -9), and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }

    fn signal(&self, signal: Signal) -> Result<(), Error> {
        if self.reaped {
            return Err(Error::NotRunning {
                name: self.spec.name(),
            });
        }
        kill_process(Pid::from_child(&self.child), signal).map_err(|e| Error::Signal {
            name: self.spec.name(),
            source: e.into(),
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Stops `nodes` the way Ctrl-C would: SIGTERM to all at once, then each
/// gets until `grace` from now to exit before it is killed.
pub fn stop_gracefully<'a>(nodes: impl IntoIterator<Item = &'a mut Node>, grace: Duration) {
    let nodes: Vec<&mut Node> = nodes.into_iter().collect();
    for node in &nodes {
        let _ = node.signal(Signal::TERM);
    }
    let deadline = Instant::now() + grace;
    for node in nodes {
        while Instant::now() < deadline {
            if node.exited().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        node.kill();
    }
}

/// The URL in a `... listening on <url> ...` line.
fn listening_url(line: &str) -> Option<&str> {
    line.split("listening on ")
        .nth(1)?
        .split_whitespace()
        .next()
}

#[cfg(test)]
mod tests {
    use crate::node::listening_url;

    #[test]
    fn the_url_is_the_word_after_listening_on() {
        assert_eq!(
            listening_url("palisade gateway listening on http://127.0.0.1:8080"),
            Some("http://127.0.0.1:8080")
        );
        assert_eq!(
            listening_url("node 1 listening on http://127.0.0.1:1 (peers on 127.0.0.1:2)"),
            Some("http://127.0.0.1:1")
        );
        assert_eq!(listening_url("starting"), None);
    }
}
