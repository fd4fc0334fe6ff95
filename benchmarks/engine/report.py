"""Numbers -> the markdown table `benchmarks/engine/compare.py` prints (and the machine facts that go with it)."""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

import torch


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def machine_info() -> dict[str, str]:
    cpu = platform.processor() or "unknown"
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")), cpu)
    return {
        "command": " ".join(["python", "-m", "benchmarks.engine.compare", *sys.argv[1:]]),
        "nproc": str(os.cpu_count()),
        "cpu": cpu,
        "torch": torch.__version__,
        "torch_threads": str(torch.get_num_threads()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),  # AVX512 or AVX2 (ATEN_CPU_CAPABILITY=avx2 forces it)
        "python": platform.python_version(),
        "load_average_at_start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "n/a" if x is None else format(x, spec)


def _met(ok: bool) -> str:
    return "yes" if ok else "**no**"


def kernels_off_rows(o: dict, off: dict, streams: int) -> list[tuple[str, ...]]:
    """The streams again without edgerun's kernels (EDGERUN_KERNELS=off, same rounds): edgerun's column is the
    kernels', the transformers column holds the kernels-off figure, the ratio is on / off (goal: no loss)."""
    if not off:
        return []
    ratio = o["streams_agg_tok_s"] / off["streams_agg_tok_s"]
    cpu_ratio = off["streams_cpu_ms_per_token"] / o["streams_cpu_ms_per_token"]
    return [
        (f"{streams} streams tok/s, kernels on | off (per round: {o['streams_rounds_tok_s']} | {off['rounds_tok_s']})",
         _fmt(o["streams_agg_tok_s"]), _fmt(off["streams_agg_tok_s"]), f"{ratio:.2f}x", ">= 1.0x", _met(ratio >= 0.98)),
        (f"{streams} streams CPU ms per token, kernels on | off", _fmt(o["streams_cpu_ms_per_token"], ".2f"),
         _fmt(off["streams_cpu_ms_per_token"], ".2f"), f"{cpu_ratio:.2f}x", ">= 1.0x", _met(cpu_ratio >= 0.98)),
    ]


def render(results: dict) -> str:
    o, h, m, p = results["ours"], results["transformers"], results["machine"], results["params"]
    streams, tokens = p["streams"], p["tokens"]
    b1_ratio = o["b1_decode_tok_s"] / h["b1_decode_tok_s"] if h else None
    agg_ratio = o["streams_agg_tok_s"] / h["streams_agg_tok_s"] if h else None
    ttft_ratio = o["ttft_cached_s"] / o["ttft_cold_s"]
    rows = [
        ("batch-1 decode tok/s", _fmt(o["b1_decode_tok_s"]), _fmt(h.get("b1_decode_tok_s")),
         _fmt(b1_ratio, ".2f") + "x", ">= 3x", _met(b1_ratio is not None and b1_ratio >= 3)),
        ("batch-1 inter-token ms p50 / p90", f"{o['b1_itl_ms_p50']:.1f} / {o['b1_itl_ms_p90']:.1f}",
         f"{h['b1_itl_ms_p50']:.1f} / {h['b1_itl_ms_p90']:.1f}" if h else "n/a", "", "", ""),
        (f"{streams} streams x {tokens} tokens: aggregate tok/s", _fmt(o["streams_agg_tok_s"]),
         _fmt(h.get("streams_agg_tok_s")), _fmt(agg_ratio, ".2f") + "x", ">= 2.5x",
         _met(agg_ratio is not None and agg_ratio >= 2.5)),
        (f"{streams} streams: wall s", _fmt(o["streams_wall_s"], ".2f"), _fmt(h.get("streams_wall_s"), ".2f"), "", "", ""),
        *kernels_off_rows(o, results.get("kernels_off") or {}, streams),
        (f"{streams} streams: TTFT ms p50 / p90", f"{o['streams_ttft_ms_p50']:.0f} / {o['streams_ttft_ms_p90']:.0f}", "", "", "", ""),
        (f"{streams} streams: inter-token ms p50 / p90", f"{o['streams_itl_ms_p50']:.0f} / {o['streams_itl_ms_p90']:.0f}", "", "", "", ""),
        (f"TTFT {o['ttft_prompt_tokens']}-token prompt, cold (s)", _fmt(o["ttft_cold_s"], ".3f"),
         _fmt(h.get("ttft_cold_s"), ".3f"), "", "", ""),
        (f"TTFT same prompt, {o['ttft_cached_tokens']} tokens cached (s)", _fmt(o["ttft_cached_s"], ".3f"), "",
         f"{ttft_ratio:.0%} of cold", "<= 20%", _met(ttft_ratio <= 0.2)),
        ("cold start: new process to first token (s)", _fmt(o["cold_start_s"], ".2f"), "", "", "< 3 s", _met(o["cold_start_s"] < 3)),
    ]
    if "b1_decode_tok_s" in results["llama_cpp"]:
        rows.append(("llama.cpp (Q4_1) batch-1 decode tok/s", "", _fmt(results["llama_cpp"]["b1_decode_tok_s"]), "", "", ""))
    lines = [
        "| measurement | edgerun | transformers | ratio | target | met |",
        "| --- | ---: | ---: | ---: | --- | --- |",
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
        f"Command: `{m['command']}` (each number: median of {p['repeats']} runs; percentiles over all runs)",
        f"Weights: edgerun {p.get('weights', 'float32')}{' (' + ', '.join(p['set']) + ')' if p['set'] else ''}; "
        "transformers float32, dequantised from the same GGUF"
        + (f" (load {h['load_s']:.1f} s)" if h else ""),
        f"Machine: {m['nproc']} CPUs ({m['cpu']}, {m.get('cpu_capability', '?')}), torch {m['torch']} ({m['torch_threads']} threads), "
        f"Python {m['python']}; load average (1/5/15 min) at start {m['load_average_at_start']}, "
        f"at end {m.get('load_average_at_end', '?')}",
        "Cold start split (last run, s): " + ", ".join(f"{k} {v:.2f}" for k, v in o["cold_start_splits_s"].items()),
    ]
    if "skipped" in results["llama_cpp"]:
        lines.append(f"llama.cpp: skipped, {results['llama_cpp']['skipped']}")
    if results.get("profile"):
        lines += ["", "Profile of one 32-token batch-1 generation (top functions by own time):", "```",
                  results["profile"].strip(), "```"]
    return "\n".join(lines)
