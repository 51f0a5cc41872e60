//! The allow-list of each kind of thread, derived from what its code calls.
//!
//! WHY these shapes: a filter is inherited by the threads its thread
//! starts, and a call must pass every filter on the way. Device workers
//! are started by the vCPU that writes DRIVER_OK (and the API thread boots
//! whole VMs), so the vCPU list holds every worker's, and the API list
//! holds the vCPU's. What no device-facing thread gets: `execve`, `fork`,
//! `ptrace`, new sockets, opening files for writing, mounts, module
//! loading, changing identity: what turns a hijacked device model into a
//! host root shell.
//!
//! `ioctl` is narrowed by its type byte where a kind needs only one
//! driver (TUN for the net worker, KVM for irqfds); `openat` on
//! device-facing threads is read-only (the vhost-user stop path reads
//! `/proc/<pid>/stat`); `kill` is signal 0 only (the same path checks the
//! back-end's process exists).

use std::collections::BTreeMap;

use seccompiler::{BackendError, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};

/// The kinds of thread the VMM starts, each with its own allow-list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ThreadKind {
    /// A vCPU: KVM_RUN, MMIO/PIO emulation of every device, virtio
    /// activation (which starts workers) and inline vIOMMU requests.
    Vcpu,
    /// A virtio-net queue pair on a TAP.
    NetWorker,
    /// A virtio-blk request queue on an image.
    BlockWorker,
    /// A vIOMMU request queue: invalidates every DMA consumer (VFIO unmap,
    /// vhost-user IOTLB messages) and stops those that do not confirm.
    IommuRequest,
    /// The vIOMMU event queue (fault reports).
    IommuEvent,
    /// vhost-user helpers: the back-end's IOTLB channel, the control
    /// queue, the call-to-interrupt forwarder.
    VhostUser,
    /// The REST API's worker: creates, boots and changes VMs.
    Api,
    /// The REST API's server loop: accepts connections and parses
    /// requests (client bytes), hands them to the worker.
    ApiServer,
    /// PCI hot-unplug completion (VFIO functions torn down).
    Hotplug,
    /// stdin or a pty master to the serial port; the virtio-console's
    /// worker (its rings, its back-end's descriptors); the thread of a
    /// `Socket` back-end, which accepts its clients (`accept4`; the
    /// socket is bound by the thread that builds the VM). Pty modes need
    /// no more: the pair is opened, and its ioctls made, by the thread
    /// that builds the VM (main or `Api`, every ioctl allowed).
    Serial,
    /// The DMA test device's streaming thread.
    DmaStream,
}

impl ThreadKind {
    /// Every kind.
    pub const ALL: [ThreadKind; 11] = [
        ThreadKind::Vcpu,
        ThreadKind::NetWorker,
        ThreadKind::BlockWorker,
        ThreadKind::IommuRequest,
        ThreadKind::IommuEvent,
        ThreadKind::VhostUser,
        ThreadKind::Api,
        ThreadKind::ApiServer,
        ThreadKind::Hotplug,
        ThreadKind::Serial,
        ThreadKind::DmaStream,
    ];

    /// A short name (fits a thread name with a prefix).
    pub fn short_name(self) -> &'static str {
        match self {
            ThreadKind::Vcpu => "vcpu",
            ThreadKind::NetWorker => "net",
            ThreadKind::BlockWorker => "blk",
            ThreadKind::IommuRequest => "viommu-req",
            ThreadKind::IommuEvent => "viommu-evt",
            ThreadKind::VhostUser => "vhost-user",
            ThreadKind::Api => "api",
            ThreadKind::ApiServer => "api-server",
            ThreadKind::Hotplug => "hotplug",
            ThreadKind::Serial => "serial",
            ThreadKind::DmaStream => "dma-stream",
        }
    }
}

