//! The command line and the REST API's `VmConfig` JSON agree: a VM built
//! from flags, printed as `vm.info` prints it and fed back to `vm.create`,
//! is the same VM, with cloud-hypervisor's field names. A module of its own
//! because it needs both `crate::cli` and `crate::api`, which import
//! neither each other.

use clap::Parser;
use serde_json::{json, Value};

use crate::api::vm_config::{parse, to_json};
use crate::cli::Cli;
use crate::config::VmConfig;

fn cli_config(args: &[&str]) -> VmConfig {
    let mut argv = vec!["dmavisor", "--kernel", "/k"];
    argv.extend_from_slice(args);
    Cli::try_parse_from(argv)
        .expect("command line")
        .to_config()
        .expect("valid")
        .expect("a VM")
}

/// Everything dmavisor can configure, off its defaults.
fn full() -> VmConfig {
    cli_config(&[
        "--initramfs",
        "/i.cpio.gz",
        "--cmdline",
        "console=ttyS0 quiet",
        "--cpus",
        "boot=2,max=4",
        "--memory",
        "size=1G,thp=off,shared=on",
        "--serial",
        "file=/tmp/serial.log",
        "--net",
        "tap=t0,mac=52:54:00:00:00:01,ip=192.168.249.1,mask=255.255.255.0,num_queues=4,queue_size=512,iommu=on",
        "--net",
        "vhost_user=on,socket=/run/vu.sock,vhost_mode=server",
        "--disk",
        "path=/img/d.raw,readonly=on,num_queues=2,queue_size=64,id=disk0,iommu=on",
        "--disk",
        "path=/img/e.raw",
        "--iommu",
        "impl=baseline,bypass=on,queues=2,requests=inline",
        "--dma-test",
        "iommu=on",
        "--dma-test",
        "--device",
        "path=/sys/bus/pci/devices/0000:00:03.0,iommu=on,id=nic0",
        "--device",
        "path=/sys/bus/pci/devices/0000:00:04.0",
    ])
}

#[test]
fn vm_info_config_fed_to_vm_create_gives_the_same_config() {
    for c in [
        full(),
        cli_config(&[]),
        cli_config(&["--iommu", "--serial", "off"]),
    ] {
        let text = to_json(&c).to_string();
        let back = parse(text.as_bytes()).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(back, c, "{text}");
        // And printing it again gives the same text.
        assert_eq!(to_json(&back).to_string(), text);
    }
}

#[test]
fn prints_cloud_hypervisor_field_names_and_units() {
    let c = to_json(&full());
    assert_eq!(c["cpus"], json!({ "boot_vcpus": 2, "max_vcpus": 4 }));
    assert_eq!(c["memory"]["size"], json!(1u64 << 30));
    assert_eq!(c["memory"]["shared"], json!(true));
    assert_eq!(c["payload"]["kernel"], json!("/k"));
    assert_eq!(c["payload"]["initramfs"], json!("/i.cpio.gz"));
    assert_eq!(
        c["serial"],
        json!({ "mode": "File", "file": "/tmp/serial.log" })
    );
    assert_eq!(c["console"], json!({ "mode": "Off" }));
    assert_eq!(c["net"][0]["mac"], json!("52:54:00:00:00:01"));
    assert_eq!(c["net"][1]["vhost_socket"], json!("/run/vu.sock"));
    assert_eq!(c["net"][1]["vhost_mode"], json!("Server"));
    assert_eq!(c["disks"][0]["id"], json!("disk0"));
    assert_eq!(c["disks"][1]["queue_size"], json!(128));
    assert_eq!(c["devices"][1]["id"], Value::Null);
    assert_eq!(c["iommu"], json!(true));
    assert_eq!(c["iommu_config"]["impl"], json!("baseline"));
    assert_eq!(
        c["dma_test"],
        json!([{ "iommu": true }, { "iommu": false }])
    );
}
