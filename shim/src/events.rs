//! Ordered event delivery to containerd.
//!
//! Events go through one queue drained by one task, so they reach containerd in the order
//! the shim emitted them (create → start → exit → delete), whichever RPC or exit emitted them.

use std::sync::Arc;

use containerd_shim::{
    asynchronous::publisher::RemotePublisher,
    protos::{protobuf::MessageDyn, ttrpc::context::Context},
};
use tokio::sync::mpsc;

#[derive(Clone)]
pub struct EventSender {
    tx: mpsc::UnboundedSender<(&'static str, Box<dyn MessageDyn>)>,
}

impl EventSender {
    pub fn start(publisher: RemotePublisher, namespace: String) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(&'static str, Box<dyn MessageDyn>)>();
        let publisher = Arc::new(publisher);
        tokio::spawn(async move {
            while let Some((topic, event)) = rx.recv().await {
                if let Err(e) = publisher
                    .publish(Context::default(), topic, &namespace, event)
                    .await
                {
                    tracing::warn!(topic, error = %e, "publishing event failed");
                }
            }
        });
        Self { tx }
    }

    pub fn send(&self, topic: &'static str, event: impl MessageDyn + 'static) {
        if self.tx.send((topic, Box::new(event))).is_err() {
            tracing::warn!(topic, "event queue closed; event dropped");
        }
    }
}
