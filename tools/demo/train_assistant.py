"""Train the embedded demo model's MTP assistant (docs/DESIGN.md §7, "Demo assistant"): a two-layer
Gemma 4 drafter that reads the demo's last hidden state and its KV caches, as Gemma 4's assistants do.

Runs on the GPU machine (torch, transformers 5.17, tokenizers, numpy; llama.cpp's gguf-py on
PYTHONPATH) through tools/demo/gpu_train_assistant.sh, in about five minutes:

    python3 tools/demo/train_assistant.py TARGET_GGUF OUT_DIR

The target is TARGET_GGUF (models/demo.gguf) exactly as g4 runs it: its Q4_K and Q8_0 blocks are
dequantized by gguf-py into transformers' Gemma4ForCausalLM, in float32, and its tokenizer is rebuilt
from the file's pieces and merges. Both are checked first against tests/fixtures/demo-chat/golden.json
(the ids of its prompts and probes; the greedy continuations wherever the top-2 margin exceeds 1).

A draft step (model/assistant.h): for a pending token t at position P and the target's final-normed
hidden state h of position P - 1, x = pre_projection [embed_target(t) * sqrt(B) | h], then per layer
q_proj, q_norm, RoPE at P, attention over the target's keys below P (sliding: P - p < window) of its
last layer of the same kind, o_proj, the gated-GELU MLP, the Gemma 4 norms and layer scalar; logits =
embed_assistant . final_norm(x) without soft-cap, h_next = post_projection . final_norm(x). Later steps
take the previous step's h_next and token at the same P. Training runs every position of a batch at
once: step j at position p takes token ids[p + 1 + j] and learns the target's distribution of row
p + 1 + j (soft cross-entropy on the target's soft-capped logits: the distribution the verify judges
drafts by), for STEPS chained steps. Before training, the same attention code reproduces the target's
own attention outputs of its last two layers from their caches, so RoPE, masks and caches are the
ones the target uses.

Data: synthetic chats of tools/demo/demo_chat_corpus.py (a seed of their own, CHAT_SEED + 7), and the
target's own replies, sampled with its generation config, to fortune requests and chat prompts (the
corpus has no fortune the target would write: the demo's fortunes come from Debian's files, which this
run does not need). Validation, on the demo's held-out chats (CHAT_SEED + 1) and on held-out replies
of each kind, reports per-step top-1 agreement with the target and the mean tokens a round of DRAFTS
greedy drafts would keep if every step saw the right tokens (teacher forcing: the real rounds are
measured by g4); the state with the best mean over the three sets is kept.

OUT_DIR receives hf/ (config.json, generation_config.json, model.safetensors in float32) and
summary.json: the checks, the training figures and the validation agreement per step.
"""
import json, math, os, random, sys, time

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tools", "fixtures"))
import gguf  # noqa: E402  (llama.cpp's gguf-py, on PYTHONPATH)
from tokenizers import Tokenizer  # noqa: E402
from transformers import Gemma4ForCausalLM  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402

from demo_chat_corpus import CHAT_SEED, chat_examples, fortune_example, render  # noqa: E402
from gemma_style_tokenizer import tokenizer_spec  # noqa: E402
from make_assistant_fixture import assistant_config, write_safetensors  # noqa: E402
from train_demo import SEQ, demo_config, make_batches  # noqa: E402

SEED = 20261207
HIDDEN = 256
HEADS = 8
INTERMEDIATE = 1024
LAYER_TYPES = ["sliding_attention", "full_attention"]
DRAFTS = 4                 # num_assistant_tokens in generation_config.json: the drafts of a round
STEPS = 4                  # chained steps trained per position
TRAIN_CHATS = 40000
VAL_CHATS = 600
# The target's own replies (sampled with its generation config) to fortune requests and chat prompts:
# what it writes is what a round must guess, and the corpus holds no fortune the target would write.
GENERATED_FORTUNES = 3000
GENERATED_CHATS = 3000
GENERATED_REPEATS = 3      # each generated reply appears this often per pass beside the corpus
VAL_GENERATED = 300        # of each kind, held out
GEN_BATCH = 500
GEN_TOKENS = 96
STOP_IDS = (1, 106, 50)    # <eos>, <turn|>, <|tool_response>
# Debian's `fortunes` files, whose names are the demo's fortune topics (tools/demo/demo_corpus.py).
FORTUNE_TOPICS = ("art", "computers", "cookie", "definitions", "drugs", "education", "ethnic", "food", "fortunes",
                  "goedel", "humorists", "kids", "law", "linuxcookie", "literature", "love", "magic", "medicine",
                  "men-women", "miscellaneous", "news", "people", "pets", "platitudes", "politics", "riddles",
                  "science", "songs-poems", "sports", "startrek", "wisdom", "work", "zippy")
