#!/usr/bin/env python3
"""peft_roundtrip.py — the adapter grpod wrote, loaded by PEFT onto the base with transformers,
gives grpod's logprobs. Reads OUT/peft_case.json (tests/gpu/test_lora.c: base dir, adapter dir,
a prompt, responses, grpod's logprobs on cuda and on the cpu backend), loads
AutoModelForCausalLM(base) + PeftModel.from_pretrained(adapter) in fp32, and scores the
responses. Rows (tests/gpu/run.sh format):
  grpod cpu (fp32) vs peft fp32: max |d logprob| <= 1e-4 (the same math in another order);
  grpod cuda (bf16) vs peft fp32: mean |d| <= 1e-2 (bf16 activations and weights).
Usage: peft_roundtrip.py OUT_DIR"""
import json
import os
import sys

import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM


def row(test, shape, value, tol):
    ok = value <= tol
    print("ROW|%s|%s|%.3e|%.0e|%s" % (test, shape, value, tol, "PASS" if ok else "FAIL"), flush=True)
    return ok


def main():
    case = json.load(open(os.path.join(sys.argv[1], "peft_case.json")))
    base = AutoModelForCausalLM.from_pretrained(case["base"], torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, case["adapter"]).eval()
    cfg = json.load(open(os.path.join(case["adapter"], "adapter_config.json")))
    print("peft: r=%s alpha=%s targets=%s" % (cfg["r"], cfg["lora_alpha"], cfg["target_modules"]))
    prompt, ok = case["prompt"], True
    worst_cpu, sum_cuda, n = 0.0, 0.0, 0
    with torch.no_grad():
        for i, resp in enumerate(case["responses"]):
            ids = torch.tensor([prompt + resp])
            logits = model(input_ids=ids).logits[0].float()
            lp = torch.log_softmax(logits, dim=-1)
            P = len(prompt)
            ref = [lp[P - 1 + t, tok].item() for t, tok in enumerate(resp)]
            for t in range(len(resp)):
                worst_cpu = max(worst_cpu, abs(ref[t] - case["grpod_cpu"][i][t]))
                sum_cuda += abs(ref[t] - case["grpod_cuda"][i][t])
                n += 1
            print("  response %d: peft %s\n               cpu  %s" % (
                i, " ".join("%.5f" % x for x in ref), " ".join("%.5f" % x for x in case["grpod_cpu"][i])))
        # the adapter is not a no-op: PEFT with adapters disabled gives other logprobs
        with model.disable_adapter():
            ids = torch.tensor([prompt + case["responses"][0]])
            lp0 = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        P = len(prompt)
        moved = sum(abs(lp0[P - 1 + t, tok].item() - case["grpod_cpu"][0][t]) for t, tok in enumerate(case["responses"][0]))
    shape = "default model, PEFT r=%s, %d tokens" % (cfg["r"], n)
    ok &= row("peft round trip: grpod cpu vs peft fp32, max |d logprob|", shape, worst_cpu, 1e-4)
    ok &= row("peft round trip: grpod cuda vs peft fp32, mean |d logprob|", shape, sum_cuda / n, 1e-2)
    ok &= row("peft round trip: the adapter matters (-sum |d| adapters off)", shape, -moved, -1e-2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
