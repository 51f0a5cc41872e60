//! Several commands in ONE KVM-environment session.
//!
//! Why: in the nested runner every session boots an L2 kernel under TCG,
//! which costs tens of seconds. Tests therefore describe their guest boots
//! as [`Case`]s, run them all in one session, and each test then inspects
//! its own [`CaseResult`] (typically through a `OnceLock` shared by the
//! tests of one file).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::error::HarnessError;
use crate::markers::{token_value, RUNNER_DIED, VMM_TRIPLE_FAULT};
use crate::runner::{run_script_in_kvm, RunOutput, RunnerOptions};

const BEGIN: &str = "@@CASE-BEGIN";
const END: &str = "@@CASE-END";

/// One command run inside the session, stdout and stderr merged.
#[derive(Debug, Clone)]
pub struct Case {
    /// Name made of `[A-Za-z0-9_-]`, unique in the session.
    pub name: String,
    pub argv: Vec<String>,
    /// Seconds before the case is killed (the session goes on).
    pub timeout_secs: u32,
}

impl Case {
    pub fn new(name: &str, argv: Vec<String>, timeout_secs: u32) -> Self {
        Case {
            name: name.to_string(),
            argv,
            timeout_secs,
        }
    }
}

/// What one case did.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// Exit status (124 when the case's time-out killed it); `None` if the
    /// session ended before the case finished.
    pub exit: Option<i32>,
    /// Wall time inside the KVM environment.
    pub secs: Option<f64>,
    /// Merged stdout/stderr with `\r` removed.
    pub output: String,
}

impl CaseResult {
    /// One line for the test log: exit status, wall time and, when the
    /// output shows one, the crash that ended the case.
    pub fn summary(&self, name: &str) -> String {
        let crash = self.crash().map(|c| format!(" ({c})")).unwrap_or_default();
        format!(
            "case {name}: exit {:?} in {:.2} s{crash}",
            self.exit,
            self.secs.unwrap_or(f64::NAN)
        )
    }

