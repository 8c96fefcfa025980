"""bench_daemon.py — the end-to-end GRPO loop through the daemon's HTTP API at real dims, as an
orchestrator runs it (standard library only in this process; the checkpoint maker uses torch on
the GPU when it is there, else numpy).

1. A random Qwen3 checkpoint at --dims (tiny | 0.6b | 1.7b | 8b | MoE: tiny-moe, 30b-a3b-l4, 30b-a3b
   whole | Qwen3.5 hybrid: tiny-hybrid, qwen3.5-9b-l4, qwen3.5-9b): config.json and bf16
   safetensors with every tensor grpod loads (engine/model/model.c), normal(0, 0.02), norms 1 +-
   0.02 (Qwen3.5's zero-centred norms 0 +- 0.02); one
   file, or shards of <= 5 GB with model.safetensors.index.json. Made tensor by tensor in a child
   process (its CUDA context gone before the daemon starts), cached in --model-cache
   (/tmp/grpod-bench-DIMS) and reused when its marker matches.
2. `grpod serve --model DIR --data-dir FRESH --listen 127.0.0.1:PORT --backend B` plus any
   --serve-arg (--lora RANK adds --lora-rank RANK); start-up time = process start to /readyz 200;
   GET /v1/model printed (with its memory plan when the daemon reports one).
3. --steps GRPO steps: a rollout job of --groups groups x --n responses, --prompt random token
   ids each (seeded, new prompts every step), --max-tokens, ignore_eos, temperature 1; then an
   update on its tokens with random client rewards per response (old_logprobs "rollout": the
   rollout's logprobs travel with the responses; --old-logprobs recompute for the old pass).
   --interleave: two rollouts queued before each update, the update on the older one (queue
   R0 R1 U0 R2 U1 R3 ...: the daemon never waits for the client; one step off-policy; step 1
   then holds two rollouts, decoded together, and a step is the time between update completions).
4. Per step: rollout s, update s with the daemon's phases (timings_ms old/ref/policy/optimizer),
   step s, tokens/s/GPU counted as P+NR (each prompt once + responses) and N(P+R) (NeMo-RL's:
   every sample's prompt + response) over the step's wall time; first step vs steady state
   (median of steps 2..N). A table, ROW lines for tests/gpu/run.sh, and a JSON summary in
   OUTDIR/bench_daemon_DIMS[_interleave].json; the daemon's output in OUTDIR/daemon_DIMS.log.
5. SIGTERM, a bounded wait (--stop-timeout; the default --checkpoint-on-exit writes a checkpoint
   then: fp32 weights and AdamW moments, 12 bytes a parameter, 24 GB at 1.7b, ~100 GB at 8b; pass
   --serve-arg=--checkpoint-on-exit=false where the disk cannot hold it), SIGKILL past it.
   --kill-replay: after --kill-after updates (3) SIGKILL, restart on the same data dir, time to
   /readyz 200 (load + replay), policy_version == updates done; the loop then goes on (the step
   after the restart is left out of the steady state).
   --checkpoint-at K: a checkpoint job submitted after step K's update, not waited for; reported
   at the end: its size, the capture (the engine's stall: the state copied to host memory), the
   time until it was written and indexed, and step K+1's time (run beside the write).

Every wait is bounded: a job past --job-timeout, a daemon not ready in --ready-timeout or one
that exits is a FAIL row with the reason printed, never a hang.

Usage: LD_LIBRARY_PATH=.devlibs python3 tests/bench/gpu/bench_daemon.py ./grpod OUTDIR --dims 1.7b --steps 10
         [--interleave] [--kill-replay [--kill-after 3]] [--port 18800] [--backend cuda]
         [--groups 8 --n 16 --prompt 1024 --max-tokens 512] [--serve-arg=--kv-budget-mib=40000 ...]
       on the CPU: python3 tests/bench/gpu/bench_daemon.py ./grpod /tmp/bd --dims tiny --steps 3 --backend cpu
       (tiny defaults to 4 groups x 8, P=64, 32 tokens; real dims to 8 x 16, P=1024, 512 tokens)
       Qwen3-30B-A3B with LoRA on one H200: ... --dims 30b-a3b --lora 16 --model-cache /big/disk/30b-a3b
ROW lines: ROW|daemon_loop|DIMS ... steps|done|steps|PASS/FAIL, ROW|daemon_first_vs_steady|DIMS|ratio|1.5|...
(informational), ROW|daemon_kill_replay|...|version|updates|..., ROW|daemon_sigterm|...|exit|0|...
"""
import argparse, json, os, random, shutil, signal, statistics, struct, subprocess, sys, tempfile, time
import urllib.error, urllib.request

