# A/B: suffix with other options beside the usual methods, one bench run (methods' order interleaved per question)
import sys, json
import verispec.bench.run as R
from verispec.bench.methods import OursMethod
from verispec.config import SpeculativeConfig
from verispec.bench.cli import _write_report
from pathlib import Path
model, out, questions = sys.argv[1], sys.argv[2], sys.argv[3]
variants = json.loads(sys.argv[4])
from verispec.proposers.suffix import SuffixProposer
from verispec.proposers.base import register
@register("suffix_req4")
class Req4(SuffixProposer):
    def candidate(self, seq, k, max_nodes=0):
        own = self._own(seq)
        tail = seq.tokens[-self.max_depth :]
        mine = own.best(tail, k, self.max_depth, 4.0, self.min_token_prob, exclude_from=len(own.tokens), max_nodes=max_nodes)
        seeded = seq.params.seed is not None and not seq.params.greedy
        theirs = None if seeded else self.responses.index.best(tail, k, self.max_depth, self.max_spec_factor, self.min_token_prob, max_nodes=max_nodes)
        pick = max((c for c in (mine, theirs) if c is not None), key=lambda c: c.score, default=None)
        if pick is not None:
            pick.source = "request" if pick is mine else "global"
        return pick

@register("suffix_nolabel")
class NoLabel(SuffixProposer):
    labels_drafts = False
    def draft_of(self, pick):
        d = super().draft_of(pick); d.kind = None; return d  # {"name": {options}, ...}; name like suffix_f4@torch:gguf-int8
orig = R.build_methods
def bm(cfg, llm):
    methods, s, f = orig(cfg, llm)
    llms = {}
    for name, opts in variants.items():
        base, family = R.split_family(name)
        opts = dict(opts); meth = opts.pop("_method", "suffix"); old = opts.pop("_oldprior", False)
        spec = SpeculativeConfig(method=meth, num_speculative_tokens=cfg.k, adaptive_k=True,
                                 cost_profile=R.family_profile(cfg.cost_profile, family, cfg.model), **opts)
        m = OursMethod(name, R.family_llm(cfg, llm, family, llms), spec, cfg.prefix_caching)
        if old:
            from verispec.engine.policy import AcceptanceEstimate
            m.decoder._estimate = lambda req, kind: req.estimates.setdefault(kind, AcceptanceEstimate())
        methods.append(m)
    return methods, s, f
R.build_methods = bm
methods = tuple(sys.argv[5].split(","))
cfg = R.BenchConfig(model=model, methods=methods, limit=int(sys.argv[6]) if len(sys.argv) > 6 else 10, k=8, adaptive_k=True,
                    prefix_caching=True, questions=None if questions == "spec_bench" else questions, out=out)
res = R.run_bench(cfg)
R.save(res, Path(out)); _write_report(res, Path(out))
