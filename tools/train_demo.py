"""Train g4's embedded demo model: a tiny Gemma 4 (transformers.Gemma4ForCausalLM) on fortunes.

Runs on the GPU machine (torch 2.11, transformers 5.17, tokenizers). Deterministic: every random
choice is seeded. Usage:

    python3 tools/train_demo.py CORPUS_DIR OUT_DIR

CORPUS_DIR holds fortune files from Debian's `fortunes` package (/usr/share/games/fortunes, one
quote per block, blocks separated by a line with a single '%'). Licence: BSD (University of
California, fortune-mod), see /usr/share/doc/fortunes/copyright; the script copies that file to
OUT_DIR/CORPUS_LICENSE.

OUT_DIR receives a Hugging Face checkpoint (config.json, generation_config.json, model.safetensors
in bfloat16, tokenizer.json; committed as tests/fixtures/demo/hf, and `g4 export` of it is
models/demo.gguf) and golden.json: greedy continuations computed by transformers from the saved
files, which tests/test_demo_model.cpp checks g4 against, plus the validation loss.

The tokenizer is a BPE with byte fallback in Gemma's style ("▁" for spaces, <0xNN> byte tokens at
Gemma's ids 238..493) and keeps Gemma 4's special and chat tokens at Gemma 4's ids (<pad> 0,
<eos> 1, <bos> 2, <unk> 3, <|turn> 105, <turn|> 106, ...), so the chat template and stop tokens of
`g4 run` work unchanged. Half the training examples are chat turns ("Tell me a fortune about
<topic>." -> the fortune, then <turn|>), half plain text, so both `g4 run --prompt` and
`--raw_prompt` give fortune-like text.
"""
import json, math, os, random, shutil, sys, time

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

from demo_corpus import SEED, read_fortunes, validation_count
from gemma_style_tokenizer import FIRST_BYTE_ID, tokenizer_spec

VOCAB = 4096
SEQ = 256
CHAT_PREFIX = "<|turn>user\n{}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"


def train_tokenizer(texts):
    """BPE merges learned on '▁'-prefixed words; the saved file uses Gemma's own pipeline."""
    learner = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    learner.normalizer = normalizers.Replace(" ", "▁")
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    learned_size = VOCAB - (FIRST_BYTE_ID + 256)
    trainer = trainers.BpeTrainer(vocab_size=learned_size, limit_alphabet=160, show_progress=False)
    learner.train_from_iterator(texts, trainer=trainer)
    learned = json.loads(learner.to_str())["model"]
    pieces = [piece for piece, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m.split(" ") if isinstance(m, str) else m for m in learned["merges"]]
    spec = tokenizer_spec(pieces, merges)
    text = json.dumps(spec, ensure_ascii=False)
    return Tokenizer.from_str(text), text


def examples(tok, items):
    """Token ids of each example: half chat turns, half plain text (seeded choice)."""
    rng = random.Random(SEED + 1)
    out = []
    for topic, body in items:
        if rng.random() < 0.5:
            text = "<bos>" + CHAT_PREFIX.format(f"Tell me a fortune about {topic}.") + body + "<turn|>"
        else:
            text = "<bos>" + body + "<eos>"
        ids = tok.encode(text, add_special_tokens=False).ids
        out.append(ids[:SEQ])
    return out


def batches(data, batch_size, rng):
    order = list(range(len(data)))
    rng.shuffle(order)
    for at in range(0, len(order) - batch_size + 1, batch_size):
        rows = [data[i] for i in order[at:at + batch_size]]
        width = max(len(r) for r in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r)
            labels[i, :len(r)] = torch.tensor(r)
            mask[i, :len(r)] = 1
        yield ids, labels, mask


def evaluate(model, data, device):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for ids, labels, mask in batches(data, 64, random.Random(0)):
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device))
            n = int((labels[:, 1:] != -100).sum())
            total += float(out.loss) * n
            count += n
    model.train()
    return total / max(count, 1)


def greedy(model, prompt, steps, device):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1]
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):]


