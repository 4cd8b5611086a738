#!/usr/bin/env bash
# packaging/deb/test-deb.sh — the .deb as an operator uses it, on this machine: lintian must
# report no error; then docs/install.md's commands marked `test: deb` run as written (build,
# apt-get install, man page, `gpusnap install`, restart, `gpusnap doctor`, `gpusnap
# uninstall`, apt-get remove, apt-get purge), with an upgrade to a newer package in between
# that must keep an edited conffile and the registration. Checks after each step.
#
# The node is this machine in a private mount namespace whose runtime configuration
# directories (/etc/containerd, /etc/crio, /etc/containers, /etc/criu, /etc/gpusnap,
# /var/lib/gpusnap, /run/containerd) are fresh tmpfs, with a real containerd (the rig's 2.1)
# serving /run/containerd/containerd.sock; `systemctl restart containerd` restarts it (no
# systemd here). The package itself is installed for real (dpkg's database), and purged.
#
# Environment: DEB_PROFILE/DEB_NO_BUILD as for build-deb.sh (CI packages target/debug).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
RIG=${GPUSNAP_RIG_BIN:-/opt/gpusnap-rig/bin}
if [[ ${GPUSNAP_DEB_TEST_NS:-} != 1 ]]; then
    exec env GPUSNAP_DEB_TEST_NS=1 unshare --mount --propagation private "$0" "$@"