DIMS = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 intermediate_size=128, vocab_size=1000, tie_word_embeddings=True, eos_token_id=999),
    "0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=3072, vocab_size=151936, tie_word_embeddings=True, eos_token_id=151645,
                 bos_token_id=151643),
    "1.7b": dict(hidden_size=2048, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                 intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True, eos_token_id=151645,
                 bos_token_id=151643),
    "tiny-moe": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=64,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                     intermediate_size=128, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                     norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
                     vocab_size=1000, tie_word_embeddings=True, eos_token_id=999),
    # Qwen3-30B-A3B's dims (128 experts, top-8, expert MLP 768) with 4 of its 48 layers: 3.1B
    # parameters, every tensor of the real model's layers, on one GPU with its training state
    "30b-a3b-l4": dict(model_type="qwen3_moe", architectures=["Qwen3MoeForCausalLM"], hidden_size=2048,
                       num_hidden_layers=4, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
                       intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                       norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], router_aux_loss_coef=0.001,
                       output_router_logits=False, vocab_size=151936, tie_word_embeddings=False,
                       eos_token_id=151645, bos_token_id=151643),
    "8b": dict(hidden_size=4096, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
               intermediate_size=12288, vocab_size=151936, tie_word_embeddings=False, eos_token_id=151645,
               bos_token_id=151643),
}
# Qwen3-30B-A3B whole (48 layers, 30.5B parameters, 61 GB bf16): with --lora on one GPU (the base
# frozen and the reference, adapters on attention and experts); its checkpoint needs 61 GB of disk
# for --model-cache beside the daemon's data dir
DIMS["30b-a3b"] = dict(DIMS["30b-a3b-l4"], num_hidden_layers=48)
# Qwen3.5-9B (the HF default Qwen3.5 text config: every fourth layer gated full attention at head
# dim 256, the others gated DeltaNet); -l4: 3 DeltaNet + 1 attention layer, 2.9B parameters (the
# untied 248,320-row embedding and head are 2.0B of them)
DIMS["qwen3.5-9b"] = dict(model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"], hidden_size=4096,
                          num_hidden_layers=32, num_attention_heads=16, num_key_value_heads=4, head_dim=256,
                          intermediate_size=12288, linear_num_key_heads=16, linear_num_value_heads=32,
                          linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000000.0,
                                           "partial_rotary_factor": 0.25},
                          rope_theta=10000000.0, max_position_embeddings=262144, vocab_size=248320,
                          tie_word_embeddings=False, eos_token_id=248044, bos_token_id=None)
DIMS["qwen3.5-9b-l4"] = dict(DIMS["qwen3.5-9b"], num_hidden_layers=4)
DIMS["tiny-hybrid"] = dict(DIMS["qwen3.5-9b"], hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=16, intermediate_size=96, linear_num_key_heads=2,
                           linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=24,
                           max_position_embeddings=4096, vocab_size=1000, eos_token_id=999)
for _d in ("qwen3.5-9b", "qwen3.5-9b-l4", "tiny-hybrid"):
    DIMS[_d]["layer_types"] = ["full_attention" if l % 4 == 3 else "linear_attention"
                               for l in range(DIMS[_d]["num_hidden_layers"])]
LORA_HELP = ("train LoRA adapters of this rank (grpod serve --lora-rank; alpha 2 x rank, all targets: on a MoE "
             "model attention and the experts, as PEFT): the base frozen and the reference")
SHARD_BYTES = int(os.environ.get("BENCH_SHARD_BYTES", 5 * 10**9))   # env: to try sharding at tiny dims
MODEL_FORMAT = 1                   # bump when the checkpoint layout changes (invalidates caches)
MARKER = ".grpod_bench_model.json"


def log(*a):
    print(*a, flush=True)


def row(test, shape, value, tol, ok, fmt="%d"):
    print(("ROW|%s|%s|" + fmt + "|%s|%s") % (test, shape, value, tol, "PASS" if ok else "FAIL"), flush=True)


# ------------------------------------------------------------------ the random checkpoint

def qwen3_config(dims):
    c = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu",
         "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
         "max_position_embeddings": 40960, "rope_theta": 1000000, "rope_scaling": None, "rms_norm_eps": 1e-6,
         "torch_dtype": "bfloat16", "initializer_range": 0.02, "use_cache": True}
    c.update(DIMS[dims])
    return c


def tensor_list(c):
    """(name, shape, kind) in HF order: every tensor engine/model/model.c loads for qwen3 (and
    qwen3_moe: the router and each expert's three projections in place of the MLP)."""
    C, H, K, D, F, V = (c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"],
                        c["intermediate_size"], c["vocab_size"])
    t = [("model.embed_tokens.weight", [V, C], "w")]
    hybrid = c["model_type"] == "qwen3_5_text"
    g = "w" if hybrid else "n"  # Qwen3.5's RMSNorm weights are zero-centred (1 + w)
    for l in range(c["num_hidden_layers"]):
        p = "model.layers.%d." % l
        if hybrid and c["layer_types"][l] == "linear_attention":
            KL, VL, hv = (c["linear_num_key_heads"] * c["linear_key_head_dim"],
                          c["linear_num_value_heads"] * c["linear_value_head_dim"], c["linear_num_value_heads"])
            a = p + "linear_attn."
            t += [(p + "input_layernorm.weight", [C], g),
                  (a + "in_proj_qkv.weight", [2 * KL + VL, C], "w"), (a + "in_proj_z.weight", [VL, C], "w"),
                  (a + "in_proj_b.weight", [hv, C], "w"), (a + "in_proj_a.weight", [hv, C], "w"),
                  (a + "conv1d.weight", [2 * KL + VL, 1, c["linear_conv_kernel_dim"]], "w"),
                  (a + "dt_bias", [hv], "w"), (a + "A_log", [hv], "w"),
                  (a + "norm.weight", [c["linear_value_head_dim"]], "n"), (a + "out_proj.weight", [C, VL], "w"),
                  (p + "post_attention_layernorm.weight", [C], g),
                  (p + "mlp.gate_proj.weight", [F, C], "w"), (p + "mlp.up_proj.weight", [F, C], "w"),
                  (p + "mlp.down_proj.weight", [C, F], "w")]
            continue
        t += [(p + "input_layernorm.weight", [C], g),
              (p + "self_attn.q_proj.weight", [(2 if hybrid else 1) * H * D, C], "w"),
              (p + "self_attn.k_proj.weight", [K * D, C], "w"),
              (p + "self_attn.v_proj.weight", [K * D, C], "w"),
              (p + "self_attn.o_proj.weight", [C, H * D], "w"),
              (p + "self_attn.q_norm.weight", [D], g),
              (p + "self_attn.k_norm.weight", [D], g),
              (p + "post_attention_layernorm.weight", [C], g)]
        E = c.get("num_experts", 0)
        if E:
            Fm = c["moe_intermediate_size"]
            t.append((p + "mlp.gate.weight", [E, C], "w"))
            for e in range(E):
                t += [(p + "mlp.experts.%d.gate_proj.weight" % e, [Fm, C], "w"),
                      (p + "mlp.experts.%d.up_proj.weight" % e, [Fm, C], "w"),
                      (p + "mlp.experts.%d.down_proj.weight" % e, [C, Fm], "w")]
        else:
            t += [(p + "mlp.gate_proj.weight", [F, C], "w"),
                  (p + "mlp.up_proj.weight", [F, C], "w"),
                  (p + "mlp.down_proj.weight", [C, F], "w")]
    t.append(("model.norm.weight", [C], g))
    if not c["tie_word_embeddings"]:
        t.append(("lm_head.weight", [V, C], "w"))
    return t


def numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


class Gen:
    """bf16 random tensors, written straight to a file: torch on the GPU, else numpy (fp32 ->
    bf16 rounding to nearest even), else the random module (tiny dims only)."""

    def __init__(self, seed):
        self.torch = self.np = None
        try:
            import torch
            if torch.cuda.is_available():
                self.torch = torch
                self.g = torch.Generator(device="cuda")
                self.g.manual_seed(seed)
        except Exception:
            pass
        if self.torch is None:
            try:
                import numpy
                self.np = numpy
                self.rng = numpy.random.default_rng(seed)
            except Exception:
                self.rng = random.Random(seed)
        self.name = "torch-cuda" if self.torch else "numpy" if self.np else "python"

    def write(self, f, shape, kind):
        n = numel(shape)
        std, mean = (0.02, 0.0) if kind == "w" else (0.02, 1.0)
        if self.torch:
            t = self.torch.randn(n, generator=self.g, dtype=self.torch.float32, device="cuda")
            t = t.mul_(std).add_(mean).to(self.torch.bfloat16)
            h = t.cpu()
            del t
            h.view(self.torch.int16).numpy().tofile(f)
            return
        if self.np:
            np = self.np
            chunk = 1 << 24
            for a in range(0, n, chunk):
                x = self.rng.standard_normal(min(chunk, n - a), dtype=np.float32) * np.float32(std) + np.float32(mean)
                u = x.view(np.uint32)
                b = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")
                b.tofile(f)
            return
        assert n <= 1 << 22, "no numpy and no torch: only tiny dims can be made with the random module"
        vals = []
        for _ in range(n):
            u = struct.unpack("<I", struct.pack("<f", self.rng.gauss(mean, std)))[0]
            vals.append(((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
        f.write(struct.pack("<%dH" % n, *vals))


def make_model(dims, path, seed):
    """Writes the checkpoint into path (a fresh directory). Host memory: one tensor at a time."""
    c = qwen3_config(dims)
    tl = tensor_list(c)
    total = sum(numel(s) * 2 for _, s, _ in tl)
    shards, cur, size = [], [], 0
    for t in tl:
        b = numel(t[1]) * 2
        if cur and total > SHARD_BYTES and size + b > SHARD_BYTES:
            shards.append(cur)
            cur, size = [], 0
        cur.append(t)
        size += b
    shards.append(cur)
    gen = Gen(seed)
    t0 = time.time()
    names = ["model.safetensors"] if len(shards) == 1 else \
        ["model-%05d-of-%05d.safetensors" % (i + 1, len(shards)) for i in range(len(shards))]
    weight_map = {}
    for fname, sh in zip(names, shards):
        hdr, off = {"__metadata__": {"format": "pt"}}, 0
        for name, shape, _ in sh:
            b = numel(shape) * 2
            hdr[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [off, off + b]}
            off += b
            weight_map[name] = fname
        hb = json.dumps(hdr, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(os.path.join(path, fname), "wb") as f:
            f.write(struct.pack("<Q", len(hb)))
            f.write(hb)
            for name, shape, kind in sh:
                gen.write(f, shape, kind)
            want = 8 + len(hb) + off
            if f.tell() != want:
                raise RuntimeError("%s: wrote %d bytes, expected %d" % (fname, f.tell(), want))
    if len(shards) > 1:
        with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=1)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(c, f, indent=2)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": c["eos_token_id"]}, f)
    log("# made %s checkpoint: %d tensors, %.2f GB in %d file(s), %.1f s (%s)" %
        (dims, len(tl), total / 1e9, len(shards), time.time() - t0, gen.name))


def marker_for(dims, seed):
    return {"format": MODEL_FORMAT, "dims": dims, "seed": seed, "config": qwen3_config(dims)}


def ensure_model(dims, cache, seed):
    want = marker_for(dims, seed)
    mk = os.path.join(cache, MARKER)
    try:
        with open(mk) as f:
            if json.load(f) == want:
                log("# reusing the %s checkpoint in %s" % (dims, cache))
                return 0.0
    except (OSError, ValueError):
        pass
    if os.path.exists(cache):
        shutil.rmtree(cache)
    tmp = cache + ".tmp-%d" % os.getpid()
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    t0 = time.time()
    # a child process: its CUDA context (torch) is gone before the daemon starts
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--make-model", tmp, "--dims", dims,
                        "--seed", str(seed)], timeout=1800)
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError("making the %s checkpoint failed (exit %d)" % (dims, r.returncode))
    with open(os.path.join(tmp, MARKER), "w") as f:
        json.dump(want, f)
    os.rename(tmp, cache)
    return time.time() - t0


# ------------------------------------------------------------------ HTTP

class Api:
    def __init__(self, port):
        self.base = "http://127.0.0.1:%d" % port

    def call(self, method, path, body=None, timeout=120):
        data = json.dumps(body, separators=(",", ":")).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read()
                code = r.status
        except urllib.error.HTTPError as e:
            raw, code = e.read(), e.code
        try:
            return code, json.loads(raw or b"null")
        except ValueError:
            return code, raw.decode(errors="replace")


class Daemon:
    def __init__(self, a, data, tag):
        self.a, self.data = a, data
        self.logname = os.path.join(a.outdir, "daemon_%s.log" % a.dims)
        self.log = open(self.logname, "a")
        self.log.write("==== %s start %s\n" % (tag, time.strftime("%FT%T")))
        self.log.flush()
        cmd = [a.grpod, "serve", "--model", a.model_dir, "--data-dir", data, "--listen", "127.0.0.1:%d" % a.port,
               "--backend", a.backend] + (["--lora-rank", str(a.lora)] if getattr(a, "lora", 0) else [])
        cmd += list(a.serve_arg or [])
        log("# %s: %s" % (tag, " ".join(cmd)))
        self.t0 = time.time()
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.api = Api(a.port)

    def tail(self, n=15):
        try:
            with open(self.logname, errors="replace") as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""

    def dead(self):
        return self.p.poll() is not None

    def why_dead(self):
        return "grpod exited %s; last lines of %s:\n%s" % (self.p.returncode, self.logname, self.tail())

    def wait_ready(self, timeout):
        """Seconds from process start to /readyz 200; raises with the reason otherwise."""
        last = None
        while time.time() - self.t0 < timeout:
            if self.dead():
                raise RuntimeError(self.why_dead())
            try:
                code, r = self.api.call("GET", "/readyz", timeout=5)
                if code == 200:
                    return time.time() - self.t0
                if r != last:
                    last = r
                    log("#   readyz %d %s (%.1f s)" % (code, json.dumps(r)[:200], time.time() - self.t0))
                why = ((r or {}).get("error") or {}).get("message", "") if isinstance(r, dict) else ""
                if why.startswith("engine failed"):  # the daemon stays up; the engine will not open
                    raise RuntimeError("%s (after %.1f s)" % (why, time.time() - self.t0))
            except (OSError, urllib.error.URLError):
                pass
            time.sleep(0.2)
        raise RuntimeError("not ready in %d s (last /readyz: %s); last lines of %s:\n%s" %
                           (timeout, last, self.logname, self.tail()))

    def stop(self, timeout):
        """SIGTERM, then SIGKILL after timeout s: (exit status, seconds)."""
        t0 = time.time()
        if self.dead():
            return self.p.returncode, 0.0
        self.p.send_signal(signal.SIGTERM)
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            log("# the daemon did not stop in %d s after SIGTERM: SIGKILL" % timeout)
            self.p.kill()
            self.p.wait(60)
            rc = -9
        self.log.close()
        return rc, time.time() - t0

    def kill9(self):
        self.p.kill()
        try:
            self.p.wait(60)
        finally:
            self.log.close()


class JobError(RuntimeError):
    pass


def submit(d, path, body):
    code, r = d.api.call("POST", path, body, timeout=120)
    if code != 202:
        raise JobError("POST %s: %d %s" % (path, code, json.dumps(r)[:500]))
    return r["job_id"]


def wait_job(d, jid, timeout):
    """The finished job (done); raises JobError on failed/cancelled, a dead daemon or timeout."""
    t0 = time.time()
    while True:
        left = timeout - (time.time() - t0)
        if left <= 0:
            try:                 # cancelled, so that the stop does not wait for it
                d.api.call("DELETE", "/v1/jobs/%s" % jid, timeout=10)
            except (OSError, urllib.error.URLError):
                pass
            raise JobError("job %s not finished in %d s (cancel requested)" % (jid, timeout))
        try:
            code, j = d.api.call("GET", "/v1/jobs/%s?wait=%d" % (jid, max(1, min(30, int(left)))), timeout=90)
        except (OSError, urllib.error.URLError) as e:
            if d.dead():
                raise JobError("waiting for %s: %s" % (jid, d.why_dead()))
            log("#   GET job %s: %s (retrying)" % (jid, e))
            time.sleep(1)
            continue
        if code != 200:
            if d.dead():
                raise JobError("waiting for %s: %s" % (jid, d.why_dead()))
            if code == 503:
                time.sleep(1)
                continue
            raise JobError("GET job %s: %d %s" % (jid, code, json.dumps(j)[:300]))
        if j["status"] == "done":
            return j
        if j["status"] in ("failed", "cancelled"):
            raise JobError("job %s (%s) %s: %s" % (jid, j.get("kind"), j["status"], json.dumps(j.get("error"))))


# ------------------------------------------------------------------ for the other daemon benchmarks

def daemon_args(ap, port):
    """The arguments of the benchmarks that drive a daemon through this file (bench_turns.py,
    bench_trees.py): GRPOD OUTDIR, the checkpoint's dims and cache, the daemon's flags, timeouts."""
    ap.add_argument("grpod")
    ap.add_argument("outdir")
    ap.add_argument("--dims", default="1.7b", choices=sorted(DIMS))
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu", "auto"])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--port", type=int, default=port)
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK", help=LORA_HELP)
    ap.add_argument("--model-cache")
    ap.add_argument("--ready-timeout", type=int, default=300)
    ap.add_argument("--job-timeout", type=int, default=300)


