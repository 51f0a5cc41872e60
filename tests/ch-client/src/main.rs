//! `ch-client-call SOCKET COMMAND [JSON]`: one request to a VMM's REST API
//! made by `cloud-hypervisor-client`, the crates.io client generated from
//! cloud-hypervisor's OpenAPI description. The tests' scripts chain calls
//! (`tests/integration/guest/ch-client-host.sh`); what matters is that a
//! client nobody here wrote can parse every answer dmavisor gives.
//!
//! WHY one call per process instead of a scripted flow in Rust: the steps
//! in between (waiting for the guest to see a device, checking the serial
//! log) are shell work, and a failing step then names itself.
//!
//! Prints `CH-CLIENT COMMAND ok BODY` (BODY: the parsed answer as JSON, or
//! `-`) and exits 0, or `CH-CLIENT COMMAND err ERROR` and exits 1; a usage
//! error exits 2.

use std::process::ExitCode;

use cloud_hypervisor_client::apis::DefaultApi;
use cloud_hypervisor_client::models;
use cloud_hypervisor_client::socket_based_api_client;
use serde_json::Value;

const USAGE: &str = "usage: ch-client-call SOCKET COMMAND [JSON]\n\
commands: ping info counters create JSON boot pause resume reboot shutdown delete \
power-button vmm-shutdown add-device JSON add-net JSON add-disk JSON remove-device ID";

/// What a call returned, printed as JSON.
type Answer = Result<Option<Value>, String>;

fn to_value<T: serde::Serialize>(v: &T) -> Answer {
    serde_json::to_value(v)
        .map(Some)
        .map_err(|e| format!("re-encoding the answer: {e}"))
}

fn parse<T: serde::de::DeserializeOwned>(json: Option<&str>) -> Result<T, String> {
    let text = json.ok_or("this command needs a JSON argument")?;
    serde_json::from_str(text).map_err(|e| format!("the JSON argument: {e}"))
}

fn unit(r: Result<(), impl std::fmt::Debug>) -> Answer {
    r.map(|()| None).map_err(|e| format!("{e:?}"))
}

async fn call(socket: &str, command: &str, json: Option<&str>) -> Answer {
    let c = socket_based_api_client(socket);
    let dbg = |e: cloud_hypervisor_client::apis::Error| format!("{e:?}");
    match command {
        "ping" => to_value(&c.vmm_ping_get().await.map_err(dbg)?),
        "info" => to_value(&c.vm_info_get().await.map_err(dbg)?),
        "counters" => to_value(&c.vm_counters_get().await.map_err(dbg)?),
        "create" => unit(c.create_vm(parse::<models::VmConfig>(json)?).await),
        "boot" => unit(c.boot_vm().await),
        "pause" => unit(c.pause_vm().await),
        "resume" => unit(c.resume_vm().await),
        "reboot" => unit(c.reboot_vm().await),
        "shutdown" => unit(c.shutdown_vm().await),
        "delete" => unit(c.delete_vm().await),
        "power-button" => unit(c.power_button_vm().await),
        "vmm-shutdown" => unit(c.shutdown_vmm().await),
        "add-device" => to_value(
            &c.vm_add_device_put(parse::<models::DeviceConfig>(json)?)
                .await
                .map_err(dbg)?,
        ),
        "add-net" => to_value(
            &c.vm_add_net_put(parse::<models::NetConfig>(json)?)
                .await
                .map_err(dbg)?,
        ),
        "add-disk" => to_value(
            &c.vm_add_disk_put(parse::<models::DiskConfig>(json)?)
                .await
                .map_err(dbg)?,
        ),
        "remove-device" => {
            let id = json.ok_or("remove-device needs an ID")?.to_string();
            let body = models::VmRemoveDevice { id: Some(id) };
            unit(c.vm_remove_device_put(body).await)
        }
        other => Err(format!("unknown command {other}\n{USAGE}")),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(socket), Some(command)) = (args.first(), args.get(1)) else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    match call(socket, command, args.get(2).map(String::as_str)).await {
        Ok(body) => {
            let body = body.map_or_else(|| "-".to_string(), |v| v.to_string());
            println!("CH-CLIENT {command} ok {body}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // One line: the scripts grep for it.
            println!("CH-CLIENT {command} err {}", e.replace('\n', " "));
            ExitCode::FAILURE
        }
    }
}
