//! The SIGSYS handler of `--seccomp true`: one line naming the thread and
//! the system call its filter refused, then the VMM ends.
//!
//! WHY a handler rather than SECCOMP_RET_KILL_PROCESS: a killed process
//! says nothing (a core dump at best), and the operator must learn which
//! thread kind's allow-list lacks which call, or which thread was
//! subverted. The handler runs on the offending thread, under its filter,
//! so it uses only calls every allow-list has (`prctl`, `write`,
//! `exit_group`) and allocates nothing.

use std::io;

use super::syscall_names::syscall_name;

/// Exit status after a refused system call (as for any VMM failure).
pub const SECCOMP_EXIT_CODE: i32 = 1;

/// The SIGSYS part of `siginfo_t` on x86_64 (`_sigsys` in the kernel's
/// union, which starts 16 bytes in).
#[repr(C)]
#[allow(dead_code)] // Only `syscall` is read; the rest is layout.
struct SigsysInfo {
    signo: libc::c_int,
    errno: libc::c_int,
    code: libc::c_int,
    _pad: libc::c_int,
    call_addr: *mut libc::c_void,
    syscall: libc::c_int,
    arch: libc::c_uint,
}

/// A fixed buffer the handler formats into (no allocation in a handler).
struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    fn push(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if let Some(slot) = self.buf.get_mut(self.len) {
                *slot = b;
                self.len += 1;
            }
        }
    }

    fn push_number(&mut self, mut n: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            if let Some(d) = digits.get_mut(i) {
                *d = b'0' + (n % 10) as u8;
            }
            n /= 10;
            if n == 0 || i == 0 {
                break;
            }
        }
        self.push(digits.get(i..).unwrap_or_default());
    }
}

/// The refused call's first two arguments (x86-64: rdi, rsi), from the
/// context the kernel saved: for an ioctl the second is the request, which
/// says which device's call it was.
fn call_args(ctx: *mut libc::c_void) -> Option<(u64, u64)> {
    if ctx.is_null() {
        return None;
    }
    // SAFETY: a SIGSYS handler installed with SA_SIGINFO gets the
    // interrupted thread's ucontext_t as its third argument; we only read
    // two saved general registers from it.
    let regs = unsafe { &(*ctx.cast::<libc::ucontext_t>()).uc_mcontext.gregs };
    let rdi = regs.get(libc::REG_RDI as usize).copied()?;
    let rsi = regs.get(libc::REG_RSI as usize).copied()?;
    // The registers' 64 bits as the syscall's unsigned arguments.
    Some((
        u64::from_ne_bytes(rdi.to_ne_bytes()),
        u64::from_ne_bytes(rsi.to_ne_bytes()),
    ))
}

extern "C" fn on_sigsys(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel hands a SIGSYS handler installed with SA_SIGINFO
    // a valid siginfo_t whose union holds `_sigsys` (layout above).
    let nr = unsafe { (*info.cast::<SigsysInfo>()).syscall };
    let mut name = [0u8; 17];
    // SAFETY: PR_GET_NAME writes at most 16 bytes (NUL included) into the
    // 17-byte buffer.
    unsafe { libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr(), 0, 0, 0) };
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(16);
    let mut line = Line {
        buf: [0; 256],
        len: 0,
    };
    line.push(b"dmavisor: error: seccomp: thread '");
    line.push(name.get(..name_len).unwrap_or_default());
    line.push(b"' made a forbidden system call: ");
    line.push(syscall_name(i64::from(nr)).as_bytes());
    line.push(b" (");
    line.push_number(u64::try_from(nr).unwrap_or(0));
    if let Some((a0, a1)) = call_args(ctx) {
        line.push(b", args ");
        line.push_number(a0);
        line.push(b", ");
        line.push_number(a1);
        if i64::from(nr) == libc::SYS_openat && a1 != 0 {
            // openat's path: the caller's own NUL-terminated string, read
            // up to 96 bytes, so the line says which file was wanted.
            line.push(b" \"");
            let path = a1 as *const u8;
            for i in 0..96 {
                // SAFETY: the interrupted openat was handed this pointer
                // to a NUL-terminated path; we stop at its NUL.
                let b = unsafe { *path.add(i) };
                if b == 0 {
                    break;
                }
                line.push(&[b]);
            }
            line.push(b"\"");
        }
    }
    line.push(b"); ending the VMM\n");
    // SAFETY: writes `line.len` initialised bytes of our buffer to stderr;
    // then ends the process without running anything else (exit_group).
    unsafe {
        libc::write(2, line.buf.as_ptr().cast(), line.len);
        libc::_exit(SECCOMP_EXIT_CODE);
    }
}

/// Installs [`on_sigsys`] for the whole process.
pub fn install_handler() -> io::Result<()> {
    // SAFETY: a zeroed sigaction is a valid starting point; we fill the
    // handler, flags and an empty mask before handing it to the kernel.
    let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
    let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_sigsys;
    action.sa_sigaction = handler as usize;
    action.sa_flags = libc::SA_SIGINFO;
    // SAFETY: `action.sa_mask` is ours to initialise.
    unsafe { libc::sigemptyset(&mut action.sa_mask) };
    // SAFETY: installs a handler that only reads its siginfo and makes
    // async-signal-safe calls; the old action is not asked for.
    let rc = unsafe { libc::sigaction(libc::SIGSYS, &action, std::ptr::null_mut()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_formats_numbers_and_truncates() {
        let mut l = Line {
            buf: [0; 256],
            len: 0,
        };
        l.push(b"nr ");
        l.push_number(101);
        l.push(b" ");
        l.push_number(0);
        assert_eq!(l.buf.get(..l.len).unwrap(), b"nr 101 0");
        l.push(&[b'x'; 300]);
        assert_eq!(l.len, 256);
    }
}
