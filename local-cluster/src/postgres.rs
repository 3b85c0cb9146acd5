//! [`PostgresServer`]: a throwaway PostgreSQL from Debian's binaries, for
//! `palisade dev --postgres`, the tests and the benches. Run as the
//! `postgres` user when this process is root (PostgreSQL refuses to run as
//! root), on a loopback port, with trust authentication: for local use
//! only. A synchronous standby can be made from it ([`PostgresServer::standby`]).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// Where Debian's PostgreSQL 15 puts its binaries.
pub const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

/// What to tell someone without the binaries.
pub const PG_INSTALL_HINT: &str = "install PostgreSQL 15: apt-get install -y postgresql \
     (binaries expected in /usr/lib/postgresql/15/bin)";

/// Whether PostgreSQL's binaries are where [`PostgresServer`] looks.
pub fn postgres_installed() -> bool {
    Path::new(PG_BIN).join("initdb").exists() && Path::new(PG_BIN).join("pg_ctl").exists()
}

/// Why a PostgreSQL command failed, with its stderr.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {detail}")]
pub struct PostgresError {
    what: String,
    detail: String,
}

fn failed(what: impl Into<String>, detail: impl std::fmt::Display) -> PostgresError {
    PostgresError {
        what: what.into(),
        detail: detail.to_string(),
    }
}

/// A PostgreSQL data directory and, once started, its server.
#[derive(Debug)]
pub struct PostgresServer {
    /// Holds `data/` and `server.log`; owned by `postgres` when root.
    dir: PathBuf,
    /// The loopback port it listens on.
    port: u16,
    /// Settings passed as `-c name=value` at every start.
    settings: Vec<String>,
    /// Stop the server (immediate) when dropped.
    stop_on_drop: bool,
}

impl PostgresServer {
    /// `initdb` in `dir/data` (dir is created; made traversable and, when
    /// root, given to `postgres`), with `settings` (`name=value`) for
    /// every start. Not started yet.
    ///
    /// # Errors
    /// When the binaries are missing or initdb fails.
    pub fn init(dir: &Path, settings: &[&str]) -> Result<Self, PostgresError> {
        let server = Self::at(dir, settings)?;
        server.pg(
            "initdb",
            &["-D", &server.data(), "-A", "trust", "-U", "postgres"],
            &["-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"],
        )?;
        Ok(server)
    }

    /// The data directory in `dir/data` if it holds one (a reused dev data
    /// dir), else [`PostgresServer::init`].
    ///
    /// # Errors
    /// As [`PostgresServer::init`].
    pub fn open_or_init(dir: &Path, settings: &[&str]) -> Result<Self, PostgresError> {
        if dir.join("data/PG_VERSION").exists() {
            return Self::at(dir, settings);
        }
        Self::init(dir, settings)
    }

    fn at(dir: &Path, settings: &[&str]) -> Result<Self, PostgresError> {
        if !postgres_installed() {
            return Err(failed("PostgreSQL is not installed", PG_INSTALL_HINT));
        }
        std::fs::create_dir_all(dir).map_err(|e| failed(format!("mkdir {}", dir.display()), e))?;
        let dir = dir
            .canonicalize()
            .map_err(|e| failed(format!("{}", dir.display()), e))?;
        run(Command::new("chmod").arg("755").arg(&dir))?;
        if is_root() {
            run(Command::new("chown").arg("postgres:postgres").arg(&dir))?;
            let reach = Command::new("runuser")
                .args(["-u", "postgres", "--", "test", "-w"])
                .arg(&dir)
                .status();
            if !reach.is_ok_and(|s| s.success()) {
                return Err(failed(
                    format!("the postgres user cannot reach {}", dir.display()),
                    "a directory above it is not traversable (chmod o+x), or use a dir under /tmp",
                ));
            }
        }
        Ok(Self {
            dir,
            port: 0,
            settings: settings.iter().map(|s| (*s).to_owned()).collect(),
            stop_on_drop: true,
        })
    }

    /// Starts the server on `port` (0: a free one, three tries), waiting
    /// until it accepts connections.
    ///
    /// # Errors
    /// When it does not start (its log is `server.log` in the dir).
    pub fn start(&mut self, port: u16) -> Result<(), PostgresError> {
        let mut last = None;
        for _ in 0..3 {
            self.port = match port {
                0 => crate::free_ports(1).map_err(|e| failed("free port", e))?[0],
                p => p,
            };
            let mut opts = format!(
                "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories=''",
                self.port
            );
            for setting in &self.settings {
                opts.push_str(&format!(" -c {setting}"));
            }
            let log = self.dir.join("server.log").display().to_string();
            let data = self.data();
            match self.pg(
                "pg_ctl",
                &["-D", &data, "-l", &log, "-w", "-t", "60"],
                &["-o", &opts, "start"],
            ) {
                Ok(_) => return Ok(()),
                Err(err) if port == 0 => last = Some(err),
                Err(err) => return Err(err),
            }
        }
        Err(last.unwrap_or_else(|| failed("pg_ctl start", "no attempt")))
    }

