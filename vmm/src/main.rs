//! dmavisor: a KVM virtual machine monitor.

#![allow(dead_code)]

mod devices;
mod error;
mod memory;
mod pci;

fn main() {}
