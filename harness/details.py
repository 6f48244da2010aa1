"""Every key a point's `details` may hold: its type, what it means and who writes it.

One registry, as pyperf's `_metadata.py` is for its metadata: a key that is not here is a
programming error where a point is made (`check`, from `Point.__post_init__`) and a bad file
where one is read (`problem`, from `results.validate`), never silently stored. docs/results.md
lists the keys from `markdown()` (tests/test_results.py keeps the two equal).

Keys a writer no longer writes stay registered (`retired` says since when) so the files
that hold them still load.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

_NUMBER = (int, float)


@dataclass(frozen=True)
class Detail:
    """One key: the JSON types its value may have, a one-line meaning, the module writing it."""

    types: tuple[type, ...]
    meaning: str
    writer: str
    retired: str = ""


def _d(types: type | tuple[type, ...], meaning: str, writer: str, retired: str = "") -> Detail:
    return Detail(types if isinstance(types, tuple) else (types,), meaning, writer, retired)


_WORKER, _RUNNER, _REPEATS = "harness/worker.py", "harness/runner.py", "harness/repeats.py"
_PAGES, _ORT, _BASELINE = "backends/pages.py", "backends/ort.py", "harness/commands/baseline.py"
_GENAI = "backends/genai.py"

DETAILS: dict[str, Detail] = {
    # the worker: how the timed steps ran
    "step_ms_samples": _d(list, "each timed step's wall time (ms); moved into `repeats` by "
                          "harness/repeats.py, so only files made before --repeat keep it", _WORKER),
    "gpu_ms_samples": _d(list, "each timed step's GPU time (ms), where the backend times it; "
                         "moved into `repeats` as step_ms_samples is", _WORKER),
    "heated_s": _d(_NUMBER, "seconds of continuous GPU load before the warm-up steps "
                   "(harness/heater.py)", _WORKER),
    "not_heated": _d(str, "why no load ran before the warm-up steps (a CPU adapter, no "
                     "adapter, --warm-s 0)", _WORKER),
    "sm_clock_mhz": _d(dict, "the SM clock over the timed steps {min, median, max, samples, "
                       "peak_seen} from nvidia-smi; over repeats the lowest-clocked one's", _WORKER),
    "host_breakdown_ms": _d(dict, "a WebNN page's host time per step by part, medians "
                            "(docs/measuring.md \"Host time\"); over repeats each part's median",
                            _WORKER),
    "host_cpus": _d(dict, "where the process ran and whether it kept its CPU over the timed "
                    "steps (harness/host_facts.py); moved into `repeats`", _WORKER),
    "gc_timed": _d(dict, "CPython's collections inside the timed steps {collections: [gen0, "
                   "gen1, gen2], ms, max_ms, frozen: the objects setup made, frozen before the "
                   "warm-up (harness/gc_window.py)}; moved into `repeats`", _WORKER),
    # the runner and the repeats
    "wall_s": _d(_NUMBER, "wall time of the point's workers, build included (s); the sum over "
                 "repeats", _RUNNER),
    "peak_rss_scope": _d(str, "\"process (--inprocess)\": peak_rss_bytes is the whole sweep "
                         "process's, not one worker's", _RUNNER),
    "floor_reason": _d(str, "why the point has no floor_ms (a bandwidth not calibrated, a model "
                       "statebench did not write)", _RUNNER),
    "warning": _d(str, "the unstable warning: stdev ≥ 10 % of the mean, transients left out "
                  "(harness/stats.py)", _REPEATS),
    "bytes_differ": _d(str, "the repeats counted different bytes per step; the point's figure "
                       "is their mean", _REPEATS),
    "baseline_runs": _d(int, "how many runs a baseline's step_ms is the per-point median of",
                        _BASELINE),
    "baseline_run_medians_ms": _d(list, "each of those runs' median step time (ms)", _BASELINE),
    # the WebNN pages
    "engine": _d(dict, "the WebGPU engine {engine, version, backend_api, features_lacking}",
                 _PAGES),
    "kernel_options": _d(dict, "every kernel knob and its value (KernelOptions.as_dict)", _PAGES),
    "gpu_time_reason": _d(str, "why the page has no GPU time (no timestamp queries)", _PAGES),
    "is_stateful": _d(bool, "the page's graph keeps its cache inside (MLGraph.is_stateful)",
                      _PAGES),
    "in_place": _d(dict, "per cache pair (its input): whether the step writes it in place",
                   f"{_PAGES}, {_ORT}"),
    "launches": _d(int, "the launches (kernels and buffer copies) one dispatch of the page's "
                   "graph runs (MLGraph.launches)", _PAGES),
    "fixed_capacity": _d(dict, "per cache pair of a user's model: how its growing cache was "
                         "fixed at the capacity (backends/webnn/fixed_capacity.py)", _PAGES),
    "deferred_commit": _d(dict, "a model's K-token graph rewritten for a speculative loop's "
                          "rollback (backends/webnn/deferred_commit.py): the recurrent and conv "
                          "state pairs it commits by accepted_count {recurrent, conv}",
                          f"{_PAGES}, {_ORT}"),
    # ONNX Runtime
    "provider": _d(str, "the execution provider the session runs on", f"{_ORT}, {_GENAI}"),
    "flavour": _d(str, "the exported graph's flavour (ort, standard)", _ORT),
    "mode": _d(str, "how the cache is carried between steps (copy, iobinding, shared, ...)", _ORT),
    "rollback": _d(str, "how a speculative loop's K-token graph rolls a hybrid back: "
                   "'deferred commit (accepted_count)' where the standard mode built the "
                   "deferred-commit export (docs/speculative.md)", _ORT),
    "model": _d(str, "the .onnx file the session runs", f"{_ORT}, {_GENAI}"),
    "host_cache": _d(bool, "the cache lives on the host between steps (a stateless mode)", _ORT),
    "kernel_bytes_base": _d(int, "bytes the graph's kernels move a step at depth 0", _ORT),
    "kernel_bytes_per_token": _d(int, "bytes they move per token of depth", _ORT),
    "kernel_bytes_unsized": _d(list, "tensors of a user's model whose size is not known, "
                               "left out of the kernel bytes (first 50)", _ORT),
    "pairs": _d(dict, "a user's model: each cache input and the output that carries it on",
                _ORT),
    "cpu_fallback": _d((bool, str), "nodes the WebGPU EP left to the CPU EP (\"unknown (...)\" "
                       "where ORT did not tell)", _ORT),
    "cpu_fallback_nodes": _d(list, "those nodes, op:name (first 50)", _ORT),
    "logits_read": _d(str, "how the logits were read to the host (copy_tensors or numpy())",
                      _ORT),
    "logits_read_reason": _d(str, "why copy_tensors was not used", _ORT),
    "graph_capture": _d(dict, "the EP options a captured graph ran with", _ORT),
    "static_feeds": _d(dict, "`captured`: each input fed as a device value written in place, "
                       "and its shape, the same every step (a model's attention_mask "
                       "capacity-sized)", _ORT),
    # onnxruntime-genai's loop
    "genai": _d(dict, "onnxruntime-genai's loop as the export configures it {provider, "
                "provider_options, graph_capture, past_present_share_buffer, model_type, version}, "
                "how many warm-up and timed steps were its own greedy pick (greedy_steps) or "
                "a token fed (forced_steps), and the first step where its pick was not the "
                "reference's greedy token (diverged: {step, token, reference_token, margin, "
                "margin_rel}, genai's logit margin between the two)", _GENAI),
    "logits_bytes": _d(int, "the bytes of one step's logits as the backend hands them, where "
                       "that is not the graph's type (genai's are float32): the cache "
                       "attribution of the host link's bytes takes these as the logits", _GENAI),
    # retired
    "warm_clock_steps": _d(int, "steps stepped in bursts to warm the clock before the timed "
                           "ones", _WORKER, retired="6d7dec3 (heated_s took its place)"),
}


class UnknownDetail(ValueError):
    """A point made with a details key that is not registered, or of the wrong type: a bug in
    the module that wrote it (register the key in harness/details.py)."""


def _type_name(types: tuple[type, ...]) -> str:
    names = {int: "integer", float: "number", str: "string", bool: "true/false", list: "list",
             dict: "object"}
    if types == _NUMBER:
        return "number"
    return " or ".join(names.get(t, t.__name__) for t in types)


def problem(details: object) -> str | None:
    """What is wrong with `details` (an unknown key, a value of the wrong type), or None."""
    if not isinstance(details, Mapping):
        return "is not an object"
    for key, value in details.items():
        d = DETAILS.get(key)
        if d is None:
            return f"has unknown key {key!r} (harness/details.py lists the keys)"
        if (isinstance(value, bool) and bool not in d.types) or not isinstance(value, d.types):
            return f"{key} is {value!r:.60}, not {_type_name(d.types)}"
    return None


def check(details: Mapping, where: str = "a point") -> None:
    """UnknownDetail where `details` is not what the registry allows."""
    found = problem(details)
    if found:
        raise UnknownDetail(f"{where}: details {found}")


def markdown() -> str:
    """The registry as the Markdown table docs/results.md carries."""
    lines = ["| key | type | meaning | written by |", "|---|---|---|---|"]
    for key, d in DETAILS.items():
        meaning = d.meaning + (f" (retired: {d.retired}; still read)" if d.retired else "")
        lines.append(f"| `{key}` | {_type_name(d.types)} | {meaning.replace('|', '/')} | "
                     f"{', '.join(f'`{w}`' for w in d.writer.split(', '))} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown())
