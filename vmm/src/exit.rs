//! Why the VM stopped, reported by vCPU threads and devices to the main
//! thread, which turns it into the process exit code.

use std::sync::mpsc::Sender;

/// A reason to end the VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExitEvent {
    /// ACPI S5 (guest `poweroff`).
    PowerOff,
    /// Guest reset request (ACPI reset register, i8042 pulse, KVM reset event).
    Reset,
    /// A vCPU triple-faulted (KVM_EXIT_SHUTDOWN).
    TripleFault {
        /// vCPU index.
        vcpu: u8,
    },
    /// `vmm.shutdown` through the REST API: the VM (if any) is torn down
    /// and the VMM ends.
    ApiShutdown,
    /// `vm.shutdown` (or `vm.delete` of a running VM) through the REST
    /// API: the VM is torn down and the VMM goes on serving the API.
    VmShutdown,
    /// `vm.reboot` through the REST API: the VM is torn down and built
    /// again from its configuration, in this process.
    ApiReboot,
    /// An unrecoverable KVM or VMM error.
    Error(Failure),
}

/// An unrecoverable KVM or VMM error ([`ExitEvent::Error`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// KVM reported a guest crash (KVM_SYSTEM_EVENT_CRASH).
    #[error("guest crash reported by KVM on vCPU {vcpu}")]
    GuestCrash {
        /// vCPU index.
        vcpu: u8,
    },
    /// A KVM system event this VMM does not know.
    #[error("unknown KVM system event {kind} ({data:?}) on vCPU {vcpu}")]
    UnknownSystemEvent {
        /// The event type.
        kind: u32,
        /// Its data words.
        data: Vec<u64>,
        /// vCPU index.
        vcpu: u8,
    },
    /// KVM_EXIT_FAIL_ENTRY.
    #[error("KVM could not enter vCPU {vcpu} (hardware reason {reason:#x}, host cpu {cpu})")]
    FailEntry {
        /// vCPU index.
        vcpu: u8,
        /// The hardware's entry failure reason.
        reason: u64,
        /// Host CPU the entry was tried on.
        cpu: u32,
    },
    /// KVM_EXIT_INTERNAL_ERROR.
    #[error(
        "KVM internal error on vCPU {vcpu} (suberror {suberror}); \
         the guest did something KVM cannot emulate"
    )]
    KvmInternal {
        /// vCPU index.
        vcpu: u8,
        /// KVM's suberror code.
        suberror: u32,
    },
    /// KVM_RUN failed with an errno other than EINTR or EAGAIN.
    #[error("KVM_RUN failed on vCPU {vcpu}: {source}")]
    KvmRun {
        /// vCPU index.
        vcpu: u8,
        /// errno.
        source: kvm_ioctls::Error,
    },
    /// Every sender of the exit channel is gone.
    #[error("the exit channel closed")]
    ChannelClosed,
}

impl ExitEvent {
    /// Exit code of the VMM process when this event ends it: 0 for a
    /// guest-requested power-off or reboot (a VMM without an API socket
    /// ends on either), 1 for failures.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExitEvent::PowerOff
            | ExitEvent::Reset
            | ExitEvent::ApiShutdown
            | ExitEvent::VmShutdown
            | ExitEvent::ApiReboot => 0,
            ExitEvent::TripleFault { .. } | ExitEvent::Error(_) => 1,
        }
    }

    /// One-line description for the log / stderr.
    pub fn describe(&self) -> String {
        match self {
            ExitEvent::PowerOff => "guest powered off".into(),
            ExitEvent::Reset => "guest requested a reboot".into(),
            ExitEvent::TripleFault { vcpu } => format!(
                "guest triple fault on vCPU {vcpu} (KVM_EXIT_SHUTDOWN): the guest kernel crashed or did not boot"
            ),
            ExitEvent::ApiShutdown => "shut down through the API".into(),
            ExitEvent::VmShutdown => "VM shut down through the API".into(),
            ExitEvent::ApiReboot => "reboot requested through the API".into(),
            ExitEvent::Error(failure) => failure.to_string(),
        }
    }
}

/// Where exit events are sent.
pub type ExitSender = Sender<ExitEvent>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes() {
        assert_eq!(ExitEvent::PowerOff.exit_code(), 0);
        assert_eq!(ExitEvent::Reset.exit_code(), 0);
        assert_eq!(ExitEvent::ApiShutdown.exit_code(), 0);
        assert_eq!(ExitEvent::ApiReboot.exit_code(), 0);
        assert_eq!(ExitEvent::TripleFault { vcpu: 1 }.exit_code(), 1);
        assert_eq!(ExitEvent::Error(Failure::ChannelClosed).exit_code(), 1);
        assert!(ExitEvent::TripleFault { vcpu: 1 }
            .describe()
            .contains("triple fault"));
    }

    #[test]
    fn failures_read_as_one_line() {
        let internal = ExitEvent::Error(Failure::KvmInternal {
            vcpu: 2,
            suberror: 1,
        });
        assert_eq!(
            internal.describe(),
            "KVM internal error on vCPU 2 (suberror 1); the guest did something KVM cannot emulate"
        );
        let event = Failure::UnknownSystemEvent {
            kind: 9,
            data: vec![1, 2],
            vcpu: 0,
        };
        assert_eq!(
            event.to_string(),
            "unknown KVM system event 9 ([1, 2]) on vCPU 0"
        );
    }
}
