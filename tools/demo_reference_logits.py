"""Reference logits of the trained demo model (models/demo.gguf) from transformers' own Gemma 4 code.

SPEC §6's oracles are random-weight models, which amplify any rounding layer by layer (even
transformers' own bf16 misses the bf16 bound on them). This makes the same oracle for a trained
model: the demo's weights are read from the GGUF file g4 runs, loaded into Gemma4ForCausalLM with
the configuration tools/train_demo.py trained it with, rounded as make_fixtures.py rounds a bf16
fixture (weights and the RoPE buffers in bfloat16), and run in float64 over a fixed text longer
than two sliding windows. Runs where torch and transformers are installed (the GPU machine):

    python3 tools/demo_reference_logits.py models/demo.gguf OUT_DIR

OUT_DIR receives reference_logits.f32 (float32, row-major [position][vocab]) and reference.json
(token ids, greedy next tokens, how they were made).
"""
import json, os, struct, sys

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

TEXT = ("A fortune about computers: the program you wrote yesterday will do exactly what you told it, "
        "and nothing that you meant. Never trust a computer you cannot throw out of a window. "
        "To err is human, but to really foul things up you need a computer. "
        "A clean desk is a sign of a cluttered desk drawer. Today is the first day of the rest of your "
        "life, so back up your files before it ends. He who laughs last probably made a backup. "
        "The best way to predict the future is to implement it, then fix the bugs it brings. "
        "You will be surprised by a loud noise, and then by the silence of the machine room.")

# GGUF <-> Hugging Face names (src/model/gguf_model.cpp's table; HF adds the "model." prefix).
LAYER = {"attn_norm.weight": "input_layernorm.weight", "attn_q.weight": "self_attn.q_proj.weight",
         "attn_k.weight": "self_attn.k_proj.weight", "attn_v.weight": "self_attn.v_proj.weight",
         "attn_output.weight": "self_attn.o_proj.weight", "attn_q_norm.weight": "self_attn.q_norm.weight",
         "attn_k_norm.weight": "self_attn.k_norm.weight", "post_attention_norm.weight": "post_attention_layernorm.weight",
         "ffn_norm.weight": "pre_feedforward_layernorm.weight", "ffn_gate.weight": "mlp.gate_proj.weight",
         "ffn_up.weight": "mlp.up_proj.weight", "ffn_down.weight": "mlp.down_proj.weight",
         "post_ffw_norm.weight": "post_feedforward_layernorm.weight", "layer_output_scale.weight": "layer_scalar"}
GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
          "output.weight": "lm_head.weight"}


def read_gguf(path):
    """(metadata, {name: float32 numpy array in the file's row-major shape}) of a GGUF v3 file."""
    data = open(path, "rb").read()
    pos = 0

    def take(fmt):
        nonlocal pos
        v = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return v[0]

    def string():
        nonlocal pos
        n = take("Q")
        s = data[pos:pos + n].decode()
        pos += n
        return s

    scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

    def value(t):
        if t == 8:
            return string()
        if t == 9:
            et, n = take("I"), take("Q")
            return [value(et) for _ in range(n)]
        return take(scalar[t])

    assert data[:4] == b"GGUF", "not a GGUF file"
    pos = 4
    assert take("I") == 3, "GGUF version 3 expected"
    n_tensors, n_kv = take("Q"), take("Q")
    meta = {}
    for _ in range(n_kv):
        k = string()
        meta[k] = value(take("I"))
    infos = []
    for _ in range(n_tensors):
        name = string()
        dims = [take("Q") for _ in range(take("I"))]
        infos.append((name, dims, take("I"), take("Q")))
    align = meta.get("general.alignment", 32)
    base = (pos + align - 1) // align * align
    tensors = {}
    for name, dims, ggml_type, offset in infos:
        count = int(np.prod(dims))
        start = base + offset
        if ggml_type == 0:  # F32
            arr = np.frombuffer(data, np.float32, count, start)
        elif ggml_type == 30:  # BF16
            arr = (np.frombuffer(data, np.uint16, count, start).astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{name}: ggml type {ggml_type} not handled (the demo is BF16/F32)")
        tensors[name] = arr.reshape(list(reversed(dims))).copy()
    return meta, tensors


def hf_name(gguf_name):
    if gguf_name in GLOBAL:
        return GLOBAL[gguf_name]
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{LAYER[rest]}"


def main():
    gguf_path, out_dir = sys.argv[1], sys.argv[2]
    meta, tensors = read_gguf(gguf_path)
    # tools/train_demo.py's configuration, checked against the file's metadata.
    cfg = Gemma4TextConfig(
        vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, global_head_dim=128, num_global_key_value_heads=1, attention_k_eq_v=True,
        sliding_window=64, final_logit_softcapping=30.0, max_position_embeddings=1024, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=4096, tie_word_embeddings=True, rms_norm_eps=1e-6, bos_token_id=2,
        eos_token_id=[1, 106], pad_token_id=0)
    for key, want in [("gemma4.vocab_size", cfg.vocab_size), ("gemma4.embedding_length", cfg.hidden_size),
                      ("gemma4.block_count", cfg.num_hidden_layers), ("gemma4.feed_forward_length", cfg.intermediate_size),
                      ("gemma4.attention.sliding_window", cfg.sliding_window)]:
        assert meta[key] == want, f"{key}: file has {meta[key]}, the trained configuration {want}"
    state = {hf_name(n): torch.from_numpy(a) for n, a in tensors.items() if n != "rope_freqs.weight"}
    model = Gemma4ForCausalLM(cfg).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, f"tensors the model does not have: {unexpected}"
    assert all("inv_freq" in m or m == "lm_head.weight" for m in missing), f"weights missing: {missing}"
    # Round as make_fixtures.py does for a bf16 fixture: weights and buffers (the RoPE inverse
    # frequencies among them) in bfloat16, then compute in float64.
    model = model.to(torch.bfloat16).to(torch.float64)

    tok = Tokenizer.from_str(meta["tokenizer.huggingface.json"])
    ids = [cfg.bos_token_id] + tok.encode(TEXT, add_special_tokens=False).ids
    assert len(ids) > 2 * cfg.sliding_window, "the text must be longer than two sliding windows"
    x = torch.tensor([ids])
    with torch.no_grad():
        full = model(x, use_cache=False).logits[0]
        past, inc = None, []
        for t in range(len(ids)):  # HF's own cache, token by token: a cross-check of HF itself
            o = model(x[:, t:t + 1], past_key_values=past, use_cache=True)
            past = o.past_key_values
            inc.append(o.logits[0, -1])
        inc = torch.stack(inc)
    diff = (full - inc).abs().max().item()
    print(f"{len(ids)} tokens; full-vs-incremental max abs diff {diff:.3g}")
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "reference_logits.f32"), "wb") as f:
        f.write(full.to(torch.float32).numpy().tobytes())
    top2 = full.topk(2, dim=-1).values
    json.dump({"token_ids": ids, "logits_shape": list(full.shape),
               "logits_dtype": "float32 little-endian, row-major [position][vocab]",
               "computed_in": "float64 by transformers Gemma4ForCausalLM from models/demo.gguf's weights, weights and "
                              "buffers rounded to bfloat16 (tools/demo_reference_logits.py)",
               "full_vs_incremental_max_abs_diff": diff, "greedy_next": full.argmax(-1).tolist(),
               "min_top2_margin": (top2[:, 0] - top2[:, 1]).min().item()},
              open(os.path.join(out_dir, "reference.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
