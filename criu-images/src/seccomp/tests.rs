//! Filters assembled by hand, against profiles: what the comparison must accept (the same
//! meaning in another layout, anything stricter) and refuse (anything that lets more
//! through), including argument conditions, ABIs and instructions it cannot follow.

use super::*;

/// A tiny assembler: labels are instruction indexes, resolved to relative jumps.
#[derive(Default)]
struct Asm {
    code: Vec<(u16, Option<usize>, Option<usize>, u32)>,
}

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO_EPERM: u32 = 0x0005_0001;
const RET_KILL: u32 = 0;
const RET_TRACE: u32 = 0x7ff0_0000;

impl Asm {
    fn ld(&mut self, off: u32) -> &mut Self {
        self.code.push((0x20, None, None, off));
        self
    }
    fn and(&mut self, k: u32) -> &mut Self {
        self.code.push((0x54, None, None, k));
        self
    }
    fn add(&mut self, k: u32) -> &mut Self {
        self.code.push((0x04, None, None, k));
        self
    }
    /// `jeq k, then, else` with absolute targets.
    fn jeq(&mut self, k: u32, t: usize, f: usize) -> &mut Self {
        self.code.push((0x15, Some(t), Some(f), k));
        self
    }
    fn jgt(&mut self, k: u32, t: usize, f: usize) -> &mut Self {
        self.code.push((0x25, Some(t), Some(f), k));
        self
    }
    fn ret(&mut self, k: u32) -> &mut Self {
        self.code.push((0x06, None, None, k));
        self
    }
    fn ret_a(&mut self) -> &mut Self {
        self.code.push((0x16, None, None, 0));
        self
    }
    fn here(&self) -> usize {
        self.code.len()
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for (pc, (code, t, f, k)) in self.code.iter().enumerate() {
            let rel = |x: &Option<usize>| x.map_or(0, |x| (x - pc - 1) as u8);
            out.extend(code.to_ne_bytes());
            out.push(rel(t));
            out.push(rel(f));
            out.extend(k.to_ne_bytes());
        }
        out
    }
}

const NR_READ: u32 = 0;
const NR_WRITE: u32 = 1;
const NR_PERSONALITY: u32 = 135;
const NR_MOUNT: u32 = 165;

fn profile(json: serde_json::Value) -> Profile {
    let s: LinuxSeccomp = serde_json::from_value(json).unwrap();
    Profile::of(&s)
}

/// Allows read and write, personality(0) only; everything else EPERM; x86-64 only.
fn allowlist() -> Profile {
    profile(serde_json::json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "architectures": ["SCMP_ARCH_X86_64"],
        "syscalls": [
            {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW"},
            {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
             "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]}
        ]
    }))
}

/// What libseccomp makes of [`allowlist`] (in its shape: arch, x32 bit, nr, then arguments'
/// high and low words).
fn honest(personality_hi_checked: bool) -> Vec<u8> {
    let mut a = Asm::default();
    // 0: ld arch; 1: jeq X86_64 ? 2 : kill
    a.ld(4);
    let kill = 100; // patched below
    a.jeq(AUDIT_ARCH_X86_64, 2, kill);
    a.ld(0); // 2
    a.jgt(0x3fff_ffff, kill, 4); // 3: x32 → kill
    a.jeq(NR_READ, 20, 5); // 4
    a.jeq(NR_WRITE, 20, 6); // 5
    a.jeq(NR_PERSONALITY, 7, 21); // 6
    if personality_hi_checked {
        a.ld(20); // 7: args[0] hi
        a.jeq(0, 9, 21); // 8
        a.ld(16); // 9: args[0] lo
        a.jeq(0, 20, 21); // 10
    } else {
        a.ld(16); // 7
        a.jeq(0, 20, 21); // 8
        a.ret(RET_ERRNO_EPERM); // 9 (unused)
        a.ret(RET_ERRNO_EPERM); // 10 (unused)
    }
    while a.here() < 20 {
        a.ret(RET_ERRNO_EPERM);
    }
    a.ret(RET_ALLOW); // 20
    a.ret(RET_ERRNO_EPERM); // 21
                            // Patch the kill target.
    let k = a.here();
    a.ret(RET_KILL);
    for c in a.code.iter_mut() {
        if c.1 == Some(kill) {
            c.1 = Some(k);
        }
        if c.2 == Some(kill) {
            c.2 = Some(k);
        }
    }
    a.bytes()
}

fn weaker(program: &[u8], p: &Profile) -> String {
    match at_least_as_strict(program, p) {
        Ok(()) => panic!("accepted"),
        Err(w) => w.what,
    }
}

#[test]
fn the_same_meaning_and_anything_stricter_is_accepted() {
    let p = allowlist();
    at_least_as_strict(&honest(true), &p).unwrap_or_else(|w| panic!("{}", w.what));
    // Errno for everything, kill for everything: stricter.
    let mut a = Asm::default();
    a.ret(RET_ERRNO_EPERM);
    at_least_as_strict(&a.bytes(), &p).unwrap_or_else(|w| panic!("{}", w.what));
    let mut a = Asm::default();
    a.ret(RET_KILL);
    at_least_as_strict(&a.bytes(), &p).unwrap_or_else(|w| panic!("{}", w.what));
}

#[test]
fn one_allow_instruction_is_refused_naming_a_call() {
    let mut a = Asm::default();
    a.ret(RET_ALLOW);
    let why = weaker(&a.bytes(), &allowlist());
    assert!(why.contains("SECCOMP_RET_ALLOW"), "{why}");
    assert!(why.contains("SCMP_ACT_ERRNO"), "{why}");
}

