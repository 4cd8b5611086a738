#!/usr/bin/env bash
# packaging/gen-docs.sh BIN_DIR SHARE_DIR — man pages and shell completions of the three
# binaries in BIN_DIR, generated from their clap commands, laid out under SHARE_DIR as Debian
# and the installer image install them:
#   man/man1/<page>.1.gz, bash-completion/completions/<bin>,
#   zsh/vendor-completions/_<bin>, fish/vendor_completions.d/<bin>.fish
set -euo pipefail
BIN=$1
SHARE=$2
install -d "$SHARE/man/man1" "$SHARE/bash-completion/completions" \
    "$SHARE/zsh/vendor-completions" "$SHARE/fish/vendor_completions.d"
for b in gpusnap gpusnap-runc containerd-shim-gpusnap-v2; do
    "$BIN/$b" --generate-man "$SHARE/man/man1"
    "$BIN/$b" --generate-completion bash >"$SHARE/bash-completion/completions/$b"
    "$BIN/$b" --generate-completion zsh >"$SHARE/zsh/vendor-completions/_$b"
    "$BIN/$b" --generate-completion fish >"$SHARE/fish/vendor_completions.d/$b.fish"
done
# Reproducible compression (no name, no time stamp), as dh_compress does.
for page in "$SHARE"/man/man1/*.1; do
    gzip -9n "$page"
done
chmod 0644 "$SHARE"/man/man1/*.gz "$SHARE"/bash-completion/completions/* \
    "$SHARE"/zsh/vendor-completions/* "$SHARE"/fish/vendor_completions.d/*
