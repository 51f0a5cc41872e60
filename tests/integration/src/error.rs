//! The harness's error type.

use std::path::PathBuf;

/// Why a harness step failed; the message names the command or path involved
/// so a failing test says what to fix.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("cannot run {cmd}: {source}")]
    Spawn {
        cmd: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{cmd} failed with status {status}:\n{stderr}")]
    Command {
        cmd: String,
        status: String,
        stderr: String,
    },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} not found")]
    Missing(PathBuf),
}

impl HarnessError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        HarnessError::Io {
            path: path.into(),
            source,
        }
    }
}