def start_daemon(a, prefix):
    """The checkpoint made (or reused) and grpod serve started on a fresh data dir, ready: (the
    daemon, its data dir, its vocabulary size). Raises with the reason."""
    a.grpod = os.path.abspath(a.grpod)
    os.makedirs(a.outdir, exist_ok=True)
    a.model_dir = os.path.abspath(a.model_cache or "/tmp/grpod-bench-%s" % a.dims)
    ensure_model(a.dims, a.model_dir, a.seed)
    data = tempfile.mkdtemp(prefix=prefix)
    d = Daemon(a, data, "serve")
    log("# ready in %.2f s" % d.wait_ready(a.ready_timeout))
    _, model = d.api.call("GET", "/v1/model")
    vocab = (model or {}).get("vocab") or DIMS[a.dims]["vocab_size"]
    if isinstance(vocab, dict):
        vocab = vocab.get("size") or DIMS[a.dims]["vocab_size"]
    return d, data, vocab


# ------------------------------------------------------------------ the loop

def rollout_body(a, idx, vocab):
    rnd = random.Random(a.seed * 1000003 + idx)
    hi = min(vocab, 151643)                      # ordinary tokens: below Qwen's special ids
    groups = [{"prompt_ids": [rnd.randrange(hi) for _ in range(a.prompt)], "n": a.n} for _ in range(a.groups)]
    return {"groups": groups, "sampling": {"temperature": 1.0, "max_tokens": a.max_tokens, "ignore_eos": True,
                                           "seed": a.seed * 7919 + idx}}


