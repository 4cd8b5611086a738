//! A seccomp filter from `seccomp.img` against the spec's seccomp profile: does the filter
//! let through any system call the profile stops?
//!
//! The check is semantic, not a byte comparison with what runc would compile: the filter's
//! classic BPF is executed symbolically (every input word a variable, every branch a
//! constraint on one word), and every path that ends in a more permissive action than the
//! profile gives somewhere in that path's inputs is a finding, with a witness (the system
//! call, and its arguments where they matter). So an honest filter compiled by another
//! libseccomp or runc version, or by crun, passes when it means the same; a forged
//! permissive one does not, whatever its bytes.
//!
//! Soundness: every approximation goes one way. Values the executor cannot follow (ALU other
//! than AND, comparisons with another variable, `RET A` of a variable) make both branches,
//! or the most permissive action, possible; a constraint set the word solver cannot decide
//! within its budget counts as satisfiable; a filter too large to explore within its budget
//! is not proven. Each may refuse an honest filter, none accepts a weaker one. The profile
//! is read as leniently as it can be: where several of its rules match a call, the most
//! permissive one counts.

use std::collections::BTreeMap;

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompOperator,
};

/// How much a seccomp outcome lets a system call through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// Kill, trap, errno: the call does not run.
    Block,
    /// Trace, user notification: another process decides.
    Delegate,
    /// Allow, log: the call runs.
    Allow,
}

impl Level {
    /// A filter's return value, as the kernel acts on it (unknown actions kill).
    fn of_ret(ret: u32) -> Level {
        match ret & 0xffff_0000 {
            0x7fff_0000 | 0x7ffc_0000 => Level::Allow,
            0x7ff0_0000 | 0x7fc0_0000 => Level::Delegate,
            _ => Level::Block,
        }
    }

    fn of_action(a: LinuxSeccompAction) -> Level {
        use LinuxSeccompAction as A;
        match a {
            A::ScmpActAllow | A::ScmpActLog => Level::Allow,
            A::ScmpActTrace | A::ScmpActNotify => Level::Delegate,
            _ => Level::Block,
        }
    }
}

fn ret_name(ret: u32) -> String {
    match ret & 0xffff_0000 {
        0x7fff_0000 => "SECCOMP_RET_ALLOW".into(),
        0x7ffc_0000 => "SECCOMP_RET_LOG".into(),
        0x7ff0_0000 => "SECCOMP_RET_TRACE".into(),
        0x7fc0_0000 => "SECCOMP_RET_USER_NOTIF".into(),
        0x0005_0000 => format!("SECCOMP_RET_ERRNO({})", ret & 0xffff),
        0x0003_0000 => "SECCOMP_RET_TRAP".into(),
        0x8000_0000 => "SECCOMP_RET_KILL_PROCESS".into(),
        _ => format!("{ret:#x} (kill)"),
    }
}

fn action_name(a: LinuxSeccompAction) -> String {
    serde_json::to_value(a)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| format!("{a:?}"))
}

// ----- words of seccomp_data and constraints on them -------------------------------------

/// `struct seccomp_data` as 16 32-bit words: nr, arch, instruction pointer (low, high),
/// six arguments (low, high), on a little-endian machine.
const WORDS: usize = 16;
const NR: usize = 0;
const ARCH: usize = 1;

fn arg_words(i: usize) -> (usize, usize) {
    // (low, high)
    if cfg!(target_endian = "little") {
        (4 + 2 * i, 5 + 2 * i)
    } else {
        (5 + 2 * i, 4 + 2 * i)
    }
}

/// `(w & mask) OP k` on one 32-bit word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lit {
    Eq(u32, u32),
    Ne(u32, u32),
    Gt(u32, u32),
    Ge(u32, u32),
    Lt(u32, u32),
    Le(u32, u32),
    /// `(w & mask) != 0`.
    Any(u32),
}

impl Lit {
    fn holds(self, w: u32) -> bool {
        match self {
            Lit::Eq(m, k) => w & m == k,
            Lit::Ne(m, k) => w & m != k,
            Lit::Gt(m, k) => w & m > k,
            Lit::Ge(m, k) => w & m >= k,
            Lit::Lt(m, k) => w & m < k,
            Lit::Le(m, k) => w & m <= k,
            Lit::Any(m) => w & m != 0,
        }
    }

