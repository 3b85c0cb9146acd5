//! `palisade-lazyfs` (lazyfs/) for the tests: a FUSE mount that keeps
//! what was written but not fsynced in memory, as a page cache does, and
//! loses it (or tears the last write) on a simulated power cut, driven over
//! its control socket. Used by `power_cut.rs` and the fault suite.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Whether this machine can mount lazyfs (root, /dev/fuse).
pub fn can_mount(what: &str) -> bool {
    let able = rustix::process::geteuid().is_root() && Path::new("/dev/fuse").exists();
    if !able {
        assert!(
            std::env::var_os("PALISADE_FAULT_STRICT").is_none(),
            "PALISADE_FAULT_STRICT: {what} needs root and /dev/fuse"
        );
        eprintln!("skipped: {what} needs root and /dev/fuse");
    }
    able
}

/// `palisade-lazyfs`, beside the binary under test; built if missing
/// (`cargo test --workspace` builds it; `--test power_cut` alone does not).
pub fn lazyfs_binary() -> PathBuf {
    let palisade = Path::new(env!("CARGO_BIN_EXE_palisade"));
    let binary = palisade.with_file_name("palisade-lazyfs");
    if !binary.exists() {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .args(["build", "-p", "palisade-lazyfs", "--bin", "palisade-lazyfs"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if palisade.parent().and_then(Path::file_name) == Some("release".as_ref()) {
            build.arg("--release");
        }
        let status = build.status().expect("cargo build palisade-lazyfs");
        assert!(status.success(), "cargo build -p palisade-lazyfs failed");
    }
    binary
}

/// One `palisade-lazyfs` process: a mount over a backing dir, and its
/// control socket. Stopped (SIGTERM: clean unmount) when dropped.
pub struct LazyMount {
    pub name: String,
    /// Where the filesystem is mounted.
    pub mount: PathBuf,
    socket: PathBuf,
    child: Child,
}

impl LazyMount {
    /// Mounts `dir/mnt/<name>` over `dir/backing/<name>`.
    pub fn start(binary: &Path, dir: &Path, name: &str) -> Self {
        let mount = dir.join("mnt").join(name);
        let socket = dir.join("ctl").join(format!("{name}.sock"));
        std::fs::create_dir_all(socket.parent().expect("parent")).expect("ctl dir");
        let mut child = Command::new(binary)
            .arg("--control")
            .arg(&socket)
            .arg(&mount)
            .arg(dir.join("backing").join(name))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn palisade-lazyfs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("lazyfs output");
        assert!(
            line.starts_with("lazyfs mounted"),
            "lazyfs {name}: {line:?}"
        );
        Self {
            name: name.to_owned(),
            mount,
            socket,
            child,
        }
    }

    /// Sends one control command; the answer line.
    pub fn control(&self, command: &str) -> String {
        let mut stream = UnixStream::connect(&self.socket).expect("lazyfs control");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        writeln!(stream, "{command}").expect("send");
        let mut line = String::new();
        BufReader::new(&stream)
            .read_line(&mut line)
            .expect("answer");
        let line = line.trim().to_owned();
        assert!(
            line.starts_with("ok"),
            "lazyfs {} {command}: {line}",
            self.name
        );
        line
    }
}

impl Drop for LazyMount {
    fn drop(&mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = Command::new("umount").arg("-l").arg(&self.mount).status();
    }
}