PEAK_LR = 2e-3
WARMUP = 100
TRAIN_SECONDS = 210        # wall time of the training loop; the schedule runs over it
VALIDATE_EVERY = 150
GOLDEN = os.path.join(ROOT, "tests", "fixtures", "demo-chat", "golden.json")


def log(*args):
    print(*args, flush=True)


# ---------------------------------------------------------------------------------------------
# The target, as g4 runs models/demo.gguf.

def gguf_tokenizer(reader):
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    merges = [m.split(" ") for m in reader.fields["tokenizer.ggml.merges"].contents()]
    spec = tokenizer_spec(tokens, merges)
    vocab = spec["model"]["vocab"]
    bad = [i for i, t in enumerate(tokens) if vocab.get(t) != i]
    if bad:
        raise SystemExit(f"the file's tokens do not rebuild its vocabulary: ids {bad[:5]} move")
    return Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))


def load_target(reader, device):
    cfg = demo_config(len(reader.fields["tokenizer.ggml.tokens"].contents()))
    model = Gemma4ForCausalLM(cfg).float()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA4, cfg.num_hidden_layers)
    tensors = {t.name: t for t in reader.tensors}
    used = set()
    parameters = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in model.state_dict().items():
            if name == "lm_head.weight":
                continue  # tied to the embedding
            if name not in parameters and not name.endswith("layer_scalar"):
                log(f"  {name}: a buffer of the model, not read from the file")
                continue
            key = name + ".weight" if name.endswith("layer_scalar") else name
            g = names.get_name(key, try_suffixes=(".weight", ".bias"))
            if g is None or g not in tensors:
                raise SystemExit(f"{name}: no tensor {g} in the target file")
            values = gguf.quants.dequantize(tensors[g].data, tensors[g].tensor_type).astype(np.float32)
            if values.size != param.numel():
                raise SystemExit(f"{name}: {values.size} values in {g}, the model wants {tuple(param.shape)}")
            param.copy_(torch.from_numpy(values.reshape(param.shape)))
            used.add(g)
    left = []
    for g in sorted(set(tensors) - used - {"rope_freqs.weight"}):
        values = gguf.quants.dequantize(tensors[g].data, tensors[g].tensor_type)
        if g.endswith("layer_output_scale.weight") and np.all(values == 1.0):
            continue  # a layer scalar of 1 that this transformers keeps outside its state dict
        left.append(g)
    if left:
        raise SystemExit(f"tensors of the file the model does not take: {left}")
    model.tie_weights()
    return model.to(device).eval(), cfg


def check_target(model, tok, device):
    """The rebuilt tokenizer gives golden.json's ids; the dequantized target continues its prompts as
    transformers' bf16 checkpoint did wherever that one's top-2 margin exceeds 1."""
    golden = json.load(open(GOLDEN))
    for probe in golden["tokenizer_probe"]:
        if tok.encode(probe["text"], add_special_tokens=False).ids != probe["ids"]:
            raise SystemExit(f"tokenizer differs from the demo's on {probe['text']!r}")
    report = {}
    for c in golden["continuations"]:
        if tok.encode(c["prompt_text"], add_special_tokens=False).ids != c["prompt_ids"]:
            raise SystemExit(f"tokenizer differs from the demo's on prompt {c['name']}")
        clear = next((i for i, m in enumerate(c["top2_margins"]) if m <= 1.0), len(c["top2_margins"]))
        ids = list(c["prompt_ids"])
        with torch.no_grad():
            for _ in range(clear):
                logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1]
                ids.append(int(logits.argmax()))
        got = ids[len(c["prompt_ids"]):]
        same = next((i for i, (a, b) in enumerate(zip(got, c["greedy_ids"])) if a != b), clear)
        report[c["name"]] = {"clear_steps": clear, "same_steps": same}
    log("target checks (greedy steps equal to transformers' bf16 checkpoint, of those with margin > 1):", report)
    # The Q4_K file may leave the bf16 text where margins are small; the tool call g4's tests require
    # of the embedded demo must come out whole.
    if report["tool_call"]["same_steps"] < 8:
        raise SystemExit("the dequantized target does not write the Paris tool call: the file was not read right")
    return report