def update_body(a, idx, rollout_result):
    rnd = random.Random(a.seed * 31337 + idx)
    groups = []
    for g in rollout_result["groups"]:
        rs = []
        for r in g["responses"]:
            x = {"token_ids": r["token_ids"], "reward": round(rnd.random(), 4), "finish_reason": r["finish_reason"]}
            if a.old_logprobs == "rollout":
                x["logprobs"] = r["logprobs"]
            rs.append(x)
        groups.append({"prompt_ids": g["prompt_ids"], "responses": rs})
    body = {"groups": groups, "algorithm": {"old_logprobs": a.old_logprobs}}
    if a.micro_batch:
        body["max_tokens_per_micro_batch"] = a.micro_batch
    if a.lr is not None:
        body["optimizer"] = {"lr": a.lr}
    return body


def token_counts(res):
    pnr = nppr = 0
    for g in res["groups"]:
        P = len(g["prompt_ids"])
        pnr += P
        for r in g["responses"]:
            R = len(r["token_ids"])
            pnr += R
            nppr += P + R
    return pnr, nppr


class Run:
    def __init__(self, a):
        self.a = a
        self.steps = []          # dicts per completed step
        self.rollouts = {}       # index -> {"id", "t_post", "job", "t_done"}
        self.replay = None
        self.restart_before = set()   # step indices right after a restart
        self.checkpoint = None   # --checkpoint-at: {"id", "after_step", ...figures}
        self.daemon = None

    def post_rollout(self, d, idx, vocab):
        body = rollout_body(self.a, idx, vocab)
        self.rollouts[idx] = {"id": submit(d, "/v1/rollouts", body), "t_post": time.time()}

    def finish_rollout(self, d, idx):
        ro = self.rollouts[idx]
        if "job" not in ro:
            ro["job"] = wait_job(d, ro["id"], self.a.job_timeout)
            ro["t_done"] = time.time()
        return ro


def fmt_ms(tm, k):
    v = (tm or {}).get(k)
    return "%.2f" % (v / 1e3) if isinstance(v, (int, float)) else "-"


