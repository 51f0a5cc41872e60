//! dmavisor's VMM as a library: the binary (`main.rs`) is a thin CLI over
//! [`vm::start`] and the REST API's [`api::controller`]; devices (PCI, virtio) plug in through [`pci`] and
//! [`devices::bus`].

#![deny(missing_docs)]

pub mod acpi;
pub mod api;
pub mod api_socket;
#[cfg(test)]
mod avail_jump_tests;
pub mod block;
pub mod boot;
pub mod cli;
#[cfg(test)]
mod cli_api_tests;
pub mod config;
pub mod console;
pub mod devices;
pub mod dma;
pub mod dma_test;
pub mod error;
pub mod event_monitor;
pub mod exit;
pub mod interrupt;
pub mod kvm_check;
pub mod log_limit;
pub mod memory;
pub mod net;
pub mod net_devices;
pub mod options;
pub mod panic_exit;
pub mod pci;
pub mod resources;
pub mod sandbox;
pub mod sandbox_rules;
pub mod vcpu;
pub mod vcpu_control;
pub mod vfio;
pub mod vhost_user;
pub mod virtio;
pub mod virtio_hotplug;
pub mod vm;
pub mod vm_owner;
pub mod width;
