"""Train g4's embedded demo model: a small Gemma 4 (transformers.Gemma4ForCausalLM) that chats in
Gemma 4's format, calls tools and tells fortunes (docs/DESIGN.md §6, "Demo model").

Runs on the GPU machine (torch 2.11, transformers 5.17, tokenizers) through tools/demo/gpu_train_demo.sh,
in about five minutes on one H200. Deterministic: every random choice is seeded. Usage:

    python3 tools/demo/train_demo.py CORPUS_DIR OUT_DIR [OLD_MODEL_DIR]

CORPUS_DIR holds fortune files from Debian's `fortunes` package (/usr/share/games/fortunes, one
quote per block, blocks separated by a line with a single '%') and their COPYRIGHT (BSD, University
of California, fortune-mod), copied to OUT_DIR/CORPUS_LICENSE. The chats come from
tools/demo/demo_chat_corpus.py (synthetic, seeded, written in this repository): Gemma 4 conversations
rendered exactly as the official template renders them, with weather/time/calculator tool calls,
tool responses and answers, plain chats from a small fact table, and fortune requests.

OUT_DIR receives a Hugging Face checkpoint (config.json, generation_config.json, model.safetensors
in bfloat16, tokenizer.json) and golden.json: transformers' greedy continuations of chat, tool-call
and plain prompts computed from the saved files (with the top-2 logit margin of every step, so a
quantized export can be held to the clear ones), the validation losses of the old demo model
(OLD_MODEL_DIR, default tests/fixtures/demo/hf) and of the new one on the same held-out text, in
bits per byte (the two tokenizers differ), and the tool-call accuracy on held-out requests.

The tokenizer is a BPE with byte fallback in Gemma's style ("▁" for spaces, <0xNN> byte tokens at
Gemma's ids 238..493) and keeps Gemma 4's special and chat tokens at Gemma 4's ids (<pad> 0,
<eos> 1, <bos> 2, <unk> 3, <|tool> 46, <|tool_call> 48, <|tool_response> 50, <|"|> 52, <|turn> 105,
<turn|> 106, ...), so the chat template and stop tokens of g4 work unchanged.
"""
import json, math, os, random, re, shutil, sys, time

import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
from transformers import Gemma4ForCausalLM, Gemma4TextConfig

from demo_chat_corpus import CHAT_SEED, PARIS_CALL, chat_examples, fortune_example, golden_prompts, render
from demo_corpus import SEED, read_fortunes, validation_count
from gemma_style_tokenizer import FIRST_BYTE_ID, GEMMA4_SPECIALS, tokenizer_spec

VOCAB = 8192
SEQ = 512                # longest training example in tokens (longer chats are left out, fortunes cut)
CHATS = 80000            # synthetic chats for training (CHAT_SEED)
VAL_CHATS = 2000         # held-out chats (CHAT_SEED + 1)
FORTUNE_REPEATS = 2      # each training fortune appears this often per pass, as a chat or as plain text
PASSES = 3
BATCH_TOKENS = 16384     # rows x padded width of one batch
PEAK_LR = 1e-3
TRAIN_SECONDS_GUARD = 300  # stop (and say so) rather than overrun the GPU machine's 8-minute limit
EVAL_SEQ = 1024          # held-out texts longer than this under either tokenizer are left out (old model: 1 024 positions)
GOLDEN_STEPS = 48
HELD_OUT_PER_KIND = 10
LAYER_TYPES = ["sliding_attention"] * 3 + ["full_attention"] + ["sliding_attention"] * 3 + ["full_attention"]


def log(*args):
    print(*args, flush=True)


SPECIAL_SPLIT = re.compile("|".join(re.escape(s) for s in sorted(GEMMA4_SPECIALS.values(), key=len, reverse=True)))


