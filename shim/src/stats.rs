//! Task metrics from the container's cgroup (v1 or v2), in the types containerd decodes
//! (`io.containerd.cgroups.v1.Metrics` / `io.containerd.cgroups.v2.Metrics`).
//!
//! On cgroup v1 the CPU and memory details are read here from cpuacct and memory.stat: the
//! shim crate's v1 collector reads v2 key names for CPU and fills only a few memory fields.

use containerd_shim::{
    cgroup::{collect_metrics, collect_metrics_v2, get_cgroup},
    protos::{
        cgroups::metrics::{CPUUsage, MemoryEntry, MemoryStat, Metrics},
        protobuf::{well_known_types::any::Any, MessageField},
    },
    util::convert_to_any,
};
use gpusnap_transaction::cgroup::v1_controller_dir;

/// Why a container's metrics could not be collected.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error("find cgroup of pid {pid}: {source}")]
    Cgroup {
        pid: u32,
        source: containerd_shim::Error,
    },
    #[error("collect cgroup {version} metrics: {source}")]
    Collect {
        version: &'static str,
        source: containerd_shim::Error,
    },
    #[error("encode metrics: {0}")]
    Encode(#[source] containerd_shim::Error),
}

impl From<StatsError> for crate::errors::Error {
    fn from(e: StatsError) -> Self {
        crate::errors::internal(e.to_string())
    }
}

pub fn collect(pid: u32) -> Result<Any, StatsError> {
    let cgroup = get_cgroup(pid).map_err(|source| StatsError::Cgroup { pid, source })?;
    let any = if cgroup.v2() {
        let m = collect_metrics_v2(&cgroup).map_err(|source| StatsError::Collect {
            version: "v2",
            source,
        })?;
        convert_to_any(Box::new(m))
    } else {
        let mut m = collect_metrics(&cgroup).map_err(|source| StatsError::Collect {
            version: "v1",
            source,
        })?;
        fill_v1(pid, &mut m);
        convert_to_any(Box::new(m))
    };
    any.map_err(StatsError::Encode)
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
