"""Reference fixtures from Hugging Face transformers' own Gemma 4 code (docs/DESIGN.md, "Oracles").

Runs where torch and transformers are installed (the GPU machine). Two jobs:

    python3 tools/make_fixtures.py make OUT_DIR [NAME ...]   # new random-weight models + references
    python3 tools/make_fixtures.py reference FIXTURE_DIR ...  # recompute a saved fixture's references

`make` builds each named model (all of MODELS when none is named) with seeded random weights,
saves it with save_pretrained (the real Hugging Face layout), then computes the references from
the *saved files*, loaded the way a user loads them: `from_pretrained(dtype=float64)`, which keeps
the weights exactly as saved and the RoPE inverse frequencies in float32 (transformers computes
them in float32 for every load dtype; an explicit `model.to(bf16)` would round them too, an
artefact no runtime has). `reference` does the second half for a fixture that already exists,
reading its token ids from reference.json.

Each fixture directory gets reference_logits.f32 (float32, row-major [row][vocab]) and
reference.json: the token ids, `rows` (which positions the stored rows are: every position for
short fixtures, a subset for long ones), the greedy next token and the top-2 margin of every
position, and transformers' own error when it runs the fixture in bfloat16 and in float32 on the
GPU (relative L2 over the stored rows, greedy agreement over all positions and over the positions
whose top-2 margin exceeds 1 logit): the yardsticks of the bf16 and long-context tolerances.
"""
import json, os, sys

import numpy as np
import torch
import transformers
from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration, Gemma4TextConfig

CLEAR_MARGIN = 1.0  # logits: a position whose top-2 gap exceeds this has an unambiguous greedy token

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=160, num_hidden_layers=6,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
            sliding_window=8, final_logit_softcapping=30.0, max_position_embeddings=256,
            hidden_size_per_layer_input=0, vocab_size_per_layer_input=512, tie_word_embeddings=True,
            rms_norm_eps=1e-6)
# The 31B model's attention shapes (sliding: head_dim 256, full: 512 with K=V, GQA groups of 2 and
# 4), its RoPE (theta 1e4 sliding; 1e6 proportional with a quarter of the pairs rotating on full
# layers), shrunk everywhere else.
HEADS_31B = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                 layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
                 num_attention_heads=4, num_key_value_heads=2, head_dim=256, global_head_dim=512,
                 num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=512,
                 final_logit_softcapping=30.0, max_position_embeddings=8192, hidden_size_per_layer_input=0,
                 vocab_size_per_layer_input=512, tie_word_embeddings=True, rms_norm_eps=1e-6)
PUBLISHED_TEXT = dict(TINY, vocab_size=384, intermediate_size=96, sliding_window=64, max_position_embeddings=8192,
                      vocab_size_per_layer_input=384)
PUBLISHED_VISION = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=2, num_key_value_heads=2, head_dim=16, patch_size=16,
                        position_embedding_size=64)

# name: (seed, model kind, config, tokens, saved dtype, stored rows: "all" or a stride for long fixtures)
MODELS = {
    "tiny-31b-style": (1234, "text", TINY, 40, torch.float32, "all"),
    "tiny-31b-style-bf16": (99, "text", TINY, 40, torch.bfloat16, "all"),
    "long-31b-heads": (4001, "text", HEADS_31B, 4096, torch.bfloat16, 16),
    "long-published-layout": (4002, "published", PUBLISHED_TEXT, 4096, torch.bfloat16, 16),
}


def build(kind, cfg_kwargs):
    if kind == "text":
        return Gemma4ForCausalLM(Gemma4TextConfig(**cfg_kwargs))
    cfg = Gemma4Config(text_config=dict(cfg_kwargs, model_type="gemma4_text"), vision_config=PUBLISHED_VISION,
                       tie_word_embeddings=True)
    return Gemma4ForConditionalGeneration(cfg)


def perturb(model):
    """Random weights everywhere, so that no norm weight or layer scalar is a silent 1 or 0."""
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) * (1.0 / p.shape[-1] ** 0.5))
        for n, b in model.named_buffers():
            if "layer_scalar" in n:
                b.copy_(0.5 + torch.rand_like(b))