fi
fail() { echo "test-deb.sh: FAIL: $*" >&2; exit 1; }
T0=$SECONDS
say() { printf '\n--> %s  [t+%ds]\n' "$*" "$((SECONDS - T0))"; }
T=$(mktemp -d /tmp/gpusnap-deb-test.XXXXXX)
cleanup() {
    touch "$T/stop"
    [[ -f $T/containerd.pid ]] && kill "$(cat "$T/containerd.pid")" 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT

NEED=()
command -v lintian >/dev/null || NEED+=(lintian)
command -v man >/dev/null || NEED+=(man-db)
if ((${#NEED[@]})); then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${NEED[@]}" >/dev/null
fi
# A package left by an earlier, interrupted run.
dpkg -s gpusnap >/dev/null 2>&1 && apt-get purge -y -qq gpusnap >/dev/null

for d in /etc/containerd /etc/crio /etc/containers /etc/criu /etc/gpusnap /var/lib/gpusnap \
    /run/containerd /var/lib/containerd; do
    mkdir -p "$d"
    mount -t tmpfs -o mode=0755 gpusnap-deb-test "$d"
done
cat >/etc/containerd/config.toml <<CONF
# this node's containerd configuration (packaging/deb/test-deb.sh)
version = 3
root = "/var/lib/containerd/root"
state = "/run/containerd/state"

[plugins.'io.containerd.internal.v1.opt']
  path = "/var/lib/containerd/opt"

[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true

[plugins.'io.containerd.cri.v1.runtime'.cni]
  bin_dirs = ["/var/lib/containerd/cni/bin"]
  conf_dir = "/var/lib/containerd/cni/net.d"

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.nri.v1.nri']
  disable = true
CONF
cp /etc/containerd/config.toml "$T/containerd-before.toml"
(
    while [[ ! -e $T/stop ]]; do
        rm -f /run/containerd/containerd.sock
        "$RIG/containerd" --config /etc/containerd/config.toml >>"$T/containerd.log" 2>&1 &
        echo $! >"$T/containerd.pid"
        wait $! || true
    done
) &
for _ in $(seq 300); do [[ -S /run/containerd/containerd.sock ]] && break; sleep 0.1; done
[[ -S /run/containerd/containerd.sock ]] || fail "containerd did not start: $(tail -5 "$T/containerd.log")"
install -d "$T/bin"
cat >"$T/bin/systemctl" <<SYSTEMCTL
#!/bin/sh
# systemd's part on this test node: restart the supervised containerd.
[ "\$*" = "restart containerd" ] || { echo "systemctl (test): only 'restart containerd'" >&2; exit 1; }
old=\$(cat $T/containerd.pid)
kill \$old
i=0
while [ "\$(cat $T/containerd.pid)" = "\$old" ] || [ ! -S /run/containerd/containerd.sock ]; do
    i=\$((i + 1)); [ \$i -lt 600 ] || exit 1; sleep 0.1
done
SYSTEMCTL
chmod +x "$T/bin/systemctl"
export PATH="$T/bin:$PATH"

python3 packaging/test/doc-blocks.py docs/install.md deb >"$T/commands"
mapfile -t COMMANDS <"$T/commands"
run_until() {
    # Runs the documented commands up to and including the one matching $1.
    while ((${#COMMANDS[@]})); do
        local cmd=${COMMANDS[0]}
        COMMANDS=("${COMMANDS[@]:1}")
        echo "\$ $cmd"
        bash -euo pipefail -c "$cmd" || fail "documented command failed: $cmd"
        [[ $cmd != *$1* ]] || return 0
    done
    fail "no documented command matches $1"
}

say "install (docs/install.md, section 2)"
run_until "man -w"
DEB=$(ls target-deb/gpusnap_*.deb | head -n1)
lintian --tag-display-limit 0 "$DEB" 2>&1 | grep -v 'root privileges' | tee "$T/lintian.txt" || true
! grep -q '^E:' "$T/lintian.txt" || fail "lintian reports errors"
echo "lintian: $(grep -c '^W:' "$T/lintian.txt" || true) warnings, no errors"
for f in /usr/bin/gpusnap /usr/bin/gpusnap-runc /usr/bin/containerd-shim-gpusnap-v2 \
    /usr/share/man/man1/gpusnap.1.gz /usr/share/man/man1/gpusnap-runc.1.gz \
    /usr/share/man/man1/containerd-shim-gpusnap-v2.1.gz \
    /usr/share/bash-completion/completions/gpusnap /usr/share/zsh/vendor-completions/_gpusnap \
    /usr/share/fish/vendor_completions.d/gpusnap.fish /etc/gpusnap/config.toml; do
    [[ -e $f ]] || fail "$f not installed"
done

say "register and check (section 4)"
run_until "gpusnap doctor"
gpusnap doctor --json | python3 -c 'import json,sys; c=[c for c in json.load(sys.stdin)["checks"] if c["name"]=="containerd"][0]; assert c["status"]=="ok", c; print("containerd:", c["summary"])'

say "upgrade to a newer package: the edited conffile and the registration stay"
sed -i 's/^lock_timeout_ms = .*/lock_timeout_ms = 20000/' /etc/gpusnap/config.toml
V=$(dpkg-query -W -f '${Version}' gpusnap)
DEB_VERSION="$V+1" bash packaging/deb/build-deb.sh --out "$T/new" >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o Dpkg::Options::=--force-confold "$T/new/gpusnap_$V+1_"*.deb >/dev/null
[[ $(dpkg-query -W -f '${Version}' gpusnap) == "$V+1" ]] || fail "not upgraded"
grep -qx 'lock_timeout_ms = 20000' /etc/gpusnap/config.toml || fail "the upgrade lost the conffile edit"
gpusnap doctor >/dev/null || fail "doctor fails after the upgrade"

say "uninstall, remove, purge (section 8)"
run_until "apt-get remove"
for f in /usr/bin/gpusnap /usr/bin/gpusnap-runc /usr/bin/containerd-shim-gpusnap-v2; do
    [[ ! -e $f ]] || fail "$f left after remove"
done
[[ -f /etc/gpusnap/config.toml ]] || fail "remove took the conffile"
cmp "$T/containerd-before.toml" /etc/containerd/config.toml || fail "containerd's config not restored"
[[ ! -e /etc/containerd/conf.d ]] || fail "drop-in directory left"
run_until "apt-get purge"
[[ ! -e /etc/gpusnap/config.toml ]] || fail "purge left the conffile"
! dpkg -s gpusnap >/dev/null 2>&1 || fail "still installed after purge"
((${#COMMANDS[@]} == 0)) || fail "documented commands not run: ${COMMANDS[*]}"
say "ok: the .deb is lintian-clean and installs, registers, upgrades, uninstalls and purges as documented"
