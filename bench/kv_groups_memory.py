"""KV memory of one long request under KV groups, for a model's config (no weights, no torch model):
the engine's own scheduler and KV manager run the request's steps with a fake sampler, and the
blocks each group holds are counted at every step.

    python bench/kv_groups_memory.py bench/models/gemma-3-12b --prompt 2000 --new 30000

prints the peak blocks per group kind and the bytes (bfloat16) next to one block table for every
layer (what a model with local and global layers held before KV groups).
"""

from __future__ import annotations

import argparse

from traceless.engine.block_pool import BlockPool
from traceless.engine.kv_manager import KVCacheManager, blocks_for
from traceless.engine.request import Request, RequestStatus
from traceless.engine.scheduler import Scheduler, SchedulerConfig
from traceless.engine.step_io import SampledTokens
from traceless.model.loader import read_model_config
from traceless.sampling_params import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a Hugging Face directory (config.json is enough)")
    ap.add_argument("--prompt", type=int, default=2000)
    ap.add_argument("--new", type=int, default=30000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=2048, help="max_num_batched_tokens")
    args = ap.parse_args()
    c = read_model_config(args.model)
    groups = c.kv_groups
    total = args.prompt + args.new
    kv = KVCacheManager(
        BlockPool(len(groups.windows) * blocks_for(total, args.block_size) + 2, lambda ids: None),
        args.block_size,
        windows=groups.windows,
    )
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=args.chunk, max_model_len=total + 1), kv)
    r = Request("r", [5] * args.prompt, SamplingParams(max_tokens=args.new, ignore_eos=True), frozenset())
    sched.add(r)
    peak, peak_total = [0] * len(groups.windows), 0
    while r.num_output_tokens < args.new:
        out = sched.schedule()
        counts = kv.live_blocks_by_group()  # during the step: before its dead blocks are freed
        peak, peak_total = [max(p, n) for p, n in zip(peak, counts)], max(peak_total, sum(counts))
        sampled = {s.request_id: SampledTokens([7], None) for s in out.seqs if s.sample}
        sched.update_from_output(out, sampled, lambda request, token_id: (None, ""))
    final = kv.live_blocks_by_group()
    sched.finish(r, RequestStatus.FINISHED_LENGTH)
    slot_bytes = 2 * c.num_kv_heads * c.head_dim * args.block_size * 2  # K and V of one layer's block, bf16
    held = peak_total * groups.num_slots * slot_bytes
    before = blocks_for(total, args.block_size) * c.num_layers * slot_bytes
    print(
        f"{args.model}: {c.num_layers} layers, windows per group {groups.windows}, {groups.num_slots} layers per "
        f"group; one request of {total} tokens, block size {args.block_size}, chunks of {args.chunk}"
    )
    for w in sorted(set(groups.windows)):
        gs = [g for g, x in enumerate(groups.windows) if x == w]
        print(
            f"  {'global' if not w else f'window {w}'}: {len(gs)} group(s), peak blocks per group "
            f"{max(peak[g] for g in gs)}, at the end {max(final[g] for g in gs)}"
        )
    print(
        f"  KV memory at peak: {held / 2**30:.2f} GiB; one table for every layer: {before / 2**30:.2f} GiB "
        f"({held / before:.1%})"
    )


if __name__ == "__main__":
    main()
