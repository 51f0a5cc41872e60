//! `--api-socket`: where the REST API listens, parsed from the flag's
//! cloud-hypervisor spellings. A leaf of its own so that the command line
//! (`crate::cli`) and the API (`crate::api`) need not import each other.

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use crate::error::{Error, OptionReason};
use crate::options::parse_options;

mod private;
use private::bind_private;

/// Where the API listens (`--api-socket path=..` or `fd=..`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApiSocket {
    /// A socket file created with mode 0600 (a stale socket there is
    /// replaced; any other file, or a socket someone listens on, is not).
    Path(PathBuf),
    /// A listening Unix socket inherited from the parent process.
    Fd(RawFd),
}

impl ApiSocket {
    /// Parses `--api-socket`: `path=PATH`, `fd=N`, or a bare path, as
    /// cloud-hypervisor accepts.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let bad = |reason: OptionReason| Error::InvalidOption {
            option: "api-socket",
            value: value.to_string(),
            reason,
        };
        if !value.contains('=') {
            if value.is_empty() {
                return Err(bad("a path or fd=N is required".into()));
            }
            return Ok(Self::Path(value.into()));
        }
        let opts = parse_options("api-socket", value, &["path", "fd"])?;
        match (opts.get("path"), opts.get("fd")) {
            (Some(p), None) if !p.is_empty() => Ok(Self::Path(p.into())),
            (None, Some(fd)) => fd
                .parse::<RawFd>()
                .ok()
                .filter(|fd| *fd >= 0)
                .map(Self::Fd)
                .ok_or_else(|| bad(format!("fd={fd}: not a file descriptor number").into())),
            _ => Err(bad("give exactly one of path= and fd=".into())),
        }
    }

    /// Binds (or takes) the listening socket.
    pub(crate) fn listen(&self) -> Result<UnixListener, Error> {
        let os = |what: &'static str| move |source| Error::Os { what, source };
        match self {
            Self::Path(p) => bind_private(p),
            Self::Fd(fd) => {
                // SAFETY: F_GETFD only reads the descriptor's flags; an
                // invalid number fails with EBADF.
                if unsafe { libc::fcntl(*fd, libc::F_GETFD) } < 0 {
                    return Err(Error::Os {
                        what: "the --api-socket fd",
                        source: std::io::Error::last_os_error(),
                    });
                }
                // SAFETY: the descriptor is open (checked above) and was
                // handed to this process for the API alone (the command
                // line names it); nothing else in the VMM uses or closes
                // it, so ownership can be taken here.
                let owned = unsafe { OwnedFd::from_raw_fd(*fd) };
                let listener = UnixListener::from(owned);
                // Not a listening Unix socket: accept would fail forever.
                listener
                    .local_addr()
                    .map_err(os("the --api-socket fd is not a Unix socket"))?;
                Ok(listener)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cloud_hypervisor_spellings() {
        assert_eq!(
            ApiSocket::parse("path=/run/a.sock").unwrap(),
            ApiSocket::Path("/run/a.sock".into())
        );
        assert_eq!(
            ApiSocket::parse("/run/a.sock").unwrap(),
            ApiSocket::Path("/run/a.sock".into())
        );
        assert_eq!(ApiSocket::parse("fd=3").unwrap(), ApiSocket::Fd(3));
        for bad in ["", "fd=-1", "fd=x", "path=", "path=/a,fd=3", "sock=/a"] {
            assert!(ApiSocket::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_closed_fd_is_refused() {
        // A descriptor number far above anything this test process opens.
        let err = ApiSocket::Fd(1_000_000).listen().unwrap_err().to_string();
        assert!(err.contains("api-socket"), "{err}");
    }
}