def train_tokenizer(texts):
    """BPE merges learned on '▁'-prefixed words of the text between special tokens (those are
    matched whole before BPE); the saved file uses Gemma's own pipeline."""
    learner = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    learner.normalizer = normalizers.Replace(" ", "▁")
    learner.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never")
    learned_size = VOCAB - (FIRST_BYTE_ID + 256)
    trainer = trainers.BpeTrainer(vocab_size=learned_size, limit_alphabet=160, show_progress=False)
    pieces_of_text = (piece for text in texts for piece in SPECIAL_SPLIT.split(text) if piece)
    learner.train_from_iterator(pieces_of_text, trainer=trainer)
    learned = json.loads(learner.to_str())["model"]
    pieces = [piece for piece, _ in sorted(learned["vocab"].items(), key=lambda kv: kv[1])]
    merges = [m.split(" ") if isinstance(m, str) else m for m in learned["merges"]]
    spec = tokenizer_spec(pieces, merges)
    text = json.dumps(spec, ensure_ascii=False)
    return Tokenizer.from_str(text), text


def encode_all(tok, texts):
    return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def fortune_texts(items, rng):
    """Each fortune as a chat turn (asked for in a user turn) or as plain text, by a seeded coin."""
    out = []
    for topic, body in items:
        if rng.random() < 0.5:
            ex = fortune_example(rng, topic, body)
            out.append(ex["text"])
        else:
            out.append("<bos>" + body + "<eos>")
    return out


def make_batches(data, rng):
    """Batches of similar lengths (little padding) of at most BATCH_TOKENS padded tokens, in a
    seeded random order."""
    order = list(range(len(data)))
    rng.shuffle(order)
    batches = []
    chunk = 4096  # sort by length within chunks of the shuffled order, then cut by the token budget
    for at in range(0, len(order), chunk):
        part = sorted(order[at:at + chunk], key=lambda i: len(data[i]))
        rows = []
        for i in part:
            if rows and (len(rows) + 1) * len(data[i]) > BATCH_TOKENS:
                batches.append(rows)
                rows = []
            rows.append(i)
        if rows:
            batches.append(rows)
    rng.shuffle(batches)
    return batches


def tensors(data, rows):
    width = max(len(data[i]) for i in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for r, i in enumerate(rows):
        seq = data[i]
        ids[r, :len(seq)] = torch.tensor(seq)
        labels[r, :len(seq)] = torch.tensor(seq)
        mask[r, :len(seq)] = 1
    return ids, labels, mask


def evaluate(model, data, device):
    """Summed nats over every predicted token of `data` (and the count)."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    batches = make_batches(data, random.Random(0))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for rows in batches:
            ids, labels, mask = tensors(data, rows)
            out = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device))
            n = int((labels[:, 1:] != -100).sum())
            total += float(out.loss) * n
            count += n
    model.train(was_training)
    return total, count


def bits_per_byte(model, tok, texts, device):
    """Validation loss on `texts` in bits per UTF-8 byte of the text after <bos> (comparable across
    tokenizers: special tokens count as the bytes of their strings), and in nats per token of this
    tokenizer."""
    data = encode_all(tok, texts)
    assert all(len(ids) <= EVAL_SEQ for ids in data)
    nats, count = evaluate(model, data, device)
    nbytes = sum(len(t.encode("utf-8")) - len("<bos>") for t in texts)
    return {"bits_per_byte": nats / math.log(2) / nbytes, "nats_per_token": nats / max(count, 1), "texts": len(texts)}


def greedy(model, prompt, steps, device):
    """transformers' greedy continuation and the top-2 logit margin at each step."""
    ids, margins = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1]
            top = torch.topk(logits.float(), 2)
            margins.append(float(top.values[0] - top.values[1]))
            ids.append(int(top.indices[0]))
    return ids[len(prompt):], margins


