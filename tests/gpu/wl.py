#!/usr/bin/env python3
"""wl.py: reads gpu_verify logs for tests/gpu/run-h200.sh (process-aware: lines carry proc=I).

A "mark" is a line count of the log file (`wc -l`): each log line is one O_APPEND write, so the
first MARK lines are the lines written before the mark was taken.

  wl.py mark LOG                              line count (0 when the file is missing)
  wl.py wait LOG AFTER STEPS PROCS TIMEOUT_S  until each proc 0..PROCS-1 has STEPS step lines
                                              after line AFTER; exit 1 on timeout or an ERROR line
  wl.py alive LOG PHASE BEFORE PROCS          each proc kept its run and stepped on without a gap
                                              in step numbers across line BEFORE (leave-running)
  wl.py continuity LOG PHASE BEFORE KILL PROCS [AFTER]
                                              restored: each proc's first step after line AFTER
                                              (default KILL) is between s0+1 and s1+1 (s0: its last
                                              step before line BEFORE, s1: its last before KILL),
                                              same run, no start line after AFTER
  wl.py firstts LOG AFTER PROCS               max over procs of the ts of the first step after AFTER
  wl.py gap LOG FROM TO PROCS                 longest ts gap (ms) between consecutive steps of one
                                              proc, over lines FROM..TO (plus the step before FROM)
  wl.py bench2-table JSONL OUT.txt            the gpusnap/reference table of run-h200.sh's bench2

Output lines start with "OK " or "FAIL " where they are checks; exit 1 when any check failed.
"""
import json
import os
import re
import statistics
import sys
import time

FIELD = re.compile(r"(\w+)=(\S+)")


def lines_of(log):
    try:
        with open(log, errors="replace") as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def fields(line):
    return dict(FIELD.findall(line))


def steps(lines):
    """(line index, proc, step, ts, run) of every step line."""
    out = []
    for i, l in enumerate(lines):
        if l.startswith("step="):
            f = fields(l)
            out.append((i, int(f.get("proc", 0)), int(f["step"]), int(f.get("ts", 0)), f.get("run")))
    return out


def bad_lines(lines, after=0):
    return [l for l in lines[after:] if l.startswith(("MISMATCH", "ERROR"))
            or re.search(r"\b(mismatches|total)=[1-9]", l)]


def cmd_wait(log, after, n, procs, timeout):
    after, n, procs, end = int(after), int(n), int(procs), time.time() + float(timeout)
    while True:
        ls = lines_of(log)
        cnt = [0] * procs
        for i, p, *_ in steps(ls):
            if i >= after and p < procs:
                cnt[p] += 1
        if min(cnt) >= n:
            return 0
        errs = [l for l in ls[after:] if l.startswith("ERROR")]
        if errs:
            print("FAIL error in log: %s" % errs[0])
            return 1
        if time.time() > end:
            print("wait: timeout; steps per proc after line %d: %s" % (after, cnt))
            return 1
        time.sleep(0.1)


def per_proc(ls, procs):
    st = steps(ls)
    return {p: [s for s in st if s[1] == p] for p in range(procs)}


def cmd_alive(log, phase, before, procs):
    before, procs = int(before), int(procs)
    ls = lines_of(log)
    fails = 0
    for p, st in per_proc(ls, procs).items():
        pre = [s for s in st if s[0] < before]
        post = [s for s in st if s[0] >= before]
        if not pre or not post:
            print("FAIL %s: proc %d has no steps %s the mark" % (phase, p, "before" if not pre else "after"))
            fails += 1
            continue
        run = pre[-1][4]
        seq = [pre[-1]] + post
        gaps = [(a[2], b[2]) for a, b in zip(seq, seq[1:]) if b[2] != a[2] + 1]
        runs = {s[4] for s in post}
        if runs != {run}:
            print("FAIL %s: proc %d changed run %s -> %s (restarted)" % (phase, p, run, sorted(runs)))
            fails += 1
        elif gaps:
            print("FAIL %s: proc %d step numbers jump: %s" % (phase, p, gaps[:3]))
            fails += 1
        else:
            print("OK %s: proc %d kept running (steps %d..%d, run %s)" % (phase, p, pre[-1][2], post[-1][2], run))
    if [l for l in ls[before:] if l.startswith("start run=")]:
        print("FAIL %s: a start line after the mark: a process started afresh" % phase)
        fails += 1
    return 1 if fails else 0


