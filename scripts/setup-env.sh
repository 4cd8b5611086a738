#!/usr/bin/env bash
# scripts/setup-env.sh — idempotent installer for the gpusnap test/dev rig.
#
# Installs (as root, on Debian 12 "bookworm"):
#   * Debian packages: runc (bookworm's 1.1.x), CRIU build deps, busybox-static,
#     iptables/nftables, jq, ...
#   * CRIU 4.x built from Debian sid's *source* package (bookworm's 3.17 fails on
#     recent kernels: vDSO), installed to $PREFIX/bin/criu.
#   * CRIU 4.2.1's image format (images/*.proto, LICENSE) in $PREFIX/criu-proto/4.2.1, for
#     criu-images/build.rs.
#   * containerd 2.x binaries (containerd, ctr, containerd-shim-runc-v2) taken
#     from Debian sid's containerd .deb (they only need glibc >= 2.34).
#   * OCI test images: $PREFIX/images/busybox.oci.tar (docker.io/gpusnap/busybox:test)
#     and $PREFIX/images/pause.oci.tar (docker.io/gpusnap/pause:test).
#   * Symlinks for criu, containerd, ctr, containerd-shim-runc-v2 in /usr/local/bin.
#
# Debian sid is ONLY ever used through a private apt configuration under
# $PREFIX/apt (own sources list, lists dir and cache). The system's apt sources
# are never touched and nothing from sid is ever installed with dpkg/apt.
#
# Re-running is cheap: each step checks versions/stamps first and does nothing
# when its result is already in place.
#
# Environment:
#   GPUSNAP_RIG_PREFIX   install prefix (default /opt/gpusnap-rig)
#   GPUSNAP_SID_MIRROR   Debian mirror for sid (default http://deb.debian.org/debian)
#   GPUSNAP_CRIU_VERSION exact CRIU upstream version to build (default: sid's)
#   GPUSNAP_FORCE=1      redo every step (rebuild CRIU, re-extract containerd, images)
#   GPUSNAP_VERIFY=1     run the containerd import/run smoke check even if nothing changed
#   GPUSNAP_LINKS=0      do not create the /usr/local/bin symlinks (e.g. for a trial prefix)
#
# Run it as root, or as a user with sudo rights: it re-runs itself through sudo.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib/as-root.sh"

