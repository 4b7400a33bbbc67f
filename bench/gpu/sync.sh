#!/bin/sh
# Copy this worktree's files (tracked and untracked-not-ignored) into the session checkout's
# ignored build/ folder, so the device tool (which sends the session's checkout) carries them:
# run with carry ["build/gpu16", ".whl"]. Usage: bench/gpu/sync.sh /work/main
set -eu
dest="$1/build/gpu16"
rm -rf "$dest"
mkdir -p "$dest"
git ls-files -co --exclude-standard -z | xargs -0 -I{} cp --parents {} "$dest"
du -sh "$dest"
