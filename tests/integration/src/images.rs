//! Guest kernels (via `resources/guest-images`), initramfs images (via
//! `resources/mkinitramfs`) and the root disk image (via
//! `resources/mkrootfs`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::error::HarnessError;
use crate::paths::{build_dir, resource};
use crate::runner::run_checked;

/// Serialises fetches: two tests asking for the same suite must not unpack
/// it twice at the same time.
static FETCH_LOCK: Mutex<()> = Mutex::new(());

/// One unpacked Debian guest kernel.
#[derive(Debug, Clone)]
pub struct GuestImages {
    pub suite: String,
    /// bzImage as shipped by Debian.
    pub vmlinuz: PathBuf,
    /// ELF kernel extracted from the bzImage (PVH boot), if extraction worked.
    pub vmlinux: Option<PathBuf>,
    /// `lib/modules/<kver>` of the package.
    pub modules: PathBuf,
    /// Kernel release, e.g. `6.1.0-56-amd64`.
    pub version: String,
}

/// Returns the images of `suite` (`bookworm` or `trixie`), fetching them
/// with `resources/guest-images fetch` when they are not cached yet.
pub fn ensure_images(suite: &str) -> Result<GuestImages, HarnessError> {
    let dir = build_dir().join("images").join(suite);
    let version_file = dir.join("version");
    {
        let _guard = FETCH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        if !version_file.exists() {
            let mut cmd = Command::new(resource("guest-images"));
            cmd.args(["fetch", "--suite", suite]);
            run_checked(&mut cmd)?;
        }
    }
    let version = std::fs::read_to_string(&version_file)
        .map_err(|e| HarnessError::io(&version_file, e))?
        .trim()
        .to_string();
    let vmlinuz = dir.join("vmlinuz");
    if !vmlinuz.exists() {
        return Err(HarnessError::Missing(vmlinuz));
    }
    let vmlinux = Some(dir.join("vmlinux")).filter(|p| p.exists());
    Ok(GuestImages {
        suite: suite.to_string(),
        vmlinuz,
        vmlinux,
        modules: dir.join("modules"),
        version,
    })
}

/// What goes into a test initramfs (see `resources/mkinitramfs`).
#[derive(Debug, Clone, Default)]
pub struct InitramfsSpec {
    pub suite: String,
    /// Module names loaded (with their dependencies) before the script.
    pub modules: Vec<String>,
    /// Modules included only if the kernel has them.
    pub optional_modules: Vec<String>,
    /// Out-of-tree modules (e.g. the guest driver), loaded last.
    pub extra_ko: Vec<PathBuf>,
    /// insmod parameters for the `extra_ko` entry at the same index.
    pub extra_ko_args: Vec<String>,
    /// Extra files: (host source, absolute destination in the guest).
    pub files: Vec<(PathBuf, String)>,
    /// The guest script, run as `/guest-script.sh`.
    pub script: PathBuf,
    /// Seconds before the guest's init kills the script.
    pub script_timeout: Option<u32>,
}

impl InitramfsSpec {
    /// A spec with a suite and a script and nothing else.
    pub fn new(suite: &str, script: impl AsRef<Path>) -> Self {
        InitramfsSpec {
            suite: suite.to_string(),
            script: script.as_ref().to_path_buf(),
            ..Default::default()
        }
    }
}

/// Builds (or finds in the content-addressed cache) the initramfs for
/// `spec` and returns its path under `build/initramfs/`.
pub fn build_initramfs(spec: &InitramfsSpec) -> Result<PathBuf, HarnessError> {
    ensure_images(&spec.suite)?;
    let mut cmd = Command::new(resource("mkinitramfs"));
    cmd.arg("--suite").arg(&spec.suite);
    cmd.arg("--modules").arg(spec.modules.join(" "));
    cmd.arg("--optional-modules")
        .arg(spec.optional_modules.join(" "));
    for ko in &spec.extra_ko {
        cmd.arg("--extra-ko").arg(ko);
    }
    for a in &spec.extra_ko_args {
        cmd.arg("--extra-ko-args").arg(a);
    }
    for (src, dest) in &spec.files {
        let mut arg = src.as_os_str().to_os_string();
        arg.push(":");
        arg.push(dest);
        cmd.arg("--file").arg(arg);
    }
    if let Some(t) = spec.script_timeout {
        cmd.arg("--script-timeout").arg(t.to_string());
    }
    cmd.arg("--script").arg(&spec.script);
    let out = run_checked(&mut cmd)?;
    let path = PathBuf::from(out.trim());
    if path.exists() {
        Ok(path)
    } else {
        Err(HarnessError::Missing(path))
    }
}

/// The cached Debian root file system image (raw ext4, systemd as init,
/// `resources/mkrootfs`), built when it is missing or stale. Tests boot a
/// copy of it: the cached image stays as built.
pub fn ensure_rootfs() -> Result<PathBuf, HarnessError> {
    let _guard = FETCH_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let out = run_checked(&mut Command::new(resource("mkrootfs")))?;
    let path = PathBuf::from(out.trim());
    if path.exists() {
        Ok(path)
    } else {
        Err(HarnessError::Missing(path))
    }
}
