//! One thing a checkpoint's images give that the restore target's spec does not: what the
//! allowlist walk and the bound report, and what a refusal lists.

use std::fmt;

/// One thing the images give that the spec does not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The task (pid in the checkpoint), when the finding is about one.
    pub task: Option<u32>,
    /// The image file.
    pub file: String,
    /// The field.
    pub field: String,
    /// What is wrong, with the spec's and the image's values.
    pub detail: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.task {
            Some(pid) => write!(
                f,
                "task {pid} ({}): {} {}",
                self.file, self.field, self.detail
            ),
            None => write!(f, "{}: {} {}", self.file, self.field, self.detail),
        }
    }
}
