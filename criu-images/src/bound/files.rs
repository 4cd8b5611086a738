//! Open files: the types CRIU reopens, and the few fields of them that need a privilege the
//! container may lack (a raw socket, a low port, socket marks and forced buffer sizes, alarm
//! timers, SIGIO owners, terminals other than pseudo-terminals), plus the files CRIU recreates
//! from the checkpoint itself (ghost files, memfd inodes): never a device node or a setuid or
//! setgid file.

use super::{Check, Refusal};
use crate::allowlist::Listing;
use crate::caps;
use crate::image::{ImageDir, ImageError, Kind};
use crate::proto::{
    FdTypes, FileEntry, FownEntry, GhostFileEntry, InetSkEntry, MemfdInodeEntry, SkOptsEntry,
    TtyInfoEntry, TtyType,
};

const SOCK_RAW: u32 = 3;
const IPPROTO_TCP: u32 = 6;
/// The highest `SO_PRIORITY` without CAP_NET_ADMIN (`TC_PRIO_CONTROL`).
const MAX_PRIORITY: u32 = 6;
const USK_EXTERN: u32 = 1;
const USK_SERVICE: u32 = 1 << 1;
const USK_CALLBACK: u32 = 1 << 2;
const S_IFMT: u32 = 0o170_000;
const S_IFCHR: u32 = 0o020_000;
const S_IFBLK: u32 = 0o060_000;
const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;

/// What a file mode CRIU recreates as root must not be: a device node, setuid or setgid.
pub fn odd_mode(mode: u32) -> Option<&'static str> {
    match mode & S_IFMT {
        S_IFCHR => Some("a character device"),
        S_IFBLK => Some("a block device"),
        _ if mode & S_ISUID != 0 => Some("setuid"),
        _ if mode & (S_ISGID | 0o010) == S_ISGID | 0o010 => Some("setgid"),
        _ => None,
    }
}

