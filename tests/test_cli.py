import json
import subprocess
import sys

from verispec.cli import main


def test_generate_prints_text_and_acceptance(tiny_dir, capsys):
    model = str(tiny_dir("llama"))
    code = main(["generate", "w5 w6 w7 w5 w6 w7 w5 w6", "--model", model, "--method", "prompt_lookup", "--k", "3",
                 "--temperature", "0", "--max-tokens", "12", "--ignore-eos"])
    out = capsys.readouterr()
    assert code == 0
    assert out.out.strip().startswith("w")
    assert "mean acceptance length" in out.err and "12 tokens" in out.err


def test_generate_json_and_chat(tiny_dir, capsys):
    model = str(tiny_dir("llama"))
    assert main(["generate", "w9", "--chat", "--model", model, "--temperature", "0", "--max-tokens", "4", "--ignore-eos", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["token_ids"]) == 4 and data["finish_reason"] == "length"
    assert data["metrics"]["mean_acceptance_length"] == 1.0


def test_errors_are_one_line_not_tracebacks(capsys):
    assert main(["generate", "hi", "--model", "nope"]) == 2
    err = capsys.readouterr().err
    assert "ModelNotFoundError" in err and "Traceback" not in err
    assert main(["generate", "hi", "--model", "nope", "--temperature", "-1"]) == 2
    assert "temperature" in capsys.readouterr().err


def test_demo_on_a_tiny_model(tiny_dir, tmp_path):
    questions = tmp_path / "q.jsonl"
    rows = [{"question_id": i, "category": c, "turns": [f"w{5 + i} w7 w8 w{5 + i} w7 w8"]} for i, c in enumerate(["summarization", "qa", "rag"])]
    questions.write_text("\n".join(json.dumps(r) for r in rows))
    proc = subprocess.run(
        [sys.executable, "-m", "verispec.cli", "demo", "--model", str(tiny_dir("llama")), "--questions", str(questions),
         "--num-prompts", "3", "--max-tokens", "16", "--k", "4"],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "outputs identical: YES" in proc.stdout
    assert "speedup" in proc.stdout