    fn mask(self) -> u32 {
        match self {
            Lit::Eq(m, _)
            | Lit::Ne(m, _)
            | Lit::Gt(m, _)
            | Lit::Ge(m, _)
            | Lit::Lt(m, _)
            | Lit::Le(m, _)
            | Lit::Any(m) => m,
        }
    }
}

/// A conjunction of literals per word.
#[derive(Debug, Clone, Default)]
struct Constraints {
    words: [Vec<Lit>; WORDS],
}

/// The nodes one satisfiability query may visit; past it the query counts as satisfiable.
const SOLVE_BUDGET: u32 = 1 << 16;

/// A value of the word satisfying every literal, `Some(None)` when the budget ran out
/// (counted as satisfiable), `None` when there is none.
fn solve(lits: &[Lit]) -> Option<Option<u32>> {
    let (mut lo, mut hi) = (0u32, u32::MAX);
    let (mut fixed, mut value) = (0u32, 0u32);
    let mut rest = Vec::new();
    let mut points = Vec::new();
    for &l in lits {
        match l {
            Lit::Eq(m, k) => {
                if k & !m != 0 || (fixed & m) & (value ^ k) != 0 {
                    return None;
                }
                fixed |= m;
                value = (value & !m) | k;
            }
            Lit::Ne(m, k) if k & !m != 0 => {}
            Lit::Ne(u32::MAX, k) => points.push(k),
            Lit::Ne(m, 0) => rest.push(Lit::Any(m)),
            Lit::Gt(u32::MAX, k) => lo = lo.max(k.checked_add(1)?),
            Lit::Ge(u32::MAX, k) => lo = lo.max(k),
            Lit::Lt(u32::MAX, k) => hi = hi.min(k.checked_sub(1)?),
            Lit::Le(u32::MAX, k) => hi = hi.min(k),
            Lit::Any(0) => return None,
            other => rest.push(other),
        }
    }
    if lo > hi {
        return None;
    }
    points.sort_unstable();
    let mut budget = SOLVE_BUDGET;
    let q = Query {
        lo,
        hi,
        fixed,
        value,
        rest: &rest,
        points: &points,
    };
    match dfs(&q, 31, 0, &mut budget) {
        Dfs::Found(v) => Some(Some(v)),
        Dfs::None => None,
        Dfs::OutOfBudget => Some(None),
    }
}

enum Dfs {
    Found(u32),
    None,
    OutOfBudget,
}

/// One word's constraints, normalised: an interval, fixed bits, excluded points, the rest.
struct Query<'a> {
    lo: u32,
    hi: u32,
    fixed: u32,
    value: u32,
    rest: &'a [Lit],
    points: &'a [u32],
}

/// Depth-first from the top bit, in increasing order, pruning a subtree as soon as the
/// interval, a fixed bit or a literal whose bits are all chosen rules it out.
fn dfs(q: &Query<'_>, bit: i32, prefix: u32, budget: &mut u32) -> Dfs {
    let (lo, hi, fixed, value) = (q.lo, q.hi, q.fixed, q.value);
    if *budget == 0 {
        return Dfs::OutOfBudget;
    }
    *budget -= 1;
    // Bits below `bit` (inclusive) are free in this subtree.
    let free = if bit < 0 {
        0
    } else {
        (((1u64 << (bit + 1)) - 1) & 0xffff_ffff) as u32
    };
    let (min, max) = (prefix, prefix | free);
    if max < lo || min > hi {
        return Dfs::None;
    }
    for l in q.rest {
        if l.mask() & free == 0 && !l.holds(prefix) {
            return Dfs::None;
        }
    }
    if bit < 0 {
        return if q.points.binary_search(&prefix).is_ok() {
            Dfs::None
        } else {
            Dfs::Found(prefix)
        };
    }
    let b = 1u32 << bit;
    let choices: &[u32] = if fixed & b != 0 {
        if value & b != 0 {
            &[1]
        } else {
            &[0]
        }
    } else {
        &[0, 1]
    };
    let mut out_of_budget = false;
    for &c in choices {
        match dfs(q, bit - 1, prefix | if c == 1 { b } else { 0 }, budget) {
            Dfs::Found(v) => return Dfs::Found(v),
            Dfs::OutOfBudget => out_of_budget = true,
            Dfs::None => {}
        }
        if out_of_budget {
            return Dfs::OutOfBudget;
        }
    }
    Dfs::None
}

