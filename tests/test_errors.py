"""Every user mistake gets its own exception type and a clear message, never a deep traceback."""

import json
import shutil

import numpy as np
import pytest

from verispec import LLM, SamplingParams
from verispec.errors import (
    ChatTemplateError,
    ConfigError,
    ContextLengthError,
    IncompatibleDraftError,
    InvalidPromptError,
    InvalidSamplingParamsError,
    InvalidSpeculativeConfigError,
    ModelNotFoundError,
    UnsupportedModelError,
    VerispecError,
)


def test_unknown_model_names_the_bundled_ones():
    with pytest.raises(ModelNotFoundError, match="smollm2-135m.*gemma3-270m"):
        LLM("no-such-model")


def test_missing_files(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        LLM(str(tmp_path))
    (tmp_path / "x.bin").write_bytes(b"1234")
    with pytest.raises(ModelNotFoundError, match="neither a .gguf"):
        LLM(str(tmp_path / "x.bin"))


def test_unsupported_architecture_in_config(tiny_dir, tmp_path):
    folder = tmp_path / "gpt2"
    shutil.copytree(tiny_dir("llama"), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*supported"):
        LLM(str(folder))


def test_unsupported_architecture_in_gguf(tmp_path):
    import gguf

    path = tmp_path / "phi.gguf"
    w = gguf.GGUFWriter(str(path), "phi2")
    w.add_tokenizer_model("gpt2")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_merges(["a b"])
    w.add_token_types([1, 1, 1])
    w.add_tensor("token_embd.weight", np.zeros((3, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedModelError, match="phi2"):
        LLM(str(path))
    garbage = tmp_path / "bad.gguf"
    garbage.write_bytes(b"not a gguf file at all")
    with pytest.raises(UnsupportedModelError, match="not a readable GGUF"):
        LLM(str(garbage))


@pytest.fixture(scope="module")
def llm(tiny_dir):
    return LLM(str(tiny_dir("llama")))


def test_context_overflow(llm):
    with pytest.raises(ContextLengthError, match="exceeds the model's context of 512"):
        llm.generate([[1] * 500], SamplingParams(max_tokens=20))
    small = LLM(llm.config.model, max_model_len=64)
    with pytest.raises(ContextLengthError, match="64"):
        small.generate([[1] * 60], SamplingParams(max_tokens=5))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=float("nan")), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-2), "top_k"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(max_tokens=2.5), "max_tokens"),
        (dict(seed="x"), "seed"),
        (dict(stop=[""]), "stop"),
        (dict(stop_token_ids=[-1]), "stop_token_ids"),
    ],
)
def test_invalid_sampling_values(kwargs, match):
    with pytest.raises(InvalidSamplingParamsError, match=match):
        SamplingParams(**kwargs)


def test_bad_prompts(llm):
    with pytest.raises(InvalidPromptError, match="empty"):
        llm.generate([""], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidPromptError, match="out of the vocabulary"):
        llm.generate([[1, 5000]], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidPromptError, match="role"):
        llm.chat([{"role": "wizard", "content": "hi"}])
    with pytest.raises(InvalidPromptError):
        llm.chat([])


def test_draft_vocabulary_mismatch(tiny_dir):
    with pytest.raises(IncompatibleDraftError, match="vocabulary"):
        LLM(str(tiny_dir("llama")), speculative={"method": "draft_model", "draft_model": str(tiny_dir("llama", vocab=80))})


def test_runners_report_a_vocabulary_fingerprint(tiny_dir):
    a, b = LLM(str(tiny_dir("llama"))).runner, LLM(str(tiny_dir("qwen2"))).runner
    other = LLM(str(tiny_dir("llama", vocab=80))).runner
    assert a.vocab_fingerprint() == LLM(str(tiny_dir("llama", seed=1))).runner.vocab_fingerprint()  # other weights, same tokens
    assert a.vocab_fingerprint() != other.vocab_fingerprint()
    assert a.vocab_fingerprint().startswith(f"{a.vocab_size}:") and b.vocab_fingerprint()


