//! Hardware smoke test of the driver-managed engine on a real GPU, without
//! CRIU: the "dump" is a pause. Runs `gpu_hold` (built beside this binary),
//! then through gpusnap's binding and orchestrator:
//! 1. capabilities and what the driver answers for non-CUDA pids;
//! 2. discovery;
//! 3. checkpoint with leave-running (lock → checkpoint → pause → restore → unlock);
//! 4. checkpoint without leave-running, then `Orchestrator::restore`;
//!
//! and finally checks that the workload verified its memory. Prints one JSON
//! document; exit status 0 means every step worked.
//!
//! Usage: `h200_smoke [MIB] [OUT_JSON]`.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gpusnap_cuda::discovery::{find_cuda_processes, DiscoveryOptions};
use gpusnap_cuda::driver::{Driver, DriverConfig, ProcessState};
use gpusnap_cuda::orchestrate::{GpuMap, Orchestrator, OrchestratorOptions, RestoreTarget};
use serde_json::json;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mib: u64 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(1024);
    let out = args.get(2).cloned();
    let mut summary = serde_json::Map::new();
    let ok = run(mib, &mut summary);
    summary.insert("ok".into(), json!(ok));
    let text = serde_json::to_string_pretty(&summary).unwrap();
    println!("{text}");
    if let Some(path) = out {
        std::fs::write(path, &text).unwrap();
    }
    std::process::exit(if ok { 0 } else { 1 });
}

fn run(mib: u64, summary: &mut serde_json::Map<String, serde_json::Value>) -> bool {
    let started = Instant::now();
    let driver = match Driver::load(&DriverConfig::default()) {
        Ok(d) => Arc::new(d),
        Err(e) => {
            summary.insert("load_error".into(), json!(e.to_string()));
            return false;
        }
    };
    summary.insert(
        "load_ms".into(),
        json!(started.elapsed().as_secs_f64() * 1e3),
    );
    summary.insert(
        "capabilities".into(),
        serde_json::to_value(driver.capabilities()).unwrap(),
    );

    // What does the real driver answer for processes without CUDA?
    let me = std::process::id() as i32;
    let probe = |pid: i32| {
        json!({
            "restore_tid": driver.restore_thread_id(pid).map_err(|e| e.to_string()),
            "state": driver.process_state(pid).map(|s| s.to_string()).map_err(|e| e.to_string()),
        })
    };
    summary.insert("non_cuda_self".into(), probe(me));
    summary.insert("non_cuda_pid1".into(), probe(1));
    summary.insert("no_such_pid".into(), probe(4_000_000));

    let hold = std::env::current_exe().unwrap().with_file_name("gpu_hold");
    let mut child = Command::new(hold)
        .args([mib.to_string(), "40".into()])
        .stdout(Stdio::piped())
        .spawn()
        .expect("start gpu_hold");
    let pid = child.id() as i32;
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.next().and_then(Result::ok).unwrap_or_default();
    summary.insert("workload_ready".into(), json!(ready));

    // `me` is a CUDA process to the driver too (it called cuInit); discovery
    // must leave it out.
    let found = find_cuda_processes(
        &driver,
        &[me, 1, pid, 4_000_000],
        &DiscoveryOptions::default(),
    );
    let processes = match found {
        Ok(p) => p,
        Err(e) => {
            summary.insert("discovery_error".into(), json!(e.to_string()));
            let _ = child.kill();
            let _ = child.wait();
            return false;
        }
    };
    summary.insert(
        "discovered".into(),
        serde_json::to_value(&processes).unwrap(),
    );
    let mut ok = processes.len() == 1 && processes[0].host_pid == pid;

    let options = OrchestratorOptions {
        lock_timeout: Duration::from_secs(10),
        ..OrchestratorOptions::default()
    };
    let orchestrator = Orchestrator::driver_managed(Arc::clone(&driver), options);

    // 3. leave-running
    let state_in_dump = std::cell::RefCell::new(None);
    let result = orchestrator.checkpoint(&processes, true, || {
        let t = Instant::now();
        let state = driver.process_state(pid);
        *state_in_dump.borrow_mut() = Some((format!("{state:?}"), t.elapsed().as_secs_f64() * 1e3));
        std::thread::sleep(Duration::from_millis(500));
        Ok::<_, std::io::Error>(())
    });
    let (state, get_state_ms) = state_in_dump.borrow().clone().unwrap_or_default();
    summary.insert("leave_running_state_during_dump".into(), json!(state));
    summary.insert("get_state_ms".into(), json!(get_state_ms));
    match result {
        Ok(report) => {
            summary.insert(
                "leave_running_report".into(),
                serde_json::to_value(&report).unwrap(),
            );
            ok &= state.contains("Checkpointed");
        }
        Err(e) => {
            summary.insert("leave_running_error".into(), json!(e.to_string()));
            ok = false;
        }
    }
    let after = driver.process_state(pid).map_err(|e| e.to_string());
    ok &= after == Ok(ProcessState::Running);
    summary.insert(
        "state_after_leave_running".into(),
        json!(format!("{after:?}")),
    );

    // 3b. a failing "dump" must roll back to running.
    if ok {
        match orchestrator.checkpoint(&processes, false, || {
            Err(std::io::Error::other("simulated CRIU dump failure"))
        }) {
            Ok(_) => ok = false,
            Err(e) => {
                ok &= e.outcome == gpusnap_cuda::Outcome::RolledBack;
                summary.insert("dump_failure_error".into(), json!(e.to_string()));
            }
        }
        let state = driver.process_state(pid).map_err(|e| e.to_string());
        ok &= state == Ok(ProcessState::Running);
        summary.insert("state_after_rollback".into(), json!(format!("{state:?}")));
    }

    // 4. checkpoint, then restore as a separate step (no CRIU in between).
    if ok {
        match orchestrator.checkpoint(&processes, false, || Ok::<_, std::io::Error>(())) {
            Ok(report) => {
                summary.insert("stop_report".into(), serde_json::to_value(&report).unwrap());
                let checkpointed = driver.process_state(pid).map_err(|e| e.to_string());
                ok &= checkpointed == Ok(ProcessState::Checkpointed);
                std::thread::sleep(Duration::from_millis(500));
                let targets: Vec<RestoreTarget> = report
                    .processes
                    .iter()
                    .map(|r| RestoreTarget {
                        record: r.clone(),
                        host_pid: r.host_pid,
                    })
                    .collect();
                match orchestrator.restore(&targets, &GpuMap::new()) {
                    Ok(report) => {
                        summary.insert(
                            "restore_report".into(),
                            serde_json::to_value(&report).unwrap(),
                        );
                    }
                    Err(e) => {
                        summary.insert("restore_error".into(), json!(e.to_string()));
                        ok = false;
                    }
                }
            }
            Err(e) => {
                summary.insert("stop_error".into(), json!(e.to_string()));
                ok = false;
            }
        }
    }
    let final_state = driver.process_state(pid).map_err(|e| e.to_string());
    summary.insert("final_state".into(), json!(format!("{final_state:?}")));
    ok &= final_state == Ok(ProcessState::Running);

    let status = child.wait().expect("wait gpu_hold");
    let done: Vec<String> = lines.map_while(Result::ok).collect();
    summary.insert("workload_exit".into(), json!(status.code()));
    summary.insert("workload_output".into(), json!(done));
    ok && status.success()
}
