//! The rootfs diff's inflated size: `image build` records it in the manifest annotation
//! [`keys::GPUSNAP_ROOTFS_DIFF_INFLATED_SIZE`], so a puller can check free space and bound the
//! diff before inflating it; extraction reads the annotation as a hostile claim (capped by the
//! free space, and the diff refused as soon as it inflates past it).

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

use super::annotations::keys;
use super::error::ImageError;
use super::source::ROOTFS_DIFF_TAR;

/// The bytes of file content `rootfs-diff.tar` holds once decompressed, read from the layer
/// blob `build` just wrote (an uncompressed tar holding that one member).
pub(crate) fn of_layer(blob: &Path) -> Result<u64, ImageError> {
    let file = File::open(blob).map_err(ImageError::io("reading", blob))?;
    let mut layer = tar::Archive::new(file);
    for entry in layer.entries().map_err(ImageError::io("reading", blob))? {
        let entry = entry.map_err(ImageError::io("reading", blob))?;
        if entry.path_bytes().as_ref() != ROOTFS_DIFF_TAR.as_bytes() {
            continue;
        }
        return gpusnap_checkpoint::rootfs_diff::content_bytes_in(
            entry,
            Path::new(ROOTFS_DIFF_TAR),
            u64::MAX,
        )
        .map_err(|e| ImageError::malformed("rootfs diff", ROOTFS_DIFF_TAR, e));
    }
    Err(ImageError::malformed(
        "rootfs diff layer",
        blob.display().to_string(),
        format!("it holds no {ROOTFS_DIFF_TAR}"),
    ))
}

/// The inflated size the image claims for its rootfs diff, if it claims one.
pub(crate) fn declared(
    annotations: &BTreeMap<String, String>,
    location: &str,
) -> Result<Option<u64>, ImageError> {
    let key = keys::GPUSNAP_ROOTFS_DIFF_INFLATED_SIZE;
    annotations
        .get(key)
        .map(|v| {
            v.parse::<u64>().map_err(|_| {
                ImageError::malformed(
                    "image manifest",
                    location,
                    format!("{key} is {v:?}, not a byte count"),
                )
            })
        })
        .transpose()
}
