//! Task metrics from the container's cgroup (v1 or v2), in the types containerd decodes
//! (`io.containerd.cgroups.v1.Metrics` / `io.containerd.cgroups.v2.Metrics`).
//!
//! On cgroup v1 the CPU and memory details are read here from cpuacct and memory.stat: the
//! shim crate's v1 collector reads v2 key names for CPU and fills only a few memory fields.

use std::path::PathBuf;

use containerd_shim::{
    cgroup::{collect_metrics, collect_metrics_v2, get_cgroup},
    protos::{
        cgroups::metrics::{CPUUsage, MemoryEntry, MemoryStat, Metrics},
        protobuf::{well_known_types::any::Any, MessageField},
    },
    util::convert_to_any,
};

pub fn collect(pid: u32) -> Result<Any, String> {
    let cgroup = get_cgroup(pid).map_err(|e| format!("find cgroup of pid {pid}: {e}"))?;
    let any = if cgroup.v2() {
        let m =
            collect_metrics_v2(&cgroup).map_err(|e| format!("collect cgroup v2 metrics: {e}"))?;
        convert_to_any(Box::new(m))
    } else {
        let mut m =
            collect_metrics(&cgroup).map_err(|e| format!("collect cgroup v1 metrics: {e}"))?;
        fill_v1(pid, &mut m);
        convert_to_any(Box::new(m))
    };
    any.map_err(|e| format!("encode metrics: {e}"))
}

/// The directory of `pid`'s cgroup for a v1 controller, e.g. `cpuacct` or `memory`.
pub fn v1_controller_dir(pid: u32, controller: &str) -> Option<PathBuf> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        if controllers.split(',').any(|c| c == controller) {
            let path = path.trim_start_matches('/');
            for mount in [controller.to_string(), controllers.to_string()] {
                let dir = PathBuf::from("/sys/fs/cgroup").join(mount).join(path);
                if dir.is_dir() {
                    return Some(dir);
                }
            }
        }
    }
    None
}

fn read_u64(dir: &std::path::Path, file: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()
}