def run_loop(a, state, d, vocab, gpus):
    """The steps; returns the daemon in use (a new one after --kill-replay)."""
    t_prev = time.time()
    if a.interleave:
        state.post_rollout(d, 0, vocab)
        if a.steps > 1:
            state.post_rollout(d, 1, vocab)
    for i in range(a.steps):
        t_step0 = time.time() if not a.interleave else t_prev
        if not a.interleave:
            state.post_rollout(d, i, vocab)
        ro = state.finish_rollout(d, i)
        rj = ro["job"]
        res = rj["result"]
        pnr, nppr = token_counts(res)
        body = update_body(a, i, res)
        blen = len(json.dumps(body, separators=(",", ":")))
        t_u0 = time.time()
        uid = submit(d, "/v1/updates", body)
        if a.interleave and i + 2 < a.steps:
            state.post_rollout(d, i + 2, vocab)
        uj = wait_job(d, uid, a.job_timeout)
        t_u1 = time.time()
        ur = uj["result"]
        step_s = t_u1 - t_step0
        t_prev = t_u1
        srv_roll = (rj.get("finished_at") or 0) - (rj.get("started_at") or 0)
        s = {"step": i + 1, "rollout_job": ro["id"], "update_job": uid,
             "rollout_s": (ro["t_done"] - ro["t_post"]) if not a.interleave else srv_roll,
             "rollout_wall_s": ro["t_done"] - ro["t_post"], "rollout_server_s": srv_roll,
             "rollout_timings_ms": res.get("timings_ms"), "rollout_policy_version": res.get("policy_version"),
             "update_s": t_u1 - t_u0, "update_server_s": (uj.get("finished_at") or 0) - (uj.get("started_at") or 0),
             "update_timings_ms": ur.get("timings_ms"), "update_metrics": ur.get("metrics"),
             "update_tokens": ur.get("tokens"), "update_body_bytes": blen,
             "policy_version_after": ur.get("policy_version_after"), "step_s": step_s,
             "tokens_p_nr": pnr, "tokens_n_p_r": nppr,
             "tok_s_gpu_p_nr": pnr / step_s / gpus, "tok_s_gpu_n_p_r": nppr / step_s / gpus,
             "completion_tokens": (res.get("usage") or {}).get("completion_tokens"),
             "after_restart": i in state.restart_before}
        state.steps.append(s)
        tm = s["update_timings_ms"] or {}
        log("step %d: rollout %.2f s (daemon %.2f s, %s completion tokens, v%s) | update %.2f s (old %s ref %s "
            "policy %s optimizer %s s; loss %.4g grad_norm %.3g; body %.1f MB) | step %.2f s | tok/s/GPU P+NR %.0f, "
            "N(P+R) %.0f%s" % (
                i + 1, s["rollout_s"], srv_roll, s["completion_tokens"], s["rollout_policy_version"], s["update_s"],
                fmt_ms(tm, "old"), fmt_ms(tm, "ref"), fmt_ms(tm, "policy"), fmt_ms(tm, "optimizer"),
                (ur.get("metrics") or {}).get("loss", float("nan")),
                (ur.get("metrics") or {}).get("grad_norm", float("nan")), blen / 1e6, step_s,
                s["tok_s_gpu_p_nr"], s["tok_s_gpu_n_p_r"], " (after the restart)" if s["after_restart"] else ""))
        if a.checkpoint_at and i + 1 == a.checkpoint_at:
            # a checkpoint job between two steps, not waited for: its state is captured before the
            # next rollout runs, its files written beside it (the engine's stall is the capture)
            state.checkpoint = {"id": submit(d, "/v1/checkpoints", {}), "after_step": i + 1}
        if a.kill_replay and state.replay is None and i + 1 == a.kill_after:
            d = kill_and_replay(a, state, d, i + 1)
            state.restart_before.add(i + 1)
            t_prev = time.time()
    return d


def checkpoint_report(a, state, d):
    """The mid-run checkpoint's figures: the job's time, the capture (the engine's stall) and the
    write from the daemon's log, its size on disk, and the step that ran beside the write."""
    ck = state.checkpoint
    j = wait_job(d, ck["id"], a.job_timeout * 4)
    path = (j.get("result") or {}).get("path")
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(path) for f in fs) if path and os.path.isdir(path) else 0
    ev = {}
    for line in open(d.logname, errors="replace"):
        if '"checkpoint_' in line and line.startswith("{"):
            e = json.loads(line)
            if e.get("id") == (j.get("result") or {}).get("id"):
                ev[e["event"]] = e
    after = [s for s in state.steps if s["step"] == ck["after_step"] + 1]
    ck.update(status=j["status"], job_s=(j.get("finished_at") or 0) - (j.get("started_at") or 0), bytes=size,
              capture_ms=(ev.get("checkpoint_captured") or {}).get("ms"), saved_ms=(ev.get("checkpoint_saved") or {}).get("ms"),
              step_beside_s=after[0]["step_s"] if after else None)
    log("checkpoint after step %d: %s, %.2f GB, job %.1f s, capture (engine stall) %s ms, written and indexed after %s ms; "
        "step %d beside it %s s" % (ck["after_step"], ck["status"], size / 1e9, ck["job_s"], ck["capture_ms"], ck["saved_ms"],
                                    ck["after_step"] + 1, ck["step_beside_s"]))
    row("daemon_checkpoint", "%s mid-run checkpoint %.1f GB, capture %s ms" % (a.dims, size / 1e9, ck["capture_ms"]),
        1 if ck["status"] == "done" else 0, 1, ck["status"] == "done")


def kill_and_replay(a, state, d, done):
    log("# --kill-replay: SIGKILL after %d updates, restart on %s" % (done, d.data))
    d.kill9()
    nd = Daemon(a, d.data, "restart")
    state.daemon = nd
    rep = {"after_updates": done}
    state.replay = rep
    rep["ready_s"] = nd.wait_ready(a.ready_timeout)
    code, m = nd.api.call("GET", "/v1/model")
    rep["policy_version"] = m.get("policy_version") if code == 200 and isinstance(m, dict) else None
    rep["ok"] = rep["policy_version"] == done
    log("# restart + replay: ready in %.2f s, policy_version %s (expected %d)" %
        (rep["ready_s"], rep["policy_version"], done))
    return nd


def summarize(a, state, startup_s, gpus):
    st = state.steps
    out = {"completed_steps": len(st), "startup_s": startup_s, "gpus": gpus}
    if not st:
        return out
    steady = [s for s in st[1:] if not s["after_restart"]]
    med = lambda k: statistics.median([s[k] for s in steady]) if steady else float("nan")
    out.update({"first_step_s": st[0]["step_s"], "steady_step_s": med("step_s"),
                "steady_rollout_s": med("rollout_s"), "steady_update_s": med("update_s"),
                "steady_tok_s_gpu_p_nr": med("tok_s_gpu_p_nr"), "steady_tok_s_gpu_n_p_r": med("tok_s_gpu_n_p_r"),
                "steady_steps": [s["step"] for s in steady]})
    out["first_vs_steady"] = out["first_step_s"] / out["steady_step_s"] if steady else float("nan")
    return out