PREFIX=${GPUSNAP_RIG_PREFIX:-/opt/gpusnap-rig}
SID_MIRROR=${GPUSNAP_SID_MIRROR:-http://deb.debian.org/debian}
WANT_CRIU=${GPUSNAP_CRIU_VERSION:-}
FORCE=${GPUSNAP_FORCE:-0}
VERIFY=${GPUSNAP_VERIFY:-0}
LINKS=${GPUSNAP_LINKS:-1}
CRIU_MIN=4.2          # oldest CRIU accepted as "already installed"
IMAGE_RECIPE=3        # bump when the image layout/config below changes
BUSYBOX_REF=docker.io/gpusnap/busybox:test
PAUSE_REF=docker.io/gpusnap/pause:test

BIN=$PREFIX/bin
SRC=$PREFIX/src
IMAGES=$PREFIX/images
STAMPS=$PREFIX/stamps
APTDIR=$PREFIX/apt

export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C

START_TS=$(date +%s.%N)
CHANGED=()

log() { printf '[setup-env] %s\n' "$*"; }
die() { printf '[setup-env] ERROR: %s\n' "$*" >&2; exit 1; }
changed() { CHANGED+=("$1"); log "changed: $1"; }

# version_ge A B: true when version A >= B (dpkg ordering).
version_ge() { dpkg --compare-versions "$1" ge "$2"; }

[[ $(id -u) -eq 0 ]] || die "must run as root"
command -v apt-get >/dev/null || die "apt-get not found: this script targets Debian 12"
if [[ -r /etc/os-release ]]; then
    # shellcheck disable=SC1091
    . /etc/os-release
    [[ ${VERSION_CODENAME:-} == bookworm ]] || log "warning: expected Debian 12 (bookworm), found ${PRETTY_NAME:-unknown}"
fi

mkdir -p "$BIN" "$SRC" "$IMAGES" "$STAMPS" "$APTDIR"

# ---------------------------------------------------------------------------
# 1. Debian (bookworm) packages
# ---------------------------------------------------------------------------
APT_PKGS=(
    # container runtime bits
    runc iptables nftables jq busybox-static xz-utils ca-certificates util-linux
    # CRIU build dependencies actually needed by `make criu`
    gcc make pkgconf libc6-dev
    libprotobuf-c-dev protobuf-c-compiler protobuf-compiler libprotobuf-dev
    libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev
    libnftables-dev uuid-dev libaio-dev
    # CRIU's python tooling (crit) and misc
    python3-protobuf
    # OCI checkpoint images: a real registry on loopback and an independent image reader
    docker-registry skopeo
    # the other front doors: Podman (with conmon and CNI), and what CRI-O links against
    podman conmon containernetworking-plugins golang-github-containers-common
    libseccomp2 libsqlite3-0
    # TLS registry tests: a CA and an htpasswd made in the test
    openssl apache2-utils
    # GNU time: the peak memory of a hostile pull (cli/tests/image_hostile_pull.rs)
    time
)

missing_pkgs() {
    local p st
    for p in "${APT_PKGS[@]}"; do
        st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
        [[ $st == installed ]] || printf '%s\n' "$p"
    done
}

mapfile -t MISSING < <(missing_pkgs)
if ((${#MISSING[@]})); then
    log "installing Debian packages: ${MISSING[*]}"
    # A third-party source that cannot be reached must not stop us: install decides.
    apt-get update -qq || log "warning: apt-get update reported errors; installing anyway"
    apt-get install -y -qq --no-install-recommends "${MISSING[@]}" >/dev/null
    changed "apt: ${MISSING[*]}"
else
    log "Debian packages: all ${#APT_PKGS[@]} present"
fi
RUNC_VERSION=$(runc --version | awk '/^runc version/ {print $3}')

# ---------------------------------------------------------------------------
# Private apt configuration for Debian sid (source + binary indexes).
# ---------------------------------------------------------------------------
SID_LIST=$APTDIR/sid.list
SID_OPTS=(
    -o "Dir::Etc::SourceList=$SID_LIST"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$APTDIR/lists"
    -o "Dir::Cache=$APTDIR/cache"
    -o "Dir::State::status=/var/lib/dpkg/status"
    -o "Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false"
    -o "Acquire::IndexTargets::deb::CNF::DefaultEnabled=false"
    -o "APT::Get::List-Cleanup=true"
)
SID_READY=0

sid_apt_get() { apt-get "${SID_OPTS[@]}" "$@"; }
sid_apt_cache() { apt-cache "${SID_OPTS[@]}" "$@"; }

sid_prepare() {
    ((SID_READY)) && return 0
    mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial"
    local want
    want=$(printf '%s\n' \
        "# private to gpusnap's setup-env.sh; NOT used by the system's apt" \
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $SID_MIRROR sid main" \
        "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $SID_MIRROR sid main")
    if [[ ! -f $SID_LIST || $(cat "$SID_LIST") != "$want" ]]; then
        printf '%s\n' "$want" >"$SID_LIST"
    fi
    # Refresh the sid indexes when missing or older than a day.
    if [[ -z $(find "$APTDIR/lists" -maxdepth 1 -name '*_sid_main_source_Sources*' -mmin -1440 2>/dev/null) ]]; then
        log "refreshing private Debian sid indexes ($APTDIR/lists)"
        sid_apt_get update -qq || die "apt-get update for the private sid list failed"
    fi
    SID_READY=1
}

# Directory owned by _apt so apt can download without the "unsandboxed" warning.
apt_download_dir() {
    local d=$1
    mkdir -p "$d"
    if id _apt >/dev/null 2>&1; then chown _apt:root "$d"; fi
}

# ---------------------------------------------------------------------------
# 2. CRIU from sid's source package
# ---------------------------------------------------------------------------
criu_installed_version() {
    "$BIN/criu" --version 2>/dev/null | awk '/^Version:/ {print $2}' || true
}

# fetch_criu_orig [VERSION]: CRIU's orig tarball from sid, checked against the sha256 sid's
# Sources index lists, cached in $SRC; sets CRIU_ORIG (its path) and CRIU_UPVER.
fetch_criu_orig() {
    sid_prepare
    local want=${1:-} srcver upver orig sha
    if [[ -n $want ]]; then
        upver=$want
    else
        srcver=$(sid_apt_cache showsrc criu | awk '/^Version:/ {print $2}' | sort -V | tail -n1)
        [[ -n $srcver ]] || die "criu source package not found in sid"
        upver=${srcver#*:}
        upver=${upver%-*}
    fi
    [[ ${upver%%.*} -ge 4 ]] || die "sid carries criu $upver; need 4.x"
    orig=criu_${upver}.orig.tar.xz
    # sha256 of the orig tarball as published in sid's Sources index.
    sha=$(sid_apt_cache showsrc criu | awk -v f="$orig" '
        /^Checksums-Sha256:/ {in_s=1; next}
        /^[^ ]/ {in_s=0}
        in_s && $3 == f {print $1; exit}')
    [[ -n $sha ]] || die "no $orig listed in sid's Sources (versions: $(sid_apt_cache showsrc criu | awk '/^Version:/ {printf "%s ", $2}'))"

    if [[ -f $SRC/$orig ]] && echo "$sha  $SRC/$orig" | sha256sum -c --status; then
        log "CRIU $upver: using cached $SRC/$orig"
    else
        log "CRIU $upver: downloading source package from sid"
        local dl
        dl=$(mktemp -d "$SRC/dl.XXXXXX")
        apt_download_dir "$dl"
        # --download-only fetches .dsc, orig and debian tarballs; we only need the
        # orig tarball, so a failure of the other parts is tolerated as long as the
        # orig tarball arrived with the right checksum.
        (cd "$dl" && sid_apt_get source -qq --download-only "criu=${srcver:-$upver}" >/dev/null 2>&1) ||
            (cd "$dl" && sid_apt_get source -qq --download-only criu >/dev/null 2>&1) || true
        [[ -f $dl/$orig ]] || die "failed to download $orig from sid"
        echo "$sha  $dl/$orig" | sha256sum -c --status || die "$orig: sha256 mismatch"
        mv "$dl/$orig" "$SRC/$orig"
        rm -rf "$dl"
    fi
    CRIU_ORIG=$SRC/$orig
    CRIU_UPVER=$upver
}

install_criu() {
    fetch_criu_orig "$WANT_CRIU"
    local upver=$CRIU_UPVER orig
    orig=$(basename "$CRIU_ORIG")
    local build
    build=$(mktemp -d "$SRC/build.XXXXXX")
    tar -C "$build" -xf "$SRC/$orig"
    local dir
    dir=$(find "$build" -mindepth 1 -maxdepth 1 -type d | head -n1)
    log "CRIU $upver: building (make criu, $(nproc) jobs; log: $SRC/criu-build.log)"
    if ! make -C "$dir" -j"$(nproc)" criu >"$SRC/criu-build.log" 2>&1; then
        tail -n 40 "$SRC/criu-build.log" >&2
        die "CRIU build failed (full log: $SRC/criu-build.log)"
    fi
    install -m 0755 "$dir/criu/criu" "$BIN/criu.new"
    mv -f "$BIN/criu.new" "$BIN/criu"
    rm -rf "$build"
    echo "$upver" >"$STAMPS/criu"
    changed "criu $upver built from sid source"
}

CRIU_HAVE=$(criu_installed_version)
if [[ $FORCE == 1 || -z $CRIU_HAVE ]] || ! version_ge "$CRIU_HAVE" "$CRIU_MIN" ||
    { [[ -n $WANT_CRIU ]] && [[ $CRIU_HAVE != "$WANT_CRIU" ]]; }; then
    install_criu
    CRIU_HAVE=$(criu_installed_version)
    [[ -n $CRIU_HAVE ]] || die "installed criu does not run"
else
    log "CRIU $CRIU_HAVE: already installed"
fi

# ---------------------------------------------------------------------------
# 2b. CRIU 4.2.1's image format (images/*.proto and their LICENSE), which
#     criu-images/build.rs generates its types and its allowlist's schema from. Always 4.2.1,
#     whatever CRIU is installed: the allowlist models that format, and build.rs checks each
#     file against criu-images/proto/criu-4.2.1.sha256.
# ---------------------------------------------------------------------------
CRIU_PROTO_VERSION=4.2.1
CRIU_PROTO_DIR=$PREFIX/criu-proto/$CRIU_PROTO_VERSION
CRIU_PROTO_SUMS=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/criu-images/proto/criu-$CRIU_PROTO_VERSION.sha256

criu_protos_ok() {
    [[ -f $CRIU_PROTO_DIR/LICENSE ]] && (cd "$CRIU_PROTO_DIR" && sha256sum -c --status --strict "$CRIU_PROTO_SUMS")
}

install_criu_protos() {
    if [[ $FORCE != 1 ]] && criu_protos_ok; then
        log "CRIU $CRIU_PROTO_VERSION image protos: present in $CRIU_PROTO_DIR"
        return 0
    fi
    fetch_criu_orig "$CRIU_PROTO_VERSION"
    local tmp
    tmp=$(mktemp -d "$SRC/proto.XXXXXX")
    tar -C "$tmp" -xf "$CRIU_ORIG" --wildcards --no-anchored '*/images/*.proto' '*/images/LICENSE'
    rm -rf "$CRIU_PROTO_DIR.new"
    mkdir -p "$CRIU_PROTO_DIR.new"
    install -m 0644 "$tmp"/*/images/*.proto "$tmp"/*/images/LICENSE "$CRIU_PROTO_DIR.new/"
    rm -rf "$tmp"
    (cd "$CRIU_PROTO_DIR.new" && sha256sum -c --status --strict "$CRIU_PROTO_SUMS") ||
        die "CRIU $CRIU_PROTO_VERSION's images/*.proto do not match $CRIU_PROTO_SUMS"
    rm -rf "$CRIU_PROTO_DIR"
    mv "$CRIU_PROTO_DIR.new" "$CRIU_PROTO_DIR"
    changed "CRIU $CRIU_PROTO_VERSION image protos in $CRIU_PROTO_DIR"
}
install_criu_protos

# ---------------------------------------------------------------------------
# 3. containerd 2.x from sid's binary .deb (extracted, never dpkg-installed)
# ---------------------------------------------------------------------------
CONTAINERD_BINS=(containerd ctr containerd-shim-runc-v2)

containerd_installed_version() {
    local b
    for b in "${CONTAINERD_BINS[@]}"; do [[ -x $BIN/$b ]] || return 0; done
    "$BIN/containerd" --version 2>/dev/null | awk '{print $3}' | sed 's/+.*//' || true
}

install_containerd() {
    sid_prepare
    local cand upver
    cand=$(sid_apt_cache policy containerd | awk '/Candidate:/ {print $2}')
    [[ -n $cand && $cand != "(none)" ]] || die "containerd not found in sid"
    upver=${cand#*:}
    upver=${upver%%+*}
    upver=${upver%%~*}
    upver=${upver%-*}
    [[ ${upver%%.*} == 2 ]] || die "sid carries containerd $cand; need a 2.x release"
    if [[ $upver != 2.1.9 ]]; then
        log "note: sid carries containerd $upver (not 2.1.9); using it"
    fi
    local deb
    deb=$(find "$SRC" -maxdepth 1 -name "containerd_${cand#*:}_*.deb" | head -n1)
    if [[ -z $deb ]]; then
        log "containerd $cand: downloading .deb from sid"
        local dl
        dl=$(mktemp -d "$SRC/dl.XXXXXX")
        apt_download_dir "$dl"
        (cd "$dl" && sid_apt_get download -qq "containerd=$cand" >/dev/null) || die "apt-get download containerd=$cand failed"
        rm -f "$SRC"/containerd_*.deb
        mv "$dl"/containerd_*.deb "$SRC/"
        rm -rf "$dl"
        deb=$(find "$SRC" -maxdepth 1 -name "containerd_*.deb" | head -n1)
    else
        log "containerd $cand: using cached $deb"
    fi
    local x b
    x=$(mktemp -d "$SRC/x.XXXXXX")
    dpkg-deb -x "$deb" "$x"
    for b in "${CONTAINERD_BINS[@]}"; do
        [[ -x $x/usr/bin/$b ]] || die "$b missing from $deb"
        install -m 0755 "$x/usr/bin/$b" "$BIN/$b.new"
        mv -f "$BIN/$b.new" "$BIN/$b"
    done
    rm -rf "$x"
    echo "$cand" >"$STAMPS/containerd"
    changed "containerd $upver (sid $cand) binaries extracted"
}

CONTAINERD_HAVE=$(containerd_installed_version)
if [[ $FORCE == 1 || -z $CONTAINERD_HAVE || ${CONTAINERD_HAVE%%.*} != 2 ]]; then
    install_containerd
    CONTAINERD_HAVE=$(containerd_installed_version)
    [[ -n $CONTAINERD_HAVE ]] || die "installed containerd does not run"
else
    log "containerd $CONTAINERD_HAVE: already installed"
fi

# ---------------------------------------------------------------------------
# 3b. The real CRI client (crictl), the CRI validation suite (critest) and CRI-O, from the
#     steering repository's shared tools (no Go toolchain or module proxy is reachable)
# ---------------------------------------------------------------------------
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
SHARED_TOOLS=${GPUSNAP_SHARED_TOOLS:-$REPO_ROOT/../shared/tools}
install_shared_tool() {
    local xz=$1 name=$2
    if [[ ! -f $xz ]]; then
        log "warning: $xz not found (set GPUSNAP_SHARED_TOOLS): $name is not installed; the tests that need it fail"
        return 0
    fi
    if [[ -x $BIN/$name && $BIN/$name -nt $xz ]]; then
        return 0
    fi
    xz -dc "$xz" >"$BIN/$name.new"
    chmod 0755 "$BIN/$name.new"
    mv -f "$BIN/$name.new" "$BIN/$name"
    changed "$name from $xz"
}
install_shared_tool "$SHARED_TOOLS/cri-tools/crictl.xz" crictl
install_shared_tool "$SHARED_TOOLS/cri-tools/critest.xz" critest
install_shared_tool "$SHARED_TOOLS/cri-o/crio.xz" crio
install_shared_tool "$SHARED_TOOLS/cri-o/pinns.xz" pinns
if [[ -f $SHARED_TOOLS/cri-tools/mkimages.py ]]; then
    install -m 0755 "$SHARED_TOOLS/cri-tools/mkimages.py" "$BIN/cri-mkimages.py"
fi

# ---------------------------------------------------------------------------
# 4. /usr/local/bin symlinks
# ---------------------------------------------------------------------------
for b in criu containerd ctr containerd-shim-runc-v2 crictl; do
    [[ $LINKS == 1 ]] || break
    [[ -x $BIN/$b ]] || continue
    link=/usr/local/bin/$b
    if [[ -L $link && $(readlink "$link") == "$BIN/$b" ]]; then
        continue
    elif [[ -e $link && ! -L $link ]]; then
        log "warning: $link exists and is not a symlink; leaving it alone"
    else
        ln -sfn "$BIN/$b" "$link"
        changed "symlink $link -> $BIN/$b"
    fi
done

# ---------------------------------------------------------------------------
# 5. OCI test images (written by hand: rootfs layer, config, manifest, index)
# ---------------------------------------------------------------------------
case $(dpkg --print-architecture) in
amd64) OCI_ARCH=amd64 ;;
arm64) OCI_ARCH=arm64 ;;
ppc64el) OCI_ARCH=ppc64le ;;
*) OCI_ARCH=$(dpkg --print-architecture) ;;
esac

BUSYBOX_VERSION=$(dpkg-query -W -f='${Version}' busybox-static)
IMAGE_STAMP="recipe=$IMAGE_RECIPE busybox-static=$BUSYBOX_VERSION arch=$OCI_ARCH"

# blob FILE DIR: store FILE as a content-addressed blob under DIR/blobs/sha256,
# print "sha256:<hex> <size>".
blob() {
    local f=$1 layout=$2 hex size
    hex=$(sha256sum "$f" | awk '{print $1}')
    size=$(stat -c %s "$f")
    mkdir -p "$layout/blobs/sha256"
    cp "$f" "$layout/blobs/sha256/$hex"
    echo "sha256:$hex $size"
}

deterministic_tar() { # deterministic_tar OUT DIR ENTRIES...
    local out=$1 dir=$2
    shift 2
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu \
        -C "$dir" -cf "$out" "$@"
}

# build_image OUT REF LAYER_TAR CONFIG_JSON_FRAGMENT(jq object for .config)
build_image() {
    local out=$1 ref=$2 layer=$3 cfg=$4 work layout ldig lsize diffid cdig csize mdig msize
    work=$(mktemp -d)
    layout=$work/layout
    mkdir -p "$layout"
    read -r ldig lsize < <(blob "$layer" "$layout")
    diffid=$ldig # uncompressed layer: diff_id == digest
    jq -n --arg arch "$OCI_ARCH" --arg diffid "$diffid" --argjson cfg "$cfg" '{
        created: "1970-01-01T00:00:00Z",
        architecture: $arch,
        os: "linux",
        config: $cfg,
        rootfs: {type: "layers", diff_ids: [$diffid]},
        history: [{created: "1970-01-01T00:00:00Z", created_by: "gpusnap scripts/setup-env.sh (busybox-static)"}]
    }' >"$work/config.json"
    read -r cdig csize < <(blob "$work/config.json" "$layout")
    jq -n --arg cdig "$cdig" --argjson csize "$csize" --arg ldig "$ldig" --argjson lsize "$lsize" '{
        schemaVersion: 2,
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cdig, size: $csize},
        layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar", digest: $ldig, size: $lsize}]
    }' >"$work/manifest.json"
    read -r mdig msize < <(blob "$work/manifest.json" "$layout")
    jq -n --arg mdig "$mdig" --argjson msize "$msize" --arg arch "$OCI_ARCH" --arg ref "$ref" '{
        schemaVersion: 2,
        mediaType: "application/vnd.oci.image.index.v1+json",
        manifests: [{
            mediaType: "application/vnd.oci.image.manifest.v1+json",
            digest: $mdig, size: $msize,
            platform: {architecture: $arch, os: "linux"},
            annotations: {
                "org.opencontainers.image.ref.name": $ref,
                "io.containerd.image.name": $ref
            }
        }]
    }' >"$layout/index.json"
    echo '{"imageLayoutVersion":"1.0.0"}' >"$layout/oci-layout"
    deterministic_tar "$out.new" "$layout" oci-layout index.json blobs
    mv -f "$out.new" "$out"
    rm -rf "$work"
    echo "$mdig"
}

