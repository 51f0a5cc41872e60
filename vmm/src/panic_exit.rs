//! A panic anywhere ends the whole VMM, loudly.
//!
//! Why: the VMM is a set of threads (vCPUs, device workers, the vIOMMU's
//! request queues). By default a panicking thread just unwinds and
//! disappears: its vCPU stops running or its queue stops being served, the
//! guest stalls, and nothing says why. The hook installed here writes one
//! line naming the thread and the panic and exits the process with
//! [`PANIC_EXIT_CODE`], so a harness sees a dead VMM at once instead of a
//! stalled guest.

use std::panic::PanicHookInfo;

/// Exit code of a VMM that panicked (as Rust's own default for a panic in
/// `main`, distinct from the 1 of a guest or KVM failure).
pub const PANIC_EXIT_CODE: i32 = 101;

/// The line written for a panic: which thread, where, and its message.
pub fn describe(thread: Option<&str>, info: &PanicHookInfo<'_>) -> String {
    let msg = info
        .payload()
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| info.payload().downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into());
    let at = info
        .location()
        .map(|l| format!(" at {}:{}", l.file(), l.line()))
        .unwrap_or_default();
    format!(
        "dmavisor: error: thread '{}' panicked{at}: {msg}; ending the VMM",
        thread.unwrap_or("<unnamed>")
    )
}

/// Installs the hook: after the default report (with a backtrace when
/// RUST_BACKTRACE asks for one) it writes [`describe`] and exits.
pub fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        // One plain line on stderr (where the log goes too, so not both).
        eprintln!("{}", describe(std::thread::current().name(), info));
        std::process::exit(PANIC_EXIT_CODE);
    }));
}
