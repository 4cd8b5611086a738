//! `cgroup.img`: which cgroups CRIU moves the restored tasks into.
//!
//! runc (1.1.5 cannot pass `--manage-cgroups-mode ignore`) runs CRIU with cgroup management
//! in soft mode and one cgroup root per controller: the container's own cgroup, which runc has
//! already made and put CRIU in. Per controller, CRIU rewrites only the set paths that start
//! with a dumped directory's name to that root (`criu/cgroup.c`: `rewrite_cgroup_roots`,
//! `rewrite_cgsets`, a plain string prefix); a path that does not is used as it is, relative
//! to the node's hierarchy. A task whose set is its parent's (the root task's: CRIU's own at
//! the dump, `inventory.root_cg_set`) is not moved at all. In soft mode CRIU writes properties
//! and permissions only to cgroups it creates itself.
//!
//! So the rule: every set a task, a thread or the inventory names is a set of the image
//! (CRIU's own may be absent), and every member of it is exactly the one directory dumped for
//! its controller, which is rewritten to the container's cgroup: no other path (it would land
//! in the node's hierarchy: `/` is the node's root cgroup), no child cgroup (CRIU would create
//! and configure it), no `.`/`..`, and a cgroup-namespace prefix that is the whole path. This
//! relies on soft mode with a root per controller, which the restore enforces on every door.

use std::collections::BTreeMap;

use super::{missing, Check, Refusal};
use crate::image::{ImageDir, Kind};
use crate::proto::{CgControllerEntry, CgroupEntry};

/// `cgroup.img`'s type, for the reader.
pub const CGROUP: Kind = Kind::Cgroup;

impl Check<'_> {
    pub(super) fn cgroups(&mut self, dir: &mut ImageDir) -> Result<(), Refusal> {
        let file = "cgroup.img";
        let used = std::mem::take(&mut self.cg_sets);
        let entry: CgroupEntry = match dir.read_one(file, CGROUP)? {
            Some(e) => e,
            None if used.is_empty() => return Ok(()),
            // Tasks name sets but the image is gone: CRIU would fail; refuse before it runs.
            None => return Err(missing(file)),
        };
        let root_set = self.root_cg_set;
        // One dumped directory per controller, with no child: the container's cgroup.
        let mut dirs: BTreeMap<String, String> = BTreeMap::new();
        for (i, c) in entry.controllers.iter().enumerate() {
            let field = format!("controllers[{i}]");
            match &c.dirs[..] {
                [] => {}
                [d] if d.children.is_empty() => {
                    for name in &c.cnames {
                        dirs.insert(
                            String::from_utf8_lossy(name).into_owned(),
                            String::from_utf8_lossy(&d.dir_name).into_owned(),
                        );
                    }
                }
                [d] => self.find(
                    None,
                    file,
                    &field,
                    format!(
                        "{} has {} child cgroup(s) under {:?}: CRIU would create them and write \
                         their properties (nested cgroups are not restored)",
                        names(c),
                        d.children.len(),
                        String::from_utf8_lossy(&d.dir_name)
                    ),
                ),
                more => self.find(
                    None,
                    file,
                    &field,
                    format!(
                        "{} has {} dumped cgroups; a container has one per controller",
                        names(c),
                        more.len()
                    ),
                ),
            }
        }
        let mut checked = std::collections::BTreeSet::new();
        for (pid, at, field, id) in used {
            if !checked.insert(id) {
                continue;
            }
            let task = (pid != 0).then_some(pid);
            let Some(set) = entry.sets.iter().find(|s| s.id == id) else {
                if Some(id) != root_set {
                    self.find(
                        task,
                        &at,
                        field,
                        format!("is set {id}, which {file} does not hold"),
                    );
                }
                continue;
            };
            for m in &set.ctls {
                let name = String::from_utf8_lossy(&m.name).into_owned();
                let path = String::from_utf8_lossy(&m.path).into_owned();
                let dumped = name
                    .split(',')
                    .map(|n| dirs.get(n))
                    .reduce(|a, b| if a == b { a } else { None })
                    .flatten();
                let shown = format!("set {id} ({field} of {at}): {name:?} path {path:?}");
                let Some(dumped) = dumped else {
                    self.find(
                        None,
                        file,
                        "sets",
                        format!(
                            "{shown} is not rewritten to the container's cgroup: the image \
                             dumps no cgroup of that controller, so CRIU would move the task \
                             to that path of the node's hierarchy"
                        ),
                    );
                    continue;
                };
                let want = format!("/{dumped}");
                let plain = path.starts_with('/')
                    && path[1..]
                        .split('/')
                        .all(|p| !p.is_empty() && p != "." && p != "..");
                if !plain || path != want {
                    self.find(
                        None,
                        file,
                        "sets",
                        format!(
                            "{shown} is not the dumped cgroup {want:?} that CRIU rewrites to the \
                             container's: the task would be moved to that path of the node's \
                             hierarchy (or a cgroup CRIU creates)"
                        ),
                    );
                    continue;
                }
                if let Some(prefix) = m.cgns_prefix.filter(|p| *p != 0) {
                    if prefix as usize != path.len() {
                        self.find(
                            None,
                            file,
                            "sets",
                            format!(
                                "{shown} has a cgroup namespace prefix of {prefix} bytes, not \
                                 the whole path ({})",
                                path.len()
                            ),
                        );
                    }
                }
            }
        }
        Ok(())
    }
}

fn names(c: &CgControllerEntry) -> String {
    let n: Vec<String> = c
        .cnames
        .iter()
        .map(|n| format!("{:?}", String::from_utf8_lossy(n)))
        .collect();
    format!("controller {}", n.join(","))
}