def test_bad_speculative_config(tiny_dir):
    target = str(tiny_dir("llama"))
    with pytest.raises(InvalidSpeculativeConfigError, match="unknown speculative method 'eagle9'.*prompt_lookup"):
        LLM(target, speculative={"method": "eagle9"})
    with pytest.raises(InvalidSpeculativeConfigError, match="unknown speculative option"):
        LLM(target, speculative={"method": "prompt_lookup", "k": 3})
    with pytest.raises(InvalidSpeculativeConfigError, match="num_speculative_tokens"):
        LLM(target, speculative={"method": "prompt_lookup", "num_speculative_tokens": 0})
    with pytest.raises(InvalidSpeculativeConfigError, match="draft_model"):
        LLM(target, speculative={"method": "draft_model"})
    with pytest.raises(ConfigError, match="unknown LLM option"):
        LLM(target, temperature=0.5)


def test_chat_without_template(tiny_dir, tmp_path):
    folder = tmp_path / "notemplate"
    shutil.copytree(tiny_dir("llama"), folder)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    del cfg["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        LLM(str(folder)).chat([{"role": "user", "content": "w5 w6"}])


def test_all_errors_share_a_base():
    for cls in (ModelNotFoundError, UnsupportedModelError, ContextLengthError, InvalidSamplingParamsError):
        assert issubclass(cls, VerispecError)


def test_failed_requests_release_their_caches(tiny_dir, monkeypatch):
    llm = LLM(str(tiny_dir("llama")), speculative={"method": "draft_model", "draft_model": str(tiny_dir("llama", seed=7))})
    llm.generate([[1, 5, 6]], SamplingParams(max_tokens=4))
    with pytest.raises(InvalidPromptError):
        llm.generate([[1, 5000]], SamplingParams(max_tokens=4))

    def broken_forward(*args, **kwargs):
        raise RuntimeError("simulated failure inside the target's forward")

    monkeypatch.setattr(llm.runner, "forward", broken_forward)
    with pytest.raises(RuntimeError, match="simulated"):
        llm.generate([[1, 5, 6]], SamplingParams(max_tokens=4))
    assert llm.runner.open_sequences == 0
    assert llm.decoder.proposer.runner.open_sequences == 0


@pytest.mark.parametrize(
    "options, match",
    [
        (dict(max_model_len="4096"), "max_model_len"),
        (dict(max_model_len=-5), "max_model_len"),
        (dict(num_threads=-1), "num_threads"),
    ],
)
def test_bad_engine_options(tiny_dir, options, match):
    with pytest.raises(ConfigError, match=match):
        LLM(str(tiny_dir("llama")), **options)


def test_bad_types_from_python_callers(llm, tiny_dir):
    with pytest.raises(InvalidSamplingParamsError, match="seed"):
        SamplingParams(seed=2**64)
    with pytest.raises(InvalidSamplingParamsError, match="SamplingParams"):
        llm.generate(["w5"], {"temperature": 0})
    with pytest.raises(InvalidSpeculativeConfigError, match="must be a dict"):
        LLM(str(tiny_dir("llama")), speculative="prompt_lookup")
    with pytest.raises(InvalidSpeculativeConfigError, match="prompt_lookup_min"):
        LLM(str(tiny_dir("llama")), speculative={"method": "prompt_lookup", "prompt_lookup_min": "2"})


def test_tiny_temperature_is_greedy(llm):
    greedy = llm.generate([[1, 5, 6]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))[0]
    tiny = llm.generate([[1, 5, 6]], SamplingParams(temperature=1e-39, max_tokens=6, ignore_eos=True))[0]
    assert tiny.token_ids == greedy.token_ids


def test_draft_model_with_a_shorter_context(tiny_dir, tmp_path):
    folder = tmp_path / "short"
    shutil.copytree(tiny_dir("llama", seed=7), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["max_position_embeddings"] = 32
    (folder / "config.json").write_text(json.dumps(cfg))
    llm = LLM(str(tiny_dir("llama")), speculative={"method": "draft_model", "draft_model": str(folder)})
    assert llm.generate([[1, 5, 6]], SamplingParams(max_tokens=8))[0].token_ids
    with pytest.raises(ContextLengthError, match="draft model's context of 32"):
        llm.generate([[1] * 30], SamplingParams(max_tokens=8))
    assert llm.runner.open_sequences == 0
