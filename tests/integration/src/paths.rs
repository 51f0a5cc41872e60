//! Where things live: the checkout, its build directory, the resources.

use std::path::{Path, PathBuf};

/// Top of the checkout (two levels above this crate's manifest).
pub fn repo_root() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.join("..").join("..");
    root.canonicalize().unwrap_or(root)
}

/// The cache/build directory shared with the resources scripts
/// (`DMAVISOR_BUILD_DIR`, default `<repo>/build`).
pub fn build_dir() -> PathBuf {
    match std::env::var_os("DMAVISOR_BUILD_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d),
        _ => repo_root().join("build"),
    }
}

/// `p` as a command-line argument. Lossy on purpose: case argv end up in a
/// generated shell script (text), and the checkout's paths are UTF-8.
pub fn path_arg(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A script or tool under `resources/`.
pub fn resource(name: &str) -> PathBuf {
    repo_root().join("resources").join(name)
}

/// A guest script shipped with this crate (`tests/integration/guest/`).
pub fn guest_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("guest")
        .join(name)
}

/// Scratch directory for test files that must be visible inside the nested
/// runner (which shares the checkout read-write but has its own `/tmp`).
pub fn scratch_dir() -> PathBuf {
    build_dir().join("tests")
}

/// Builds the static guest tool `guest/<name>.c` (gcc is one of the
/// project's host dependencies) into the scratch directory and returns the
/// binary's path. Warnings are errors: these tools run as root in the guest.
pub fn build_guest_tool(name: &str) -> Result<PathBuf, String> {
    gcc(name, name, &["-static"], &[])
}

/// Builds `guest/<name>.c` as an `LD_PRELOAD` library `<name>.so` for a
/// program the tests run in the runner (e.g. the reference QEMU).
pub fn build_preload_lib(name: &str) -> Result<PathBuf, String> {
    gcc(
        name,
        &format!("{name}.so"),
        &["-shared", "-fPIC"],
        &["-ldl"],
    )
}

fn gcc(name: &str, out_name: &str, mode: &[&str], libs: &[&str]) -> Result<PathBuf, String> {
    std::fs::create_dir_all(scratch_dir())
        .map_err(|e| format!("{}: {e}", scratch_dir().display()))?;
    let out = scratch_dir().join(out_name);
    // Test groups run in parallel lanes (resources/test-lanes) and may build
    // the same tool: compile to a private name and rename it into place, so
    // nobody runs or loads a half-written file.
    let tmp = scratch_dir().join(format!("{out_name}.tmp{}", std::process::id()));
    let src = guest_script(&format!("{name}.c"));
    let st = std::process::Command::new("gcc")
        .args(mode)
        .args(["-O2", "-Wall", "-Werror", "-Wno-unused-function", "-o"])
        .arg(&tmp)
        .arg(&src)
        .args(libs)
        .status()
        .map_err(|e| format!("gcc: {e}"))?;
    if !st.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!("gcc {} failed: {st}", src.display()));
    }
    std::fs::rename(&tmp, &out).map_err(|e| format!("{}: {e}", out.display()))?;
    Ok(out)
}
