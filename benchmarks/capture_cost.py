"""What capturing costs (docs/capture.md): the writer's time per turn and the bytes per 1000 turns, on
the bundled captures' turns (tests/data/*.capture.jsonl) written again through `CaptureWriter` as the
engine and the server write them (each turn its prompt, output, grammar and tools; one tools and one
grammar line per file), no engine.

  python benchmarks/capture_cost.py [--turns 1000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from agentspec_sdk.backends.capture import CaptureWriter, read_capture

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
SETS = ("tool_calls", "react", "code")


def measure(name: str, count: int) -> dict:
    turns = read_capture([DATA / f"{name}.capture.jsonl"]).turns
    with tempfile.TemporaryDirectory() as tmp:
        writer = CaptureWriter(tmp, writer="engine", model="m")
        times, cpu = [], []
        for i in range(count):
            t = turns[i % len(turns)]
            start, start_cpu = time.perf_counter(), time.thread_time()
            writer.write_turn(id=f"{name}-{i}", episode=f"ep{i // 4}", prompt=t.prompt, out=t.out,
                              temperature=t.temperature, grammar=t.grammar, format=t.format, tools=t.tools,
                              started=1.0, finished=2.0, finish_reason="stop")
            times.append(time.perf_counter() - start)
            cpu.append(time.thread_time() - start_cpu)
        writer.close()
        size = sum(p.stat().st_size for p in writer.files)
        start = time.perf_counter()
        read = read_capture([tmp])
        read_s = time.perf_counter() - start
    times.sort()
    cpu.sort()
    return {"set": name, "turns": count, "prompt_tokens": sum(len(t.prompt) for t in turns) / len(turns),
            "median_us": 1e6 * times[len(times) // 2], "p90_us": 1e6 * times[int(len(times) * 0.9)],
            "cpu_us": 1e6 * cpu[len(cpu) // 2], "mb_per_1k": size / count * 1000 / 2 ** 20,
            "read_ms_per_1k": 1e3 * read_s / len(read.turns) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--turns", type=int, default=1000)
    args = ap.parse_args()
    print("| set | mean prompt tokens | write µs/turn: wall median, p90; CPU median | MiB per 1000 turns "
          "| read ms per 1000 turns |")
    print("|---|---:|---:|---:|---:|")
    for name in SETS:
        r = measure(name, args.turns)
        print(f"| {r['set']} | {r['prompt_tokens']:.0f} | {r['median_us']:.0f}, {r['p90_us']:.0f}; "
              f"{r['cpu_us']:.0f} | {r['mb_per_1k']:.2f} | {r['read_ms_per_1k']:.0f} |")


if __name__ == "__main__":
    main()
