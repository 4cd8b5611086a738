//! What the entries of a diff read so far make of the rootfs, path by path, as far as the check
//! needs it: whether a name is a directory, something else, or nothing yet. A trie of path
//! components, so each entry costs one step per component of its name (the check was a scan of
//! every path seen, per entry: quadratic). Names no entry touched are looked up in the rootfs
//! once, the first time an entry leads through them.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::FileType;
use rustix::io::Errno;

use super::EntryRefusal;
use crate::beneath;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// A directory of the image's rootfs, kept: names beneath it that no entry touched are the
    /// image's, looked up in the rootfs.
    Lower,
    /// A directory this diff made (empty when made), or a name that is not there (never was,
    /// or removed by a whiteout or a replacement; the application makes it a directory when
    /// an entry needs it as a parent): nothing is beneath it but what later entries put there.
    Fresh,
    /// Something other than a directory: a file, symlink, hard link or fifo an entry made.
    Other,
}

struct Node {
    state: State,
    children: HashMap<Box<[u8]>, usize>,
}

/// The trie; node 0 is the rootfs itself.
pub(super) struct Tree<'a> {
    root: BorrowedFd<'a>,
    nodes: Vec<Node>,
}

/// What an entry leaves at its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Made {
    Dir,
    Other,
}

impl<'a> Tree<'a> {
    pub(super) fn new(root: BorrowedFd<'a>) -> Self {
        Tree {
            root,
            nodes: vec![Node {
                state: State::Lower,
                children: HashMap::new(),
            }],
        }
    }

    fn add(&mut self, parent: usize, name: &[u8], state: State) -> usize {
        let id = self.nodes.len();
        self.nodes.push(Node {
            state,
            children: HashMap::new(),
        });
        self.nodes[parent].children.insert(name.into(), id);
        id
    }

    /// The node of `name` in directory `parent` (`at` is its path), looked up in the rootfs the
    /// first time: a directory there is `Lower`, nothing there is `Fresh`; `None` for anything
    /// else (a symlink, a file, or a name that cannot be resolved without following one).
    fn child(
        &mut self,
        parent: usize,
        name: &[u8],
        at: &Path,
    ) -> Result<Option<usize>, EntryRefusal> {
        if let Some(&id) = self.nodes[parent].children.get(name) {
            return Ok(Some(id));
        }
        let state = match self.nodes[parent].state {
            State::Fresh => State::Fresh,
            State::Other => return Ok(None),
            State::Lower => match self.in_rootfs(at)? {
                None => State::Fresh,
                Some(FileType::Directory) => State::Lower,
                Some(_) => return Ok(None),
            },
        };
        Ok(Some(self.add(parent, name, state)))
    }

    /// The type of `at` in the rootfs, not followed; `None` when it does not exist.
    fn in_rootfs(&self, at: &Path) -> Result<Option<FileType>, EntryRefusal> {
        let found = beneath::parent_of(self.root, at, None)
            .and_then(|(p, n)| beneath::file_type_at(p.as_fd(), &n));
        match found {
            Ok(t) => Ok(t),
            Err(e) if e.raw_os_error() == Some(Errno::NOENT.raw_os_error()) => Ok(None),
            // ELOOP, ENOTDIR: the way there passes through something that is not a directory.
            Err(e)
                if [Errno::LOOP, Errno::NOTDIR]
                    .iter()
                    .any(|x| e.raw_os_error() == Some(x.raw_os_error())) =>
            {
                Ok(Some(FileType::Unknown))
            }
            Err(source) => Err(EntryRefusal::Lookup {
                at: at.to_path_buf(),
                source,
            }),
        }
    }

    /// The directory `dirs` names (components from the rootfs down), which every one of them
    /// must be, or become, when the diff is applied: the node, or why an entry may not lead
    /// through it.
    pub(super) fn dir(&mut self, dirs: &[&[u8]]) -> Result<usize, EntryRefusal> {
        let mut at = PathBuf::new();
        let mut node = 0;
        for c in dirs {
            at.push(OsStr::from_bytes(c));
            node = match self.child(node, c, &at)? {
                Some(id) if self.nodes[id].state != State::Other => id,
                _ => return Err(EntryRefusal::NotADirectory { at }),
            };
        }
        Ok(node)
    }

    /// An entry makes `name` in `parent` (whose path is `at`, the name included) a directory
    /// or something else. A directory over a directory keeps what it holds; anything else
    /// replaces the name and all beneath it.
    pub(super) fn make(&mut self, parent: usize, name: &[u8], at: &Path, made: Made) {
        let existing = self.nodes[parent].children.get(name).copied();
        let state = match (made, existing.map(|id| self.nodes[id].state)) {
            (Made::Other, _) => State::Other,
            (Made::Dir, Some(State::Lower)) => State::Lower,
            (Made::Dir, Some(State::Fresh)) => State::Fresh,
            (Made::Dir, Some(State::Other)) => State::Fresh,
            (Made::Dir, None) => match self.nodes[parent].state {
                // What the rootfs has there decides whether its content stays; what cannot be
                // looked up counts as kept, so later names beneath it are looked up (and
                // refused) rather than assumed absent.
                State::Lower => match self.in_rootfs(at) {
                    Ok(Some(FileType::Directory)) | Err(_) => State::Lower,
                    Ok(_) => State::Fresh,
                },
                _ => State::Fresh,
            },
        };
        match existing {
            Some(id) => {
                let n = &mut self.nodes[id];
                if n.state != state || state == State::Other {
                    n.children.clear();
                }
                n.state = state;
            }
            None => {
                self.add(parent, name, state);
            }
        }
    }

    /// A whiteout removes `name` in `parent` and everything beneath it.
    pub(super) fn remove(&mut self, parent: usize, name: &[u8]) {
        match self.nodes[parent].children.get(name).copied() {
            Some(id) => {
                let n = &mut self.nodes[id];
                n.state = State::Fresh;
                n.children.clear();
            }
            None => {
                self.add(parent, name, State::Fresh);
            }
        }
    }

    /// A hard link's target (components from the rootfs down) exists when the link is made and
    /// is not a directory.
    pub(super) fn link_target(&mut self, target: &[&[u8]]) -> Result<(), EntryRefusal> {
        let (last, dirs) = target.split_last().ok_or(EntryRefusal::LinkWithoutTarget)?;
        let parent = self.dir(dirs)?;
        let at: PathBuf = target.iter().map(|c| OsStr::from_bytes(c)).collect();
        let state = match self.nodes[parent].children.get(*last) {
            Some(&id) => self.nodes[id].state,
            None if self.nodes[parent].state == State::Lower => match self.in_rootfs(&at)? {
                None => State::Fresh,
                Some(FileType::Directory) => State::Lower,
                Some(_) => State::Other,
            },
            None => State::Fresh,
        };
        if state != State::Other {
            return Err(EntryRefusal::LinkTarget { at });
        }
        Ok(())
    }
}