build_images() {
    local work root
    work=$(mktemp -d)
    root=$work/rootfs
    mkdir -p "$root"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,proc,sys,dev,root,var/run,run}
    chmod 1777 "$root/tmp"
    install -m 0755 /bin/busybox "$root/bin/busybox"
    local applet
    while read -r applet; do
        [[ $applet == bin/busybox ]] && continue
        mkdir -p "$root/$(dirname "$applet")"
        ln -sfn /bin/busybox "$root/$applet"
    done < <(/bin/busybox --list-full)
    [[ -L $root/bin/sh ]] || die "busybox has no sh applet"
    printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$root/etc/passwd"
    printf 'root:x:0:\nnogroup:x:65534:\n' >"$root/etc/group"
    printf 'gpusnap-test\n' >"$root/etc/hostname"
    : >"$root/etc/resolv.conf"
    : >"$root/etc/hosts"
    deterministic_tar "$work/layer.tar" "$root" .

    local path_env='PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    local bb_cfg pause_cfg
    bb_cfg=$(jq -cn --arg p "$path_env" '{Env: [$p], Cmd: ["sh"], WorkingDir: "/"}')
    # A pause-like image: PID 1 sleeps forever and exits 0 on SIGTERM/SIGINT
    # (PID 1 in a PID namespace ignores signals it has no handler for).
    pause_cfg=$(jq -cn --arg p "$path_env" '{Env: [$p], WorkingDir: "/",
        Entrypoint: ["/bin/sh", "-c", "trap \"exit 0\" TERM INT; while :; do sleep 3600 & wait $!; done"],
        Labels: {"io.cri-containerd.pause": "true"}}')
    BUSYBOX_DIGEST=$(build_image "$IMAGES/busybox.oci.tar" "$BUSYBOX_REF" "$work/layer.tar" "$bb_cfg")
    PAUSE_DIGEST=$(build_image "$IMAGES/pause.oci.tar" "$PAUSE_REF" "$work/layer.tar" "$pause_cfg")
    rm -rf "$work"
    printf '%s\n' "$IMAGE_STAMP" >"$STAMPS/images"
    changed "images rebuilt (busybox $BUSYBOX_DIGEST, pause $PAUSE_DIGEST)"
}