impl Constraints {
    fn with(&self, w: usize, l: Lit) -> Constraints {
        let mut c = self.clone();
        c.words[w].push(l);
        c
    }

    fn word_ok(&self, w: usize) -> bool {
        solve(&self.words[w]).is_some()
    }

    /// One value per word satisfying everything (a free word is 0), `None` when there is
    /// none; `Some` also when a word could not be decided (then its value is 0).
    fn witness(&self) -> Option<[u32; WORDS]> {
        let mut out = [0u32; WORDS];
        for (w, lits) in self.words.iter().enumerate() {
            out[w] = solve(lits)?.unwrap_or(0);
        }
        Some(out)
    }
}

// ----- symbolic execution of classic BPF ---------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Val {
    Const(u32),
    /// A word of seccomp_data, masked.
    Word(usize, u32),
    Unknown,
}

#[derive(Debug, Clone, Copy)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

/// The program in `bytes` (`struct sock_filter` array, native endianness), checked as the
/// kernel checks a seccomp filter before loading it.
fn decode(bytes: &[u8]) -> Result<Vec<Insn>, String> {
    const BPF_MAXINSNS: usize = 4096;
    if bytes.is_empty() || !bytes.len().is_multiple_of(8) {
        return Err(format!("{} bytes is not a BPF program", bytes.len()));
    }
    let n = bytes.len() / 8;
    if n > BPF_MAXINSNS {
        return Err(format!(
            "{n} instructions, more than the kernel's {BPF_MAXINSNS}"
        ));
    }
    let insns: Vec<Insn> = bytes
        .chunks_exact(8)
        .map(|c| Insn {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    for (pc, i) in insns.iter().enumerate() {
        let bad = |why: &str| Err(format!("instruction {pc} ({:#06x}): {why}", i.code));
        let class = i.code & 0x07;
        match i.code {
            // ld [k] (word of seccomp_data)
            0x20 => {
                if i.k % 4 != 0 || i.k >= 64 {
                    return bad("loads outside seccomp_data");
                }
            }
            0x80 | 0x81 | 0x00 | 0x01 | 0x16 | 0x06 | 0x07 | 0x87 | 0x84 => {}
            0x60 | 0x61 | 0x02 | 0x03 => {
                if i.k >= 16 {
                    return bad("scratch memory index out of range");
                }
            }
            _ if class == 0x04 => {
                // ALU: add sub mul div or and lsh rsh mod xor, K or X
                let op = i.code & 0xf0;
                if ![0x00, 0x10, 0x20, 0x30, 0x40, 0x50, 0x60, 0x70, 0x90, 0xa0].contains(&op) {
                    return bad("ALU operation a seccomp filter may not use");
                }
                if i.code & 0x08 == 0 {
                    if (op == 0x30 || op == 0x90) && i.k == 0 {
                        return bad("division by zero");
                    }
                    if (op == 0x60 || op == 0x70) && i.k >= 32 {
                        return bad("shift by 32 or more");
                    }
                }
            }
            0x05 => {
                if pc + 1 + i.k as usize >= n {
                    return bad("jumps past the end");
                }
            }
            0x15 | 0x1d | 0x25 | 0x2d | 0x35 | 0x3d | 0x45 | 0x4d => {
                if pc + 1 + i.jt.max(i.jf) as usize >= n {
                    return bad("jumps past the end");
                }
            }
            _ => return bad("an instruction a seccomp filter may not use"),
        }
    }
    if insns[n - 1].code & 0x07 != 0x06 {
        return Err("the last instruction is not a return".into());
    }
    Ok(insns)
}

/// One path through the program: the constraints it puts on the input, and what it returns
/// (`None`: a value the executor could not follow, counted as allow).
struct Path {
    c: Constraints,
    ret: Option<u32>,
}

/// Steps a whole exploration of one filter may take.
const EXPLORE_BUDGET: u32 = 1 << 20;

#[derive(Clone)]
struct State {
    pc: usize,
    a: Val,
    x: Val,
    mem: [Val; 16],
    c: Constraints,
}

/// Every feasible path that returns something more permissive than `floor`, passed to `f`
/// (which returns `false` to stop). `Err` when the budget ran out.
fn explore(insns: &[Insn], floor: Level, f: &mut dyn FnMut(Path) -> bool) -> Result<(), String> {
    let mut budget = EXPLORE_BUDGET;
    let mut stack = vec![State {
        pc: 0,
        a: Val::Const(0),
        x: Val::Const(0),
        mem: [Val::Unknown; 16],
        c: Constraints::default(),
    }];
    while let Some(mut s) = stack.pop() {
        loop {
            if budget == 0 {
                return Err(format!(
                    "the filter has too many paths to compare (more than {EXPLORE_BUDGET} steps)"
                ));
            }
            budget -= 1;
            let i = insns[s.pc];
            let operand = if i.code & 0x08 != 0 {
                s.x
            } else {
                Val::Const(i.k)
            };
            match i.code {
                0x20 => s.a = Val::Word(i.k as usize / 4, u32::MAX),
                0x80 => s.a = Val::Const(64),
                0x81 => s.x = Val::Const(64),
                0x00 => s.a = Val::Const(i.k),
                0x01 => s.x = Val::Const(i.k),
                0x60 => s.a = s.mem[i.k as usize],
                0x61 => s.x = s.mem[i.k as usize],
                0x02 => s.mem[i.k as usize] = s.a,
                0x03 => s.mem[i.k as usize] = s.x,
                0x07 => s.x = s.a,
                0x87 => s.a = s.x,
                0x84 => {
                    s.a = match s.a {
                        Val::Const(v) => Val::Const(v.wrapping_neg()),
                        _ => Val::Unknown,
                    }
                }
                0x06 | 0x16 => {
                    let ret = match (i.code, s.a) {
                        (0x06, _) => Some(i.k),
                        (_, Val::Const(v)) => Some(v),
                        _ => None,
                    };
                    let level = ret.map_or(Level::Allow, Level::of_ret);
                    if level > floor && !f(Path { c: s.c, ret }) {
                        return Ok(());
                    }
                    break;
                }
                0x05 => s.pc += i.k as usize,
                code if code & 0x07 == 0x04 => {
                    let op = code & 0xf0;
                    s.a = match (s.a, operand) {
                        (Val::Const(a), Val::Const(b)) => match op {
                            0x00 => Val::Const(a.wrapping_add(b)),
                            0x10 => Val::Const(a.wrapping_sub(b)),
                            0x20 => Val::Const(a.wrapping_mul(b)),
                            // Division by a zero X makes the program return 0 (kill).
                            0x30 | 0x90 if b == 0 => break,
                            0x30 => Val::Const(a / b),
                            0x90 => Val::Const(a % b),
                            0x40 => Val::Const(a | b),
                            0x50 => Val::Const(a & b),
                            0x60 if b < 32 => Val::Const(a << b),
                            0x70 if b < 32 => Val::Const(a >> b),
                            0xa0 => Val::Const(a ^ b),
                            _ => Val::Unknown,
                        },
                        (Val::Word(w, m), Val::Const(b)) if op == 0x50 => Val::Word(w, m & b),
                        _ => Val::Unknown,
                    };
                }
                _ => {
                    // Conditional jump.
                    let (t, e) = (s.pc + 1 + i.jt as usize, s.pc + 1 + i.jf as usize);
                    let op = i.code & 0xf0;
                    match (s.a, operand) {
                        (Val::Const(a), Val::Const(b)) => {
                            let taken = match op {
                                0x10 => a == b,
                                0x20 => a > b,
                                0x30 => a >= b,
                                _ => a & b != 0,
                            };
                            let to = if taken { t } else { e };
                            s.pc = to - 1;
                        }
                        (Val::Word(w, m), Val::Const(k)) => {
                            let (yes, no) = match op {
                                0x10 => (Lit::Eq(m, k), Lit::Ne(m, k)),
                                0x20 => (Lit::Gt(m, k), Lit::Le(m, k)),
                                0x30 => (Lit::Ge(m, k), Lit::Lt(m, k)),
                                _ => (Lit::Any(m & k), Lit::Eq(m & k, 0)),
                            };
                            let other = s.c.with(w, no);
                            if other.word_ok(w) {
                                stack.push(State {
                                    pc: e,
                                    c: other,
                                    ..s.clone()
                                });
                            }
                            s.c = s.c.with(w, yes);
                            if !s.c.word_ok(w) {
                                break;
                            }
                            s.pc = t - 1;
                        }
                        _ => {
                            // Not followed: both ways.
                            stack.push(State { pc: e, ..s.clone() });
                            s.pc = t - 1;
                        }
                    }
                }
            }
            s.pc += 1;
        }
    }
    Ok(())
}

// ----- the spec's profile ------------------------------------------------------------------

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_I386: u32 = 0x4000_0003;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_AARCH64: u32 = 0xc000_00b7;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_ARM: u32 = 0x4000_0028;
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

#[cfg(target_arch = "x86_64")]
/// x32's own system calls (512 and up, with `X32_SYSCALL_BIT`); below 512 x32 shares
/// x86-64's numbers.
const X32_OWN: [&str; 36] = [
    "rt_sigaction",
    "rt_sigreturn",
    "ioctl",
    "readv",
    "writev",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "execve",
    "ptrace",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigqueueinfo",
    "sigaltstack",
    "timer_create",
    "mq_notify",
    "kexec_load",
    "waitid",
    "set_robust_list",
    "get_robust_list",
    "vmsplice",
    "move_pages",
    "preadv",
    "pwritev",
    "rt_tgsigqueueinfo",
    "recvmmsg",
    "sendmmsg",
    "process_vm_readv",
    "process_vm_writev",
    "setsockopt",
    "getsockopt",
    "io_setup",
    "io_submit",
    "execveat",
    "preadv2",
    "pwritev2",
];

/// One ABI a process on this node can call the kernel through.
struct Abi {
    /// The libseccomp/OCI name.
    arch: Arch,
    label: &'static str,
    audit: u32,
    /// Constraints on `nr` that select this ABI under `audit` (x32 shares x86-64's arch).
    nr_class: &'static [Lit],
    /// 32-bit ABI: libseccomp compares the low words of arguments only.
    narrow: bool,
    /// Its system calls by name: numbers as `nr` carries them.
    numbers: fn(&str) -> Vec<u32>,
}

#[cfg(target_arch = "x86_64")]
fn node_abis() -> Vec<Abi> {
    use std::str::FromStr;
    vec![
        Abi {
            arch: Arch::ScmpArchX86_64,
            label: "x86_64",
            audit: AUDIT_ARCH_X86_64,
            nr_class: &[Lit::Eq(X32_SYSCALL_BIT | 0x8000_0000, 0)],
            narrow: false,
            numbers: |n| {
                syscalls::x86_64::Sysno::from_str(n)
                    .map(|s| vec![s.id() as u32])
                    .unwrap_or_default()
            },
        },
        Abi {
            arch: Arch::ScmpArchX32,
            label: "x32",
            audit: AUDIT_ARCH_X86_64,
            nr_class: &[Lit::Eq(X32_SYSCALL_BIT | 0x8000_0000, X32_SYSCALL_BIT)],
            narrow: true,
            numbers: |n| {
                let mut v: Vec<u32> = X32_OWN
                    .iter()
                    .position(|x| *x == n)
                    .map(|i| X32_SYSCALL_BIT | (512 + i as u32))
                    .into_iter()
                    .collect();
                // Shared with x86-64 below 512, unless x32 has its own (the x86-64 number
                // then is not a valid x32 call, and counting it as the name's is lenient).
                if let Ok(s) = syscalls::x86_64::Sysno::from_str(n) {
                    v.push(X32_SYSCALL_BIT | s.id() as u32);
                }
                v
            },
        },
        Abi {
            arch: Arch::ScmpArchX86,
            label: "x86",
            audit: AUDIT_ARCH_I386,
            nr_class: &[Lit::Eq(0x8000_0000, 0)],
            narrow: true,
            numbers: |n| {
                syscalls::x86::Sysno::from_str(n)
                    .map(|s| vec![s.id() as u32])
                    .unwrap_or_default()
            },
        },
    ]
}

#[cfg(target_arch = "aarch64")]
fn node_abis() -> Vec<Abi> {
    use std::str::FromStr;
    vec![
        Abi {
            arch: Arch::ScmpArchAarch64,
            label: "aarch64",
            audit: AUDIT_ARCH_AARCH64,
            nr_class: &[Lit::Eq(0x8000_0000, 0)],
            narrow: false,
            numbers: |n| {
                syscalls::aarch64::Sysno::from_str(n)
                    .map(|s| vec![s.id() as u32])
                    .unwrap_or_default()
            },
        },
        Abi {
            arch: Arch::ScmpArchArm,
            label: "arm",
            audit: AUDIT_ARCH_ARM,
            nr_class: &[Lit::Eq(0x8000_0000, 0)],
            narrow: true,
            numbers: |n| {
                syscalls::arm::Sysno::from_str(n)
                    .map(|s| vec![s.id() as u32])
                    .unwrap_or_default()
            },
        },
    ]
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn node_abis() -> Vec<Abi> {
    Vec::new()
}

/// Whether this build can compare filter content on this node.
pub fn supported() -> bool {
    !node_abis().is_empty()
}

/// One disjunct: literals on words.
type Conj = Vec<(usize, Lit)>;
/// A formula in disjunctive normal form.
type Dnf = Vec<Conj>;

/// Disjuncts a profile's condition may expand into before the comparison gives up.
const MAX_DISJUNCTS: usize = 4096;

struct Rule {
    level: Level,
    action: LinuxSeccompAction,
    /// All must hold.
    conds: Vec<LinuxSeccompArg>,
}

/// The spec's profile, for one ABI: its rules by system call number.
struct AbiProfile {
    listed: bool,
    rules: BTreeMap<u32, (String, Vec<Rule>)>,
}

/// The spec's seccomp profile, as a bound.
pub struct Profile {
    default: LinuxSeccompAction,
    abis: Vec<(Abi, AbiProfile)>,
}

impl Profile {
    pub fn of(spec: &LinuxSeccomp) -> Profile {
        let listed: Vec<Arch> = spec.architectures().clone().unwrap_or_default();
        let mut abis = Vec::new();
        for (index, abi) in node_abis().into_iter().enumerate() {
            // libseccomp always adds the native ABI (the first).
            let is_listed = index == 0 || listed.contains(&abi.arch);
            let mut rules: BTreeMap<u32, (String, Vec<Rule>)> = BTreeMap::new();
            for s in spec.syscalls().iter().flatten() {
                let args = s.args().clone().unwrap_or_default();
                // runc: conditions on one argument given more than once are each a rule of
                // their own (ORed); otherwise all of a rule's conditions must hold.
                let mut seen = std::collections::BTreeSet::new();
                let repeated = args.iter().any(|a| !seen.insert(a.index()));
                let groups: Vec<Vec<LinuxSeccompArg>> = if repeated {
                    args.iter().map(|a| vec![*a]).collect()
                } else {
                    vec![args]
                };
                for name in s.names() {
                    for nr in (abi.numbers)(name) {
                        let entry = rules
                            .entry(nr)
                            .or_insert_with(|| (name.clone(), Vec::new()));
                        for g in &groups {
                            entry.1.push(Rule {
                                level: Level::of_action(s.action()),
                                action: s.action(),
                                conds: g.clone(),
                            });
                        }
                    }
                }
            }
            abis.push((
                abi,
                AbiProfile {
                    listed: is_listed,
                    rules,
                },
            ));
        }
        Profile {
            default: spec.default_action(),
            abis,
        }
    }
}

/// One condition as DNF over the argument's words (`negate`: its complement).
fn cond_dnf(c: &LinuxSeccompArg, narrow: bool, negate: bool) -> Dnf {
    use LinuxSeccompOperator as O;
    if c.index() >= 6 {
        // libseccomp refuses such a rule; runc then fails: never matches.
        return if negate { vec![vec![]] } else { vec![] };
    }
    let (lo, hi) = arg_words(c.index());
    let v = c.value();
    let (vl, vh) = (v as u32, (v >> 32) as u32);
    let full = u32::MAX;
    let op = c.op();
    // (op on the whole value) as DNF; the negation through the complementary operator.
    let op = if negate {
        match op {
            O::ScmpCmpEq => O::ScmpCmpNe,
            O::ScmpCmpNe => O::ScmpCmpEq,
            O::ScmpCmpLt => O::ScmpCmpGe,
            O::ScmpCmpGe => O::ScmpCmpLt,
            O::ScmpCmpGt => O::ScmpCmpLe,
            O::ScmpCmpLe => O::ScmpCmpGt,
            O::ScmpCmpMaskedEq => {
                let d = c.value_two().unwrap_or(0);
                let (dl, dh) = (d as u32, (d >> 32) as u32);
                let mut out = vec![vec![(lo, Lit::Ne(vl, dl))]];
                if !narrow {
                    out.push(vec![(hi, Lit::Ne(vh, dh))]);
                }
                return out;
            }
        }
    } else {
        op
    };
    let low = |l: Lit| -> Conj { vec![(lo, l)] };
    if narrow {
        return match op {
            O::ScmpCmpEq => vec![low(Lit::Eq(full, vl))],
            O::ScmpCmpNe => vec![low(Lit::Ne(full, vl))],
            O::ScmpCmpLt => vec![low(Lit::Lt(full, vl))],
            O::ScmpCmpLe => vec![low(Lit::Le(full, vl))],
            O::ScmpCmpGt => vec![low(Lit::Gt(full, vl))],
            O::ScmpCmpGe => vec![low(Lit::Ge(full, vl))],
            O::ScmpCmpMaskedEq => {
                let d = c.value_two().unwrap_or(0) as u32;
                vec![low(Lit::Eq(vl, d))]
            }
        };
    }
    let high_eq = (hi, Lit::Eq(full, vh));
    match op {
        O::ScmpCmpEq => vec![vec![high_eq, (lo, Lit::Eq(full, vl))]],
        O::ScmpCmpNe => vec![vec![(hi, Lit::Ne(full, vh))], vec![(lo, Lit::Ne(full, vl))]],
        O::ScmpCmpGt => vec![
            vec![(hi, Lit::Gt(full, vh))],
            vec![high_eq, (lo, Lit::Gt(full, vl))],
        ],
        O::ScmpCmpGe => vec![
            vec![(hi, Lit::Gt(full, vh))],
            vec![high_eq, (lo, Lit::Ge(full, vl))],
        ],
        O::ScmpCmpLt => vec![
            vec![(hi, Lit::Lt(full, vh))],
            vec![high_eq, (lo, Lit::Lt(full, vl))],
        ],
        O::ScmpCmpLe => vec![
            vec![(hi, Lit::Lt(full, vh))],
            vec![high_eq, (lo, Lit::Le(full, vl))],
        ],
        O::ScmpCmpMaskedEq => {
            let d = c.value_two().unwrap_or(0);
            vec![vec![
                (hi, Lit::Eq(vh, (d >> 32) as u32)),
                (lo, Lit::Eq(vl, d as u32)),
            ]]
        }
    }
}

fn and(a: &Dnf, b: &Dnf) -> Result<Dnf, String> {
    if a.len().saturating_mul(b.len()) > MAX_DISJUNCTS {
        return Err(format!(
            "the profile's argument conditions expand into more than {MAX_DISJUNCTS} cases"
        ));
    }
    let mut out = Vec::with_capacity(a.len() * b.len());
    for x in a {
        for y in b {
            let mut c = x.clone();
            c.extend(y.iter().copied());
            out.push(c);
        }
    }
    Ok(out)
}

/// The arguments for which the profile's outcome for a call with `rules` is below `above`:
/// no rule at least as permissive matches, and some stricter rule matches or the default is
/// stricter.
fn stricter_region(
    rules: &[Rule],
    default: Level,
    above: Level,
    narrow: bool,
) -> Result<Dnf, String> {
    let mut region: Dnf = vec![vec![]];
    for r in rules.iter().filter(|r| r.level >= above) {
        // Not all conditions hold: some condition fails.
        let mut fails: Dnf = Vec::new();
        for c in &r.conds {
            fails.extend(cond_dnf(c, narrow, true));
        }
        region = and(&region, &fails)?;
    }
    if default >= above {
        let mut some: Dnf = Vec::new();
        for r in rules.iter().filter(|r| r.level < above) {
            let mut all: Dnf = vec![vec![]];
            for c in &r.conds {
                all = and(&all, &cond_dnf(c, narrow, false))?;
            }
            some.extend(all);
        }
        region = and(&region, &some)?;
    }
    Ok(region)
}

/// Why a filter is weaker than the profile.
pub struct Weaker {
    pub what: String,
}

/// Whether the filter `program` lets through anything the profile stops: `Ok(())` when it is
/// at least as strict everywhere, `Err` saying where it is not (or why it could not be shown).
pub fn at_least_as_strict(program: &[u8], profile: &Profile) -> Result<(), Weaker> {
    let insns = decode(program).map_err(|what| Weaker { what })?;
    let default = Level::of_action(profile.default);
    // The least permissive outcome the profile has anywhere: paths at or below it are fine.
    let floor = profile
        .abis
        .iter()
        .flat_map(|(_, p)| {
            p.rules
                .values()
                .flat_map(|(_, r)| r.iter().map(|r| r.level))
                .chain([if p.listed { default } else { Level::Block }])
        })
        .min()
        .unwrap_or(Level::Block);
    let mut found: Option<String> = None;
    let mut failure: Option<String> = None;
    explore(
        &insns,
        floor,
        &mut |path| match check_path(&path, profile, default) {
            Ok(None) => true,
            Ok(Some(w)) => {
                found = Some(w);
                false
            }
            Err(e) => {
                failure = Some(e);
                false
            }
        },
    )
    .map_err(|what| Weaker { what })?;
    match (found, failure) {
        (Some(what), _) | (None, Some(what)) => Err(Weaker { what }),
        (None, None) => Ok(()),
    }
}

/// A path of the filter against the profile: `Some` describes an input where the filter is
/// more permissive.
fn check_path(path: &Path, profile: &Profile, default: Level) -> Result<Option<String>, String> {
    let got = path.ret.map_or(Level::Allow, Level::of_ret);
    let got_name = path.ret.map_or(
        "a value computed from the input (counted as allow)".into(),
        ret_name,
    );
    for (abi, p) in &profile.abis {
        let mut base = path.c.with(ARCH, Lit::Eq(u32::MAX, abi.audit));
        for l in abi.nr_class {
            base = base.with(NR, *l);
        }
        if !base.word_ok(ARCH) || !base.word_ok(NR) {
            continue;
        }
        let describe = |c: &Constraints, what: &str, spec: String| -> Option<String> {
            let w = c.witness()?;
            let nr = w[NR] & !(X32_SYSCALL_BIT * (abi.arch == Arch::ScmpArchX32) as u32);
            let args: Vec<String> = (0..6)
                .filter(|&i| {
                    let (lo, hi) = arg_words(i);
                    !c.words[lo].is_empty() || !c.words[hi].is_empty()
                })
                .map(|i| {
                    let (lo, hi) = arg_words(i);
                    format!(
                        "args[{i}] = {:#x}",
                        (u64::from(w[hi]) << 32) | u64::from(w[lo])
                    )
                })
                .collect();
            let args = if args.is_empty() {
                String::new()
            } else {
                format!(" with {}", args.join(", "))
            };
            Some(format!(
                "it returns {got_name} for {what} ({} nr {nr}{args}), where the spec's seccomp \
                 profile gives {spec}",
                abi.label
            ))
        };
        if !p.listed {
            // libseccomp's action for an ABI the profile does not list: kill.
            if got > Level::Block {
                if let Some(w) = describe(
                    &base,
                    "a system call",
                    format!("no {} architecture (killed)", abi.label),
                ) {
                    return Ok(Some(w));
                }
            }
            continue;
        }
        // Calls the profile names no rule for: its default action.
        if default < got {
            let mut c = base.clone();
            for nr in p.rules.keys() {
                c = c.with(NR, Lit::Ne(u32::MAX, *nr));
            }
            if let Some(w) = describe(
                &c,
                "a system call the profile has no rule for",
                action_name(profile.default),
            ) {
                return Ok(Some(w));
            }
        }
        // Calls with rules: where the rules (or the default) are stricter than the path.
        // A path that fixes the number (libseccomp's are a tree of `jeq nr`) has one
        // candidate; otherwise every number with rules that the path admits.
        let fixed = path.c.words[NR].iter().find_map(|l| match l {
            Lit::Eq(u32::MAX, k) => Some(*k),
            _ => None,
        });
        let candidates: Vec<(&u32, &(String, Vec<Rule>))> = match fixed {
            Some(k) => p.rules.get_key_value(&k).into_iter().collect(),
            None => p.rules.iter().collect(),
        };
        for (nr, (name, rules)) in candidates {
            if !path.c.words[NR].iter().all(|l| l.holds(*nr)) {
                continue;
            }
            let c = base.with(NR, Lit::Eq(u32::MAX, *nr));
            for conj in stricter_region(rules, default, got, abi.narrow)? {
                let mut cc = c.clone();
                for (w, l) in conj {
                    cc = cc.with(w, l);
                }
                let spec = rules
                    .iter()
                    .map(|r| r.level)
                    .filter(|l| *l < got)
                    .min()
                    .map_or(action_name(profile.default), |lvl| {
                        rules
                            .iter()
                            .find(|r| r.level == lvl)
                            .map_or(String::new(), |r| action_name(r.action))
                    });
                if let Some(w) = describe(&cc, name, spec) {
                    return Ok(Some(w));
                }
            }
        }
    }
    Ok(None)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests;