def cmd_continuity(log, phase, before, kill, procs, after=None):
    before, kill, procs = int(before), int(kill), int(procs)
    after = kill if after is None else int(after)
    ls = lines_of(log)
    fails = 0
    for p, st in per_proc(ls, procs).items():
        s0 = [s for s in st if s[0] < before]
        s1 = [s for s in st if s[0] < kill]
        post = [s for s in st if s[0] >= after]
        if not s0 or not post:
            print("FAIL %s: proc %d: no steps %s" % (phase, p, "before the checkpoint" if not s0 else "after the restore"))
            fails += 1
            continue
        a, b, r = s0[-1][2], s1[-1][2], post[0]
        run = s1[-1][4]
        if r[4] != run:
            print("FAIL %s: proc %d restored with run %s, not %s: restarted, not restored" % (phase, p, r[4], run))
            fails += 1
        elif not (a + 1 <= r[2] <= b + 1):
            print("FAIL %s: proc %d first step after restore is %d; expected %d..%d" % (phase, p, r[2], a + 1, b + 1))
            fails += 1
        else:
            print("OK %s: proc %d continued at step %d (checkpoint after step %d, killed at %d), same run %s"
                  % (phase, p, r[2], a, b, run))
    starts = [l for l in ls[after:] if l.startswith("start run=")]
    if starts:
        print("FAIL %s: the workload started afresh after the restore: %s" % (phase, starts[0]))
        fails += 1
    bad = bad_lines(ls)
    if bad:
        print("FAIL %s: mismatches/errors in the log: %s" % (phase, bad[0]))
        fails += 1
    else:
        n = len(steps(ls))
        print("OK %s: %d step lines, 0 mismatches" % (phase, n))
    return 1 if fails else 0


def cmd_firstts(log, after, procs):
    after, procs = int(after), int(procs)
    first = {}
    for i, p, step, ts, run in steps(lines_of(log)):
        if i >= after and p < procs and p not in first:
            first[p] = ts
    print(max(first.values()) if len(first) == procs else "-")
    return 0


def cmd_gap(log, a, b, procs):
    a, b, procs = int(a), int(b), int(procs)
    worst = 0
    for p, st in per_proc(lines_of(log), procs).items():
        pre = [s for s in st if s[0] < a]
        seq = pre[-1:] + [s for s in st if a <= s[0] < b]
        for x, y in zip(seq, seq[1:]):
            worst = max(worst, y[3] - x[3])
    print(worst)
    return 0


def num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def med(vals):
    vals = [v for v in vals if num(v)]
    if not vals:
        return None
    return statistics.median(vals)


def fmt(v):
    if v is None:
        return "-"
    return "%d" % round(v)


METRICS = [
    ("ck_image_path_ms", "(i)   ctr t checkpoint --image-path, leave running: wall"),
    ("stall_i_ms", "(iv)  workload stall around (i): longest step gap"),
    ("ck_task_ms", "(ii)  ctr c checkpoint --task: wall"),
    ("stall_ii_ms", "(iv)  workload stall around (ii): longest step gap"),
    ("restore_ms", "(iii) ctr c restore --live: wall"),
    ("first_step_ms", "(iii) restore start -> first verified step (all procs)"),
    ("annot_restore_first_step_ms", "(v)   pod restore-from: runp+create+start -> first verified step"),
    ("own_first_step_ms", "(vi)  own checkpoint, pod restore-from: runp -> first verified step"),
    ("own_start_first_step_ms", "(vi)  own checkpoint: crictl start -> first verified step"),
    ("own_phase_sum_ms", "(vi)  own checkpoint: shim phase sum (validate..CRIU+CUDA)"),
]