def main():
    corpus_dir, out_dir = sys.argv[1], sys.argv[2]
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(SEED)
    random.seed(SEED)
    device = "cuda"
    items = read_fortunes(corpus_dir)
    tok, tok_json = train_tokenizer([body for _, body in items])
    data = examples(tok, items)
    split = validation_count(len(data))
    val, train = data[:split], data[split:]
    print(f"fortunes: {len(items)}, train {len(train)}, validation {len(val)}, "
          f"tokens {sum(map(len, data))}", flush=True)

    cfg = Gemma4TextConfig(
        vocab_size=len(json.loads(tok_json)["model"]["vocab"]), hidden_size=256, intermediate_size=768,
        num_hidden_layers=6, num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        global_head_dim=128, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=64,
        final_logit_softcapping=30.0, max_position_embeddings=1024, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=VOCAB, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0)
    model = Gemma4ForCausalLM(cfg).to(device)
    print("parameters", sum(p.numel() for p in model.parameters()), flush=True)

    # 2e-3 diverged to NaN in the third epoch on the full fortunes corpus (2026-12-01); 1e-3 with
    # non-finite steps skipped, keeping the weights of the best validation loss.
    epochs, batch_size, peak_lr = 8, 64, 1e-3
    steps_total = epochs * (len(train) // batch_size)
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 100) * 0.5 * (1 + math.cos(math.pi * min(s, steps_total) / steps_total)))
    rng = random.Random(SEED + 2)
    t0, step, skipped = time.time(), 0, 0
    best_loss, best_state = math.inf, None
    for epoch in range(epochs):
        for ids, labels, mask in batches(train, batch_size, rng):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
            if torch.isfinite(loss):
                loss.backward()
            if not torch.isfinite(loss) or not torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)):
                skipped += 1
                opt.zero_grad(set_to_none=True)
                continue
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        val_loss = evaluate(model, val, device)
        print(f"epoch {epoch + 1}: train loss {float(loss.detach()):.3f}, validation loss {val_loss:.3f}, "
              f"{skipped} non-finite steps skipped, {time.time() - t0:.0f} s", flush=True)
        if val_loss < best_loss:
            best_loss, best_state = val_loss, {k: v.detach().clone() for k, v in model.state_dict().items()}
    if best_state is None:
        raise SystemExit("training diverged: no finite validation loss")
    model.load_state_dict(best_state)

    model = model.to(torch.bfloat16)
    # Sampling defaults g4 run uses when no flag is given (chosen by reading samples).
    model.generation_config.do_sample = True
    model.generation_config.temperature = 0.7
    model.generation_config.top_k = 40
    model.generation_config.top_p = 0.9
    model.save_pretrained(out_dir, safe_serialization=True)
    open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8").write(tok_json)
    # The goldens come from the saved files, loaded as a user loads them: from_pretrained keeps the
    # RoPE inverse frequencies in float32 (a model.to(float32) of the bf16 model would keep them
    # rounded to bf16, which no runtime does).
    model = Gemma4ForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
    val_loss = evaluate(model, val, device)
    prompts = {
        "chat": "<bos>" + CHAT_PREFIX.format("Tell me a fortune about computers."),
        "raw": "<bos>The secret of life is",
    }
    golden = {"validation_loss_nats_per_token": val_loss, "steps": step, "seed": SEED, "continuations": []}
    for name, text in prompts.items():
        prompt = tok.encode(text, add_special_tokens=False).ids
        out = greedy(model, prompt, 40, device)
        golden["continuations"].append({"name": name, "prompt_text": text, "prompt_ids": prompt,
                                        "greedy_ids": out, "greedy_text": tok.decode(out, skip_special_tokens=False)})
        print(name, repr(tok.decode(out, skip_special_tokens=False)), flush=True)
    probe = ["Hello, world!  Tabs\tand  spaces.", "naïve café — 東京 🙂", "<|turn>user\nhi<turn|>\n"]
    golden["tokenizer_probe"] = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in probe]
    json.dump(golden, open(os.path.join(out_dir, "golden.json"), "w"), indent=1, ensure_ascii=False)
    shutil.copy(os.path.join(corpus_dir, "COPYRIGHT"), os.path.join(out_dir, "CORPUS_LICENSE"))
    print(f"validation loss {val_loss:.3f} nats/token after {step} steps", flush=True)


if __name__ == "__main__":
    main()
