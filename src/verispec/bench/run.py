"""`verispec bench`: Spec-Bench questions through our methods and peers, interleaved per question.

Peers (transformers, llama.cpp) run in child processes (bench/peers.py): one that crashes, hangs
or raises is reported as failed, with the reason, and left out of the tables; the run goes on.

For each question every method runs once, one after the other, so machine drift hits all alike.
Multi-turn (MT-bench) questions run both turns through the chat template: the second turn's
prompt holds the first answer (each method continues its own conversation). Greedy speculative
outputs are compared token for token with our plain decoding; a mismatch is reported loudly.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm import tqdm

from verispec.bench.methods import Method, OursMethod, Unavailable
from verispec.bench.peers import PEERS, IsolatedPeer, PeerFailed
from verispec.config import EngineConfig, SpeculativeConfig
from verispec.data import questions as question_set, subtask
from verispec.proposers import PROPOSERS
from verispec.models.kernels.rowwise import cpu_name
from verispec.runners.registry import family_options

SUBTASKS = ("multi_turn", "translation", "summarization", "qa", "math_reasoning", "rag")


@dataclass
class BenchConfig:
    model: str = "smollm2-135m"
    methods: tuple[str, ...] = ("plain", "prompt_lookup", "hf", "hf_prompt_lookup")
    categories: tuple[str, ...] | None = None  # None: every subtask of the question set
    limit: int = 10
    max_tokens: int = 128
    temperature: float = 0.0
    k: int = 4
    draft_model: str | None = None
    eagle_head: str | None = None  # method eagle3's head folder (None: the one shipped for a bundled model)
    questions: str | None = None
    out: str = "results/bench"
    seed: int = 0
    adaptive_k: bool = False  # our speculative methods choose k per step (engine/policy.py) instead of k
    cost_profile: str | None = "measured"  # the forward-cost curve adaptive k reads (SpeculativeConfig.cost_profile)
    peer_timeout: float = 600.0  # seconds a peer may take to load or to answer one run, else it failed
    # our methods keep the keys and values of earlier prompts and answers (engine/prefix_cache.py), each
    # method its own cache: a multi-turn question's later turns forward only their new tokens, as
    # llama.cpp's peer (which keeps its last prompt's) already does
    prefix_caching: bool = False


@dataclass
class Record:
    question_id: int
    subtask: str
    method: str
    new_tokens: int
    wall_time: float
    ttft: float
    target_forwards: int
    accepted_lengths: list[int]
    accepted_per_position: list[int]
    process_peak_rss_mb: float  # high-water mark so far of the method's process (ours share one; each peer has its own)
    matches_plain: bool | None = None  # greedy: same tokens as our plain decoding
    first_mismatch: int | None = None
    cached_prompt_tokens: int = 0  # over all turns: prompt tokens taken from the prefix cache (--prefix-caching)
    token_ids: list[int] = field(default_factory=list)  # the new tokens, every turn's in order (results compared across runs)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time if self.wall_time else 0.0


@dataclass
class BenchResult:
    config: BenchConfig
    records: list[Record] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # method -> why
    failed: dict[str, str] = field(default_factory=dict)  # peer -> how it failed (its records are left out)
    mismatches: list[str] = field(default_factory=list)
    # how methods were ordered; results.json files written before the rotation say "fixed"
    protocol: str = "rotated"
    bandwidth_gbs: float | None = None  # this machine's read bandwidth, measured before the run
    weight_bytes: dict[str, int] = field(default_factory=dict)  # method -> bytes of weights it reads per token


def split_family(name: str) -> tuple[str, str]:
    """'prompt_lookup@llamacpp:Q8_0' -> ('prompt_lookup', 'llamacpp:Q8_0'); no '@' or '@torch' = our
    torch backend with its defaults ('')."""
    base, _, family = name.partition("@")
    return base, "" if family == EngineConfig.backend else family


def family_llm(cfg: BenchConfig, llm, family: str, llms: dict):
    """Our engine on a backend (and weights format): 'llamacpp', 'llamacpp:Q8_0'; '' = the torch one
    (batch-invariant, the default); 'torch:fast' = torch with batch_invariant off."""
    if not family:
        return llm
    if family not in llms:
        from verispec import LLM
        from verispec.errors import ConfigError

        try:
            llms[family] = LLM(cfg.model, **family_options(family))
        except ConfigError as e:
            raise Unavailable(str(e)) from e
    return llms[family]


def family_profile(cost_profile: str | None, family: str, model: str = "") -> str | None:
    """A profile file as given ('auto' too), or from a --profile output folder the one of this backend
    and format (in its <model>/ subfolder when there is one)."""
    if cost_profile in (None, "auto", "measured", "builtin") or not Path(cost_profile).is_dir():
        return cost_profile
    folder = Path(cost_profile) / Path(model).name
    folder = folder if model and folder.is_dir() else Path(cost_profile)
    path = folder / f"cost_profile-{(family or 'torch').replace(':', '-')}.json"
    if not path.exists():
        raise Unavailable(f"no {path.name} in {folder} (run verispec bench --profile --backends ...)")
    return str(path)


def build_methods(cfg: BenchConfig, llm) -> tuple[list[Method], dict[str, str], dict[str, str]]:
    """Our methods and the peers (each in its child process, loaded); a peer that cannot run here
    is skipped with the reason, one whose child died while loading failed, with the reason.

    Our methods may name a backend: `plain@llamacpp`, `prompt_lookup@llamacpp:Q8_0` (GGUF targets)."""
    methods: list[Method] = []
    skipped: dict[str, str] = {}
    failed: dict[str, str] = {}
    eos = list(llm.runner.eos_token_ids)
    llms: dict = {}
    try:
        _add_methods(cfg, llm, eos, llms, methods, skipped)
    except BaseException:
        close_peers(methods)
        raise
    ready: list[Method] = []
    for m in methods:  # the peers' children loaded side by side
        try:
            if isinstance(m, IsolatedPeer):
                m.wait_ready()
            ready.append(m)
        except Unavailable as e:
            skipped[m.name] = str(e)
        except PeerFailed as e:
            failed[m.name] = str(e)
    if not ready or ready[0].name != "plain":
        close_peers(ready)
        raise SystemExit("the bench needs 'plain' first among --methods: every speedup is relative to it")
    return ready, skipped, failed


TREE_NODES = 16  # the "<method>_tree" methods' tree_max_nodes (the cached cost curve covers 17 rows)


def our_methods() -> dict[str, dict | None]:
    """Our methods by name, from the drafter registry: "plain" (no drafter: every speedup's
    baseline), each registered drafter, "<name>_tree" for a drafter that proposes token trees (up
    to TREE_NODES nodes, sized by their probabilities), and "<name>_<variant>" for each variant a
    drafter declares (suffix_cold: no earlier responses kept). Value: SpeculativeConfig options."""
    methods: dict[str, dict | None] = {"plain": None}
    for name, drafter in PROPOSERS.items():
        methods[name] = {"method": name}
        if drafter.proposes_trees:
            methods[f"{name}_tree"] = {"method": name, "tree_max_nodes": TREE_NODES}
        for variant, options in drafter.variants.items():
            methods[f"{name}_{variant}"] = {"method": name, **options}
    return methods


def _drafter_options(cfg: BenchConfig, options: dict) -> dict:
    """The draft model or head a method's drafter reads (`Proposer.draft_model_kind`): --draft-model
    for a model, --eagle-head for a head; a drafter that drives another (the hybrid) takes the head
    when given, else the draft model through the drafter that reads a model."""
    kind = PROPOSERS[options["method"]].draft_model_kind
    if kind == "model":
        if not cfg.draft_model:
            raise Unavailable("no --draft-model given (none of the bundled models shares a vocabulary)")
        return {"draft_model": cfg.draft_model}
    if not kind:
        return {}
    if kind == "head" or cfg.eagle_head or not cfg.draft_model:
        return {"draft_model": cfg.eagle_head}
    model_drafter = next(name for name, d in PROPOSERS.items() if d.draft_model_kind == "model")
    return {"draft_model": cfg.draft_model, "hybrid_drafter": model_drafter}


def _add_methods(cfg: BenchConfig, llm, eos: list[int], llms: dict, methods: list[Method],
                 skipped: dict[str, str]) -> None:
    """--methods into `methods`, in order (a peer's child is started, not waited for)."""
    ours = our_methods()
    for name in cfg.methods:
        base, family = split_family(name)
        try:
            if base in ours and ours[base] is None:  # plain decoding
                methods.append(OursMethod(name, family_llm(cfg, llm, family, llms), None, cfg.prefix_caching))
            elif base in ours:
                options = {**ours[base], **_drafter_options(cfg, ours[base])}
                spec = SpeculativeConfig(num_speculative_tokens=cfg.k, adaptive_k=cfg.adaptive_k,
                                         cost_profile=family_profile(cfg.cost_profile, family, cfg.model), **options)
                methods.append(OursMethod(name, family_llm(cfg, llm, family, llms), spec, cfg.prefix_caching))
            elif name in PEERS:
                PEERS[name].check(cfg.model, cfg.draft_model)
                methods.append(IsolatedPeer(name, cfg.model, eos, cfg.draft_model, timeout=cfg.peer_timeout))
            else:
                known = ", ".join([*ours, *PEERS])
                raise Unavailable(f"unknown method {name!r} (known: {known}; ours may take @backend[:format])")
        except Unavailable as e:
            skipped[name] = str(e)


def close_peers(methods: list[Method]) -> None:
    """End the peers' child processes."""
    for m in methods:
        if isinstance(m, IsolatedPeer):
            m.close()


def select_questions(cfg: BenchConfig) -> list[dict]:
    """Up to `limit` questions of each chosen subtask (by default every subtask of the set)."""
    questions = question_set(cfg.questions or "spec_bench")
    present = subtasks_in(subtask(q) for q in questions)
    unknown = set(cfg.categories or ()) - set(present)
    if unknown:
        raise SystemExit(f"unknown categories {sorted(unknown)}; these questions have {', '.join(present)}")
    picked: list[dict] = []
    for cat in cfg.categories or present:
        picked += [q for q in questions if subtask(q) == cat][: cfg.limit]
    return picked


def subtasks_in(names) -> list[str]:
    """The distinct subtask names, Spec-Bench's six first in their order, then others as they come."""
    seen = list(dict.fromkeys(names))
    return [s for s in SUBTASKS if s in seen] + [s for s in seen if s not in SUBTASKS]


def run_question(method: Method, llm, q: dict, cfg: BenchConfig) -> tuple[list[int], float, float, int, list[int], list[int], int]:
    """All turns of one question; returns the concatenated new tokens and summed figures (the last:
    prompt tokens taken from the prefix cache)."""
    messages: list[dict] = []
    tokens: list[int] = []
    wall = ttft = 0.0
    forwards = 0
    lengths: list[int] = []
    per_pos: list[int] = []
    cached = 0
    for turn, text in enumerate(q["turns"]):
        messages.append({"role": "user", "content": text})
        ids = llm.tokenizer.encode_chat(messages)
        r = method.run(ids, cfg.max_tokens, cfg.temperature, cfg.seed + q["question_id"])
        if turn == 0:
            ttft = r.ttft
        wall += r.wall_time
        forwards += r.target_forwards
        tokens += r.token_ids
        lengths += r.accepted_lengths
        per_pos = add_counts(per_pos, r.accepted_per_position)
        cached += r.cached_prompt_tokens
        messages.append({"role": "assistant", "content": llm.tokenizer.decode(r.token_ids)})
    return tokens, wall, ttft, forwards, lengths, per_pos, cached


def add_counts(a: list[int], b: list[int]) -> list[int]:
    """Element-wise sum of two per-position count lists of any lengths: [1, 2] + [3] = [4, 2]."""
    n = max(len(a), len(b))
    return [x + y for x, y in zip(a + [0] * (n - len(a)), b + [0] * (n - len(b)))]


def run_bench(cfg: BenchConfig) -> BenchResult:
    from verispec import LLM

    llm = LLM(cfg.model)
    methods, skipped, failed = build_methods(cfg, llm)
    try:
        return _run_methods(cfg, llm, methods, skipped, failed)
    finally:
        close_peers(methods)


def _run_methods(cfg: BenchConfig, llm, methods: list[Method], skipped: dict[str, str],
                 failed: dict[str, str]) -> BenchResult:
    for name, why in skipped.items():
        print(f"[bench] skipping {name}: {why}", file=sys.stderr)
    for name, why in failed.items():
        print(f"[bench] FAILED {name}: {why}; the other methods go on", file=sys.stderr)
    questions = select_questions(cfg)
    from verispec.bench.profile import measure_bandwidth

    result = BenchResult(cfg, skipped=skipped, failed=failed, bandwidth_gbs=measure_bandwidth(),
                         weight_bytes={m.name: m.weight_bytes for m in methods})
    methods = list(methods)  # a peer that fails leaves this list (the caller still closes it)

    def fail(m: Method, e: PeerFailed, where: str) -> None:
        result.failed[m.name] = f"{e} {where}"
        tqdm.write(f"[bench] FAILED {m.name}: {e} {where}; its results are left out, the other methods go on",
                   file=sys.stderr)
        methods.remove(m)
        result.records = [r for r in result.records if r.method != m.name]
        result.weight_bytes.pop(m.name, None)

    if questions:  # untimed warm-up: first-touch costs must not land on whichever method runs first
        warm = llm.tokenizer.encode_chat([{"role": "user", "content": questions[0]["turns"][0]}])
        for m in list(methods):
            try:
                m.run(warm, 8, cfg.temperature, cfg.seed)
            except PeerFailed as e:
                fail(m, e, "in the warm-up run")
    bar = tqdm(total=len(questions) * len(methods), desc="bench", unit="run", file=sys.stderr)
    tok_sum: dict[str, tuple[int, float]] = {}
    for i, q in enumerate(questions):
        records: dict[str, tuple[Record, list[int]]] = {}
        for m in methods[i % len(methods):] + methods[: i % len(methods)]:  # rotate: no method always first
            n, t = tok_sum.get(m.name, (0, 0.0))
            bar.set_postfix_str(f"{m.name} q{q['question_id']} ({subtask(q)}) {n / t if t else 0:.1f} tok/s")
            try:
                tokens, wall, ttft, forwards, lengths, per_pos, cached = run_question(m, llm, q, cfg)
            except PeerFailed as e:
                fail(m, e, f"on question {q['question_id']} ({subtask(q)})")
                bar.total -= len(questions) - i
                continue
            tok_sum[m.name] = (n + len(tokens), t + wall)
            rss = getattr(m, "peak_rss_mb", None) or resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            records[m.name] = (Record(q["question_id"], subtask(q), m.name, len(tokens), wall, ttft, forwards, lengths,
                                      per_pos, rss, cached_prompt_tokens=cached, token_ids=list(tokens)), tokens)
            bar.update(1)
        for m in methods:
            rec, tokens = records[m.name]
            # lossless means: equal to plain decoding of the same backend and format (if measured)
            base, family = split_family(m.name)
            plain = "plain" + (f"@{family}" if family and m.speculative else "")
            if m.name != plain and plain in records and cfg.temperature == 0:
                _compare(rec, tokens, records[plain][1], m.speculative, result)
            result.records.append(rec)
    bar.close()
    return result


def _compare(rec: Record, tokens: list[int], plain: list[int], lossless: bool, result: BenchResult) -> None:
    """Greedy: a lossless method must reproduce our plain decoding token for token."""
    rec.matches_plain = tokens == plain
    if rec.matches_plain:
        return
    rec.first_mismatch = next((i for i, (a, b) in enumerate(zip(tokens, plain)) if a != b), min(len(tokens), len(plain)))
    if lossless:
        msg = (f"MISMATCH: {rec.method} differs from plain on question {rec.question_id} "
               f"at new token {rec.first_mismatch} (a bug in a lossless method)")
        result.mismatches.append(msg)
        tqdm.write(f"[bench] {msg}", file=sys.stderr)


def save(result: BenchResult, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "config": asdict(result.config),
        "skipped": result.skipped,
        "failed": result.failed,
        "mismatches": result.mismatches,
        "protocol": result.protocol,
        "bandwidth_gbs": result.bandwidth_gbs,
        "weight_bytes": result.weight_bytes,
        "records": [{**asdict(r), "tokens_per_s": r.tokens_per_s} for r in result.records],
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "commit": code_commit(),
        "cpu": cpu_name(),
    }
    (out / "results.json").write_text(json.dumps(data, indent=1))


def code_commit() -> str | None:
    """The commit of the code that ran (with "+changes" where the working tree differs), where the
    package lies in a git checkout; else None."""
    import subprocess

    here = Path(__file__).parent
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=here.parent, capture_output=True, text=True,
                               timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+changes" if dirty.stdout.strip() else "")


def load(path: Path) -> BenchResult:
    """A saved results.json back into a BenchResult (to redraw the report and plots)."""
    data = json.loads(Path(path).read_text())
    cfg = BenchConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in data["config"].items()})
    fields = set(Record.__dataclass_fields__)
    records = []
    for raw in data["records"]:
        raw = dict(raw)
        if "peak_rss_mb" in raw:  # the name results.json used before
            raw["process_peak_rss_mb"] = raw.pop("peak_rss_mb")
        # runs saved before a fix padded per-position counts past k with zeros
        raw["accepted_per_position"] = raw["accepted_per_position"][: cfg.k]
        records.append(Record(**{k: v for k, v in raw.items() if k in fields}))
    return BenchResult(cfg, records, data.get("skipped", {}), data.get("failed", {}), data.get("mismatches", []),
                       data.get("protocol", "fixed"), data.get("bandwidth_gbs"), data.get("weight_bytes", {}))
