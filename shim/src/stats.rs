//! Task metrics from the container's cgroup (v1 or v2), in the types containerd decodes
//! (`io.containerd.cgroups.v1.Metrics` / `io.containerd.cgroups.v2.Metrics`).

use containerd_shim::{
    cgroup::{collect_metrics, collect_metrics_v2, get_cgroup},
    protos::protobuf::well_known_types::any::Any,
    util::convert_to_any,
};

pub fn collect(pid: u32) -> Result<Any, String> {
    let cgroup = get_cgroup(pid).map_err(|e| format!("find cgroup of pid {pid}: {e}"))?;
    let any = if cgroup.v2() {
        let m =
            collect_metrics_v2(&cgroup).map_err(|e| format!("collect cgroup v2 metrics: {e}"))?;
        convert_to_any(Box::new(m))
    } else {
        let m = collect_metrics(&cgroup).map_err(|e| format!("collect cgroup v1 metrics: {e}"))?;
        convert_to_any(Box::new(m))
    };
    any.map_err(|e| format!("encode metrics: {e}"))
}
