"""test_tok_chat.py — engine/text/chat.c against the chat templates themselves, rendered by jinja2 the way
transformers' apply_chat_template does (sandboxed, trim_blocks, lstrip_blocks), for the Qwen3 and
Llama 3 tokenizer_config.json files and grpod's default model, with and without
add_generation_prompt. Unknown templates must be refused."""
import json
import os
import subprocess

import jinja2
import jinja2.ext
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from test_parity import TOKDIR, driver, run_jsonl  # noqa: F401  (driver is a fixture)

CONVS = [
    [{"role": "user", "content": "What is 2+2?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"},
     {"role": "assistant", "content": "A1"}, {"role": "user", "content": "  Q2 \n"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "A"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA"}],
    [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "<think>r1</think>A1"},
     {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "x</think>\n\nA2"}],
    [{"role": "user", "content": "Q"}, {"role": "assistant", "content": "calling"},
     {"role": "tool", "content": "42"}, {"role": "tool", "content": "43"}, {"role": "assistant", "content": "done"}],
    [{"role": "user", "content": "a"}, {"role": "system", "content": "mid"}, {"role": "user", "content": "\u00e9 \u4f60\u597d \U0001F600"}],
    [{"role": "user", "content": "\t spaces \u3000"}, {"role": "assistant", "content": "\n\nx\n"}],
]


def jinja_render(cfg, conv, gen):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = lambda x, **k: json.dumps(x, ensure_ascii=False)
    tpl = env.from_string(cfg["chat_template"])
    return tpl.render(messages=conv, add_generation_prompt=gen, bos_token=cfg.get("bos_token") or "",
                      eos_token=cfg.get("eos_token") or "")


def model_dirs(driver, tmp):
    subprocess.run([driver, "default-tokenizer", str(tmp)], check=True)
    return [os.path.join(TOKDIR, "qwen3"), os.path.join(TOKDIR, "llama3"), str(tmp)]


@pytest.mark.parametrize("gen", [False, True])
def test_chat_matches_jinja(driver, tmp_path, gen):
    for d in model_dirs(driver, tmp_path):
        cfg = json.load(open(os.path.join(d, "tokenizer_config.json")))
        got = run_jsonl([driver, "chat", d] + (["--gen"] if gen else []), CONVS)
        for conv, g in zip(CONVS, got):
            assert g == jinja_render(cfg, conv, gen), (d, conv)


def test_unknown_template_refused(driver, tmp_path):
    subprocess.run([driver, "default-tokenizer", str(tmp_path)], check=True)
    cfg_path = tmp_path / "tokenizer_config.json"
    cfg = json.load(open(cfg_path))
    cfg["chat_template"] = "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"
    json.dump(cfg, open(cfg_path, "w"))
    got = run_jsonl([driver, "chat", str(tmp_path)], CONVS[:1])
    assert "error" in got[0] and "neither ChatML" in got[0]["error"]