def cmd_bench2_table(jsonl, out):
    rows = [json.loads(l) for l in open(jsonl) if l.strip()] if os.path.exists(jsonl) else []
    cases = []
    for r in rows:
        c = (r["size_mib"], r["procs"])
        if c not in cases:
            cases.append(c)
    text = []
    w = text.append
    w("bench2: gpusnap (containerd + gpusnap shim) vs reference (containerd + containerd-shim-runc-v2 + CRIU cuda_plugin + cuda-checkpoint)")
    w("medians over repetitions; ratio = gpusnap / reference (< 1: gpusnap faster); all times in ms")
    for size, procs in cases:
        cr = [r for r in rows if r["size_mib"] == size and r["procs"] == procs]
        side = lambda s: [r for r in cr if r["side"] == s and r.get("position", 1) > 0]
        g, ref = side("gpusnap"), side("reference")
        annot = [r for r in cr if r.get("position") == 0]
        w("")
        vi_first_reps = {r["rep"] for r in annot if r.get("own_order") == "first"}
        firsts = ["(vi) first" if r["rep"] in vi_first_reps else "%s first" % r["side"]
                  for r in cr if r.get("position") == 1]
        w("== %d MiB, %d process%s (%d gpusnap run(s), %d reference run(s); order per rep: %s)" % (
            size, procs, "" if procs == 1 else "es", len(g), len(ref), ", ".join(firsts)))
        w("%-66s %12s %12s %8s   %s" % ("metric", "reference", "gpusnap", "ratio", "values g | r"))
        for key, label in METRICS:
            src = annot if key.startswith(("annot_", "own_")) else g
            gv, rv = [r.get(key) for r in src], [r.get(key) for r in ref]
            gm, rm = med(gv), med(rv)
            if gm is None and rm is None:
                continue
            ratio = "%.2fx" % (gm / rm) if gm is not None and rm else "-"
            w("%-66s %12s %12s %8s   %s | %s" % (label, fmt(rm), fmt(gm), ratio,
                                              ",".join(fmt(v) if num(v) else "-" for v in gv),
                                              ",".join(fmt(v) if num(v) else "-" for v in rv)))
        # (vi) against what the issue compares it with: the shim's own phase sum for that restore,
        # and the reference's `ctr c restore` to its first verified step (iii).
        own_first = med([r.get("own_first_step_ms") for r in annot])
        own_start = med([r.get("own_start_first_step_ms") for r in annot])
        own_sum = med([r.get("own_phase_sum_ms") for r in annot])
        ref_first = med([r.get("first_step_ms") for r in ref])
        for label, a, b in (
            ("(vi) runp -> first step / reference (iii) restore -> first step", own_first, ref_first),
            ("(vi) crictl start -> first step / reference (iii)", own_start, ref_first),
            ("(vi) crictl start -> first step / shim phase sum", own_start, own_sum),
            ("(vi) runp -> first step / shim phase sum", own_first, own_sum),
        ):
            if a is not None and b:
                w("  %-64s %.2fx (%s / %s ms)" % (label, a / b, fmt(a), fmt(b)))
        # The same ratio pair by pair: (vi) of a repetition against the reference's (iii) of the
        # same repetition, with where (vi) ran in it (first or last).
        ref_by_rep = {r["rep"]: r.get("first_step_ms") for r in ref}
        pairs = []
        for r in annot:
            a, b = r.get("own_first_step_ms"), ref_by_rep.get(r["rep"])
            if num(a) and num(b) and b:
                pairs.append((r["rep"], r.get("own_order") or "-", a / b))
        if pairs:
            w("  %-64s %s; median %.2fx" % (
                "(vi) runp -> first step / reference (iii), per rep",
                ", ".join("rep %d (%s) %.2fx" % p for p in pairs), med([p[2] for p in pairs])))
        for r in g + annot:
            for k in ("manifest_i", "manifest_ii"):
                if r.get(k):
                    w("  gpusnap rep %d %s phases: %s" % (r["rep"], k.split("_")[1], " ".join("%s=%s" % tuple(kv) for kv in r[k])))
            for k in ("shim_ck_i", "shim_ck_ii", "shim_restore", "annot_detail", "own_detail"):
                if r.get(k):
                    w("  gpusnap rep %d %s: %s" % (r["rep"], k, r[k]))
        for r in cr:
            if r.get("failures"):
                w("  FAILURES %s rep %d: %s" % (r["side"], r["rep"], "; ".join(r["failures"])))
    s = "\n".join(text) + "\n"
    with open(out, "w") as f:
        f.write(s)
    sys.stdout.write(s)
    return 0


def main(a):
    if len(a) < 2:
        sys.exit(__doc__)
    cmd, rest = a[1], a[2:]
    if cmd == "mark":
        print(len(lines_of(rest[0])))
        return 0
    table = {"wait": cmd_wait, "alive": cmd_alive, "continuity": cmd_continuity,
             "firstts": cmd_firstts, "gap": cmd_gap, "bench2-table": cmd_bench2_table}
    if cmd not in table:
        sys.exit(__doc__)
    return table[cmd](*rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