/// What Rust's runtime, the allocator, logging, panics and every wait
/// loop (`virtio::wake`) need in any thread.
const RUNTIME: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_close,
    libc::SYS_futex,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mremap,
    libc::SYS_mprotect,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_sigaltstack,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_restart_syscall,
    libc::SYS_clock_gettime,
    libc::SYS_clock_getres,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_gettimeofday,
    libc::SYS_getrandom,
    libc::SYS_sched_yield,
    libc::SYS_sched_getaffinity,
    libc::SYS_getcpu,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_tgkill,
    libc::SYS_rseq,
    libc::SYS_set_robust_list,
    libc::SYS_prctl,
    libc::SYS_fcntl,
    libc::SYS_dup,
    libc::SYS_dup3,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_epoll_create1,
    libc::SYS_epoll_ctl,
    libc::SYS_epoll_wait,
    libc::SYS_epoll_pwait,
    libc::SYS_epoll_pwait2,
    libc::SYS_eventfd2,
];

/// Starting threads (virtio activation starts device workers), which then
/// install their own filter (`seccomp`, only ever narrowing).
const SPAWN: &[i64] = &[
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_prlimit64,
    libc::SYS_seccomp,
];

/// Positioned and vectored I/O on images and VFIO regions, and syncing.
const FILE_IO: &[i64] = &[
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_preadv,
    libc::SYS_pwritev,
    libc::SYS_preadv2,
    libc::SYS_pwritev2,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_fallocate,
];

/// Talking over sockets the VMM already has (vhost-user), fds included.
const SOCKET_IO: &[i64] = &[
    libc::SYS_sendmsg,
    libc::SYS_recvmsg,
    libc::SYS_sendto,
    libc::SYS_recvfrom,
    libc::SYS_shutdown,
    libc::SYS_socketpair,
    libc::SYS_getsockopt,
    // Reply time-outs (SO_RCVTIMEO) on a vhost-user socket, set by the
    // vCPU that drives the device: found by the nested suite.
    libc::SYS_setsockopt,
];

/// What only the threads that build VMs need: opening files and devices,
/// sockets, guest RAM (`memfd_create`), paths.
const BUILD: &[i64] = &[
    libc::SYS_openat,
    libc::SYS_socket,
    libc::SYS_bind,
    libc::SYS_listen,
    libc::SYS_accept4,
    libc::SYS_connect,
    libc::SYS_getsockname,
    libc::SYS_getpeername,
    libc::SYS_memfd_create,
    libc::SYS_ftruncate,
    libc::SYS_unlinkat,
    // std's `remove_file` (glibc's `unlink`): a Socket back-end's file
    // removed when an API-built VM is torn down; sandbox_threads found it.
    libc::SYS_unlink,
    libc::SYS_readlinkat,
    libc::SYS_readlink,
    libc::SYS_getdents64,
    libc::SYS_faccessat,
    libc::SYS_faccessat2,
    libc::SYS_access,
    libc::SYS_statfs,
    libc::SYS_fstatfs,
    libc::SYS_pipe2,
    libc::SYS_uname,
    libc::SYS_getcwd,
    libc::SYS_kill,
    libc::SYS_sched_setaffinity,
    libc::SYS_mlock,
    libc::SYS_munlock,
    libc::SYS_umask,
    libc::SYS_chmod,
    libc::SYS_fchmod,
    libc::SYS_fchmodat,
    libc::SYS_getuid,
    libc::SYS_geteuid,
    libc::SYS_getgid,
    libc::SYS_getegid,
];

/// ioctl type bytes (`_IOC_TYPE`, bits 8..16 of the request). 'T': TUN's
/// ioctls, and the generic FIONBIO of std's `set_nonblocking`.
const IOC_T: u64 = b'T' as u64;
const IOC_KVM: u64 = 0xae;
/// `isatty`'s terminal query.
const TCGETS: u64 = libc::TCGETS;
/// membarrier's command (`include/uapi/linux/membarrier.h`): a full
/// barrier on every CPU running a thread of this process.
const MEMBARRIER_CMD_PRIVATE_EXPEDITED: u64 = 1 << 3;

