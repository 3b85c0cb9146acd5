//! The real binary mounted (root and /dev/fuse needed; skipped without
//! them unless PALISADE_FAULT_STRICT=1): what a cut loses and keeps through
//! the kernel, the file operations sled and Palisade use, and sled itself.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use palisade_plumbing::sled_files::SledFiles;

/// One running `palisade-lazyfs` over a temp dir; stopped (SIGTERM, clean
/// unmount) when dropped.
struct Mount {
    child: Child,
    dir: tempfile::TempDir,
}

impl Mount {
    /// Mounts, or `None` (with a note) where this machine cannot.
    fn start() -> Option<Self> {
        let root = nix::unistd::geteuid().is_root();
        if !root || !Path::new("/dev/fuse").exists() {
            assert!(
                std::env::var_os("PALISADE_FAULT_STRICT").is_none(),
                "PALISADE_FAULT_STRICT: lazyfs needs root and /dev/fuse"
            );
            eprintln!("skipped: lazyfs needs root and /dev/fuse");
            return None;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_palisade-lazyfs"))
            .arg("--control")
            .arg(dir.path().join("ctl.sock"))
            .arg(dir.path().join("mnt"))
            .arg(dir.path().join("backing"))
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn palisade-lazyfs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read");
        assert!(line.starts_with("lazyfs mounted"), "{line}");
        Some(Self { child, dir })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join("mnt").join(rel)
    }

    fn backing(&self, rel: &str) -> PathBuf {
        self.dir.path().join("backing").join(rel)
    }

    fn control(&self, command: &str) -> String {
        palisade_lazyfs::control::request(&self.dir.path().join("ctl.sock"), command)
            .expect("control")
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let pid = Pid::from_raw(self.child.id() as i32);
        let _ = kill(pid, Signal::SIGTERM);
        for _ in 0..100 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = nix::mount::umount2(
            &self.dir.path().join("mnt"),
            nix::mount::MntFlags::MNT_DETACH,
        );
    }
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

#[test]
fn a_cut_loses_what_was_not_synced_and_keeps_what_was() {
    let Some(m) = Mount::start() else { return };
    // Synced, then more appended without a sync.
    let mut a = OpenOptions::new()
        .create(true)
        .append(true)
        .open(m.path("a"))
        .expect("a");
    a.write_all(b"durable ").expect("write");
    a.sync_all().expect("fsync");
    a.write_all(b"volatile").expect("write");
    drop(a); // close does not persist
             // Created and written, never synced.
    std::fs::write(m.path("b"), b"never synced").expect("b");
    // fdatasync counts too.
    let c = File::create(m.path("c")).expect("c");
    c.write_all_at(b"data-synced", 0).expect("write");
    c.sync_data().expect("fdatasync");
    drop(c);
    // The safe way to replace a file: write, fsync, rename.
    std::fs::write(m.path("d"), b"old").expect("d");
    let mut tmp = File::create(m.path("d.tmp")).expect("tmp");
    tmp.write_all(b"new").expect("write");
    tmp.sync_all().expect("fsync");
    drop(tmp);
    std::fs::rename(m.path("d.tmp"), m.path("d")).expect("rename");

    // Everything is visible before the cut, and nothing unsynced is on disk.
    assert_eq!(read(&m.path("a")), b"durable volatile");
    assert_eq!(read(&m.path("b")), b"never synced");
    assert_eq!(read(&m.backing("a")), b"durable ");
    assert_eq!(read(&m.backing("b")), b"");

    let answer = m.control("cut");
    let lost: u64 = answer
        .split("lost_files=")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    // a and b, and the replaced d's unsynced "old" if the kernel still
    // holds that inode.
    assert!((2..=3).contains(&lost), "{answer}");
    assert_eq!(read(&m.path("a")), b"durable ");
    assert_eq!(std::fs::metadata(m.path("a")).expect("stat").len(), 8);
    assert_eq!(
        read(&m.path("b")),
        b"",
        "a file never synced comes back empty"
    );
    assert_eq!(read(&m.path("c")), b"data-synced");
    assert_eq!(read(&m.path("d")), b"new");
    assert!(!m.path("d.tmp").exists());
    // The mount keeps serving.
    std::fs::write(m.path("e"), b"after").expect("e");
    assert_eq!(read(&m.path("e")), b"after");
}

#[test]
fn a_torn_write_leaves_whole_sectors_of_it() {
    let Some(m) = Mount::start() else { return };
    let last: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
    for seed in 0..8u64 {
        let name = format!("t{seed}");
        let mut f = File::create(m.path(&name)).expect("create");
        f.write_all(b"head").expect("write");
        f.sync_all().expect("fsync");
        f.write_all(&last).expect("write");
        drop(f);
        let answer = m.control(&format!("cut tear {seed}"));
        let kept: usize = answer
            .split("kept=")
            .nth(1)
            .and_then(|s| s.split('/').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("no torn write in {answer}"));
        assert!(kept < last.len());
        assert!(
            kept == 0 || (4 + kept) % 512 == 0,
            "torn at a sector boundary: {answer}"
        );
        let seen = read(&m.path(&name));
        assert_eq!(&seen[..4], b"head");
        assert_eq!(
            &seen[4..],
            &last[..kept],
            "seed {seed}: a prefix of the last write"
        );
    }
}

#[test]
fn the_file_operations_sled_and_palisade_use() {
    let Some(m) = Mount::start() else { return };
    // mkdir with a mode, chmod, nested paths.
    std::fs::create_dir_all(m.path("data/sub")).expect("mkdir");
    std::fs::set_permissions(m.path("data"), std::fs::Permissions::from_mode(0o700))
        .expect("chmod");
    let mode = std::fs::metadata(m.path("data"))
        .expect("stat")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(m.path("data/f"))
        .expect("create 0600");
    assert_eq!(
        file.metadata().expect("stat").permissions().mode() & 0o777,
        0o600
    );
    drop(file);

    // pwrite past the end leaves zeros; pread sees pending data.
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("data/f"))
        .expect("open");
    f.write_all_at(b"xyz", 10_000).expect("pwrite");
    let mut buf = [1u8; 5];
    f.read_exact_at(&mut buf, 9_998).expect("pread");
    assert_eq!(&buf, b"\0\0xyz");
    // ftruncate down and up.
    f.set_len(10_001).expect("truncate");
    f.set_len(10_003).expect("extend");
    let mut tail = [9u8; 3];
    f.read_exact_at(&mut tail, 10_000).expect("pread");
    assert_eq!(&tail, b"x\0\0");
    drop(f);

    // O_APPEND and O_TRUNC.
    std::fs::write(m.path("data/log"), b"one\n").expect("write");
    let mut log = OpenOptions::new()
        .append(true)
        .open(m.path("data/log"))
        .expect("append");
    log.write_all(b"two\n").expect("append");
    drop(log);
    assert_eq!(read(&m.path("data/log")), b"one\ntwo\n");
    let mut trunc = OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(m.path("data/log"))
        .expect("O_TRUNC");
    trunc.write_all(b"3").expect("write");
    drop(trunc);
    assert_eq!(read(&m.path("data/log")), b"3");

    // readdir sees every name.
    let mut names: Vec<String> = std::fs::read_dir(m.path("data"))
        .expect("readdir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["f", "log", "sub"]);

    // A directory renamed with a file inside that has unsynced data: the
    // data follows the inode; the file is reachable under its new path.
    std::fs::write(m.path("data/sub/inner"), b"pending").expect("write");
    std::fs::rename(m.path("data/sub"), m.path("data/moved")).expect("rename dir");
    assert_eq!(read(&m.path("data/moved/inner")), b"pending");

    // Unlinked while open: still readable through the handle.
    std::fs::write(m.path("data/gone"), b"still here").expect("write");
    let mut open = File::open(m.path("data/gone")).expect("open");
    std::fs::remove_file(m.path("data/gone")).expect("unlink");
    let mut text = String::new();
    open.read_to_string(&mut text).expect("read");
    assert_eq!(text, "still here");
    drop(open);
    std::fs::remove_file(m.path("data/moved/inner")).expect("unlink");
    std::fs::remove_dir(m.path("data/moved")).expect("rmdir");

    // flock is the kernel's (sled takes one on its file).
    let first = nix::fcntl::Flock::lock(
        File::open(m.path("data/f")).expect("open"),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    )
    .expect("flock");
    let second = nix::fcntl::Flock::lock(
        File::open(m.path("data/f")).expect("open"),
        nix::fcntl::FlockArg::LockExclusiveNonblock,
    );
    assert!(second.is_err(), "a second exclusive flock is refused");
    drop(first);

    // statfs answers (sled asks for free space? no, but tools do).
    let stat = nix::sys::statvfs::statvfs(&m.path("")).expect("statfs");
    assert!(stat.blocks() > 0);
}

/// The child half of the sled tests: writes keys into the sled database at
/// `LAZYFS_SLED_CHILD` (`LAZYFS_SLED_VALUE` bytes each, default 100),
/// flushes, makes it durable as `LAZYFS_SLED_SYNC` says (`db`: an fsync of
/// the database file; `files`: Palisade's [`SledFiles::sync`], blobs
/// first; unset: nothing more), and exits at once, as a process killed
/// right after an acknowledgement would: sled's drop (which fsyncs) never
/// runs.
#[test]
fn sled_child() {
    let Some(dir) = std::env::var_os("LAZYFS_SLED_CHILD") else {
        return;
    };
    let dir = PathBuf::from(dir);
    let size: usize = std::env::var("LAZYFS_SLED_VALUE")
        .map(|v| v.parse().expect("LAZYFS_SLED_VALUE"))
        .unwrap_or(100);
    let db = sled::Config::new()
        .path(&dir)
        .flush_every_ms(None)
        .open()
        .expect("open sled");
    let files = SledFiles::open(&dir).expect("sled files");
    for i in 0..child_keys(size) {
        db.insert(format!("new{i}"), child_value(i, size))
            .expect("insert");
    }
    db.flush().expect("flush");
    match std::env::var("LAZYFS_SLED_SYNC").as_deref() {
        Ok("db") => File::open(dir.join("db"))
            .expect("open db file")
            .sync_all()
            .expect("fsync"),
        Ok("files") => files.sync().expect("sync sled files"),
        _ => {}
    }
    println!("acknowledged");
    std::process::exit(0);
}

/// How many keys [`sled_child`] writes: 200, or 20 large ones.
fn child_keys(size: usize) -> u32 {
    if size > 4096 {
        20
    } else {
        200
    }
}

/// What [`sled_child`] writes under `new{i}`.
fn child_value(i: u32, size: usize) -> Vec<u8> {
    (0..size).map(|n| (n as u32 ^ i) as u8).collect()
}

/// Runs [`sled_child`] over `dir`; returns once it acknowledged and died.
fn run_sled_child(dir: &Path, sync: &str, size: usize) {
    let mut command = Command::new(std::env::current_exe().expect("exe"));
    command
        .args(["sled_child", "--exact", "--nocapture", "--test-threads=1"])
        .env("LAZYFS_SLED_CHILD", dir)
        .env("LAZYFS_SLED_SYNC", sync)
        .env("LAZYFS_SLED_VALUE", size.to_string());
    let output = command.output().expect("child");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("acknowledged"), "child: {stdout}");
}

/// sled runs through the mount, and its durability is what lazyfs shows:
/// `Db::flush` writes and calls sync_file_range, which never reaches a
/// filesystem as an fsync (and is no durability guarantee on a real disk
/// either: no device cache flush, no metadata); only sled's periodic
/// flusher thread (flush_every_ms) fsyncs. An explicit fsync of the
/// database file after the flush makes the acknowledged keys survive.
#[test]
fn sled_through_the_mount_and_what_a_cut_does_to_its_flush() {
    let Some(m) = Mount::start() else { return };
    for fsync in [false, true] {
        let dir = m.path(if fsync { "sled-fsync" } else { "sled-flush" });
        {
            let db = sled::Config::new()
                .path(&dir)
                .flush_every_ms(None)
                .open()
                .expect("open");
            for i in 0..100u32 {
                db.insert(format!("base{i}"), vec![1u8; 100])
                    .expect("insert");
            }
            db.flush().expect("flush");
        }
        m.control("sync"); // a clean base on disk
        run_sled_child(&dir, if fsync { "db" } else { "none" }, 100);
        let answer = m.control("cut");
        eprintln!("fsync after flush: {fsync}; cut: {answer}");
        let db = sled::Config::new()
            .path(&dir)
            .open()
            .expect("reopen after cut");
        for i in 0..100u32 {
            assert!(db.contains_key(format!("base{i}")).expect("get"), "base{i}");
        }
        let kept = (0..200u32)
            .filter(|i| db.contains_key(format!("new{i}")).expect("get"))
            .count();
        if fsync {
            assert_eq!(
                kept, 200,
                "flush + fsync of the db file: every key survives"
            );
        } else {
            assert!(
                kept < 200,
                "sled's flush alone reached the disk ({kept} of 200 kept): lazyfs saw an fsync"
            );
        }
        drop(db);
    }
}

/// Values too large for a log segment (over ~128 KiB) live in sled's
/// `blobs/` files, which an fsync of the database file does not cover: a
/// cut after such a flush left a log pointing at torn blobs, and a node
/// that would not start (the fault suite's power cut found it). With
/// [`SledFiles::sync`] every acknowledged large value survives, whole.
/// (With `"db"` in place of `"files"` this fails: sled panics opening the
/// database, or the values are gone.)
#[test]
fn large_values_survive_a_cut_when_sleds_blobs_are_synced() {
    let Some(m) = Mount::start() else { return };
    let dir = m.path("sled-blobs");
    drop(sled::Config::new().path(&dir).open().expect("create"));
    m.control("sync");
    let size = 200 * 1024;
    run_sled_child(&dir, "files", size);
    let blobs = std::fs::read_dir(dir.join("blobs")).expect("blobs").count();
    assert!(
        blobs > 0,
        "the values did not go to blobs: the test tests nothing"
    );
    let answer = m.control("cut");
    eprintln!("{blobs} blobs; cut: {answer}");
    let db = sled::Config::new()
        .path(&dir)
        .open()
        .expect("reopen after cut");
    for i in 0..child_keys(size) {
        let value = db.get(format!("new{i}")).expect("get");
        assert_eq!(
            value.as_deref(),
            Some(&child_value(i, size)[..]),
            "new{i} after the cut"
        );
    }
}

/// The child half of [`the_gateway_store_keeps_large_acknowledged_objects_through_cuts`]:
/// a `SledStore` at `LAZYFS_STORE_CHILD`; four writers put objects of
/// 100-300 KiB (sled blobs, and leaves of them) to keys of their own, each
/// acknowledged put printed as `acked KEY TOKEN`; after ~1 s it exits at
/// once, writers mid-put, as a killed gateway would.
#[test]
fn store_child() {
    let Some(dir) = std::env::var_os("LAZYFS_STORE_CHILD") else {
        return;
    };
    let round: u64 = std::env::var("LAZYFS_STORE_ROUND")
        .map(|v| v.parse().expect("round"))
        .unwrap_or(0);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        use palisade_store::{FencedStore, FencingToken, ObjectKey, SledStore, SledStoreConfig};
        let store = std::sync::Arc::new(
            SledStore::open(&SledStoreConfig::new(PathBuf::from(dir))).expect("open store"),
        );
        for writer in 0..4u64 {
            let store = store.clone();
            tokio::spawn(async move {
                for n in 0.. {
                    let key = format!("w{writer}/r{round}-{n}");
                    let size = 100 * 1024 + ((n * 37 + writer * 11) % 200) as usize * 1024;
                    let token = FencingToken(round * 1_000_000 + n + 1);
                    let key = ObjectKey::new(&key).expect("key");
                    store
                        .put(&key, child_value(n as u32, size), token)
                        .await
                        .expect("put");
                    println!("acked {} {size} {n}", key.as_str());
                }
            });
        }
        tokio::time::sleep(Duration::from_millis(1000)).await;
        std::process::exit(0);
    });
}