#[test]
fn one_more_allowed_call_is_refused_by_name() {
    // The honest program, with mount allowed too.
    let mut a = Asm::default();
    a.ld(4).jeq(AUDIT_ARCH_X86_64, 2, 6);
    a.ld(0).jeq(NR_MOUNT, 5, 4);
    a.ret(RET_ERRNO_EPERM); // 4
    a.ret(RET_ALLOW); // 5
    a.ret(RET_KILL); // 6
    let why = weaker(&a.bytes(), &allowlist());
    assert!(why.contains("x86_64 nr 165"), "{why}");
}

#[test]
fn an_argument_condition_left_out_is_refused_with_the_arguments() {
    // personality allowed whatever args[0] is.
    let mut a = Asm::default();
    a.ld(4).jeq(AUDIT_ARCH_X86_64, 2, 6);
    a.ld(0).jeq(NR_PERSONALITY, 5, 4);
    a.ret(RET_ERRNO_EPERM); // 4
    a.ret(RET_ALLOW); // 5
    a.ret(RET_KILL); // 6
    let why = weaker(&a.bytes(), &allowlist());
    assert!(why.contains("personality"), "{why}");
    assert!(why.contains("args[0] = 0x"), "{why}");
    // Only the low word checked: a high word other than 0 gets through.
    let why = weaker(&honest(false), &allowlist());
    assert!(
        why.contains("personality") && why.contains("args[0]"),
        "{why}"
    );
}

#[test]
fn abis_the_profile_does_not_list_must_not_be_allowed() {
    // No arch check: i386's call 0 is allowed, where libseccomp kills.
    let mut a = Asm::default();
    a.ld(0).jgt(0x3fff_ffff, 4, 2);
    a.jeq(NR_READ, 3, 4);
    a.ret(RET_ALLOW); // 3
    a.ret(RET_ERRNO_EPERM); // 4
    let why = weaker(&a.bytes(), &allowlist());
    assert!(why.contains("x86 nr"), "{why}");
}

#[test]
fn what_the_executor_cannot_follow_counts_as_allowed() {
    // `ret A` of a value computed from nr.
    let mut a = Asm::default();
    a.ld(0).add(1).ret_a();
    weaker(&a.bytes(), &allowlist());
    // AND masks are followed: (nr & 0) == 0 always, so this is "errno for everything".
    let mut a = Asm::default();
    a.ld(0).and(0).jeq(0, 4, 3);
    a.ret(RET_ALLOW); // 3
    a.ret(RET_ERRNO_EPERM); // 4
    at_least_as_strict(&a.bytes(), &allowlist()).unwrap_or_else(|w| panic!("{}", w.what));
}

#[test]
fn delegating_where_the_profile_blocks_is_refused() {
    let mut a = Asm::default();
    a.ret(RET_TRACE);
    let why = weaker(&a.bytes(), &allowlist());
    assert!(why.contains("SECCOMP_RET_TRACE"), "{why}");
}

#[test]
fn a_denylist_profile_needs_its_denials() {
    let p = profile(serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["mount"], "action": "SCMP_ACT_ERRNO"}]
    }));
    let mut a = Asm::default();
    a.ret(RET_ALLOW);
    let why = weaker(&a.bytes(), &p);
    assert!(why.contains("mount"), "{why}");
    // Blocking mount on x86-64, and x32 and i386 (which the profile does not list) whole,
    // is enough.
    let mut a = Asm::default();
    a.ld(4).jeq(AUDIT_ARCH_X86_64, 2, 6);
    a.ld(0).jgt(0x3fff_ffff, 6, 4);
    a.jeq(NR_MOUNT, 6, 5); // 4
    a.ret(RET_ALLOW); // 5
    a.ret(RET_ERRNO_EPERM); // 6
    at_least_as_strict(&a.bytes(), &p).unwrap_or_else(|w| panic!("{}", w.what));
    // Letting x32 through is not.
    let mut a = Asm::default();
    a.ld(4).jeq(AUDIT_ARCH_X86_64, 2, 5);
    a.ld(0).jeq(NR_MOUNT, 5, 4);
    a.ret(RET_ALLOW); // 4
    a.ret(RET_ERRNO_EPERM); // 5
    let why = weaker(&a.bytes(), &p);
    assert!(why.contains("x32"), "{why}");
}

#[test]
fn malformed_programs_are_refused() {
    for (bytes, why) in [
        (vec![0u8; 7], "not a BPF program"),
        (
            {
                let mut a = Asm::default();
                a.ld(64).ret(RET_ALLOW);
                a.bytes()
            },
            "outside seccomp_data",
        ),
        (
            {
                let mut a = Asm::default();
                a.ld(0);
                a.bytes()
            },
            "not a return",
        ),
    ] {
        let got = weaker(&bytes, &allowlist());
        assert!(got.contains(why), "{got}");
    }
}

#[test]
fn the_word_solver_handles_points_masks_and_intervals() {
    assert_eq!(solve(&[Lit::Eq(0xff, 0x100)]), None);
    assert_eq!(
        solve(&[
            Lit::Ge(u32::MAX, 5),
            Lit::Le(u32::MAX, 7),
            Lit::Ne(u32::MAX, 5)
        ]),
        Some(Some(6))
    );
    assert_eq!(
        solve(&[
            Lit::Ge(u32::MAX, 5),
            Lit::Le(u32::MAX, 6),
            Lit::Ne(u32::MAX, 5),
            Lit::Ne(u32::MAX, 6)
        ]),
        None
    );
    assert_eq!(
        solve(&[Lit::Any(0x8000_0000), Lit::Lt(u32::MAX, 0x8000_0000)]),
        None
    );
    assert_eq!(
        solve(&[Lit::Eq(0xf0, 0x30), Lit::Ne(0x0f, 0)]),
        Some(Some(0x31))
    );
}