def sample(model, prompt, steps, device, generator, temperature=0.7, top_k=40, top_p=0.9):
    """A sampled continuation with the generation config's settings (temperature, then top-k, then
    top-p), stopping at a stop token."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([ids], device=device), use_cache=False).logits[0, -1].float()
            values, indices = torch.topk(logits / temperature, top_k)
            probs = torch.softmax(values, dim=-1)
            keep = torch.cumsum(probs, dim=-1) - probs < top_p
            probs = probs * keep
            pick = int(indices[torch.multinomial(probs / probs.sum(), 1, generator=generator)])
            ids.append(pick)
            if pick in (1, 106, 50):
                break
    return ids[len(prompt):]


def stop_at(tok, ids):
    """The text up to and including the first stop token (<eos>, <turn|>, <|tool_response>)."""
    for n, i in enumerate(ids):
        if i in (1, 106, 50):
            return tok.decode(ids[:n + 1], skip_special_tokens=False)
    return tok.decode(ids, skip_special_tokens=False)


def demo_config(vocab_size):
    """The demo model's transformers config (docs/DESIGN.md §6, "Demo model"); checks that each full
    layer gets head_dim 128 and one K=V head in per_layer_config, as config.json will say
    (tools/fixtures/make_fixtures.py's HEADS_31B gives layer_types the same way)."""
    cfg = Gemma4TextConfig(
        vocab_size=vocab_size, hidden_size=512, intermediate_size=1024,
        num_hidden_layers=len(LAYER_TYPES), layer_types=LAYER_TYPES, num_attention_heads=8, num_key_value_heads=2,
        head_dim=64, global_head_dim=128, num_global_key_value_heads=1, attention_k_eq_v=True, sliding_window=128,
        final_logit_softcapping=30.0, max_position_embeddings=2048, hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=VOCAB, tie_word_embeddings=True, rms_norm_eps=1e-6,
        bos_token_id=2, eos_token_id=[1, 106], pad_token_id=0)
    saved = cfg.to_dict()
    full_layers = {str(i) for i, t in enumerate(LAYER_TYPES) if t == "full_attention"}
    if saved.get("layer_types") != LAYER_TYPES or {str(k) for k in (saved.get("per_layer_config") or {})} != full_layers:
        raise SystemExit(f"unexpected config: layer_types {saved.get('layer_types')}, per_layer_config "
                         f"{saved.get('per_layer_config')}; the full layers {sorted(full_layers)} need head_dim 128")
    return cfg


def main():
    corpus_dir, out_dir = sys.argv[1], sys.argv[2]
    old_dir = sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__), "..", "..", "tests",
                                                                  "fixtures", "demo", "hf")
    os.makedirs(out_dir, exist_ok=True)
    t_start = time.time()
    torch.manual_seed(SEED)
    random.seed(SEED)
    device = "cuda"

    items = read_fortunes(corpus_dir)
    split = validation_count(len(items))
    val_items, train_items = items[:split], items[split:]
    chats = chat_examples(CHATS, CHAT_SEED)
    val_chats = chat_examples(VAL_CHATS, CHAT_SEED + 1)
    log(f"corpus: {len(items)} fortunes ({len(train_items)} train, {len(val_items)} validation), "
        f"{len(chats)} chats + {len(val_chats)} validation chats, {time.time() - t_start:.0f} s")

    tok, tok_json = train_tokenizer([body for _, body in train_items] + [ex["text"] for ex in chats[:30000]])
    log(f"tokenizer: {len(json.loads(tok_json)['model']['vocab'])} ids, {time.time() - t_start:.0f} s")

    rng = random.Random(SEED + 1)
    chat_ids = encode_all(tok, [ex["text"] for ex in chats])
    dropped = sum(len(ids) > SEQ for ids in chat_ids)
    chat_ids = [ids for ids in chat_ids if len(ids) <= SEQ]
    fortune_ids = []
    for _ in range(FORTUNE_REPEATS):
        fortune_ids += [ids[:SEQ] for ids in encode_all(tok, fortune_texts(train_items, rng))]
    train = chat_ids + fortune_ids
    log(f"training examples: {len(chat_ids)} chats ({dropped} over {SEQ} tokens left out, "
        f"{sum(map(len, chat_ids))} tokens), {len(fortune_ids)} fortune examples ({sum(map(len, fortune_ids))} tokens)")

    # Held-out text, scored by the old and the new model: the fortune validation split as plain text
    # (as the old demo was trained) and the held-out chats; the same texts for both models.
    old_tok = Tokenizer.from_file(os.path.join(old_dir, "tokenizer.json"))

    def fits_both(texts):
        new_len, old_len = encode_all(tok, texts), encode_all(old_tok, texts)
        return [t for t, a, b in zip(texts, new_len, old_len) if max(len(a), len(b)) <= EVAL_SEQ]

    val_fortunes = fits_both(["<bos>" + body + "<eos>" for _, body in val_items])
    val_chat_texts = fits_both([ex["text"] for ex in val_chats])

    cfg = demo_config(len(json.loads(tok_json)["model"]["vocab"]))
    saved = cfg.to_dict()
    model = Gemma4ForCausalLM(cfg).to(device)
    log("parameters", sum(p.numel() for p in model.parameters()), "per_layer_config", saved["per_layer_config"])
    for name, p in model.named_parameters():
        if ".layers.0." in name or ".layers.3." in name:
            log(f"  {name} {tuple(p.shape)}")

    batch_rng = random.Random(SEED + 2)
    schedule = [rows for _ in range(PASSES) for rows in make_batches(train, batch_rng)]
    steps_total = len(schedule)
    log(f"{steps_total} steps of at most {BATCH_TOKENS} padded tokens ({PASSES} passes)")
    opt = torch.optim.AdamW(model.parameters(), lr=PEAK_LR, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 200
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(s, steps_total) / steps_total))))
    val_chat_ids = [ids for ids in encode_all(tok, val_chat_texts) if len(ids) <= SEQ]
    val_fortune_ids = [ids[:SEQ] for ids in encode_all(tok, val_fortunes)]

    def validation():
        nc, cc = evaluate(model, val_chat_ids, device)
        nf, cf = evaluate(model, val_fortune_ids, device)
        return nc / cc, nf / cf

    t0, step, skipped, stopped_early = time.time(), 0, 0, False
    best_score, best_state, loss = math.inf, None, torch.tensor(float("nan"))
    checkpoints = {int(steps_total * f) for f in (0.25, 0.5, 0.75)} | {steps_total}
    for index, rows in enumerate(schedule):
        ids, labels, mask = tensors(train, rows)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids.to(device), attention_mask=mask.to(device), labels=labels.to(device)).loss
        if torch.isfinite(loss):
            loss.backward()
        if not torch.isfinite(loss) or not torch.isfinite(torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)):
            skipped += 1
            opt.zero_grad(set_to_none=True)
        else:
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            step += 1
        done = index + 1
        if done % 100 == 0:
            elapsed = time.time() - t0
            log(f"step {done}/{steps_total}: loss {float(loss.detach()):.3f}, lr {sched.get_last_lr()[0]:.2e}, "
                f"{elapsed:.0f} s, {elapsed / done * 1000:.0f} ms/step, eta {elapsed / done * (steps_total - done):.0f} s")
        guard = time.time() - t0 > TRAIN_SECONDS_GUARD
        if done in checkpoints or guard:
            chat_loss, fortune_loss = validation()
            log(f"validation after {done} steps: chats {chat_loss:.3f}, fortunes {fortune_loss:.3f} nats/token, "
                f"{skipped} non-finite steps skipped, {time.time() - t0:.0f} s")
            if math.isfinite(chat_loss + fortune_loss) and chat_loss + fortune_loss < best_score:
                best_score, best_state = chat_loss + fortune_loss, {k: v.detach().clone() for k, v in model.state_dict().items()}
        if guard:
            stopped_early = True
            log(f"TIME GUARD: stopped after {done} of {steps_total} steps ({TRAIN_SECONDS_GUARD} s): NOT the planned run, "
                f"lower PASSES or BATCH_TOKENS")
            break
    if best_state is None:
        raise SystemExit("training diverged: no finite validation loss")
    model.load_state_dict(best_state)
    train_seconds = time.time() - t0

    model = model.to(torch.bfloat16)
    # Sampling defaults g4 uses when a request or flag gives none (chosen by reading samples).
    model.generation_config.do_sample = True
    model.generation_config.temperature = 0.7
    model.generation_config.top_k = 40
    model.generation_config.top_p = 0.9
    model.save_pretrained(out_dir, safe_serialization=True)
    open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8").write(tok_json)
    shutil.copy(os.path.join(corpus_dir, "COPYRIGHT"), os.path.join(out_dir, "CORPUS_LICENSE"))
    log(f"saved {out_dir} after {train_seconds:.0f} s of training, {time.time() - t_start:.0f} s in all")

    # The goldens come from the saved files, loaded as a user loads them: from_pretrained keeps the
    # RoPE inverse frequencies in float32 (a model.to(float32) of the bf16 model would keep them
    # rounded to bf16, which no runtime does).
    model = Gemma4ForCausalLM.from_pretrained(out_dir, dtype=torch.float32).to(device).eval()
    golden = {"seed": SEED, "chat_seed": CHAT_SEED, "steps": step, "planned_steps": steps_total,
              "stopped_early_by_time_guard": stopped_early, "train_seconds": round(train_seconds),
              "parameters": sum(p.numel() for p in model.parameters()), "validation": {}, "continuations": []}
    golden["validation"]["new"] = {"fortunes": bits_per_byte(model, tok, val_fortunes, device),
                                   "chats": bits_per_byte(model, tok, val_chat_texts, device)}
    for name, text in golden_prompts().items():
        prompt = tok.encode(text, add_special_tokens=False).ids
        out, margins = greedy(model, prompt, GOLDEN_STEPS, device)
        golden["continuations"].append({"name": name, "prompt_text": text, "prompt_ids": prompt, "greedy_ids": out,
                                        "greedy_text": tok.decode(out, skip_special_tokens=False),
                                        "top2_margins": [round(m, 4) for m in margins]})
        log(f"{name}: {stop_at(tok, out)!r} (smallest margin {min(margins):.3f})")
    paris = golden["continuations"][0]
    golden["paris_tool_call_ok"] = stop_at(tok, paris["greedy_ids"]) == PARIS_CALL + "<|tool_response>"
    log("Paris tool call well-formed:", golden["paris_tool_call_ok"])

    # Held-out tool requests: does greedy decoding write exactly the expected call / answer?
    correct, tried, misses = {}, {}, []
    for ex in val_chats:
        kind = ex["kind"]
        if tried.get(kind, 0) >= HELD_OUT_PER_KIND or kind == "plain":
            continue
        prompt = tok.encode(render(ex["messages"], ex["tools"]), add_special_tokens=False).ids
        want = tok.encode(ex["completion"], add_special_tokens=False).ids
        out, _ = greedy(model, prompt, len(want), device)
        tried[kind] = tried.get(kind, 0) + 1
        ok = out == want
        correct[kind] = correct.get(kind, 0) + ok
        if not ok and len(misses) < 6:
            misses.append((ex["completion"], tok.decode(out, skip_special_tokens=False)))
    golden["held_out_exact"] = {k: f"{correct[k]}/{tried[k]}" for k in sorted(tried)}
    log("held-out completions written exactly:", golden["held_out_exact"])
    for want, got in misses:
        log(f"  wanted {want!r}\n  got    {got!r}")

    # The old demo (fortunes only, 4 096 ids) on the same held-out text.
    old_model = Gemma4ForCausalLM.from_pretrained(old_dir, dtype=torch.float32).to(device).eval()
    golden["validation"]["old"] = {"fortunes": bits_per_byte(old_model, old_tok, val_fortunes, device),
                                   "chats": bits_per_byte(old_model, old_tok, val_chat_texts, device)}
    for which in ("old", "new"):
        v = golden["validation"][which]
        log(f"validation {which}: fortunes {v['fortunes']['bits_per_byte']:.3f} bits/byte "
            f"({v['fortunes']['nats_per_token']:.3f} nats/token), chats {v['chats']['bits_per_byte']:.3f} bits/byte "
            f"({v['chats']['nats_per_token']:.3f} nats/token)")
    old_prompt = old_tok.encode(golden_prompts()["raw"], add_special_tokens=False).ids
    old_out, _ = greedy(old_model, old_prompt, GOLDEN_STEPS, device)
    log("old raw:", repr(old_tok.decode(old_out, skip_special_tokens=False)))

    # A few samples as g4 serves them (the generation config's sampling, seeded).
    generator = torch.Generator(device=device)
    generator.manual_seed(SEED)
    for name, text in golden_prompts().items():
        for _ in range(2):
            out = sample(model, tok.encode(text, add_special_tokens=False).ids, 60, device, generator)
            log(f"sample {name}: {tok.decode(out, skip_special_tokens=False)!r}")

    probe = ["Hello, world!  Tabs\tand  spaces.", "naïve café — 東京 🙂", "<|turn>user\nhi<turn|>\n",
             '<|tool_call>call:get_weather{location:<|"|>Paris<|"|>}<tool_call|>']
    golden["tokenizer_probe"] = [{"text": t, "ids": tok.encode(t, add_special_tokens=False).ids} for t in probe]
    json.dump(golden, open(os.path.join(out_dir, "golden.json"), "w"), indent=1, ensure_ascii=False)
    log(f"done in {time.time() - t_start:.0f} s")


if __name__ == "__main__":
    main()
