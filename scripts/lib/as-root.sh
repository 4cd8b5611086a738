# shellcheck shell=bash
# scripts/lib/as-root.sh — makes the script that sources it run as root.
#
# Source it near the top of a script, BEFORE the script changes directory:
#     . "$(dirname "${BASH_SOURCE[0]}")/lib/as-root.sh"
# As root it does nothing. Otherwise it re-runs that script through sudo with the same
# arguments, so a sudo user can type `scripts/setup-env.sh` where root types the same.
#
# sudo resets the environment (env_reset, secure_path); what the scripts need is passed on
# explicitly: the system PATH plus the directory of the caller's cargo (rustup's proxies in
# ~/.cargo/bin, with RUSTUP_HOME pointing at the caller's ~/.rustup so they find its
# toolchains), and CI, GPUSNAP_*, CARGO_*, RUSTUP_*, RUST_*, RUSTFLAGS, DEB_*, K8S_VERSION,
# DEBIAN_FRONTEND, the proxy variables, TERM and NO_COLOR. HOME becomes root's: cargo keeps
# its registry cache in /root/.cargo (not in the caller's home, which would fill with
# root-owned files) unless CARGO_HOME is set, and builds into the repository's target/ as root.

if [[ $(id -u) -ne 0 ]]; then
    __as_root_script=$(realpath -e -- "${BASH_SOURCE[1]:-}" 2>/dev/null) || {
        echo "as-root.sh: cannot find the script to re-run as root (source it before any cd)" >&2
        exit 1
    }
    __as_root_name=${__as_root_script##*/}
    if [[ -n ${GPUSNAP_AS_ROOT:-} ]]; then
        echo "$__as_root_name: sudo did not make this root (uid $(id -u))" >&2
        exit 1
    fi
    if ! command -v sudo >/dev/null 2>&1; then
        echo "$__as_root_name: needs root: run it as root, or install sudo and give $(id -un) sudo rights" >&2
        exit 1
    fi
    __as_root_path=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    __as_root_env=(GPUSNAP_AS_ROOT=1)
    __as_root_cargo=$(command -v cargo 2>/dev/null || true)
    if [[ -z $__as_root_cargo && -x ${HOME:-}/.cargo/bin/cargo ]]; then
        __as_root_cargo=$HOME/.cargo/bin/cargo
    fi
    if [[ -n $__as_root_cargo ]]; then
        __as_root_path+=:${__as_root_cargo%/*}
        if [[ -z ${RUSTUP_HOME:-} && -d ${HOME:-}/.rustup ]]; then
            __as_root_env+=("RUSTUP_HOME=$HOME/.rustup")
        fi
    fi
    __as_root_env+=("PATH=$__as_root_path")
    while IFS= read -r __as_root_var; do
        case $__as_root_var in
            CI | GPUSNAP_* | CARGO_* | RUSTUP_* | RUST_* | RUSTFLAGS | DEB_* | K8S_VERSION | \
                DEBIAN_FRONTEND | http_proxy | https_proxy | no_proxy | HTTP_PROXY | HTTPS_PROXY | \
                NO_PROXY | TERM | NO_COLOR)
                __as_root_env+=("$__as_root_var=${!__as_root_var}") ;;
        esac
    done < <(compgen -e)
    echo "$__as_root_name: not root: running it through sudo" >&2
    # The caller's positional parameters are "$@" here: a sourced file shares them.
    exec sudo -- env "${__as_root_env[@]}" bash "$__as_root_script" "$@"
fi
