"""The engine's host time per decode step with the model stubbed (an executor that returns token 5
at once), synchronous and with asynchronous scheduling, interleaved: the host work that running
ahead hides behind the device's step. Runs on any machine. Usage:
    PYTHONPATH=. python3 bench/gpu/host_step.py [MODEL_DIR_WITH_CONFIG_JSON]
(default bench/models/llama-3.2-1b; dummy weights, float32, on the CPU)."""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time

from traceless import SamplingParams
from traceless.config import EngineConfig
from traceless.engine.llm_engine import LLMEngine
from traceless.engine.step_io import SampledTokens
from traceless.runner.build import build_engine_parts


class Stub:
    """A model executor that computes nothing."""

    def execute(self, plan):
        return {s.request_id: SampledTokens([5], None) for s in plan.seqs if s.sample}

    def launch(self, plan):
        out = self.execute(plan)

        class Done:
            def result(self):
                return out

        return Done()

    def release(self, request_id):
        pass

    def sweep(self):
        pass

    def num_held(self):
        return 0


def host_ms(model: str, batch: int, ahead: bool, steps: int = 60) -> float:
    cfg = EngineConfig(
        model=model,
        load_format="dummy",
        dtype="float32",
        kv_cache_memory=2**30,
        max_num_seqs=256,
        max_num_batched_tokens=8192,
        async_scheduling=ahead,
        max_model_len=1024,
    )
    engine = LLMEngine(cfg, dataclasses.replace(build_engine_parts(cfg), executor=Stub()))
    for i in range(batch):
        engine.add_request(f"r{i}", [1000 + i] * 128, SamplingParams(temperature=0, max_tokens=900, ignore_eos=True))
    for _ in range(5):  # prefill
        engine.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    model = sys.argv[1] if len(sys.argv) > 1 else "bench/models/llama-3.2-1b"
    results: dict[tuple[int, bool], list[float]] = {}
    for _ in range(3):
        for batch in (64, 256):
            for ahead in (False, True):
                results.setdefault((batch, ahead), []).append(host_ms(model, batch, ahead))
    for (batch, ahead), ms in sorted(results.items()):
        print(f"batch {batch:>3} {'async' if ahead else 'sync '}: host ms/step " + ", ".join(f"{x:.2f}" for x in ms))


if __name__ == "__main__":
    main()