    /// A synchronous standby of `primary` in `dir` (pg_basebackup -R),
    /// started on a free port as `application_name`; the primary is told
    /// to wait for it (`synchronous_standby_names`) and reloaded.
    ///
    /// # Errors
    /// When the base backup, the start or the primary's reload fails.
    pub fn standby(primary: &Self, dir: &Path, name: &str) -> Result<Self, PostgresError> {
        let mut standby = Self::at(dir, &[])?;
        standby.settings = primary.settings.clone();
        // -R writes this connection string as the standby's primary_conninfo.
        let conninfo = format!(
            "host=127.0.0.1 port={} user=postgres application_name={name}",
            primary.port
        );
        standby.pg(
            "pg_basebackup",
            &["-D", &standby.data(), "-d", &conninfo],
            &["-R", "-X", "stream", "--no-sync"],
        )?;
        standby.start(0)?;
        primary.sql(&format!(
            "ALTER SYSTEM SET synchronous_standby_names = '{name}'"
        ))?;
        primary.sql("SELECT pg_reload_conf()")?;
        Ok(standby)
    }

    /// Promotes a standby to primary (`pg_ctl promote -w`).
    ///
    /// # Errors
    /// When pg_ctl fails.
    pub fn promote(&self) -> Result<(), PostgresError> {
        let data = self.data();
        self.pg("pg_ctl", &["-D", &data, "-w", "-t", "60"], &["promote"])
            .map(drop)
    }

    /// Stops the server: `immediate` (a crash, as far as the data is
    /// concerned) or `fast`.
    pub fn stop(&self, mode: &str) {
        let data = self.data();
        let _ = self.pg(
            "pg_ctl",
            &["-D", &data, "-m", mode, "-w", "-t", "30"],
            &["stop"],
        );
    }

    /// kill -9 of the postmaster (its children die with it when they
    /// notice), like a machine's crash without the page cache lost.
    pub fn kill9(&self) {
        let pid = std::fs::read_to_string(self.dir.join("data/postmaster.pid")).unwrap_or_default();
        if let Some(pid) = pid.lines().next().filter(|p| !p.is_empty()) {
            let _ = Command::new("kill").args(["-9", pid]).status();
            // The backends too, at once: a killed machine's would be gone.
            let _ = Command::new("pkill").args(["-9", "-P", pid]).status();
        }
    }

    /// Runs one SQL command with `psql` as `postgres`; its output.
    ///
    /// # Errors
    /// When psql fails.
    pub fn sql(&self, sql: &str) -> Result<String, PostgresError> {
        let port = self.port.to_string();
        let out = self.pg(
            "psql",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-d",
                "postgres",
            ],
            &["-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql],
        )?;
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// The port it listens on (0 before the first start).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory holding `data/` and `server.log`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops the server (immediate) once this process has exited, however
    /// it exits: for a server kept in a `static` by a test binary.
    pub fn stop_when_this_process_exits(&self) {
        let pg_ctl = Path::new(PG_BIN).join("pg_ctl");
        let as_postgres = if is_root() {
            "runuser -u postgres -- "
        } else {
            ""
        };
        let script = format!(
            "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
             {as_postgres}{pg_ctl} -D '{data}' -m immediate stop >/dev/null 2>&1; rm -rf '{dir}'",
            pid = std::process::id(),
            pg_ctl = pg_ctl.display(),
            data = self.data(),
            dir = self.dir.display(),
        );
        let _ = Command::new("sh")
            .args(["-c", &script])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn();
    }

    /// Leaves the server running when this value is dropped (dev stops it
    /// itself, fast).
    pub fn keep_running(&mut self) {
        self.stop_on_drop = false;
    }

    fn data(&self) -> String {
        self.dir.join("data").display().to_string()
    }

    /// Runs one of PostgreSQL's binaries, as `postgres` when root.
    fn pg(&self, program: &str, args: &[&str], more: &[&str]) -> Result<Output, PostgresError> {
        let binary = Path::new(PG_BIN).join(program);
        let mut command = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&binary);
            c
        } else {
            Command::new(&binary)
        };
        command.args(args).args(more).current_dir(&self.dir);
        let out = command
            .output()
            .map_err(|e| failed(format!("cannot run {program}"), e))?;
        if !out.status.success() {
            return Err(failed(
                format!("{program} failed"),
                String::from_utf8_lossy(&out.stderr).trim(),
            ));
        }
        Ok(out)
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        if self.stop_on_drop && self.port != 0 {
            self.stop("immediate");
        }
    }
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

fn run(command: &mut Command) -> Result<(), PostgresError> {
    let status = command
        .status()
        .map_err(|e| failed(format!("{command:?}"), e))?;
    if status.success() {
        Ok(())
    } else {
        Err(failed(format!("{command:?}"), status))
    }
}

/// The throwaway server one test binary shares: started on first use in
/// `/tmp/<prefix><pid>` with `fsync=off` (tests, not durability) and room
/// for 300 connections, stopped when the process exits. `None`, saying so,
/// without PostgreSQL's binaries — unless `PALISADE_PG_STRICT` is set:
/// then it panics.
pub fn shared_test_server(prefix: &str) -> Option<&'static PostgresServer> {
    static SERVER: std::sync::OnceLock<Option<PostgresServer>> = std::sync::OnceLock::new();
    SERVER
        .get_or_init(|| {
            if !postgres_installed() {
                assert!(
                    std::env::var_os("PALISADE_PG_STRICT").is_none(),
                    "PALISADE_PG_STRICT is set but PostgreSQL is missing: {PG_INSTALL_HINT}"
                );
                eprintln!("SKIPPED: {PG_INSTALL_HINT}; set PALISADE_PG_STRICT to fail instead");
                return None;
            }
            let dir = Path::new("/tmp").join(format!("{prefix}{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("the test server's dir");
            let mut server =
                PostgresServer::init(&dir, &["fsync=off", "max_connections=300"]).expect("initdb");
            server.start(0).expect("start PostgreSQL");
            server.stop_when_this_process_exits();
            Some(server)
        })
        .as_ref()
}
