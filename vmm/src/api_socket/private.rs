//! Creates the API's socket file so that only the VMM's user can connect,
//! whatever the umask.
//!
//! WHY not `bind` then `chmod`: between the two, the socket exists with the
//! umask's mode and anyone it allows can connect (and keep the connection).
//! `fchmod` on a socket descriptor does not change the file either. So the
//! socket is bound inside a fresh directory of mode 0700 next to the wanted
//! path, made 0600 there (nobody else can reach it yet), and renamed into
//! place with `RENAME_NOREPLACE`: a file that appeared at the path in the
//! meantime is never replaced.
//!
//! What is at the path already: a socket nobody listens on (a VMM that
//! died) is removed; a socket somebody listens on, or any other kind of
//! file, is left alone and the VMM refuses to start, because it is not
//! ours to remove.

use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::Error;

/// The socket file's mode: the VMM's user alone reads and writes it.
pub(crate) const SOCKET_MODE: u32 = 0o600;

fn os(what: &'static str) -> impl FnOnce(io::Error) -> Error {
    move |source| Error::Os { what, source }
}

/// Removes a stale socket at `path`; refuses anything else.
fn clear_path(path: &Path) -> Result<(), Error> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(os("looking at the --api-socket path")(e)),
    };
    if !meta.file_type().is_socket() {
        return Err(os(
            "the --api-socket path exists and is not a socket; not removing it",
        )(io::Error::from(io::ErrorKind::AlreadyExists)));
    }
    match UnixStream::connect(path) {
        // Somebody serves it: another VMM's API.
        Ok(_) => Err(os("another process listens on the --api-socket path")(
            io::Error::from(io::ErrorKind::AddrInUse),
        )),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
            std::fs::remove_file(path).map_err(os("removing a stale API socket"))
        }
        Err(e) => Err(os("probing the socket at the --api-socket path")(e)),
    }
}

/// A directory of mode 0700 beside `path`, on the same file system so
/// that the rename out of it is atomic.
fn private_dir(path: &Path) -> Result<PathBuf, Error> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = parent.join(format!(".dmavisor-api.{}.{nonce}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(os("creating a private directory for the API socket"))?;
    Ok(dir)
}

fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
    let c = |p: &Path| {
        CString::new(p.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    };
    let (from, to) = (c(from)?, c(to)?);
    // SAFETY: both are NUL-terminated strings that outlive the call;
    // renameat2 only reads them.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Binds a listening socket at `path` whose file has mode 0600.
pub(crate) fn bind_private(path: &Path) -> Result<UnixListener, Error> {
    clear_path(path)?;
    let dir = private_dir(path)?;
    let inner = dir.join("api.sock");
    let result = (|| {
        let listener = UnixListener::bind(&inner).map_err(os("binding the API socket"))?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(os("setting the API socket's mode"))?;
        rename_noreplace(&inner, path).map_err(os("moving the API socket into place"))?;
        Ok(listener)
    })();
    // Empty once the rename succeeded; on failure it holds the socket.
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_dir(&dir);
    result
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dmavisor-sock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn api_socket_is_private() {
        let dir = scratch("private");
        let path = dir.join("api.sock");
        // A plain bind gives 0777 less the umask, 0600 only for the rare
        // umask 0177; the umask is not changed here because it is the
        // whole test process's, shared with the tests running alongside.
        let listener = bind_private(&path).unwrap();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.mode() & 0o777, SOCKET_MODE, "mode {:o}", meta.mode());
        // The private directory is gone: only the socket is left.
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("api.sock")]);

        // A socket somebody listens on is not taken over.
        let err = bind_private(&path).unwrap_err().to_string();
        assert!(err.contains("listens"), "{err}");
        // Once its listener is gone it is stale, and replaced.
        drop(listener);
        let again = bind_private(&path).unwrap();
        assert!(UnixStream::connect(&path).is_ok());
        drop(again);

        // A file that is not a socket is never removed.
        let file = dir.join("precious");
        std::fs::write(&file, b"keep me").unwrap();
        let err = bind_private(&file).unwrap_err().to_string();
        assert!(err.contains("not a socket"), "{err}");
        assert_eq!(std::fs::read(&file).unwrap(), b"keep me");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