fn fill_v1(pid: u32, m: &mut Metrics) {
    if let Some(dir) = v1_controller_dir(pid, "cpuacct") {
        let mut usage = CPUUsage::new();
        usage.set_total(read_u64(&dir, "cpuacct.usage").unwrap_or_default());
        if let Ok(per_cpu) = std::fs::read_to_string(dir.join("cpuacct.usage_percpu")) {
            usage.set_per_cpu(
                per_cpu
                    .split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect(),
            );
        }
        // cpuacct.stat is in USER_HZ ticks; containerd reports nanoseconds.
        let tick_ns = 1_000_000_000 / clock_ticks();
        if let Ok(stat) = std::fs::read_to_string(dir.join("cpuacct.stat")) {
            for line in stat.lines() {
                match line.split_once(' ') {
                    Some(("user", v)) => {
                        usage.set_user(v.trim().parse::<u64>().unwrap_or_default() * tick_ns)
                    }
                    Some(("system", v)) => {
                        usage.set_kernel(v.trim().parse::<u64>().unwrap_or_default() * tick_ns)
                    }
                    _ => {}
                }
            }
        }
        let mut cpu = m.cpu.take().unwrap_or_default();
        cpu.usage = MessageField::some(usage);
        m.cpu = MessageField::some(cpu);
    }
    if let Some(dir) = v1_controller_dir(pid, "memory") {
        let mut mem = m.memory.take().unwrap_or_default();
        let entry = |prefix: &str| {
            let mut e = MemoryEntry::new();
            e.set_usage(read_u64(&dir, &format!("{prefix}.usage_in_bytes")).unwrap_or_default());
            e.set_max(read_u64(&dir, &format!("{prefix}.max_usage_in_bytes")).unwrap_or_default());
            e.set_limit(read_u64(&dir, &format!("{prefix}.limit_in_bytes")).unwrap_or_default());
            e.set_failcnt(read_u64(&dir, &format!("{prefix}.failcnt")).unwrap_or_default());
            e
        };
        mem.usage = MessageField::some(entry("memory"));
        mem.kernel = MessageField::some(entry("memory.kmem"));
        if let Ok(stat) = std::fs::read_to_string(dir.join("memory.stat")) {
            for line in stat.lines() {
                let Some((key, value)) = line.split_once(' ') else {
                    continue;
                };
                let Ok(v) = value.trim().parse::<u64>() else {
                    continue;
                };
                let set: Option<fn(&mut MemoryStat, u64)> = match key {
                    "cache" => Some(MemoryStat::set_cache),
                    "rss" => Some(MemoryStat::set_rss),
                    "rss_huge" => Some(MemoryStat::set_rss_huge),
                    "mapped_file" => Some(MemoryStat::set_mapped_file),
                    "dirty" => Some(MemoryStat::set_dirty),
                    "writeback" => Some(MemoryStat::set_writeback),
                    "pgpgin" => Some(MemoryStat::set_pg_pg_in),
                    "pgpgout" => Some(MemoryStat::set_pg_pg_out),
                    "pgfault" => Some(MemoryStat::set_pg_fault),
                    "pgmajfault" => Some(MemoryStat::set_pg_maj_fault),
                    "inactive_anon" => Some(MemoryStat::set_inactive_anon),
                    "active_anon" => Some(MemoryStat::set_active_anon),
                    "inactive_file" => Some(MemoryStat::set_inactive_file),
                    "active_file" => Some(MemoryStat::set_active_file),
                    "unevictable" => Some(MemoryStat::set_unevictable),
                    "hierarchical_memory_limit" => Some(MemoryStat::set_hierarchical_memory_limit),
                    "hierarchical_memsw_limit" => Some(MemoryStat::set_hierarchical_swap_limit),
                    "total_cache" => Some(MemoryStat::set_total_cache),
                    "total_rss" => Some(MemoryStat::set_total_rss),
                    "total_rss_huge" => Some(MemoryStat::set_total_rss_huge),
                    "total_mapped_file" => Some(MemoryStat::set_total_mapped_file),
                    "total_dirty" => Some(MemoryStat::set_total_dirty),
                    "total_writeback" => Some(MemoryStat::set_total_writeback),
                    "total_pgpgin" => Some(MemoryStat::set_total_pg_pg_in),
                    "total_pgpgout" => Some(MemoryStat::set_total_pg_pg_out),
                    "total_pgfault" => Some(MemoryStat::set_total_pg_fault),
                    "total_pgmajfault" => Some(MemoryStat::set_total_pg_maj_fault),
                    "total_inactive_anon" => Some(MemoryStat::set_total_inactive_anon),
                    "total_active_anon" => Some(MemoryStat::set_total_active_anon),
                    "total_inactive_file" => Some(MemoryStat::set_total_inactive_file),
                    "total_active_file" => Some(MemoryStat::set_total_active_file),
                    "total_unevictable" => Some(MemoryStat::set_total_unevictable),
                    _ => None,
                };
                if let Some(set) = set {
                    set(&mut mem, v);
                }
            }
        }
        m.memory = MessageField::some(mem);
    }
}

fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if hz > 0 {
        hz as u64
    } else {
        100
    }
}

/// Every pid in the cgroup of `init_pid` (and its sub-cgroups), read from cgroupfs: cheaper
/// than a `runc ps` on the checkpoint's critical path.
pub fn cgroup_pids(init_pid: u32) -> Option<Vec<u32>> {
    let dir = v1_controller_dir(init_pid, "pids")
        .or_else(|| v1_controller_dir(init_pid, "freezer"))
        .or_else(|| containerd_shim::cgroup::get_cgroups_v2_path_by_pid(init_pid).ok())?;
    let mut pids = Vec::new();
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        let text = std::fs::read_to_string(d.join("cgroup.procs")).ok()?;
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()));
        }
    }
    pids.sort_unstable();
    Some(pids)
}
