//! Issue 13: the guest benchmark harness (`resources/bench-guest`).
//!
//! The harness runs its own runner session (one case per guest boot, the
//! same session format as `session.rs`), so this group runs it as a
//! command: `--quick` against dmavisor and QEMU (1 vCPU, no IOMMU on the
//! 6.1 guest, the vviommu driver's magazine policy lazy and strict, Linux's
//! in-tree driver lazy: three guest boots per VMM; one run of each
//! workload, 1 s transfers, 200 DMA iterations), then checks what it
//! wrote: JSON lines that parse, every planned configuration exactly once
//! with figures for every workload it promises, a report with the ratio
//! columns, and non-empty plots.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use integration_tests::paths::{build_dir, resource};
use serde_json::Value;

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn run_quick() -> (PathBuf, std::process::Output) {
    let out = build_dir().join("bench").join("test-quick");
    let _ = std::fs::remove_dir_all(&out);
    let res = Command::new(resource("bench-guest"))
        .arg("--quick")
        .arg("--out")
        .arg(&out)
        .output()
        .expect("cannot run resources/bench-guest");
    (out, res)
}

#[test]
fn bench_guest_quick_produces_report() {
    let (dir, res) = run_quick();
    let stderr = String::from_utf8_lossy(&res.stderr);
    let stdout = String::from_utf8_lossy(&res.stdout);
    let session = std::fs::read_to_string(dir.join("session.log")).unwrap_or_default();
    let tail: Vec<&str> = session.lines().rev().take(60).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    assert!(
        res.status.success(),
        "bench-guest --quick failed ({}):\n{stdout}\n{stderr}\nsession tail:\n{}",
        res.status,
        tail.join("\n")
    );

    // the plan: dmavisor and QEMU, each with every kind of configuration
    let plan: Value = serde_json::from_str(&read(&dir.join("plan.json"))).expect("plan.json");
    let planned: Vec<String> = plan["configurations"]
        .as_array()
        .expect("configurations")
        .iter()
        .map(|v| v.as_str().expect("id").to_string())
        .collect();
    for vmm in ["dmavisor", "qemu"] {
        for iommu in [
            "off-6.1",
            "linux-lazy",
            "vvi-magazine-lazy-percpu",
            "vvi-magazine-strict",
        ] {
            let id = format!("{vmm}/1cpu/{iommu}");
            assert!(planned.contains(&id), "{id} not planned: {planned:?}");
        }
    }

    // every configuration exactly once, complete
    let mut seen: BTreeMap<String, Value> = BTreeMap::new();
    for line in read(&dir.join("results.jsonl")).lines() {
        let rec: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let id = rec["id"].as_str().expect("id").to_string();
        assert!(seen.insert(id.clone(), rec).is_none(), "{id} twice");
    }
    let ids: Vec<&String> = seen.keys().collect();
    let mut want: Vec<&String> = planned.iter().collect();
    want.sort();
    assert_eq!(
        ids, want,
        "results.jsonl does not hold the planned configurations"
    );
    for (id, rec) in &seen {
        assert_eq!(rec["status"], "ok", "{id}: {rec}");
        for w in rec["expected_workloads"]
            .as_array()
            .expect("expected_workloads")
        {
            let w = w.as_str().unwrap();
            let runs = rec["workloads"][w].as_array().expect("runs");
            assert_eq!(runs.len(), 1, "{id} {w}: {runs:?}");
            let v = runs[0]["value"].as_f64().unwrap();
            assert!(v > 0.0 && v.is_finite(), "{id} {w}: {v}");
        }
        // the DMA microbenchmark runs wherever the 6.1 guest's helper can
        if id.ends_with("-6.1") || id.contains("/vvi-") {
            assert!(
                !rec["workloads"]["dma"].as_array().unwrap().is_empty(),
                "{id}: no DMA"
            );
        }
        // vviommu counts its requests: at least one MAP and one UNMAP
        // per DMA under strict invalidation, fewer when batched
        if id.ends_with("vvi-magazine-strict") {
            let rpd = rec["requests_per_dma"].as_f64().expect("requests_per_dma");
            assert!(rpd >= 1.0, "{id}: {rpd} requests per DMA under strict");
        }
    }

    // the report: ratio and comparison columns, the headline, every id
    let report = read(&dir.join("report.md"));
    for needle in [
        "ratio to no IOMMU",
        "vs QEMU (same config)",
        "requests per DMA",
        "min–max",
        "Headline",
    ] {
        assert!(report.contains(needle), "report.md lacks {needle:?}");
    }
    for id in &planned {
        assert!(report.contains(&format!("`{id}`")), "report.md lacks {id}");
    }
    for png in [
        "throughput.png",
        "latency.png",
        "dma.png",
        "requests_per_dma.png",
    ] {
        let bytes = std::fs::read(dir.join(png)).unwrap_or_default();
        assert!(
            bytes.len() > 1000 && bytes.starts_with(b"\x89PNG"),
            "{png}: {} bytes",
            bytes.len()
        );
    }
}
