//! `palisade-lazyfs`: serves one lazy mount in the foreground, or sends a
//! command to one.
//!
//! ```text
//! palisade-lazyfs [--control SOCKET] MOUNT BACKING   # default SOCKET: BACKING.lazyfs.sock
//! palisade-lazyfs cut SOCKET [lose | tear SEED]
//! palisade-lazyfs sync SOCKET
//! palisade-lazyfs stats SOCKET
//! ```
//!
//! Mounted, it prints one line (`lazyfs mounted ...`) once the kernel
//! serves the mount, and on SIGTERM or SIGINT writes what is pending (a
//! clean shutdown is not a power cut), unmounts (lazily if the mount is
//! busy) and exits 0.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use fuser::{Config, MountOption, Session};
use nix::sys::signal::{SigSet, Signal};
use palisade_lazyfs::{control, fs::lock, LazyFs};

const USAGE: &str = "usage: palisade-lazyfs [--control SOCKET] MOUNT BACKING | cut SOCKET [lose|tear SEED] | sync SOCKET | stats SOCKET";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("cut" | "sync" | "stats") => command(&args),
        _ => match parse_mount(&args) {
            Some((mount, backing, socket)) => match serve(&mount, &backing, &socket) {
                Ok(()) => ExitCode::SUCCESS,
                Err(err) => {
                    eprintln!("palisade-lazyfs: {err}");
                    ExitCode::FAILURE
                }
            },
            None => {
                eprintln!("{USAGE}");
                ExitCode::from(2)
            }
        },
    }
}

/// `cut`, `sync`, `stats`: one request to a running mount's socket.
fn command(args: &[String]) -> ExitCode {
    let (Some(verb), Some(socket)) = (args.first(), args.get(1)) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let mut line = vec![verb.as_str()];
    line.extend(args[2..].iter().map(String::as_str));
    match control::request(Path::new(socket), &line.join(" ")) {
        Ok(answer) => {
            println!("{answer}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("palisade-lazyfs: {err}");
            ExitCode::FAILURE
        }
    }
}

fn parse_mount(args: &[String]) -> Option<(PathBuf, PathBuf, PathBuf)> {
    let mut control = None;
    let mut positional = Vec::new();
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--control" => control = Some(PathBuf::from(args.next()?)),
            flag if flag.starts_with('-') => return None,
            path => positional.push(PathBuf::from(path)),
        }
    }
    let [mount, backing] = <[PathBuf; 2]>::try_from(positional).ok()?;
    let control = control.unwrap_or_else(|| {
        let mut name = backing.clone().into_os_string();
        name.push(".lazyfs.sock");
        PathBuf::from(name)
    });
    Some((mount, backing, control))
}

fn serve(mount: &Path, backing: &Path, socket: &Path) -> std::io::Result<()> {
    // Block the stop signals before any thread starts, so every thread
    // inherits the mask and only the wait below takes them.
    let mut stop = SigSet::empty();
    stop.add(Signal::SIGTERM);
    stop.add(Signal::SIGINT);
    stop.thread_block().map_err(std::io::Error::from)?;

    std::fs::create_dir_all(mount)?;
    std::fs::create_dir_all(backing)?;
    let backing = backing.canonicalize()?;
    let fs = LazyFs::new(&backing);
    let state = fs.state();
    control::serve(socket, state.clone())?;

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("palisade-lazyfs".into()),
        MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(2);
    let mut session = Session::new(fs, mount, &config)?;
    let mut unmounter = session.unmount_callable();
    std::thread::Builder::new()
        .name("lazyfs-session".into())
        .spawn(move || {
            if let Err(err) = session.run() {
                eprintln!("palisade-lazyfs: session ended: {err}");
            }
            // Unmounted from outside: stop as on SIGTERM.
            let me = nix::unistd::Pid::from_raw(std::process::id() as i32);
            let _ = nix::sys::signal::kill(me, Signal::SIGTERM);
        })?;
    println!(
        "lazyfs mounted {} over {}, control {}",
        mount.display(),
        backing.display(),
        socket.display()
    );
    std::io::stdout().flush()?;

    let _ = stop.wait();
    if let Err(err) = lock(&state).sync_all() {
        eprintln!("palisade-lazyfs: sync at shutdown: {err}");
    }
    if unmounter.unmount().is_err() {
        // Busy: detach it; the kernel finishes once the last user leaves.
        let _ = nix::mount::umount2(mount, nix::mount::MntFlags::MNT_DETACH);
    }
    let _ = std::fs::remove_file(socket);
    Ok(())
}