def table(a, state, summ, stop):
    hdr = "%4s %9s %9s %7s %7s %8s %8s %8s %12s %12s %4s" % (
        "step", "rollout_s", "update_s", "old_s", "ref_s", "policy_s", "optim_s", "step_s", "tok/s/GPU", "tok/s/GPU", "v")
    log("")
    log("bench_daemon %s%s: %d groups x n=%d, P=%d, max_tokens=%d, old_logprobs=%s, backend %s, %s GPU(s)" % (
        a.dims, " --interleave" if a.interleave else "", a.groups, a.n, a.prompt, a.max_tokens, a.old_logprobs,
        a.backend, summ.get("gpus", "?")))
    log(hdr)
    log("%4s %9s %9s %7s %7s %8s %8s %8s %12s %12s %4s" % ("", "", "", "", "", "", "", "", "P+NR", "N(P+R)", ""))
    for s in state.steps:
        tm = s["update_timings_ms"] or {}
        log("%4d %9.2f %9.2f %7s %7s %8s %8s %8.2f %12.0f %12.0f %4s%s" % (
            s["step"], s["rollout_s"], s["update_s"], fmt_ms(tm, "old"), fmt_ms(tm, "ref"), fmt_ms(tm, "policy"),
            fmt_ms(tm, "optimizer"), s["step_s"], s["tok_s_gpu_p_nr"], s["tok_s_gpu_n_p_r"],
            s["policy_version_after"], " *" if s["after_restart"] else ""))
    if any(s["after_restart"] for s in state.steps):
        log("(* the step after the --kill-replay restart: not in the steady state)")
    log("start-up (process start to /readyz 200): %s s" % ("%.2f" % summ["startup_s"] if summ.get("startup_s") else "-"))
    if state.steps:
        log("first step %.2f s, steady state (median of steps %s) %.2f s: rollout %.2f s, update %.2f s; ratio %.2f" % (
            summ["first_step_s"], ",".join(map(str, summ["steady_steps"])) or "-", summ["steady_step_s"],
            summ["steady_rollout_s"], summ["steady_update_s"], summ["first_vs_steady"]))
        log("steady tokens/s/GPU: P+NR %.0f, N(P+R) %.0f" % (summ["steady_tok_s_gpu_p_nr"],
                                                           summ["steady_tok_s_gpu_n_p_r"]))
    if state.replay:
        r = state.replay
        log("kill -9 after %d updates: restart + replay to /readyz 200 in %s s, policy_version %s" % (
            r["after_updates"], "%.2f" % r["ready_s"] if "ready_s" in r else "-", r.get("policy_version")))
    if stop:
        log("stop (%s): exit %s in %.2f s" % (stop[2], stop[0], stop[1]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("grpod", nargs="?")
    ap.add_argument("outdir", nargs="?")
    ap.add_argument("--dims", default="1.7b", choices=sorted(DIMS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--interleave", action="store_true", help="two rollouts queued before each update")
    ap.add_argument("--port", type=int, default=18800)
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu", "auto"])
    ap.add_argument("--groups", type=int, help="groups per rollout (8; tiny 4)")
    ap.add_argument("--n", type=int, help="responses per group (16; tiny 8)")
    ap.add_argument("--prompt", type=int, help="prompt tokens (1024; tiny 64)")
    ap.add_argument("--max-tokens", type=int, help="response tokens (512; tiny 32)")
    ap.add_argument("--old-logprobs", default="rollout", choices=["rollout", "recompute"])
    ap.add_argument("--lr", type=float, help="optimizer lr (default: the daemon's)")
    ap.add_argument("--micro-batch", type=int, help="the update's max_tokens_per_micro_batch (default: the daemon's plan)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                    help="extra grpod serve argument (repeat; write --serve-arg=--flag=value)")
    ap.add_argument("--lora", type=int, default=0, metavar="RANK", help=LORA_HELP)
    ap.add_argument("--model-cache", help="checkpoint directory (default /tmp/grpod-bench-DIMS)")
    ap.add_argument("--ready-timeout", type=int, default=300)
    ap.add_argument("--job-timeout", type=int, default=300)
    ap.add_argument("--stop-timeout", type=int, default=300)
    ap.add_argument("--kill-replay", action="store_true", help="SIGKILL after --kill-after updates, restart, replay")
    ap.add_argument("--kill-after", type=int, default=3)
    ap.add_argument("--checkpoint-at", type=int, default=0, metavar="K",
                    help="submit a checkpoint job after step K's update without waiting; report its capture/write")
    ap.add_argument("--keep-data", action="store_true", help="keep the daemon's data dir")
    ap.add_argument("--make-model", metavar="DIR", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.make_model:
        make_model(a.dims, a.make_model, a.seed)
        return 0
    if not a.grpod or not a.outdir:
        ap.error("GRPOD and OUTDIR are required")
    small = a.dims.startswith("tiny")
    for k, big, tiny in (("groups", 8, 4), ("n", 16, 8), ("prompt", 1024, 64), ("max_tokens", 512, 32)):
        if getattr(a, k) is None:
            setattr(a, k, tiny if small else big)
    a.grpod = os.path.abspath(a.grpod)
    os.makedirs(a.outdir, exist_ok=True)
    tag = a.dims + ("_lora%d" % a.lora if a.lora else "") + ("_interleave" if a.interleave else "")
    jpath = os.path.join(a.outdir, "bench_daemon_%s.json" % tag)
    shape = "%s G%dxN%d P%d R%d%s steps" % (a.dims, a.groups, a.n, a.prompt, a.max_tokens,
                                            " interleave" if a.interleave else "")
    if a.kill_replay and not 1 <= a.kill_after <= a.steps:
        ap.error("--kill-after must be in 1..--steps")
    if not os.access(a.grpod, os.X_OK):
        log("bench_daemon: %s is not an executable" % a.grpod)
        row("daemon_loop", shape, 0, a.steps, False)
        return 1

    # run.sh's timeout sends SIGTERM: unwind through the finally below (the daemon stopped, rows printed)
    def on_term(sig, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)   # timeout(1) signals the child, then its group
        raise KeyboardInterrupt("signal %d" % sig)
    signal.signal(signal.SIGTERM, on_term)
    state = Run(a)
    summ, stop, err, model, d, data = {}, None, None, None, None, None
    interrupted = False
    startup_s = make_s = None
    try:
        a.model_dir = os.path.abspath(a.model_cache or "/tmp/grpod-bench-%s" % a.dims)
        make_s = ensure_model(a.dims, a.model_dir, a.seed)
        data = tempfile.mkdtemp(prefix="grpod-bench-data-")
        open(os.path.join(a.outdir, "daemon_%s.log" % a.dims), "w").close()
        d = Daemon(a, data, "serve")
        state.daemon = d
        startup_s = d.wait_ready(a.ready_timeout)
        log("# ready in %.2f s (process start to /readyz 200)" % startup_s)
        code, model = d.api.call("GET", "/v1/model")
        if code != 200:
            raise RuntimeError("GET /v1/model: %d %s" % (code, model))
        log("# GET /v1/model: %s" % json.dumps({k: v for k, v in model.items() if "plan" not in k},
                                                separators=(",", ":")))
        for k in [k for k in model if "plan" in k] + [k for k in model if k == "memory"]:
            log("# memory plan (%s): %s" % (k, json.dumps(model[k], separators=(",", ":"))))
        gpus = max(1, len(model.get("ranks") or [])) if a.backend != "cpu" else 1
        vocab = model.get("vocab") or DIMS[a.dims]["vocab_size"]
        if isinstance(vocab, dict):
            vocab = vocab.get("size") or DIMS[a.dims]["vocab_size"]
        try:
            d = run_loop(a, state, d, vocab, gpus)
            if state.checkpoint:
                checkpoint_report(a, state, d)
        except Exception as e:       # a failed step ends the loop: the rows say how far it got
            err = "step %d failed: %s" % (len(state.steps) + 1, e)
            log("# " + err)
        d = state.daemon
        summ = summarize(a, state, startup_s, gpus)
    except (Exception, KeyboardInterrupt) as e:
        interrupted = isinstance(e, KeyboardInterrupt)
        err = err or ("interrupted (%s)" % e if interrupted else str(e))
        log("# bench_daemon: %s" % err)
        if state.daemon is not None:
            d = state.daemon
    finally:
        if d is not None:
            if d.dead():
                stop = (d.p.returncode, 0.0, "exited on its own")
                log("# the daemon had exited: %s" % d.why_dead())
            else:
                if interrupted:      # the rollouts in flight cancelled, so that the stop is quick
                    for ro in state.rollouts.values():
                        if "job" not in ro:
                            try:
                                d.api.call("DELETE", "/v1/jobs/%s" % ro["id"], timeout=5)
                            except (OSError, urllib.error.URLError):
                                pass
                stop = d.stop(10 if interrupted else a.stop_timeout) + ("SIGTERM",)
        if data and not a.keep_data:
            shutil.rmtree(data, ignore_errors=True)
    if not summ:
        summ = summarize(a, state, startup_s, 1)
    table(a, state, summ, stop)
    out = {"args": {k: v for k, v in vars(a).items() if k != "make_model"}, "model": model,
           "make_model_s": make_s, "summary": summ, "steps": state.steps, "kill_replay": state.replay, "checkpoint": state.checkpoint,
           "stop": {"exit": stop[0], "seconds": stop[1], "how": stop[2]} if stop else None, "error": err,
           "device": device_name()}
    with open(jpath, "w") as f:
        json.dump(out, f, indent=1)
    log("# summary: %s" % jpath)
    if err:
        log("# FAILED: %s" % err)
    n = len(state.steps)
    row("daemon_loop", shape, n, a.steps, n == a.steps)
    ratio = summ.get("first_vs_steady", float("nan"))
    row("daemon_first_vs_steady", "%s first %.2f s steady %.2f s" % (a.dims, summ.get("first_step_s", float("nan")),
                                                                    summ.get("steady_step_s", float("nan"))),
        ratio, 1.5, ratio == ratio and ratio <= 1.5, fmt="%.3f")
    ok = n == a.steps
    if a.kill_replay:
        r = state.replay or {}
        rok = bool(r.get("ok"))
        row("daemon_kill_replay", "%s kill -9 after %d updates, ready in %s s" % (
            a.dims, a.kill_after, "%.1f" % r["ready_s"] if "ready_s" in r else "-"),
            r.get("policy_version") if r.get("policy_version") is not None else -1, a.kill_after, rok)
        ok = ok and rok
    if stop:
        ok_stop = stop[0] == 0 and stop[2] == "SIGTERM"
        row("daemon_sigterm", "%s exit status, %s in %.1f s" % (
            a.dims, "stopped" if stop[2] == "SIGTERM" else stop[2], stop[1]), stop[0], 0, ok_stop)
        ok = ok and ok_stop
    return 0 if ok else 1


def device_name():
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        return r.stdout.strip().splitlines()[0] if r.returncode == 0 and r.stdout.strip() else "cpu"
    except Exception:
        return "cpu"


if __name__ == "__main__":
    sys.exit(main())
