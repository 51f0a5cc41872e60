//! `vhost-user-test-net`: a small vhost-user-net back-end on a TAP
//! interface, used to test dmavisor's vhost-user-net front-end against a
//! back-end that is not dmavisor's own code.
//!
//! By default it serves exactly one front-end connection and exits 0 when
//! that front-end disconnects, so a test can run it as a child process and
//! treat any other exit as a failure. With `--reconnect` it serves one
//! front-end after another until it is killed, as a back-end must for a
//! VMM that rebuilds its VM on a guest reboot and connects again: each
//! session starts from a fresh back-end state (no owner, features, memory
//! table or rings of the previous one), on the same TAP and socket.

mod backend;
mod tap;
mod vnet_hdr;

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;
use log::{debug, error, info};
use thiserror::Error;
use vhost::vhost_user::{Error as VhostUserError, Listener};
use vhost_user_backend::{Error as DaemonError, VhostUserDaemon};
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};

use backend::{NetBackend, SharedBackend};
use tap::{Tap, TapError};

/// How long `--client` keeps retrying while the front-end's socket is not
/// there yet, since test harnesses start both sides at about the same time.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_RETRY_INTERVAL: Duration = Duration::from_millis(100);

/// A vhost-user-net back-end on a TAP interface (one queue pair, no
/// offloads), for testing a VMM's vhost-user-net front-end.
#[derive(Debug, Parser)]
#[command(name = "vhost-user-test-net", version)]
struct Cli {
    /// vhost-user socket: listened on (a stale file is replaced), or
    /// connected to with --client.
    #[arg(long, value_name = "PATH")]
    socket: PathBuf,

    /// TAP interface to create (or attach to) and bring up.
    #[arg(long, value_name = "NAME")]
    tap: String,

    /// IPv4 address for the TAP interface.
    #[arg(long, value_name = "A.B.C.D", requires = "mask")]
    ip: Option<Ipv4Addr>,

    /// IPv4 netmask for the TAP interface.
    #[arg(long, value_name = "A.B.C.D", requires = "ip")]
    mask: Option<Ipv4Addr>,

    /// Connect to the front-end's socket instead of listening.
    #[arg(long)]
    client: bool,

    /// Serve front-ends one after another (listen again, or with
    /// --client connect again, after each disconnect) until killed.
    #[arg(long)]
    reconnect: bool,

    /// Fault injection: exit abruptly (status 3, no goodbye to the
    /// front-end) after forwarding this many frames from the guest, as a
    /// back-end that crashes mid-transfer.
    #[arg(long, value_name = "N")]
    die_after_tx_frames: Option<u64>,
}

