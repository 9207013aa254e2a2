#!/usr/bin/env python3
"""Logits parity between Hugging Face transformers' DeepseekV3ForCausalLM and Locus.

On a machine with torch + transformers (5.x), this builds a small random DeepSeek-V3 model, saves it
with save_pretrained (BF16 safetensors, HF layout), runs fixed prompts (token ids, no tokenizer)
through HF and through `locus logits` with locality domains off and on (emulated domains), and prints
one table row per prompt x backend x LD setting with the relative error
||locus - hf|| / ||hf|| over the logits of every prompt position. Exit status: 0 when every row is
below the tolerance (2e-2 by default, DESIGN.md section 7), 1 when one is not, 2 on a setup error.

  python3 tools/parity/hf_parity.py --locus build/locus [--backends cpu,cuda] [--domains 2]
                                    [--widths tiny|deepseek-v3 --layers L --experts E]

`--self-test` skips HF (no torch needed): it writes the tiny model with `locus make-tiny-model`
and checks that the Locus side runs, that its dump parses and that LD off and on agree.
"""
import argparse
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

LOGITS_MAGIC = b"LOCUSLGT"


def read_logits_file(path):
    """Reads the file `locus logits --out` writes: magic, u32 version (1), u32 record count, then per
    record i64 rows, i64 cols and rows*cols little-endian float32. Returns a list of (rows, cols, flat list)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 16 or data[:8] != LOGITS_MAGIC:
        raise ValueError(f"{path}: not a Locus logits file (bad magic)")
    version, count = struct.unpack_from("<II", data, 8)
    if version != 1:
        raise ValueError(f"{path}: unsupported logits file version {version}")
    off, records = 16, []
    for r in range(count):
        if off + 16 > len(data):
            raise ValueError(f"{path}: truncated at record {r}")
        rows, cols = struct.unpack_from("<qq", data, off)
        off += 16
        n = rows * cols
        if rows < 0 or cols < 0 or off + 4 * n > len(data):
            raise ValueError(f"{path}: record {r} claims [{rows}, {cols}] beyond the file end")
        vals = struct.unpack_from(f"<{n}f", data, off)
        off += 4 * n
        records.append((rows, cols, vals))
    if off != len(data):
        raise ValueError(f"{path}: {len(data) - off} trailing bytes")
    return records


def rel_error(out, ref):
    num = den = 0.0
    for o, r in zip(out, ref):
        if not math.isfinite(o):
            return math.inf
        num += (o - r) * (o - r)
        den += r * r
    if len(out) != len(ref):
        return math.inf
    return math.sqrt(num / den) if den > 0 else math.sqrt(num)


def argmax_rows(vals, rows, cols):
    out = []
    for t in range(rows):
        row = vals[t * cols:(t + 1) * cols]
        out.append(max(range(cols), key=lambda i: (row[i], -i)))
    return out


def run_locus(args, model_dir, prompts, backend, ld, out_path):
    cmd = [args.locus, "logits", "--model", model_dir, "--out", out_path, "--backend", backend]
    for p in prompts:
        cmd += ["--ids", ",".join(str(i) for i in p)]
    env = dict(os.environ)
    env.pop("LOCUS_FAKE_LOCALITY_DOMAINS", None)
    if ld:
        cmd += ["--enable-locality-domains"]
        env["LOCUS_FAKE_LOCALITY_DOMAINS"] = str(args.domains)
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    if res.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed with exit status {res.returncode}:\n{res.stderr.strip()}")
    recs = read_logits_file(out_path)
    if len(recs) != len(prompts):
        raise RuntimeError(f"locus wrote {len(recs)} records for {len(prompts)} prompts")
    for (rows, _, _), p in zip(recs, prompts):
        if rows != len(p):
            raise RuntimeError(f"locus wrote {rows} logit rows for a prompt of {len(p)} tokens")
    return recs


def built_backends(locus):
    res = subprocess.run([locus, "version"], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"`{locus} version` failed: {res.stderr.strip()}")
    return ["cpu", "cuda"] if "cuda" in res.stdout else ["cpu"]


def make_prompts(vocab, seed):
    rng = random.Random(seed)
    lengths = [1, 5, 17, 48]
    return [[rng.randrange(vocab) for _ in range(n)] for n in lengths]


# The widths of the model HF builds: "tiny" is shaped like `locus make-tiny-model`
# (models/tiny_model.h); "deepseek-v3" has DeepSeek-V3's own (7168 hidden, 128 heads, LoRA ranks
# 1536 / 512, head dims 128 + 64 and 128, MLP 18432, experts 2048 wide, 8 per token from 4 of 8
# groups), where --layers and --experts keep it small enough to build and run.
WIDTHS = {
    "tiny": dict(hidden_size=256, intermediate_size=512, moe_intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=4, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                 q_lora_rank=128, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32),
    "deepseek-v3": dict(hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
                        num_attention_heads=128, num_key_value_heads=128, n_routed_experts=256,
                        num_experts_per_tok=8, n_group=8, topk_group=4, q_lora_rank=1536, kv_lora_rank=512,
                        qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128),
}


def build_hf_model(model_dir, seed, device, widths="tiny", layers=3, experts=0):
    import torch
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(seed)
    # `layers` layers (1 dense + the rest MoE), grouped routing, q_lora and YaRN as in DeepSeek-V3.
    w = dict(WIDTHS[widths])
    if experts:
        w["n_routed_experts"] = experts
    cfg = DeepseekV3Config(
        vocab_size=512, num_hidden_layers=layers, n_shared_experts=1, first_k_dense_replace=1,
        routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=163840,
        rope_interleave=True, tie_word_embeddings=False, initializer_range=0.02,
        rope_scaling={"type": "yarn", "factor": 40.0, "original_max_position_embeddings": 4096,
                      "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
        bos_token_id=0, eos_token_id=1, **w)
    model = DeepseekV3ForCausalLM(cfg)
    try:  # eager attention: the plain softmax(QK^T)V of the model file
        model.set_attn_implementation("eager")
    except Exception:  # noqa: BLE001 - older/newer API: keep the default (sdpa), numerically equivalent
        pass
    with torch.no_grad():
        # HF initializes norms to 1 and the correction bias to 0; make both matter.
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
        for layer in model.model.layers:
            gate = getattr(layer.mlp, "gate", None)
            if gate is not None and hasattr(gate, "e_score_correction_bias"):
                gate.e_score_correction_bias.copy_(0.05 * torch.randn_like(gate.e_score_correction_bias))
    model = model.to(torch.bfloat16)
    for layer in model.model.layers:  # HF keeps the bias in fp32 (_keep_in_fp32_modules_strict)
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and hasattr(gate, "e_score_correction_bias"):
            gate.e_score_correction_bias.data = gate.e_score_correction_bias.data.float()
    model.eval()
    model.save_pretrained(model_dir)
    return model.to(device), cfg


def hf_logits(model, prompts, device):
    import torch
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = torch.tensor([p], dtype=torch.long, device=device)
            logits = model(input_ids=ids).logits[0].float().cpu()
            out.append((logits.shape[0], logits.shape[1], logits.flatten().tolist()))
    return out


def saved_tensor_names(model_dir):
    names = []
    index = os.path.join(model_dir, "model.safetensors.index.json")
    files = [f for f in os.listdir(model_dir) if f.endswith(".safetensors")]
    if os.path.exists(index):
        with open(index) as f:
            return sorted(json.load(f)["weight_map"].keys())
    for fn in files:
        with open(os.path.join(model_dir, fn), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            names += [k for k in json.loads(f.read(n)) if k != "__metadata__"]
    return sorted(names)


def print_table(rows):
    header = ["prompt", "tokens", "backend", "LD", "rel_err(all)", "rel_err(last)", "argmax match", "status"]
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = "  ".join(h.ljust(w) for h, w in zip(header, widths))
    print(line)
    print("-" * len(line))
    for r in rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))


def compare(ref_recs, recs, prompt_idx, prompts, backend, ld, tol):
    rows_, cols, ref = ref_recs[prompt_idx]
    r2, c2, out = recs[prompt_idx]
    if (rows_, cols) != (r2, c2):
        return [prompt_idx, len(prompts[prompt_idx]), backend, ld, "shape", f"[{r2},{c2}] vs [{rows_},{cols}]", "-", "FAIL"], False
    err_all = rel_error(out, ref)
    err_last = rel_error(out[(rows_ - 1) * cols:], ref[(rows_ - 1) * cols:])
    a, b = argmax_rows(out, rows_, cols), argmax_rows(ref, rows_, cols)
    match = sum(1 for x, y in zip(a, b) if x == y)
    ok = err_all < tol and err_last < tol
    return [prompt_idx, rows_, backend, ld, f"{err_all:.3e}", f"{err_last:.3e}", f"{match}/{rows_}",
            "ok" if ok else "FAIL"], ok


def self_test(args):
    """The Locus half alone: tiny model, LD off vs on, dump parsed and compared."""
    work = tempfile.mkdtemp(prefix="locus_parity_self_")
    try:
        model_dir = os.path.join(work, "tiny")
        make = [args.locus, "make-tiny-model", model_dir]
        if args.widths == "deepseek-v3":  # as the HF side would build it: --layers, --experts
            make += ["--shape", "deepseek-v3", "--layers", str(args.layers)]
            make += ["--experts", str(args.experts)] if args.experts else []
        res = subprocess.run(make, capture_output=True, text=True)
        if res.returncode != 0:
            print(f"error: make-tiny-model failed: {res.stderr.strip()}", file=sys.stderr)
            return 2
        with open(os.path.join(model_dir, "config.json")) as f:
            vocab = json.load(f)["vocab_size"]
        prompts = make_prompts(vocab, args.seed)
        off = run_locus(args, model_dir, prompts, "cpu", False, os.path.join(work, "off.bin"))
        on = run_locus(args, model_dir, prompts, "cpu", True, os.path.join(work, "on.bin"))
        rows, ok_all = [], True
        for i in range(len(prompts)):
            row, ok = compare(off, on, i, prompts, "cpu", f"on({args.domains}) vs off", args.tolerance)
            finite = all(math.isfinite(v) for v in off[i][2])
            ok = ok and finite
            row[-1] = "ok" if ok else "FAIL"
            rows.append(row)
            ok_all = ok_all and ok
        print_table(rows)
        print("self-test: " + ("PASS" if ok_all else "FAIL"))
        return 0 if ok_all else 1
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--locus", required=True, help="path to the locus executable")
    ap.add_argument("--backends", default="", help="comma separated (default: every backend the binary has)")
    ap.add_argument("--domains", type=int, default=2, help="emulated locality domains for the LD-on runs")
    ap.add_argument("--tolerance", type=float, default=2e-2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="", help="torch device for HF (default: cuda when available)")
    ap.add_argument("--workdir", default="", help="where the checkpoint goes (default: a temp dir)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per locus run")
    ap.add_argument("--self-test", action="store_true", help="check the Locus side only (no torch)")
    ap.add_argument("--widths", choices=sorted(WIDTHS), default="tiny", help="the HF model's widths")
    ap.add_argument("--layers", type=int, default=3, help="decoder layers (the first dense)")
    ap.add_argument("--experts", type=int, default=0, help="routed experts (0: the widths' own count)")
    args = ap.parse_args()

    if not os.access(args.locus, os.X_OK):
        print(f"error: --locus {args.locus} is not an executable", file=sys.stderr)
        return 2
    if args.self_test:
        return self_test(args)
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError as e:
        print(f"error: this script needs torch and transformers ({e}); use --self-test without them", file=sys.stderr)
        return 2
    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    backends = [b for b in args.backends.split(",") if b] or built_backends(args.locus)
    work = args.workdir or tempfile.mkdtemp(prefix="locus_parity_")
    os.makedirs(work, exist_ok=True)
    model_dir = os.path.join(work, "hf_tiny_deepseek_v3")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, HF on {device}; "
          f"locus backends {backends}; LD on = {args.domains} emulated domains; checkpoint {model_dir}")
    try:
        model, cfg = build_hf_model(model_dir, args.seed, device, args.widths, args.layers, args.experts)
        names = saved_tensor_names(model_dir)
        fused = any(n.endswith("mlp.experts.gate_up_proj") for n in names)
        print(f"saved {len(names)} tensors; experts stored {'fused (mlp.experts.gate_up_proj)' if fused else 'per expert'}")
        prompts = make_prompts(cfg.vocab_size, args.seed)
        ref = hf_logits(model, prompts, device)
        rows, ok_all = [], True
        for backend in backends:
            results = {}
            for ld in (False, True):
                tag = f"on({args.domains})" if ld else "off"
                recs = run_locus(args, model_dir, prompts, backend, ld, os.path.join(work, f"{backend}_{tag}.bin"))
                results[ld] = recs
                for i in range(len(prompts)):
                    row, ok = compare(ref, recs, i, prompts, backend, tag, args.tolerance)
                    rows.append(row)
                    ok_all = ok_all and ok
            for i in range(len(prompts)):  # LD on vs off of the same backend (CPU: expected bitwise)
                row, ok = compare(results[False], results[True], i, prompts, backend, "on vs off", args.tolerance)
                rows.append(row)
                ok_all = ok_all and ok
    except Exception as e:  # noqa: BLE001 - report any failure as a setup error with its message
        print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    finally:
        if not args.keep and not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print_table(rows)
    print(f"parity (tolerance {args.tolerance:g}): " + ("PASS" if ok_all else "FAIL"))
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