/// The rules of one thread kind: each number maps to the rules of which
/// one must match (none: any arguments).
pub fn rules(kind: ThreadKind) -> Result<BTreeMap<i64, Vec<SeccompRule>>, BackendError> {
    use ThreadKind::*;
    let mut calls: Vec<&[i64]> = vec![RUNTIME];
    match kind {
        Vcpu => calls.extend([SPAWN, FILE_IO, SOCKET_IO, &[libc::SYS_ioctl]]),
        IommuRequest => calls.extend([FILE_IO, SOCKET_IO, &[libc::SYS_ioctl]]),
        // Hotplug builds an assigned function as the API worker builds a
        // VM (VFIO opens its group, reads sysfs links): the nested suite
        // found readlink refused with a narrower list.
        Api | Hotplug => calls.extend([SPAWN, FILE_IO, SOCKET_IO, BUILD, &[libc::SYS_ioctl]]),
        BlockWorker => calls.push(FILE_IO),
        VhostUser => calls.push(SOCKET_IO),
        ApiServer => calls.extend([SOCKET_IO, &[libc::SYS_accept4]]),
        Serial => calls.push(&[libc::SYS_accept4]),
        NetWorker | IommuEvent | DmaStream => {}
    }
    let mut map: BTreeMap<i64, Vec<SeccompRule>> = calls
        .into_iter()
        .flatten()
        .map(|&nr| (nr, Vec::new()))
        .collect();
    // The kinds without every ioctl: TAP offloads (the control queue) and
    // KVM (an irqfd unregistered when a worker drops the last vector);
    // the API's loop only sets sockets non-blocking (FIONBIO, type 'T').
    let ioctl_types: &[u64] = match kind {
        NetWorker => &[IOC_T, IOC_KVM],
        ApiServer => &[IOC_T],
        BlockWorker | VhostUser | IommuEvent | Serial | DmaStream => &[IOC_KVM],
        Vcpu | IommuRequest | Hotplug | Api => &[],
    };
    if !ioctl_types.is_empty() {
        let mut by_type: Vec<SeccompRule> = ioctl_types
            .iter()
            .map(|&t| arg_masked_eq(1, 0xff00, t << 8))
            .collect::<Result<_, _>>()?;
        // The logger asks whether stderr is a terminal (TCGETS) when a
        // thread logs: the nested suite found the DMA test stream ended by
        // it on its first fault warning.
        if !ioctl_types.contains(&IOC_T) {
            by_type.push(arg_masked_eq(1, u64::from(u32::MAX), TCGETS)?);
        }
        map.insert(libc::SYS_ioctl, by_type);
    }
    // Read-only opens for every kind without BUILD's: glibc's malloc reads
    // /proc/sys/vm/overcommit_memory the first time it shrinks a thread's
    // arena (the nested suite found a net worker ended by it after its
    // receive pool shrank), and the vhost-user stop path asks /proc
    // whether the back-end is gone. Which files stay readable is
    // Landlock's part (--landlock).
    if !matches!(kind, Api | Hotplug) {
        let mask = (libc::O_ACCMODE | libc::O_CREAT | libc::O_TRUNC) as u64;
        map.insert(libc::SYS_openat, vec![arg_masked_eq(2, mask, 0)?]);
    }
    if matches!(kind, Vcpu | IommuRequest | VhostUser) {
        map.insert(libc::SYS_kill, vec![arg_masked_eq(1, u64::MAX, 0)?]);
    }
    // The kinds that complete vIOMMU kicks (request queues, inline
    // requests and device resets on a vCPU, hot-unplug and VM changes on
    // the API and hotplug threads): the quiescer's barrier
    // (`virtio_iommu::barrier`), the private expedited command only. The
    // main thread registered it before any filter existed.
    if matches!(kind, Vcpu | IommuRequest | Api | Hotplug) {
        map.insert(
            libc::SYS_membarrier,
            vec![arg_masked_eq(
                0,
                u64::from(u32::MAX),
                MEMBARRIER_CMD_PRIVATE_EXPEDITED,
            )?],
        );
    }
    Ok(map)
}

/// A rule matching when `(arg & mask) == value`.
fn arg_masked_eq(arg: u8, mask: u64, value: u64) -> Result<SeccompRule, BackendError> {
    let cond = SeccompCondition::new(
        arg,
        SeccompCmpArgLen::Qword,
        SeccompCmpOp::MaskedEq(mask),
        value,
    )?;
    SeccompRule::new(vec![cond])
}
