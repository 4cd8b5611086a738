//! Phase timings of a transaction: recorded in the manifest in the order they ran, and logged
//! as one structured event (a field per phase, no Debug dumps).

use std::path::Path;
use std::time::Duration;

use gpusnap_checkpoint::Manifest;

/// Phases in the order they ran.
#[derive(Debug, Default, Clone)]
pub struct Timings {
    phases: Vec<(&'static str, Duration)>,
    /// Bytes of the checkpoint hashed while CRIU was still writing them.
    hashed_during_dump: Option<u64>,
}

impl Timings {
    pub fn add(&mut self, phase: &'static str, elapsed: Duration) {
        self.phases.push((phase, elapsed));
    }

    pub fn hashed_during_dump(&mut self, bytes: u64) {
        self.hashed_during_dump = Some(bytes);
    }

    /// Milliseconds of `phase`, when it ran.
    pub fn ms(&self, phase: &str) -> Option<u64> {
        self.phases
            .iter()
            .find(|(p, _)| *p == phase)
            .map(|(_, d)| d.as_millis() as u64)
    }

    /// Appends every phase to the manifest's `timings`.
    pub fn record_into(&self, manifest: &mut Manifest) {
        for (phase, elapsed) in &self.phases {
            manifest.record_phase(*phase, *elapsed);
        }
    }

    /// The checkpoint's one summary event.
    pub fn log(
        &self,
        message: &'static str,
        id: &str,
        dir: &Path,
        manifest: &Manifest,
        cuda_processes: usize,
        total: Duration,
    ) {
        let digest_ms = manifest
            .timings
            .iter()
            .find(|t| t.name == "digest")
            .map(|t| t.ms);
        tracing::info!(
            id,
            dir = %dir.display(),
            bytes = manifest.images.total_bytes,
            cuda_processes,
            cuda_lock_ms = self.ms("cuda-lock"),
            cuda_checkpoint_ms = self.ms("cuda-checkpoint"),
            criu_dump_ms = self.ms("criu-dump"),
            cuda_resume_ms = self.ms("cuda-resume"),
            digest_ms,
            hashed_during_dump_bytes = self.hashed_during_dump,
            total_ms = total.as_millis() as u64,
            "{message}"
        );
    }
}