if [[ $FORCE == 1 || ! -f $IMAGES/busybox.oci.tar || ! -f $IMAGES/pause.oci.tar ||
    ! -f $STAMPS/images || $(cat "$STAMPS/images") != "$IMAGE_STAMP" ]]; then
    log "building OCI test images"
    build_images
else
    log "OCI test images: up to date"
fi

# ---------------------------------------------------------------------------
# 6. Smoke check: private containerd, import both images, run busybox.
#    Only when something changed (or GPUSNAP_VERIFY=1).
# ---------------------------------------------------------------------------
verify_rig() {
    local d pid ok=0 out
    d=$(mktemp -d /tmp/gpusnap-setup.XXXXXX)
    cat >"$d/config.toml" <<EOF
version = 3
root = "$d/root"
state = "$d/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.images", "io.containerd.cri.v1.runtime", "io.containerd.nri.v1.nri"]
[grpc]
  address = "$d/c.sock"
EOF
    PATH="$BIN:$PATH" "$BIN/containerd" --config "$d/config.toml" >"$d/containerd.log" 2>&1 &
    pid=$!
    local ctr=("$BIN/ctr" --address "$d/c.sock" --namespace gpusnap-setup)
    for _ in $(seq 100); do
        "${ctr[@]}" version >/dev/null 2>&1 && { ok=1; break; }
        sleep 0.1
    done
    cleanup_verify() {
        "${ctr[@]}" tasks kill -s KILL setup-smoke >/dev/null 2>&1 || true
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
        grep -F " $d/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
        rm -rf "$d"
        rm -rf /run/containerd/runc/gpusnap-setup
        local cg
        for cg in /sys/fs/cgroup/gpusnap-setup /sys/fs/cgroup/*/gpusnap-setup; do
            if [[ -d $cg ]]; then rmdir "$cg" 2>/dev/null || true; fi
        done
    }
    if ((!ok)); then
        tail -n 20 "$d/containerd.log" >&2
        cleanup_verify
        die "smoke check: containerd did not come up"
    fi
    if ! out=$("${ctr[@]}" images import "$IMAGES/busybox.oci.tar" 2>&1 && "${ctr[@]}" images import "$IMAGES/pause.oci.tar" 2>&1); then
        echo "$out" >&2
        cleanup_verify
        die "smoke check: ctr images import failed"
    fi
    local names
    names=$("${ctr[@]}" images ls -q)
    if ! grep -qxF "$BUSYBOX_REF" <<<"$names" || ! grep -qxF "$PAUSE_REF" <<<"$names"; then
        echo "images after import: $names" >&2
        cleanup_verify
        die "smoke check: imported images are not named $BUSYBOX_REF / $PAUSE_REF"
    fi
    if ! out=$(timeout 60 "${ctr[@]}" run --rm --fifo-dir "$d/fifo" "$BUSYBOX_REF" setup-smoke sh -c 'echo gpusnap-ok' </dev/null 2>&1) ||
        [[ $out != *gpusnap-ok* ]]; then
        echo "$out" >&2
        tail -n 20 "$d/containerd.log" >&2
        cleanup_verify
        die "smoke check: ctr run busybox failed"
    fi
    cleanup_verify
    log "smoke check: private containerd imported both images and ran busybox: ok"
}

if ((${#CHANGED[@]})) || [[ $VERIFY == 1 ]]; then
    verify_rig
fi

# ---------------------------------------------------------------------------
# Summary
# ---------------------------------------------------------------------------
CRIU_CHECK=$("$BIN/criu" check 2>&1 | tail -n1) || die "criu check failed: $CRIU_CHECK"
ELAPSED=$(awk -v s="$START_TS" -v e="$(date +%s.%N)" 'BEGIN {printf "%.1f", e - s}')
echo
echo "gpusnap rig environment ($PREFIX):"
printf '  %-24s %s\n' \
    "containerd:" "$CONTAINERD_HAVE ($BIN/containerd, sid $(cat "$STAMPS/containerd" 2>/dev/null || echo '?'))" \
    "ctr:" "$BIN/ctr" \
    "containerd-shim-runc-v2:" "$BIN/containerd-shim-runc-v2" \
    "runc:" "$RUNC_VERSION ($(command -v runc))" \
    "criu:" "$CRIU_HAVE ($BIN/criu; criu check: $CRIU_CHECK)" \
    "busybox image:" "$IMAGES/busybox.oci.tar ($BUSYBOX_REF)" \
    "pause image:" "$IMAGES/pause.oci.tar ($PAUSE_REF)"
if ((${#CHANGED[@]})); then
    echo "  changes made: ${#CHANGED[@]}; done in ${ELAPSED}s"
else
    echo "  nothing to do; done in ${ELAPSED}s"
fi
