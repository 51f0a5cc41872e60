//! `--landlock` and `--landlock-rules path=..,access=r|rw`
//! (cloud-hypervisor's spelling): the VMM keeps access to the files it
//! was given and to nothing else.
//!
//! WHY before any thread starts: Landlock restricts the calling thread and
//! the threads it starts later, never those already running. The main
//! thread restricts itself before it serves the API or boots, so every
//! thread of the VMM is inside. A path the API hands in later (`vm.create`,
//! `vm.add-disk`, `vm.add-device`) opens only if it falls inside the rules:
//! the kernel refuses the rest with EACCES, whatever the VMM's bugs.

use std::path::{Path, PathBuf};

use landlock::{
    Access, AccessFs, PathBeneath, PathFd, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus,
    ABI,
};

use super::SandboxError;
use crate::error::Error;
use crate::options::parse_options;

/// The newest Landlock ABI whose file rights we ask for (v3: truncate).
/// The crate drops what an older kernel lacks (best effort) and we check
/// that something is enforced.
const LANDLOCK_ABI: ABI = ABI::V3;

/// What a rule grants beneath its path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LandlockAccess {
    /// `r`: read files, list directories, execute.
    Read,
    /// `rw`: everything, creating and removing files included.
    ReadWrite,
}

/// One path and what the VMM may do beneath it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LandlockRule {
    /// A file or a directory (the rule covers everything beneath it).
    pub path: PathBuf,
    /// The rights granted.
    pub access: LandlockAccess,
}

impl LandlockRule {
    /// A rule for `path`.
    pub fn new(path: impl Into<PathBuf>, access: LandlockAccess) -> Self {
        Self {
            path: path.into(),
            access,
        }
    }

    /// Parses one `--landlock-rules` value: `path=PATH,access=r|rw`.
    pub fn parse(value: &str) -> Result<Self, Error> {
        let opts = parse_options("landlock-rules", value, &["path", "access"])?;
        let bad = |reason: &str| Error::InvalidOption {
            option: "landlock-rules",
            value: value.to_string(),
            reason: reason.to_string().into(),
        };
        let path = opts
            .get("path")
            .filter(|p| !p.is_empty())
            .ok_or_else(|| bad("path=... is required"))?;
        let access = match opts.get("access").map(String::as_str) {
            Some("r") => LandlockAccess::Read,
            Some("rw") => LandlockAccess::ReadWrite,
            Some(_) => return Err(bad("access must be r or rw")),
            None => return Err(bad("access=r|rw is required")),
        };
        Ok(Self::new(path, access))
    }
}

/// Restricts the calling thread, and every thread it starts from now on,
/// to `rules`. Rules whose path is `optional` and missing are skipped
/// (the fixed device nodes of a host without VFIO, say); any other
/// missing path is an error, since the VMM would fail on it later anyway
/// and an operator's rule that names nothing is a typo.
pub fn restrict(rules: &[LandlockRule], optional: &[LandlockRule]) -> Result<(), SandboxError> {
    let read = AccessFs::from_read(LANDLOCK_ABI);
    let all = AccessFs::from_all(LANDLOCK_ABI);
    let mut ruleset = Ruleset::default().handle_access(all)?.create()?;
    let present = optional.iter().filter(|r| r.path.exists());
    for rule in rules.iter().chain(present) {
        let fd = open_path(&rule.path)?;
        let access = match rule.access {
            LandlockAccess::Read => read,
            LandlockAccess::ReadWrite => all,
        };
        ruleset = ruleset.add_rule(PathBeneath::new(fd, access))?;
    }
    let status = ruleset.restrict_self()?;
    if status.ruleset == RulesetStatus::NotEnforced {
        return Err(SandboxError::LandlockUnsupported);
    }
    Ok(())
}

fn open_path(path: &Path) -> Result<PathFd, SandboxError> {
    PathFd::new(path).map_err(|e| SandboxError::LandlockPath {
        path: path.to_path_buf(),
        source: std::io::Error::other(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    #[test]
    fn parses_rules() {
        assert_eq!(
            LandlockRule::parse("path=/a/b,access=rw").unwrap(),
            LandlockRule::new("/a/b", LandlockAccess::ReadWrite)
        );
        assert_eq!(
            LandlockRule::parse("access=r,path=/x").unwrap().access,
            LandlockAccess::Read
        );
        for bad in [
            "path=/a",
            "access=r",
            "path=/a,access=x",
            "path=,access=r",
            "p=/a",
        ] {
            assert!(LandlockRule::parse(bad).is_err(), "{bad}");
        }
    }

    /// Landlock binds the thread that restricts itself (and its future
    /// children): a thread of its own keeps the test runner unconfined.
    #[test]
    fn restrict_confines_the_calling_thread() {
        let base = std::env::temp_dir().join(format!("dmavisor-landlock-{}", std::process::id()));
        let inside = base.join("inside");
        let outside = base.join("outside");
        fs::create_dir_all(&inside).unwrap();
        fs::create_dir_all(&outside).unwrap();
        fs::write(inside.join("kernel"), b"in").unwrap();
        fs::write(outside.join("kernel"), b"out").unwrap();
        let (i, o) = (inside.clone(), outside.clone());
        let result = std::thread::spawn(move || {
            restrict(
                &[LandlockRule::new(&i, LandlockAccess::Read)],
                &[LandlockRule::new(
                    "/nonexistent/dmavisor",
                    LandlockAccess::ReadWrite,
                )],
            )
            .unwrap();
            (
                fs::read(i.join("kernel")).map_err(|e| e.kind()),
                fs::read(o.join("kernel")).map_err(|e| e.kind()),
                fs::write(i.join("new"), b"x").map_err(|e| e.kind()),
            )
        })
        .join()
        .unwrap();
        // This thread is not confined: the same file still opens here.
        assert_eq!(fs::read(outside.join("kernel")).unwrap(), b"out");
        fs::remove_dir_all(&base).unwrap();
        assert_eq!(result.0, Ok(b"in".to_vec()), "inside a read rule");
        assert_eq!(
            result.1,
            Err(std::io::ErrorKind::PermissionDenied),
            "outside the rules"
        );
        assert_eq!(
            result.2,
            Err(std::io::ErrorKind::PermissionDenied),
            "writing under a read-only rule"
        );
    }

    #[test]
    fn a_missing_rule_path_is_an_error() {
        let r = std::thread::spawn(|| {
            restrict(
                &[LandlockRule::new(
                    "/nonexistent/dmavisor",
                    LandlockAccess::Read,
                )],
                &[],
            )
        })
        .join()
        .unwrap();
        assert!(matches!(r, Err(SandboxError::LandlockPath { .. })), "{r:?}");
    }
}
