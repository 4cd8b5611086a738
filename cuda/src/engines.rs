//! The registry of storage engines this build has, by the name the configuration and the
//! manifest use. It sits above [`crate::engine`] (the trait every engine implements) and the
//! engines' modules, so that an engine depends on the trait and never the other way round.

use std::sync::Arc;

use gpusnap_config::StorageConfig;

use crate::engine::{DriverManaged, EngineError, StorageEngine};
use crate::posix::Posix;

/// Every storage engine this build has, by the name the configuration and the manifest use.
/// Adding an engine is its module plus one line here.
pub const ENGINES: &[(&str, EngineFactory)] = &[
    (DriverManaged::NAME, |_| Ok(Arc::new(DriverManaged))),
    (Posix::NAME, |storage| {
        Ok(Arc::new(Posix::from_config(storage)?) as Arc<dyn StorageEngine>)
    }),
];

/// Builds an engine from the node's storage settings.
pub type EngineFactory = fn(&StorageConfig) -> Result<Arc<dyn StorageEngine>, EngineError>;

/// The names of [`ENGINES`].
pub fn engine_names() -> Vec<&'static str> {
    ENGINES.iter().map(|(name, _)| *name).collect()
}

/// The engine called `name`, built from `storage`; `None` when this build has no such engine.
pub fn engine_by_name(
    name: &str,
    storage: &StorageConfig,
) -> Option<Result<Arc<dyn StorageEngine>, EngineError>> {
    ENGINES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, build)| build(storage))
}
