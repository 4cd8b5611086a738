//! Running one scenario against both runtimes, for tests that require equal outcomes from
//! `io.containerd.runc.v2` and `io.containerd.gpusnap.v2`.

use crate::Runtime;

/// Runs `scenario` against `rt`, printing the whole error chain on failure.
pub fn check(rt: Runtime, scenario: fn(Runtime) -> anyhow::Result<()>) {
    if let Err(e) = scenario(rt) {
        panic!("scenario failed on {rt}: {e:#}");
    }
}

/// Two #[test]s per scenario: `<scenario>_runc_v2` and `<scenario>_gpusnap`.
#[macro_export]
macro_rules! scenario_tests {
    ($($scenario:ident => $runc:ident, $gpusnap:ident;)*) => {
        $(
            #[test]
            fn $runc() {
                $crate::scenario::check($crate::Runtime::RuncV2, $scenario);
            }
            #[test]
            fn $gpusnap() {
                $crate::scenario::check($crate::Runtime::Gpusnap, $scenario);
            }
        )*
    };
}