# ---------------------------------------------------------------------------------------------
# Attention over the target's caches, shared by the check and the assistant.

def setting(cfg, key):
    """A config value read from its dictionary: this transformers refuses attributes that may vary
    by layer (head_dim, ...) on the config object."""
    return cfg.to_dict()[key]


def inv_freq(cfg, kind, d):
    """RoPE frequencies of a layer kind with heads of d: the sliding layers rotate every pair; the full
    layers' proportional RoPE rotates the first partial_rotary_factor of the pairs (exponents over the
    whole head) and leaves the rest (frequency 0)."""
    p = setting(cfg, "rope_parameters")[kind]
    freq = 1.0 / (p["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    if p.get("rope_type") == "proportional":
        freq[int(d * p.get("partial_rotary_factor", 1.0) / 2):] = 0.0
    return freq


# How RoPE pairs coordinates: "half" (i with i + d/2, transformers' rotate_half) or "adjacent"
# (2i with 2i + 1); check_attention keeps the one the target uses.
ROPE_PAIRS = ["half"]


def rope(x, positions, freq):
    """x [B, heads, L, d] rotated at positions [L]."""
    angles = positions.double()[:, None] * freq.to(x.device)[None, :]
    cos, sin = angles.cos().float(), angles.sin().float()
    if ROPE_PAIRS[0] == "half":
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, b * cos + a * sin], -1).flatten(-2)


def key_mask(length, window, queries_own_key, device):
    """[L, L] booleans: query row p sees key k. A query that stored its own key (the target) sees
    k <= p with p - k < window; an assistant query sits at P = p + 1 and sees k <= p with P - k < window."""
    q = torch.arange(length, device=device)[:, None]
    k = torch.arange(length, device=device)[None, :]
    pos = q if queries_own_key else q + 1
    allowed = k <= q
    if window:
        allowed &= pos - k < window
    return allowed