    /// The crash the output reports: a guest triple fault seen by the
    /// VMM, or the nested runner's own kernel dying.
    pub fn crash(&self) -> Option<&'static str> {
        [VMM_TRIPLE_FAULT, RUNNER_DIED]
            .into_iter()
            .find(|m| self.output.contains(m))
    }

    /// The last `lines` lines of the output: a whole boot log is too long
    /// for a failure message, and the end says where the guest stopped.
    pub fn tail(&self, lines: usize) -> String {
        let all: Vec<&str> = self.output.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

/// All results of a session.
#[derive(Debug, Clone)]
pub struct SessionResult {
    pub run: RunOutput,
    pub cases: BTreeMap<String, CaseResult>,
}

impl SessionResult {
    /// The result of `name`, or a description of the whole session when the
    /// case never started (for failure messages).
    pub fn case(&self, name: &str) -> Result<&CaseResult, String> {
        self.cases
            .get(name)
            .ok_or_else(|| format!("case {name} did not run; session: {}", self.run.describe()))
    }
}

/// What a test file runs in its session.
#[derive(Debug, Default)]
pub struct Plan {
    pub cases: Vec<Case>,
    /// Why the dmavisor cases are missing when the binary could not be
    /// built: the reference cases still run, and the dmavisor tests fail
    /// with this reason instead of "did not run".
    pub vmm_error: Option<String>,
}

impl From<Vec<Case>> for Plan {
    fn from(cases: Vec<Case>) -> Self {
        Plan {
            cases,
            vmm_error: None,
        }
    }
}

/// The session of one test file: run once (keep it in a `OnceLock`), then
/// each test looks up its own case. Why: every guest-booting test file
/// needs this run-once-and-look-up step and the same failure messages.
#[derive(Debug)]
pub struct SharedSession {
    /// Session name, also used in failure messages.
    pub name: String,
    /// The session, or why it did not run (preparing it failed, or the
    /// runner did).
    pub result: Result<SessionResult, String>,
    /// See [`Plan::vmm_error`].
    pub vmm_error: Option<String>,
}

impl SharedSession {
    /// Runs the cases `prepare` plans (images, initramfs, binaries) in one
    /// session bounded by `timeout`; an error of `prepare` becomes the
    /// session's error, so every test reports it.
    pub fn run(
        name: &str,
        timeout: Duration,
        prepare: impl FnOnce() -> Result<Plan, String>,
    ) -> Self {
        Self::run_in(name, timeout, &RunnerOptions::default(), prepare)
    }

    /// [`run`](Self::run) in a runner that gives the cases a NIC bound to
    /// vfio-pci (`run-kvm --assign-nic`; its BDF and peer address are in
    /// DMAVISOR_ASSIGN_BDF and DMAVISOR_ASSIGN_PEER).
    pub fn run_with_assigned_nic(
        name: &str,
        timeout: Duration,
        prepare: impl FnOnce() -> Result<Plan, String>,
    ) -> Self {
        let opts = RunnerOptions {
            assign_nic: true,
            ..RunnerOptions::default()
        };
        Self::run_in(name, timeout, &opts, prepare)
    }

    fn run_in(
        name: &str,
        timeout: Duration,
        runner: &RunnerOptions,
        prepare: impl FnOnce() -> Result<Plan, String>,
    ) -> Self {
        match prepare() {
            Ok(mut plan) => SharedSession {
                name: name.to_string(),
                result: {
                    if let Ok(only) = std::env::var(CASES_ENV) {
                        plan.cases = select_cases(plan.cases, &only);
                    }
                    run_session(name, &plan.cases, timeout, runner).map_err(|e| e.to_string())
                },
                vmm_error: plan.vmm_error,
            },
            Err(e) => SharedSession {
                name: name.to_string(),
                result: Err(e),
                vmm_error: None,
            },
        }
    }

    /// The result of case `name`, or why it has none: dmavisor could not be
    /// built (for the cases whose name contains `dmavisor`), the session
    /// failed, or the case never started.
    pub fn case(&self, name: &str) -> Result<&CaseResult, String> {
        if let (Some(e), true) = (&self.vmm_error, name.contains("dmavisor")) {
            return Err(format!("dmavisor could not be built: {e}"));
        }
        match &self.result {
            Ok(sess) => sess.case(name),
            Err(e) => Err(format!("{} session failed: {e}", self.name)),
        }
    }
}

/// `DMAVISOR_CASES=name,...`: a developer's shortcut that boots only the
/// named cases of a session (a test whose case did not run fails with
/// "did not run"); combine with cargo's test-name filter.
pub const CASES_ENV: &str = "DMAVISOR_CASES";

/// The cases whose names are in the comma-separated `only`.
fn select_cases(cases: Vec<Case>, only: &str) -> Vec<Case> {
    let wanted: Vec<&str> = only.split(',').map(str::trim).collect();
    cases
        .into_iter()
        .filter(|c| wanted.contains(&c.name.as_str()))
        .collect()
}

/// Single-quotes `s` for POSIX sh.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// The POSIX shell script that runs `cases` one after the other. A case
/// runs once: a guest that crashes or stalls fails its test.
pub fn session_script(cases: &[Case]) -> String {
    let mut s = String::from("#!/bin/sh\n# generated by integration-tests session.rs\n");
    for c in cases {
        let argv: Vec<String> = c.argv.iter().map(|a| sh_quote(a)).collect();
        s.push_str(&format!(
            "echo '{BEGIN} {name}'\nt0=$(date +%s%N)\n\
             timeout -k 5 {t} {cmd} </dev/null 2>&1\nrc=$?\n\
             t1=$(date +%s%N)\necho \"{END} {name} rc=$rc ns=$((t1 - t0))\"\n",
            name = c.name,
            t = c.timeout_secs,
            cmd = argv.join(" "),
        ));
    }
    s
}

/// Splits session stdout into per-case results.
pub fn parse_session(stdout: &str) -> BTreeMap<String, CaseResult> {
    let mut cases = BTreeMap::new();
    let mut current: Option<(String, String)> = None;
    for raw in stdout.lines() {
        let line = raw.trim_end_matches('\r');
        if let Some(name) = line.strip_prefix(BEGIN).map(str::trim) {
            if let Some((n, out)) = current.take() {
                cases.insert(n, unfinished(out));
            }
            current = Some((name.to_string(), String::new()));
        } else if let Some(rest) = line.strip_prefix(END) {
            let name = rest.split_whitespace().next().unwrap_or_default();
            if let Some((n, out)) = current.take() {
                let exit = token_value(rest, "rc").and_then(|v| v.parse().ok());
                let secs = token_value(rest, "ns")
                    .and_then(|v| v.parse::<f64>().ok())
                    .map(|ns| ns / 1e9);
                let key = if n == name { n } else { name.to_string() };
                cases.insert(
                    key,
                    CaseResult {
                        exit,
                        secs,
                        output: out,
                    },
                );
            }
        } else if let Some((_, out)) = current.as_mut() {
            out.push_str(&line.replace('\r', ""));
            out.push('\n');
        }
    }
    if let Some((n, out)) = current.take() {
        cases.insert(n, unfinished(out));
    }
    cases
}

fn unfinished(output: String) -> CaseResult {
    CaseResult {
        exit: None,
        secs: None,
        output,
    }
}

/// Runs `cases` in one KVM-environment session bounded by `timeout`. It
/// runs once: a runner that dies fails every case it had not finished.
pub fn run_session(
    name: &str,
    cases: &[Case],
    timeout: Duration,
    runner: &RunnerOptions,
) -> Result<SessionResult, HarnessError> {
    let run = run_script_in_kvm(name, &session_script(cases), timeout, runner)?;
    let cases = parse_session(&run.stdout);
    Ok(SessionResult { run, cases })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_round_trips_through_parser() {
        let cases = vec![
            Case::new("a", vec!["echo".into(), "it's".into()], 5),
            Case::new("b", vec!["false".into()], 5),
        ];
        let script = session_script(&cases);
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        let parsed = parse_session(&String::from_utf8_lossy(&out.stdout));
        assert_eq!(parsed["a"].exit, Some(0));
        assert_eq!(parsed["a"].output, "it's\n");
        assert_eq!(parsed["b"].exit, Some(1));
        assert!(parsed["b"].secs.unwrap() >= 0.0);
    }

    fn shared(result: Result<SessionResult, String>, vmm_error: Option<&str>) -> SharedSession {
        SharedSession {
            name: "boot".into(),
            result,
            vmm_error: vmm_error.map(String::from),
        }
    }

    #[test]
    fn shared_session_says_why_a_case_is_missing() {
        let run = RunOutput {
            status: Some(0),
            stdout: String::new(),
            stderr: String::new(),
            elapsed: Duration::ZERO,
        };
        let cases = parse_session("@@CASE-BEGIN qemu_x\nok\n@@CASE-END qemu_x rc=0 ns=5\n");
        let ok = shared(Ok(SessionResult { run, cases }), Some("no cargo"));
        assert_eq!(ok.case("qemu_x").map(|r| r.exit), Ok(Some(0)));
        assert_eq!(
            ok.case("net_dmavisor").map(|r| r.exit),
            Err("dmavisor could not be built: no cargo".into())
        );
        let missing = ok.case("qemu_y").map(|r| r.exit).unwrap_err();
        assert!(missing.starts_with("case qemu_y did not run"), "{missing}");
        let failed = shared(Err("no images".into()), None);
        assert_eq!(
            failed.case("qemu_x").map(|r| r.exit),
            Err("boot session failed: no images".into())
        );
    }

    #[test]
    fn summary_and_tail() {
        let r = CaseResult {
            exit: Some(1),
            secs: Some(2.5),
            output: "a\nb\nc\n".into(),
        };
        assert_eq!(r.summary("x"), "case x: exit Some(1) in 2.50 s");
        let crashed = CaseResult {
            output: "dmavisor: guest triple fault on vCPU 0\n".into(),
            ..r.clone()
        };
        assert_eq!(
            crashed.summary("x"),
            "case x: exit Some(1) in 2.50 s (guest triple fault)"
        );
        assert_eq!(r.tail(2), "b\nc");
        assert_eq!(r.tail(9), "a\nb\nc");
        assert_eq!(r.tail(0), "");
    }

    #[test]
    fn unfinished_case_has_no_exit() {
        let parsed = parse_session("@@CASE-BEGIN x\r\nhello\r\n");
        assert_eq!(parsed["x"].exit, None);
        assert_eq!(parsed["x"].output, "hello\n");
    }
}