/// The gateway's store through power cuts with large values: every object
/// a put acknowledged is there after the cut, whole, and the store opens.
/// sled puts such values in blob files; the group commit syncs them before
/// the log and lets no insert in between ([`SledFiles`], the store's
/// barrier). Six rounds of writes, kill and cut (lose or tear).
#[test]
fn the_gateway_store_keeps_large_acknowledged_objects_through_cuts() {
    let Some(m) = Mount::start() else { return };
    let dir = m.path("store");
    let mut acked: Vec<(String, usize, u32)> = Vec::new();
    for round in 0..6u64 {
        let output = Command::new(std::env::current_exe().expect("exe"))
            .args(["store_child", "--exact", "--nocapture", "--test-threads=1"])
            .env("LAZYFS_STORE_CHILD", &dir)
            .env("LAZYFS_STORE_ROUND", round.to_string())
            .output()
            .expect("child");
        let stdout = String::from_utf8_lossy(&output.stdout);
        for line in stdout.lines().filter_map(|l| l.strip_prefix("acked ")) {
            let mut parts = line.split(' ');
            let (key, size, n) = (parts.next(), parts.next(), parts.next());
            if let (Some(key), Some(size), Some(n)) = (key, size, n) {
                acked.push((
                    key.to_owned(),
                    size.parse().expect("size"),
                    n.parse().expect("n"),
                ));
            }
        }
        let cut = match round % 2 {
            0 => "cut".to_owned(),
            _ => format!("cut tear {round}"),
        };
        let answer = m.control(&cut);
        eprintln!(
            "round {round}: {} acked so far; {cut}: {answer}",
            acked.len()
        );
    }
    assert!(
        acked.len() > 20,
        "the writers hardly wrote: {}",
        acked.len()
    );
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        use palisade_store::{FencedStore, ObjectKey, SledStore, SledStoreConfig};
        let store = SledStore::open(&SledStoreConfig::new(dir.clone())).expect("reopen after cuts");
        for (key, size, n) in &acked {
            let object = store
                .get(&ObjectKey::new(key).expect("key"))
                .await
                .expect("get");
            let value = object.map(|o| o.value);
            assert!(
                value.as_deref() == Some(&child_value(*n, *size)[..]),
                "acknowledged {key} ({size} bytes) is {} after the cuts",
                value.map_or("missing".to_owned(), |v| format!("{} other bytes", v.len()))
            );
        }
    });
}