def attend(q, keys, values, mask):
    """q [B, H, L, d] over keys/values [B, kv, L, d]; scale 1 (q_norm replaces 1/sqrt(d))."""
    rep = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(rep, 1), values.repeat_interleave(rep, 1)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=1.0)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def rms(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def layer_caches(cache, layer, length):
    entry = cache.layers[layer]
    keys, values = entry.keys, entry.values
    if keys.shape[2] != length:
        raise SystemExit(f"the cache of target layer {layer} holds {keys.shape[2]} positions, not {length}")
    return keys, values


# Whether transformers' last hidden state still needs the final norm (check_attention decides).
LAST_HIDDEN_NEEDS_NORM = [False]


def target_pass(model, ids):
    """The target over ids [B, L]: soft-capped logits, final-normed hidden states and the caches."""
    cache = DynamicCache()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
    hidden = out.hidden_states[-1]
    if LAST_HIDDEN_NEEDS_NORM[0]:
        hidden = model.model.norm(hidden)
    return out.logits.float(), hidden.float(), cache


def check_attention(model, cfg, ids, device):
    """Recompute the target's last sliding and full layers' attention outputs from their caches with
    attend(): proves the RoPE, the masks and the cache contents the assistant is trained on."""
    layers = model.model.layers
    seen = {}
    hooks = [layers[i].self_attn.register_forward_hook(
        lambda mod, args, kwargs, out, i=i: seen.__setitem__(i, (kwargs.get("hidden_states", args[0] if args else None),
                                                                 out[0])), with_kwargs=True)
        for i in cache_layers(cfg)]
    with torch.no_grad():
        logits, hidden, cache = target_pass(model, ids)
    for h in hooks:
        h.remove()
    # The hidden states handed to the assistant are final-normed: the LM head of them gives the logits.
    cap = setting(cfg, "final_logit_softcapping")
    with torch.no_grad():
        hidden_err = float((torch.tanh(model.lm_head(hidden) / cap) * cap - logits).abs().max())
        normed_err = float((torch.tanh(model.lm_head(model.model.norm(hidden)) / cap) * cap - logits).abs().max())
    if normed_err < hidden_err:
        LAST_HIDDEN_NEEDS_NORM[0] = True
        hidden_err = normed_err
    log("transformers' last hidden state", "needs" if LAST_HIDDEN_NEEDS_NORM[0] else "has", "the final norm")
    errors = {"final_normed_hidden": hidden_err}
    L = ids.shape[1]

    def recompute(i):
        attn, kind = layers[i].self_attn, setting(cfg, "layer_types")[i]
        x, want = seen[i]
        keys, values = layer_caches(cache, i, L)
        d = keys.shape[-1]
        with torch.no_grad():
            q = attn.q_proj(x).view(x.shape[0], L, -1, d)
            q = attn.q_norm(q).transpose(1, 2)
            q = rope(q, torch.arange(L, device=device), inv_freq(cfg, kind, d))
            window = setting(cfg, "sliding_window") if kind == "sliding_attention" else 0
            got = attn.o_proj(attend(q, keys, values, key_mask(L, window, True, device)))
        return float((got - want).norm() / want.norm())

    for pairs in ("half", "adjacent"):
        ROPE_PAIRS[0] = pairs
        errors.update({f"layer_{i}": recompute(i) for i in cache_layers(cfg)})
        errors["rope_pairs"] = pairs
        if all(v <= 1e-4 for k, v in errors.items() if k.startswith("layer_")):
            break
    log("attention check (relative L2 of the recomputed outputs; LM head of the hidden states):", errors)
    if hidden_err > 1e-3 or any(v > 1e-4 for k, v in errors.items() if k.startswith("layer_")):
        raise SystemExit("the assistant's view of the target differs from the target's own attention")
    return errors


def cache_layers(cfg):
    """The target layer each assistant layer reads: the last one of its kind (model/assistant.h)."""
    return [max(i for i, t in enumerate(setting(cfg, "layer_types")) if t == kind) for kind in LAYER_TYPES]


# ---------------------------------------------------------------------------------------------
# The assistant.

class Assistant(torch.nn.Module):
    """Gemma4AssistantForCausalLM's parameters under its checkpoint names (HF_NAMES of
    tools/fixtures/make_assistant_fixture.py)."""

    def __init__(self, acfg, head_dims):
        super().__init__()
        H, B, V, I = acfg["hidden_size"], acfg["backbone_hidden_size"], acfg["vocab_size"], acfg["intermediate_size"]
        self.acfg, self.eps = acfg, acfg["rms_norm_eps"]
        self.dims = head_dims  # per layer: the head size of the target layer whose caches it reads
        p = torch.nn.Parameter
        init = lambda *shape: p(torch.randn(*shape) * 0.02)  # noqa: E731
        self.w = torch.nn.ParameterDict()
        self.w["embed"] = init(V, H)
        self.w["final_norm"] = p(torch.ones(H))
        self.w["pre_projection"] = init(H, 2 * B)
        self.w["post_projection"] = init(B, H)
        for i, d in enumerate(self.dims):
            self.w[f"{i}_input_norm"] = p(torch.ones(H))
            self.w[f"{i}_q_proj"] = init(HEADS * d, H)
            self.w[f"{i}_q_norm"] = p(torch.ones(d))
            self.w[f"{i}_o_proj"] = init(H, HEADS * d)
            self.w[f"{i}_post_attn_norm"] = p(torch.ones(H))
            self.w[f"{i}_pre_ffn_norm"] = p(torch.ones(H))
            self.w[f"{i}_gate_proj"] = init(I, H)
            self.w[f"{i}_up_proj"] = init(I, H)
            self.w[f"{i}_down_proj"] = init(H, I)
            self.w[f"{i}_post_ffn_norm"] = p(torch.ones(H))
            self.w[f"{i}_layer_scalar"] = p(torch.ones(1))

    def step(self, embedded, h, caches, masks, freqs):
        """One draft step for every position: embedded [B, L, Bw] (already times sqrt(Bw)), h [B, L, Bw]."""
        w, eps = self.w, self.eps
        Bn, L, _ = embedded.shape
        positions = torch.arange(1, L + 1, device=embedded.device)
        x = torch.cat([embedded, h], -1) @ w["pre_projection"].T
        for i, d in enumerate(self.dims):
            n = rms(x, w[f"{i}_input_norm"], eps)
            q = rms((n @ w[f"{i}_q_proj"].T).view(Bn, L, HEADS, d), w[f"{i}_q_norm"], eps).transpose(1, 2)
            q = rope(q, positions, freqs[i])
            keys, values = caches[i]
            a = attend(q, keys, values, masks[i]) @ w[f"{i}_o_proj"].T
            x = x + rms(a, w[f"{i}_post_attn_norm"], eps)
            n = rms(x, w[f"{i}_pre_ffn_norm"], eps)
            m = (F.gelu(n @ w[f"{i}_gate_proj"].T, approximate="tanh") * (n @ w[f"{i}_up_proj"].T)) @ w[f"{i}_down_proj"].T
            x = (x + rms(m, w[f"{i}_post_ffn_norm"], eps)) * w[f"{i}_layer_scalar"]
        f = rms(x, w["final_norm"], eps)
        return f @ w["embed"].T, f @ w["post_projection"].T

    def checkpoint(self):
        """HF name -> float32 tensor on the host."""
        out = {}
        for key, value in self.w.items():
            if key in ("embed", "final_norm", "pre_projection", "post_projection"):
                name = {"embed": "model.embed_tokens.weight", "final_norm": "model.norm.weight",
                        "pre_projection": "pre_projection.weight", "post_projection": "post_projection.weight"}[key]
            else:
                i, part = key.split("_", 1)
                name = {
                    "input_norm": "input_layernorm.weight", "q_proj": "self_attn.q_proj.weight",
                    "q_norm": "self_attn.q_norm.weight", "o_proj": "self_attn.o_proj.weight",
                    "post_attn_norm": "post_attention_layernorm.weight",
                    "pre_ffn_norm": "pre_feedforward_layernorm.weight", "gate_proj": "mlp.gate_proj.weight",
                    "up_proj": "mlp.up_proj.weight", "down_proj": "mlp.down_proj.weight",
                    "post_ffn_norm": "post_feedforward_layernorm.weight", "layer_scalar": "layer_scalar",
                }[part]
                name = f"model.layers.{i}.{name}"
            out[name] = value.detach().float().cpu().contiguous()
        return out


def draft_chain(assistant, target, ids, lengths, steps):
    """Every position's chained draft steps over a batch: per step j the assistant's logits, the target's
    logits they learn (row p + 1 + j) and where both exist."""
    with torch.no_grad():
        t_logits, t_hidden, cache = target_pass(target, ids)
        caches = [layer_caches(cache, i, ids.shape[1]) for i in cache_layers(target.config)]
        embedded = target.model.embed_tokens.weight[ids].float() * math.sqrt(t_hidden.shape[-1])
    L = ids.shape[1]
    h = t_hidden
    out = []
    for j in range(steps):
        shift = 1 + j
        # Step j at position p: token ids[p + 1 + j], learned row p + 1 + j.
        tok_emb = F.pad(embedded[:, shift:], (0, 0, 0, shift))
        a_logits, h = assistant.step(tok_emb, h, caches, assistant.masks, assistant.freqs)
        want = F.pad(t_logits[:, shift:], (0, 0, 0, shift))
        valid = (torch.arange(L, device=ids.device)[None, :] + shift) < lengths[:, None]
        out.append((a_logits, want, valid))
    return out


def prepare_masks(assistant, target_cfg, length, device):
    kinds = assistant.acfg["layer_types"]
    window = setting(target_cfg, "sliding_window")
    assistant.masks = [key_mask(length, window if k == "sliding_attention" else 0, False, device) for k in kinds]
    assistant.freqs = [inv_freq(target_cfg, k, d) for k, d in zip(kinds, assistant.dims)]


def batch_tensors(data, rows, device):
    width = max(len(data[i]) for i in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    for r, i in enumerate(rows):
        ids[r, :len(data[i])] = torch.tensor(data[i])
    lengths = torch.tensor([len(data[i]) for i in rows])
    return ids.to(device), lengths.to(device)


def generation_prompts(seed):
    """Rendered prompts: fortune requests over FORTUNE_TOPICS, then the prompts of synthetic chats."""
    rng = random.Random(seed)
    total = GENERATED_FORTUNES + VAL_GENERATED
    fortunes = [fortune_example(rng, rng.choice(FORTUNE_TOPICS).replace("-", " "), "-") for _ in range(total)]
    chats = chat_examples(GENERATED_CHATS + VAL_GENERATED, seed)
    return [render(ex["messages"], ex["tools"]) for ex in fortunes], [render(ex["messages"], ex["tools"]) for ex in chats]


def target_replies(model, tok, prompts, device):
    """The prompts with the target's replies (temperature 0.7, top-k 40, top-p 0.9: its generation
    config), each cut after its first stop token."""
    out = []
    for at in range(0, len(prompts), GEN_BATCH):
        enc = [e.ids for e in tok.encode_batch(prompts[at:at + GEN_BATCH], add_special_tokens=False)]
        width = max(map(len, enc))
        ids = torch.zeros(len(enc), width, dtype=torch.long)
        mask = torch.zeros(len(enc), width, dtype=torch.long)
        for r, e in enumerate(enc):  # left-padded
            ids[r, width - len(e):] = torch.tensor(e)
            mask[r, width - len(e):] = 1
        with torch.no_grad():
            gen = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=True,
                                 temperature=0.7, top_k=40, top_p=0.9, max_new_tokens=GEN_TOKENS, pad_token_id=0,
                                 eos_token_id=list(STOP_IDS))
        for r, e in enumerate(enc):
            new = gen[r, width:].tolist()
            cut = next((i + 1 for i, t in enumerate(new) if t in STOP_IDS), len(new))
            out.append(e + new[:cut])
    return out


def validate(assistant, target, val, device):
    """Per-step top-1 agreement with the target and the teacher-forced tokens a round of DRAFTS keeps."""
    agree = [0] * STEPS
    count = [0] * STEPS
    kept, rounds = 0, 0
    with torch.no_grad():
        for rows in make_batches(val, random.Random(0)):
            ids, lengths = batch_tensors(val, rows, device)
            prepare_masks(assistant, target.config, ids.shape[1], device)
            chain = draft_chain(assistant, target, ids, lengths, STEPS)
            hits = []
            for j, (a, want, valid) in enumerate(chain):
                hit = (a.argmax(-1) == want.argmax(-1)) & valid
                agree[j] += int(hit.sum())
                count[j] += int(valid.sum())
                hits.append(hit)
            # Rounds at positions where all DRAFTS rows exist; a round keeps its leading agreeing drafts.
            full = chain[DRAFTS - 1][2]
            run = torch.ones_like(full)
            accepted = torch.zeros(full.shape, dtype=torch.long, device=device)
            for j in range(DRAFTS):
                run = run & hits[j]
                accepted += run.long()
            kept += int(accepted[full].sum())
            rounds += int(full.sum())
    per_step = [a / max(c, 1) for a, c in zip(agree, count)]
    return {"top1_agreement_per_step": [round(x, 4) for x in per_step],
            "teacher_forced_tokens_per_round": round(1 + kept / max(rounds, 1), 4)}


def validate_sets(assistant, target, val_sets, device):
    """validate() per named set, and the mean tokens a round over the sets (the score kept)."""
    out = {name: validate(assistant, target, val, device) for name, val in val_sets.items()}
    out["score"] = round(sum(v["teacher_forced_tokens_per_round"] for v in out.values()) / len(val_sets), 4)
    return out


def train(assistant, target, data, val_sets, device, t_start):
    opt = torch.optim.AdamW(assistant.parameters(), lr=PEAK_LR, betas=(0.9, 0.95), weight_decay=0.01)
    rng = random.Random(SEED + 1)
    batches = []
    t0, step, best, best_state, history = time.time(), 0, -1.0, None, []
    while True:
        elapsed = time.time() - t0
        if elapsed >= TRAIN_SECONDS:
            break
        if not batches:
            batches = make_batches(data, rng)
        rows = batches.pop()
        lr = PEAK_LR * min(1.0, (step + 1) / WARMUP) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * elapsed / TRAIN_SECONDS)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids, lengths = batch_tensors(data, rows, device)
        prepare_masks(assistant, target.config, ids.shape[1], device)
        loss, n = 0.0, 0
        for a, want, valid in draft_chain(assistant, target, ids, lengths, STEPS):
            p = torch.softmax(want[valid], -1)
            loss = loss - (p * torch.log_softmax(a[valid], -1)).sum()
            n += int(valid.sum())
        loss = loss / max(n, 1)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(assistant.parameters(), 1.0)
        opt.step()
        step += 1
        if step % VALIDATE_EVERY == 0:
            v = validate_sets(assistant, target, val_sets, device)
            history.append({"step": step, "seconds": round(time.time() - t0, 1), "loss": round(float(loss), 4), **v})
            log(f"step {step} ({time.time() - t_start:.0f} s) loss {float(loss):.4f} lr {lr:.2e} {v}")
            if v["score"] > best:
                best = v["score"]
                best_state = {k: t.detach().clone() for k, t in assistant.state_dict().items()}
    v = validate_sets(assistant, target, val_sets, device)
    history.append({"step": step, "seconds": round(time.time() - t0, 1), "loss": round(float(loss), 4), **v})
    log(f"end: step {step} {v}")
    if best_state is not None and best > v["score"]:
        assistant.load_state_dict(best_state)
    return step, history


