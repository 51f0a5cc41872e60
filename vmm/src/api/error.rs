//! Why a request failed (a lifecycle request in the wrong state, a VM
//! that does not exist or already does, a body that is not a valid
//! `VmConfig`), and the status code cloud-hypervisor's OpenAPI
//! description gives it.

use thiserror::Error;

use crate::vcpu_control::PauseError;

/// A refused or failed lifecycle request. The VM is unchanged by a
/// refused one (wrong state, unsupported).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ApiError {
    /// The request body is malformed or names invalid values: 400.
    #[error("{0}")]
    BadRequest(String),
    /// No VM has been created: 404, as cloud-hypervisor's description
    /// answers "not created".
    #[error("{0}")]
    NotCreated(String),
    /// A VM exists already (`vm.create` twice): 409, the description's
    /// status for "already exists".
    #[error("{0}")]
    Conflict(String),
    /// The VM is not in a state that allows the request (resuming a
    /// running VM, pausing a paused one): 405, as cloud-hypervisor's
    /// description answers "not booted" and "not paused".
    #[error("{0}")]
    WrongState(String),
    /// dmavisor cannot do this for this VM's devices: 501.
    #[error("{0}")]
    Unsupported(String),
    /// It was tried and failed: 500.
    #[error("{0}")]
    Failed(String),
}

impl ApiError {
    /// The HTTP status of the answer.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadRequest(_) => 400,
            Self::NotCreated(_) => 404,
            Self::Conflict(_) => 409,
            Self::WrongState(_) => 405,
            Self::Unsupported(_) => 501,
            Self::Failed(_) => 500,
        }
    }
}

impl From<PauseError> for ApiError {
    fn from(e: PauseError) -> Self {
        match e {
            PauseError::AlreadyPaused | PauseError::NotPaused => Self::WrongState(e.to_string()),
            PauseError::Timeout { .. } | PauseError::Signal(_) => Self::Failed(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses() {
        assert_eq!(ApiError::from(PauseError::AlreadyPaused).status(), 405);
        assert_eq!(ApiError::from(PauseError::NotPaused).status(), 405);
        let t = PauseError::Timeout {
            parked: 1,
            total: 2,
            waited: std::time::Duration::from_secs(1),
        };
        assert_eq!(ApiError::from(t).status(), 500);
        assert_eq!(ApiError::Unsupported("x".into()).status(), 501);
        assert_eq!(ApiError::BadRequest("x".into()).status(), 400);
        assert_eq!(ApiError::NotCreated("x".into()).status(), 404);
        assert_eq!(ApiError::Conflict("x".into()).status(), 409);
    }
}