#[derive(Debug, Error)]
enum Error {
    #[error(transparent)]
    Tap(#[from] TapError),
    #[error("cannot create the vhost-user daemon: {0}")]
    Daemon(DaemonError),
    #[error("the daemon has no vring worker")]
    NoWorker,
    #[error("cannot listen on {path}: {err}")]
    Listen { path: PathBuf, err: VhostUserError },
    #[error("socket path {0:?} is not UTF-8, which --client requires")]
    NonUtf8Path(PathBuf),
    #[error("cannot connect to {path} within {CONNECT_TIMEOUT:?}: {err}")]
    Connect { path: PathBuf, err: DaemonError },
    #[error("cannot start serving the front-end: {0}")]
    Start(DaemonError),
    #[error("vhost-user session failed: {0}")]
    Session(DaemonError),
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            error!("{e}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> Result<(), Error> {
    let tap = Tap::open(&cli.tap)?;
    if let (Some(ip), Some(mask)) = (cli.ip, cli.mask) {
        tap.set_ipv4(ip, mask)?;
        info!("{}: address {ip} netmask {mask}", tap.name());
    }
    tap.bring_up()?;
    info!("{}: up", tap.name());

    // Kept for every session: the socket file exists for as long as the
    // back-end serves, and is removed when the listener is dropped. A
    // front-end connecting between two sessions waits in its backlog.
    let mut listener = if cli.client {
        None
    } else {
        let listener = Listener::new(&cli.socket, true).map_err(|err| Error::Listen {
            path: cli.socket.clone(),
            err,
        })?;
        info!("listening on {}", cli.socket.display());
        Some(listener)
    };
    let mut session = 1u64;
    loop {
        serve_session(cli, &tap, listener.as_mut(), session)?;
        if !cli.reconnect {
            return Ok(());
        }
        session += 1;
        info!("waiting for front-end {session}");
    }
}

/// Serves one front-end connection, from its first message to its
/// disconnect, on a back-end state of its own.
fn serve_session(
    cli: &Cli,
    tap: &Tap,
    listener: Option<&mut Listener>,
    session: u64,
) -> Result<(), Error> {
    // Empty until the front-end sends its memory table; the framework swaps
    // the mapped regions into this same atomic.
    let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
    let mut net = NetBackend::new(tap.try_clone()?, mem.clone());
    net.die_after_tx_frames = cli.die_after_tx_frames;
    let backend: SharedBackend = Arc::new(Mutex::new(net));
    let mut daemon = VhostUserDaemon::new("vhost-user-test-net".to_owned(), backend.clone(), mem)
        .map_err(Error::Daemon)?;
    // The epoll handler only exists once the daemon does, so the backend
    // learns about it afterwards; it needs it to add and remove the TAP fd.
    let worker = daemon
        .get_epoll_handlers()
        .into_iter()
        .next()
        .ok_or(Error::NoWorker)?;
    backend
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .set_epoll_handler(worker);

    match listener {
        None => connect(&mut daemon, &cli.socket)?,
        Some(listener) => daemon.start(listener).map_err(Error::Start)?,
    }
    info!("front-end connected (session {session})");

    let result = daemon.wait();
    for handler in daemon.get_epoll_handlers() {
        handler.send_exit_event();
    }
    match result {
        Ok(()) => {}
        Err(e) if is_disconnect(&e) => {}
        Err(e) => return Err(Error::Session(e)),
    }
    info!("front-end disconnected (session {session})");
    Ok(())
}

/// Connects to the front-end's socket, retrying while it does not exist
/// yet or refuses connections.
fn connect(daemon: &mut VhostUserDaemon<SharedBackend>, path: &Path) -> Result<(), Error> {
    let path_str = path
        .to_str()
        .ok_or_else(|| Error::NonUtf8Path(path.to_owned()))?;
    let deadline = Instant::now() + CONNECT_TIMEOUT;
    loop {
        match daemon.start_client(path_str) {
            Ok(()) => return Ok(()),
            Err(DaemonError::CreateBackendReqHandler(e)) if Instant::now() < deadline => {
                debug!("connecting to {path_str}: {e}; retrying");
                thread::sleep(CONNECT_RETRY_INTERVAL);
            }
            Err(err) => {
                return Err(Error::Connect {
                    path: path.to_owned(),
                    err,
                })
            }
        }
    }
}

/// Whether the session ended because the front-end went away, which is the
/// normal end of a test run. `VhostUserDaemon::wait` only maps
/// `SocketBroken` to success; `serve` additionally accepts these two, and so
/// do we, since we cannot use `serve` (it hides the listener).
fn is_disconnect(e: &DaemonError) -> bool {
    matches!(
        e,
        DaemonError::HandleRequest(
            VhostUserError::Disconnected
                | VhostUserError::PartialMessage
                | VhostUserError::SocketBroken(_)
        )
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listen_mode_with_address() {
        let cli = Cli::try_parse_from([
            "vhost-user-test-net",
            "--socket",
            "/tmp/vutn.sock",
            "--tap",
            "vutn0",
            "--ip",
            "10.77.0.1",
            "--mask",
            "255.255.255.0",
        ])
        .unwrap();
        assert_eq!(cli.socket, PathBuf::from("/tmp/vutn.sock"));
        assert_eq!(cli.tap, "vutn0");
        assert_eq!(cli.ip, Some(Ipv4Addr::new(10, 77, 0, 1)));
        assert_eq!(cli.mask, Some(Ipv4Addr::new(255, 255, 255, 0)));
        assert!(!cli.client);
        assert!(!cli.reconnect, "one session unless asked");
    }

    #[test]
    fn parses_client_mode_without_address() {
        let cli = Cli::try_parse_from([
            "vhost-user-test-net",
            "--socket",
            "s",
            "--tap",
            "t",
            "--client",
            "--reconnect",
        ])
        .unwrap();
        assert!(cli.client);
        assert!(cli.reconnect);
        assert_eq!(cli.ip, None);
    }

    #[test]
    fn rejects_incomplete_or_bad_arguments() {
        let bad: &[&[&str]] = &[
            &["x", "--tap", "t"],
            &["x", "--socket", "s"],
            &["x", "--socket", "s", "--tap", "t", "--ip", "10.0.0.1"],
            &["x", "--socket", "s", "--tap", "t", "--mask", "255.0.0.0"],
            &[
                "x",
                "--socket",
                "s",
                "--tap",
                "t",
                "--ip",
                "10.0.0",
                "--mask",
                "255.0.0.0",
            ],
        ];
        for args in bad {
            assert!(Cli::try_parse_from(*args).is_err(), "{args:?} accepted");
        }
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn front_end_going_away_is_success() {
        assert!(is_disconnect(&DaemonError::HandleRequest(
            VhostUserError::Disconnected
        )));
        assert!(!is_disconnect(&DaemonError::HandleRequest(
            VhostUserError::InvalidMessage
        )));
    }
}