# ---------------------------------------------------------------------------------------------

def main():
    target_path, out_dir = sys.argv[1], sys.argv[2]
    t_start = time.time()
    torch.manual_seed(SEED)
    random.seed(SEED)
    torch.backends.cuda.matmul.allow_tf32 = False  # the checks compare float32 sums
    device = "cuda"
    reader = gguf.GGUFReader(target_path)
    tok = gguf_tokenizer(reader)
    target, cfg = load_target(reader, device)
    for p in target.parameters():
        p.requires_grad_(False)
    summary = {"seed": SEED, "target_checks": check_target(target, tok, device)}

    chats = chat_examples(TRAIN_CHATS, CHAT_SEED + 7)
    val_chats = chat_examples(VAL_CHATS, CHAT_SEED + 1)
    data = [e.ids for e in tok.encode_batch([ex["text"] for ex in chats], add_special_tokens=False)]
    data = [ids for ids in data if len(ids) <= SEQ]
    val = [e.ids for e in tok.encode_batch([ex["text"] for ex in val_chats], add_special_tokens=False)]
    val = [ids for ids in val if len(ids) <= SEQ]
    log(f"data: {len(data)} chats ({sum(map(len, data))} tokens), {len(val)} validation chats, "
        f"{time.time() - t_start:.0f} s")
    probe = torch.tensor([max(val, key=len)], device=device)
    summary["attention_check"] = check_attention(target, cfg, probe, device)
    val_sets = {"corpus_chats": val}
    torch.manual_seed(SEED + 3)
    fortune_prompts, chat_prompts = generation_prompts(CHAT_SEED + 9)
    fortunes = target_replies(target, tok, fortune_prompts, device)
    replies = target_replies(target, tok, chat_prompts, device)
    val_sets["generated_fortunes"] = fortunes[:VAL_GENERATED]
    val_sets["generated_chats"] = replies[:VAL_GENERATED]
    generated = fortunes[VAL_GENERATED:] + replies[VAL_GENERATED:]
    data += generated * GENERATED_REPEATS
    summary["generated"] = {"fortunes": len(fortunes), "chats": len(replies),
                            "mean_tokens": round(sum(len(x) for x in generated) / max(len(generated), 1), 1)}
    log(f"target replies (prompt and reply): {summary['generated']}, {time.time() - t_start:.0f} s")

    target_dict = cfg.to_dict()
    acfg = assistant_config(target_dict, hidden=HIDDEN, heads=HEADS, intermediate=INTERMEDIATE,
                            layer_types=LAYER_TYPES)
    acfg["dtype"] = "float32"
    head_dims = [target.model.layers[i].self_attn.q_norm.weight.numel() for i in cache_layers(cfg)]
    assistant = Assistant(acfg, head_dims).to(device)
    n_params = sum(p.numel() for p in assistant.parameters())
    log(f"assistant: {n_params} parameters, layers {LAYER_TYPES} reading target layers {cache_layers(cfg)}")
    torch.backends.cuda.matmul.allow_tf32 = True  # training: TF32 matmuls
    steps, history = train(assistant, target, data, val_sets, device, t_start)
    torch.backends.cuda.matmul.allow_tf32 = False
    final = validate_sets(assistant, target, val_sets, device)
    log("kept state:", final)
    summary.update({"parameters": n_params, "steps": steps, "train_seconds": TRAIN_SECONDS,
                    "history": history, "validation": final, "draft_tokens": DRAFTS})

    hf = os.path.join(out_dir, "hf")
    os.makedirs(hf, exist_ok=True)
    with open(os.path.join(hf, "config.json"), "w") as f:
        json.dump(acfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(hf, "generation_config.json"), "w") as f:
        json.dump({"num_assistant_tokens": DRAFTS, "bos_token_id": 2, "eos_token_id": [1, 106], "pad_token_id": 0},
                  f, indent=2)
        f.write("\n")
    write_safetensors(os.path.join(hf, "model.safetensors"), {k: v.numpy() for k, v in assistant.checkpoint().items()},
                      "F32")
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
        f.write("\n")
    log(f"done in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