def model_class(d):
    return getattr(transformers, json.load(open(os.path.join(d, "config.json")))["architectures"][0])


def logits_of(d, ids, dtype, device):
    model = model_class(d).from_pretrained(d, dtype=dtype).to(device).eval()
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0]
    return out.double().cpu()


def stored_rows(positions, stride):
    """Every position, or every `stride`-th one plus the last 32 (where the caches are fullest)."""
    if stride == "all":
        return list(range(positions))
    return sorted(set(range(stride - 1, positions, stride)) | set(range(positions - 32, positions)))


def rel_l2(a, b):
    return float(torch.linalg.norm(a - b) / torch.linalg.norm(b))


def write_reference(d, ids, stride, extra, out=None):
    """Computes the float64 reference of the model saved in d, and transformers' own errors, into out (d)."""
    out = out or d
    device = "cuda" if torch.cuda.is_available() else "cpu"
    full = logits_of(d, ids, torch.float64, device)
    rows = stored_rows(len(ids), stride)
    top2 = full.topk(2, dim=-1).values
    margin = (top2[:, 0] - top2[:, 1])
    clear = margin > CLEAR_MARGIN
    greedy = full.argmax(-1)
    meta = dict(extra, token_ids=list(ids), rows=rows, logits_shape=[len(rows), full.shape[1]],
                logits_dtype="float32 little-endian, row-major [row][vocab]; row i is position rows[i]",
                computed_in="float64 by transformers " + model_class(d).__name__ +
                            ".from_pretrained(dtype=float64) of the saved files; RoPE inverse frequencies in float32 "
                            "(tools/make_fixtures.py, transformers " + transformers.__version__ + ", torch " +
                            torch.__version__ + ")",
                greedy_next=greedy.tolist(), top2_margin=[round(float(m), 4) for m in margin],
                clear_positions=int(clear.sum()))
    for dtype in (torch.bfloat16, torch.float32):
        got = logits_of(d, ids, dtype, device)
        name = str(dtype).replace("torch.", "")
        meta["transformers_" + name] = {
            "relative_l2": rel_l2(got[rows], full[rows]),
            "greedy_agreement": float((got.argmax(-1) == greedy).double().mean()),
            "clear_greedy_agreement": float((got.argmax(-1) == greedy)[clear].double().mean()) if clear.any() else 1.0,
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "reference_logits.f32"), "wb") as f:
        f.write(full[rows].to(torch.float32).numpy().tobytes())
    json.dump(meta, open(os.path.join(out, "reference.json"), "w"), indent=None, separators=(",", ":"))
    print(os.path.basename(out), len(ids), "tokens,", len(rows), "rows,", meta["clear_positions"], "clear;",
          "bf16", meta["transformers_bfloat16"], "f32", meta["transformers_float32"], flush=True)


def make(out, name):
    seed, kind, cfg_kwargs, tokens, save_dtype, stride = MODELS[name]
    torch.manual_seed(seed)
    model = build(kind, cfg_kwargs).to(torch.float64).eval()
    perturb(model)
    vocab = cfg_kwargs["vocab_size"]
    ids = torch.randint(0, vocab, (tokens,), generator=torch.Generator().manual_seed(seed + 1)).tolist()
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    model.to(save_dtype).save_pretrained(d, safe_serialization=True)
    write_reference(d, ids, stride, {"seed": seed, "saved_dtype": str(save_dtype).replace("torch.", "")})


def main():
    job, args = sys.argv[1], sys.argv[2:]
    if job == "make":
        for name in args[1:] or MODELS:
            make(args[0], name)
    elif job == "reference":
        for d in args:
            old = json.load(open(os.path.join(d, "reference.json")))
            positions = len(old["token_ids"])
            stride = "all" if "rows" not in old or len(old["rows"]) == positions else old["rows"][1] - old["rows"][0]
            keep = {k: old[k] for k in ("seed", "saved_dtype") if k in old}
            write_reference(d, old["token_ids"], stride, keep)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main()
