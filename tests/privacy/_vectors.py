from pathlib import Path

# The shared known-answer vectors live next to the repository (../shared/vectors from its root),
# so this works from the main checkout and from any worktree at /work/<name>.
VECTORS = Path(__file__).resolve().parents[2].parent / "shared" / "vectors"