impl Check<'_> {
    pub(super) fn files(&mut self, dir: &mut ImageDir, listing: &Listing) -> Result<(), Refusal> {
        let files: Vec<FileEntry> = dir.read("files.img", Kind::Files)?.unwrap_or_default();
        for f in &files {
            self.file("files.img", f);
        }
        let ttys: Vec<TtyInfoEntry> = dir.read("tty-info.img", Kind::TtyInfo)?.unwrap_or_default();
        for t in &ttys {
            let ok = [
                TtyType::Pty as i32,
                TtyType::ExtTty as i32,
                TtyType::Ctty as i32,
            ];
            if !ok.contains(&t.r#type) {
                let name = TtyType::try_from(t.r#type).map_or("unknown", |t| t.as_str_name());
                self.find(
                    None,
                    "tty-info.img",
                    "type",
                    format!(
                        "of terminal {} is {name}: only pseudo-terminals (and the console \
                         runc hands CRIU) are restored; another is a device of the node",
                        t.id
                    ),
                );
            }
        }
        let memfds: Vec<MemfdInodeEntry> =
            dir.read("memfd.img", Kind::MemfdInode)?.unwrap_or_default();
        for m in &memfds {
            if let Some(odd) = m.mode.and_then(odd_mode) {
                self.find(
                    None,
                    "memfd.img",
                    "mode",
                    format!(
                        "of memfd {:?} is {odd} ({:#o}): CRIU would create it so as root",
                        String::from_utf8_lossy(&m.name),
                        m.mode.unwrap_or(0)
                    ),
                );
            }
        }
        for (name, _) in listing.of("GHOST_FILE") {
            let name = name.to_owned();
            let bytes = dir.read_bytes(&name, "ghost file")?.unwrap_or_default();
            let ghost = first_entry::<GhostFileEntry>(&name, &bytes)?;
            if let Some(odd) = odd_mode(ghost.mode) {
                self.find(
                    None,
                    &name,
                    "mode",
                    format!(
                        "is {odd} ({:#o}): CRIU would create this unlinked file so, as root",
                        ghost.mode
                    ),
                );
            }
            if ghost.rdev.is_some_and(|r| r != 0) && ghost.mode & S_IFMT != 0o040_000 {
                self.find(
                    None,
                    &name,
                    "rdev",
                    format!(
                        "is {:#x}: a device number for a file CRIU recreates",
                        ghost.rdev.unwrap_or(0)
                    ),
                );
            }
        }
        Ok(())
    }

    fn file(&mut self, at: &str, f: &FileEntry) {
        // The one sub-message CRIU reads is the one of `type`; any other is not modeled.
        let present: Vec<(FdTypes, bool)> = vec![
            (FdTypes::Reg, f.reg.is_some()),
            (FdTypes::Inetsk, f.isk.is_some()),
            (FdTypes::Ns, f.nsf.is_some()),
            (FdTypes::Packetsk, f.psk.is_some()),
            (FdTypes::Netlinksk, f.nlsk.is_some()),
            (FdTypes::Eventfd, f.efd.is_some()),
            (FdTypes::Eventpoll, f.epfd.is_some()),
            (FdTypes::Signalfd, f.sgfd.is_some()),
            (FdTypes::Tunf, f.tunf.is_some()),
            (FdTypes::Timerfd, f.tfd.is_some()),
            (FdTypes::Inotify, f.ify.is_some()),
            (FdTypes::Fanotify, f.ffy.is_some()),
            (FdTypes::Ext, f.ext.is_some()),
            (FdTypes::Unixsk, f.usk.is_some()),
            (FdTypes::Fifo, f.fifo.is_some()),
            (FdTypes::Pipe, f.pipe.is_some()),
            (FdTypes::Tty, f.tty.is_some()),
            (FdTypes::Memfd, f.memfd.is_some()),
            (FdTypes::Bpfmap, f.bpf.is_some()),
            (FdTypes::Pidfd, f.pidfd.is_some()),
        ];
        let typ = FdTypes::try_from(f.r#type).ok();
        let set: Vec<FdTypes> = present.iter().filter(|p| p.1).map(|p| p.0).collect();
        if typ.is_none() || set != [typ.unwrap_or(FdTypes::Und)] {
            self.find(
                None,
                at,
                "type",
                format!(
                    "of file {} is {} but the entry holds {:?}: CRIU reads the sub-message of \
                     the type",
                    f.id,
                    typ.map_or(f.r#type.to_string(), |t| t.as_str_name().to_owned()),
                    set.iter().map(|t| t.as_str_name()).collect::<Vec<_>>()
                ),
            );
            return;
        }
        let fown = [
            f.reg.as_ref().map(|r| &r.fown),
            f.isk.as_ref().map(|s| &s.fown),
            f.usk.as_ref().map(|s| &s.fown),
            f.efd.as_ref().map(|e| &e.fown),
            f.epfd.as_ref().map(|e| &e.fown),
            f.sgfd.as_ref().map(|e| &e.fown),
            f.tfd.as_ref().map(|e| &e.fown),
            f.pipe.as_ref().map(|e| &e.fown),
            f.tty.as_ref().map(|e| &e.fown),
            f.memfd.as_ref().map(|e| &e.fown),
            f.pidfd.as_ref().map(|e| &e.fown),
        ];
        for o in fown.into_iter().flatten() {
            self.fown(at, f.id, o);
        }
        let b = self.bound;
        if let Some(t) = &f.tfd {
            if super::task::alarm_clock(t.clockid) && !b.may(caps::WAKE_ALARM) {
                self.find(
                    None,
                    at,
                    "tfd.clockid",
                    format!(
                        "of timerfd {} is an alarm clock ({}), which needs CAP_WAKE_ALARM the \
                         spec's {} lacks",
                        f.id,
                        t.clockid,
                        b.may_set(caps::WAKE_ALARM)
                    ),
                );
            }
        }
        if let Some(s) = &f.isk {
            self.inet(at, s);
        }
        if let Some(u) = &f.usk {
            self.sk_opts(at, f.id, &u.opts, false);
            let odd = u.uflags & (USK_EXTERN | USK_SERVICE | USK_CALLBACK);
            if odd != 0 {
                self.find(
                    None,
                    at,
                    "usk.uflags",
                    format!(
                        "of unix socket {} are {:#x}: an external, service or plugin socket, \
                         connected to something outside the checkpoint",
                        f.id, u.uflags
                    ),
                );
            }
        }
    }

    fn fown(&mut self, at: &str, id: u32, o: &FownEntry) {
        let b = self.bound;
        if b.may(caps::SETUID) {
            return;
        }
        for (field, v) in [("fown.uid", o.uid), ("fown.euid", o.euid)] {
            if v != b.uid {
                self.find(
                    None,
                    at,
                    field,
                    format!(
                        "of file {id} is {v}: the credentials SIGIO is sent with, but the \
                         container spec's user is uid {} and its {} lacks CAP_SETUID (spec {}, \
                         image {v})",
                        b.uid,
                        b.may_set(caps::SETUID),
                        b.uid
                    ),
                );
            }
        }
    }

    fn inet(&mut self, at: &str, s: &InetSkEntry) {
        let b = self.bound;
        if (s.r#type == SOCK_RAW || s.ip_opts.as_ref().is_some_and(|o| o.raw.is_some()))
            && !b.may(caps::NET_RAW)
        {
            self.find(
                None,
                at,
                "isk.type",
                format!(
                    "of socket {} is a raw socket, which needs CAP_NET_RAW the spec's {} lacks",
                    s.id,
                    b.may_set(caps::NET_RAW)
                ),
            );
        }
        let unprivileged_from = b
            .sysctl
            .get("net.ipv4.ip_unprivileged_port_start")
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(1024);
        if s.src_port != 0 && s.src_port < unprivileged_from && !b.may(caps::NET_BIND_SERVICE) {
            self.find(
                None,
                at,
                "isk.src_port",
                format!(
                    "of socket {} is {}, below {unprivileged_from}, which needs \
                     CAP_NET_BIND_SERVICE the spec's {} lacks",
                    s.id,
                    s.src_port,
                    b.may_set(caps::NET_BIND_SERVICE)
                ),
            );
        }
        self.sk_opts(at, s.id, &s.opts, s.proto == IPPROTO_TCP);
    }

    fn sk_opts(&mut self, at: &str, id: u32, o: &SkOptsEntry, tcp: bool) {
        let b = self.bound;
        if b.may(caps::NET_ADMIN) {
            return;
        }
        let h = self.host;
        let why = |what: String| {
            format!(
                "of socket {id} {what}, which needs CAP_NET_ADMIN the spec's {} lacks",
                b.may_set(caps::NET_ADMIN)
            )
        };
        let mut found = Vec::new();
        if let Some(mark) = o.so_mark.filter(|m| *m != 0) {
            found.push(("opts.so_mark", why(format!("is {mark:#x}"))));
        }
        if let Some(p) = o.so_priority.filter(|p| *p > MAX_PRIORITY) {
            found.push((
                "opts.so_priority",
                why(format!("is {p}, above {MAX_PRIORITY}")),
            ));
        }
        // CRIU sets SO_SNDBUFFORCE/SO_RCVBUFFORCE with the dumped (doubled) size. A process
        // reaches twice the sysctl maximum with SO_SNDBUF; TCP autotuning grows a connection's
        // buffers up to tcp_wmem/tcp_rmem's maximum.
        let cap = |max: u64, tcp_max: u64| {
            let own = max.saturating_mul(2);
            if tcp {
                own.max(tcp_max)
            } else {
                own
            }
        };
        for (field, v, max) in [
            (
                "opts.so_sndbuf",
                o.so_sndbuf,
                cap(h.wmem_max, h.tcp_wmem_max),
            ),
            (
                "opts.so_rcvbuf",
                o.so_rcvbuf,
                cap(h.rmem_max, h.tcp_rmem_max),
            ),
        ] {
            if u64::from(v) > max {
                found.push((field, why(format!("is {v} bytes, above the node's {max}"))));
            }
        }
        for (field, detail) in found {
            self.find(None, at, field, detail);
        }
    }
}

/// The first entry of a ghost file image (its content follows).
fn first_entry<M: prost::Message + Default>(name: &str, bytes: &[u8]) -> Result<M, ImageError> {
    let truncated = || ImageError::Truncated {
        name: name.into(),
        index: 0,
    };
    let len = bytes
        .get(8..12)
        .map(|b| u32::from_ne_bytes(b.try_into().expect("4 bytes")) as usize)
        .ok_or_else(truncated)?;
    let entry = bytes.get(12..12 + len).ok_or_else(truncated)?;
    M::decode(entry).map_err(|source| ImageError::Decode {
        name: name.into(),
        index: 0,
        what: "ghost file",
        source,
    })
}
