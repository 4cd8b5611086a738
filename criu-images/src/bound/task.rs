//! Per-task and per-thread state CRIU applies as root that a process could not give itself:
//! resource limits, the audit loginuid, oom_score_adj, the scheduling policy and nice value,
//! and timers on the alarm clocks.

use super::{Check, Host};
use crate::caps;
use crate::proto::{CoreEntry, ThreadCoreEntry};

/// `RLIMIT_*` names by resource number (`asm-generic/resource.h`), as the OCI spec names them.
pub const RLIMITS: [&str; 16] = [
    "RLIMIT_CPU",
    "RLIMIT_FSIZE",
    "RLIMIT_DATA",
    "RLIMIT_STACK",
    "RLIMIT_CORE",
    "RLIMIT_RSS",
    "RLIMIT_NPROC",
    "RLIMIT_NOFILE",
    "RLIMIT_MEMLOCK",
    "RLIMIT_AS",
    "RLIMIT_LOCKS",
    "RLIMIT_SIGPENDING",
    "RLIMIT_MSGQUEUE",
    "RLIMIT_NICE",
    "RLIMIT_RTPRIO",
    "RLIMIT_RTTIME",
];

const RLIM_INFINITY: u64 = u64::MAX;
const CLOCK_REALTIME_ALARM: u32 = 8;
const CLOCK_BOOTTIME_ALARM: u32 = 9;
const SCHED_OTHER: u32 = 0;
const SCHED_BATCH: u32 = 3;
const SCHED_IDLE: u32 = 5;

fn limit(v: u64) -> String {
    if v == RLIM_INFINITY {
        "unlimited".into()
    } else {
        v.to_string()
    }
}

/// Whether `clock` is one of the alarm clocks (they wake a suspended node).
pub fn alarm_clock(clock: u32) -> bool {
    matches!(clock, CLOCK_REALTIME_ALARM | CLOCK_BOOTTIME_ALARM)
}

impl Check<'_> {
    /// The task-wide fields of the main thread's core (`tc`).
    pub(super) fn task_state(&mut self, pid: u32, file: &str, core: &CoreEntry, host: &Host) {
        let Some(tc) = &core.tc else { return };
        let b = self.bound;
        let task = Some(pid);
        if let Some(rl) = &tc.rlimits {
            for (i, r) in rl.rlimits.iter().enumerate() {
                let name = RLIMITS.get(i).copied().unwrap_or("an unknown resource");
                let field = format!("rlimits[{name}]");
                if r.cur > r.max {
                    self.find(
                        task,
                        file,
                        &field,
                        format!(
                            "has a soft limit {} above its hard limit {}, which setrlimit \
                             refuses",
                            limit(r.cur),
                            limit(r.max)
                        ),
                    );
                }
                if b.may(caps::SYS_RESOURCE) {
                    continue;
                }
                // The container's hard limit: the spec's, else what runc and CRIU inherit
                // from the runtime (this process's own).
                let (allowed, from) = match b.rlimits.get(name) {
                    Some(hard) => (*hard, "the spec's process.rlimits"),
                    None => (
                        host.rlimits.get(i).copied().unwrap_or(RLIM_INFINITY),
                        "what the container inherits from the runtime (no process.rlimits \
                         entry in the spec)",
                    ),
                };
                if r.max > allowed {
                    self.find(
                        task,
                        file,
                        &field,
                        format!(
                            "has hard limit {}, above {from}, and the spec's {} lacks \
                             CAP_SYS_RESOURCE to raise it (spec {}, image {})",
                            limit(r.max),
                            b.may_set(caps::SYS_RESOURCE),
                            limit(allowed),
                            limit(r.max)
                        ),
                    );
                }
            }
        }
        if let Some(loginuid) = tc.loginuid {
            if Some(loginuid) != host.loginuid && !b.may(caps::AUDIT_CONTROL) {
                self.find(
                    task,
                    file,
                    "loginuid",
                    format!(
                        "is {loginuid}, not the loginuid a new task of the container inherits \
                         ({}), and the spec's {} lacks CAP_AUDIT_CONTROL to set it (spec {}, \
                         image {loginuid})",
                        host.loginuid.map_or("none".into(), |l| l.to_string()),
                        b.may_set(caps::AUDIT_CONTROL),
                        host.loginuid.map_or("none".into(), |l| l.to_string()),
                    ),
                );
            }
        }
        if let Some(adj) = tc.oom_score_adj {
            let floor = b.oom_score_adj.unwrap_or(host.oom_score_adj);
            if adj < floor && !b.may(caps::SYS_RESOURCE) {
                self.find(
                    task,
                    file,
                    "oom_score_adj",
                    format!(
                        "is {adj}, below the {floor} the container starts with, and the spec's \
                         {} lacks CAP_SYS_RESOURCE to lower it (spec {floor}, image {adj})",
                        b.may_set(caps::SYS_RESOURCE)
                    ),
                );
            }
        }
        if let Some(timers) = &tc.timers {
            for t in &timers.posix {
                if alarm_clock(t.clock_id) && !b.may(caps::WAKE_ALARM) {
                    self.find(
                        task,
                        file,
                        "timers.posix.clock_id",
                        format!(
                            "is an alarm clock ({}), which needs CAP_WAKE_ALARM the spec's {} \
                             lacks",
                            t.clock_id,
                            b.may_set(caps::WAKE_ALARM)
                        ),
                    );
                }
            }
        }
    }

    /// The per-thread scheduling fields.
    pub(super) fn thread_state(&mut self, pid: u32, file: &str, t: &ThreadCoreEntry) {
        let b = self.bound;
        if b.may(caps::SYS_NICE) {
            return;
        }
        if let Some(policy) = t.sched_policy {
            if ![SCHED_OTHER, SCHED_BATCH, SCHED_IDLE].contains(&policy) {
                self.find(
                    Some(pid),
                    file,
                    "sched_policy",
                    format!(
                        "is a real-time policy ({policy}), which needs CAP_SYS_NICE the spec's \
                         {} lacks",
                        b.may_set(caps::SYS_NICE)
                    ),
                );
            }
        }
        if let Some(nice) = t.sched_nice {
            if nice < 0 {
                self.find(
                    Some(pid),
                    file,
                    "sched_nice",
                    format!(
                        "is {nice}, a raised priority, which needs CAP_SYS_NICE the spec's {} \
                         lacks (spec 0, image {nice})",
                        b.may_set(caps::SYS_NICE)
                    ),
                );
            }
        }
    }
}
