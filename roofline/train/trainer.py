"""Train a small decoder with a DeepSeek-V3 MTP module, and its draft model, on the CPU.

The model is the project's own `Transformer` (roofline.model.decoder), trained in float32
through the same forward that inference runs: one call at start position 0 over a window of
T tokens (its static cache is replaced by fresh zero tensors before each step, so no step's
graph reaches into another's). The MTP module (num_nextn_predict_layers = 1) is DeepSeek-V3's
§2.2: at position i it reads the main model's final hidden state h_i and the embedding of
token i+1 and predicts token i+2; the loss is

    L = CE(main, t_{i+1}) + mtp_weight · CE(mtp, t_{i+2})

(DeepSeek-V3 trains with a weight of 0.3 for most of its run), the MTP gradient flowing into
the main model too. mtp_weight = 0 trains the same model without it (its MTP module stays at
its random initialisation): the pair gives the main model's held-out loss with and without
the auxiliary loss. The draft model is a smaller decoder (no MTP) trained on the same tokens.

Held-out loss is the main model's mean cross-entropy, in nats per token, over fixed windows of
the held-out files (set "a"), the same windows for every model of a run.

Each saved model is then checked for degenerate greedy text (roofline.train.quality): its
greedy continuations of the held-out prompts of set "b" (check_new tokens each) are measured
for single-token runs, distinct-token ratio and short loops, beside the same measures of the
references; the summary records the verdicts (degenerate, repetitive) and the log flags
them: a degenerate model's greedy acceptance is the acceptance of a repetition.
"""

from __future__ import annotations

import json
import math
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from roofline.io.fields import ConfigError, option
from roofline.model.config import ModelConfig
from roofline.model.decoder import build_model
from roofline.model.kvcache import caching_modules
from roofline.train import corpus as corpus_mod
from roofline.train import quality
from roofline.train import tokenizer as tok_mod


@dataclass(frozen=True)
class ModelShape:
    d: int = option(96, "hidden size (heads must divide it)")
    layers: int = option(3, "decoder layers")
    heads: int = option(4, "attention heads")
    kv_heads: int = option(2, "KV heads (must divide heads); the target's 2: the converter's tensor-parallel "
                              "round trip splits KV heads over 2 ranks")
    ffn: int = option(256, "FFN hidden size")
    mtp_layers: int = option(1, "MTP modules = num_nextn_predict_layers: 1 for the target, 0 for the draft")

    def config(self, name: str, vocab: int, max_context: int) -> ModelConfig:
        if self.d % self.heads or self.heads % self.kv_heads:
            raise ConfigError(f"{name}: d={self.d}, heads={self.heads}, kv_heads={self.kv_heads}: heads must divide d "
                              "and kv_heads divide heads")
        return ModelConfig(name=name, vocab=vocab, d=self.d, layers=self.layers, heads=self.heads,
                           kv_heads=self.kv_heads, head_dim=self.d // self.heads, ffn=self.ffn,
                           max_context=max_context, rope_theta=10000.0, norm_eps=1e-5, tie_embeddings=True,
                           mtp_layers=self.mtp_layers, source="trained by roofline.train")


@dataclass(frozen=True)
class TrainRequest:
    out_dir: str = option(help="the folder written: target/, draft/, [target_no_mtp_loss/], tokenizer/, "
                               "prompts_{a,b}.jsonl")
    target: ModelShape = option(help="the main model (0.50M + 0.12M MTP parameters); mtp_layers = "
                                     "num_nextn_predict_layers (must be 1)", factory=ModelShape)
    draft: ModelShape = option(help="the draft model (0.15M parameters; same tokenizer, no MTP)",
                               factory=lambda: ModelShape(d=48, layers=2, heads=2, kv_heads=1, ffn=128, mtp_layers=0))
    vocab: int = option(2048, "BPE vocabulary (byte-level, special role tokens included)")
    seq_len: int = option(96, "tokens per training window")
    batch: int = option(8, "windows per step")
    target_steps: int = option(2000, "training steps of the target")
    draft_steps: int = option(2000, "training steps of the draft model (0: no draft model)")
    lr: float = option(6e-3, "AdamW peak; linear warm-up over 5% of steps, cosine to peak/10")
    mtp_weight: float = option(0.3, "weight of the MTP loss (DeepSeek-V3: 0.3); 0 trains without it")
    control: bool = option(False, "also train the target with mtp_weight=0 (held-out loss with vs without MTP loss)")
    corpus_root: str | None = option(None, "default: sysconfig.get_paths()[\"stdlib\"]")
    corpus_bytes: int = option(4_000_000, "source bytes of train-split files read (tokenizer and training tokens)")
    heldout_percent: int = option(10, "share of files held out (by a hash of the path), split again into prompt "
                                      "sets a and b")
    eval_windows: int = option(64, "held-out windows of seq_len for the held-out loss")
    check_new: int = option(48, "greedy tokens per held-out prompt (set b) in the degeneracy check of the summary "
                                "(0: none)")
    prompts_per_set: int = option(24, "conversations written to prompts_a.jsonl and prompts_b.jsonl")
    save_dtype: str = option("bfloat16", "dtype of the saved safetensors")
    threads: int = option(1, "torch CPU threads (1: on a shared 2-core machine two OpenMP threads stall each other)")
    workers: int = option(2, "models trained side by side, one process (of `threads` threads) each (1: one after "
                             "another)")
    seed: int = option(0, "seed of the weights' initialisation, the batches and the held-out windows")
    progress: bool = option(True, "tqdm progress bar")

    def __post_init__(self) -> None:
        if self.vocab < 300:
            raise ConfigError(f"vocab={self.vocab}: a byte-level BPE needs >= 300 (256 bytes + specials + merges)")
        for name in ("seq_len", "batch", "target_steps", "eval_windows", "prompts_per_set", "threads", "workers"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)}: must be >= 1")
        if self.draft_steps < 0 or self.mtp_weight < 0 or self.check_new < 0:
            raise ConfigError("draft_steps, mtp_weight and check_new must be >= 0")
        if self.target.mtp_layers != 1 or self.draft.mtp_layers != 0:
            raise ConfigError("target.mtp_layers must be 1 (DeepSeek-V3's num_nextn_predict_layers) and "
                              "draft.mtp_layers 0")


def _fresh_caches(model) -> None:
    for mod in caching_modules(model):
        for name in mod.CACHE_NAMES:
            setattr(mod, name, torch.zeros_like(getattr(mod, name)))


def losses(model, window: torch.Tensor, with_mtp: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(main CE, MTP CE) in nats per token over windows [B, T + 2]."""
    T = window.shape[1] - 2
    x = window[:, :T]
    _fresh_caches(model)
    logits, h = model(x, 0, return_hidden=True)
    main = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:T + 1].flatten())
    if not with_mtp or not model.mtp:
        return main, None
    mlogits, _ = model.mtp_forward(h, window[:, 1:T + 1], 0)
    return main, F.cross_entropy(mlogits.float().flatten(0, 1), window[:, 2:T + 2].flatten())


def _batches(ids: torch.Tensor, T: int, B: int, steps: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        starts = torch.randint(0, len(ids) - T - 2, (B,), generator=g)
        yield torch.stack([ids[s:s + T + 2] for s in starts.tolist()])


def _lr(step: int, steps: int, peak: float) -> float:
    warm = max(1, steps // 20)
    if step < warm:
        return peak * (step + 1) / warm
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm))))  # cosine to peak/10


def train_model(cfg: ModelConfig, ids: torch.Tensor, req: TrainRequest, steps: int, mtp_weight: float, seed: int,
                label: str, log=print, position: int = 0):
    """A trained model (float32) and its loss log [(step, main, mtp)]."""
    from tqdm import tqdm

    torch.manual_seed(seed)
    model = build_model(cfg, max_batch=req.batch, max_context=req.seq_len + 2, dtype=torch.float32, seed=seed)
    with torch.no_grad():  # init_weights spreads the head's logits like a trained model's; training starts flat
        model.embed.weight.normal_(0.0, 0.02, generator=torch.Generator().manual_seed(seed))
    model.requires_grad_(True).train()
    params = [p for p in model.parameters() if p.requires_grad]
    # weight decay on the matrices only: decaying the RMSNorm gains pulls them towards 0
    groups = [dict(params=[p for p in params if p.dim() >= 2], weight_decay=0.1),
              dict(params=[p for p in params if p.dim() < 2], weight_decay=0.0)]
    opt = torch.optim.AdamW(groups, lr=req.lr, betas=(0.9, 0.95))
    history = []
    bar = tqdm(_batches(ids, req.seq_len, req.batch, steps, seed), total=steps, desc=label, disable=not req.progress,
               mininterval=2.0, position=position)
    for step, w in enumerate(bar):
        for group in opt.param_groups:
            group["lr"] = _lr(step, steps, req.lr)
        main, mtp = losses(model, w, with_mtp=mtp_weight > 0)
        loss = main + mtp_weight * mtp if mtp is not None else main
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        history.append((step, main.item(), mtp.item() if mtp is not None else None))
        if step % 10 == 0 or step == steps - 1:
            bar.set_postfix(main=f"{main.item():.3f}", mtp="-" if mtp is None else f"{mtp.item():.3f}")
        if step % 50 == 0 or step == steps - 1:
            log(f"{label} step {step}/{steps}: main loss {main.item():.4f} nats/token"
                + ("" if mtp is None else f", MTP loss {mtp.item():.4f}"))
    model.eval().requires_grad_(False)
    _fresh_caches(model)
    return model, history


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor, batch: int) -> dict:
    """Mean main (and MTP, if the model has one) CE over the held-out windows, nats per token."""
    main, mtp = [], []
    for i in range(0, len(windows), batch):
        m, t = losses(model, windows[i:i + batch], with_mtp=bool(model.mtp))
        main.append(float(m) * len(windows[i:i + batch]))
        if t is not None:
            mtp.append(float(t) * len(windows[i:i + batch]))
    n = len(windows)
    return dict(main=sum(main) / n, mtp=sum(mtp) / n if mtp else None)


def _encode(tok, texts: list[str]) -> torch.Tensor:
    return torch.tensor([i for e in tok.encode_batch(texts, add_special_tokens=False) for i in e.ids], dtype=torch.long)


def check_prompts(tok, prompts_file: Path, n_new: int) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, the reference's first n_new ids) per conversation of a prompts file: the
    prompt rendered with the generation prompt, the reference the rest of the full rendering."""
    out = []
    for line in prompts_file.read_text(encoding="utf-8").splitlines():
        if line.strip():
            msgs = json.loads(line)["messages"]
            p = tok.encode(tok_mod.render_text(msgs[:-1], add_generation_prompt=True), add_special_tokens=False).ids
            full = tok.encode(tok_mod.render_text(msgs), add_special_tokens=False).ids
            out.append((p, full[len(p):len(p) + n_new]))
    return out


def greedy_check(folder: Path, tok, pairs, n_new: int, reference: dict) -> dict:
    """The saved model's greedy continuations of the held-out prompts, measured for repetition."""
    from roofline.checkpoints.loader import load_checkpoint

    prompts = [p for p, _ in pairs]
    model = load_checkpoint(folder, dtype="float32", max_batch=8, max_context=max(map(len, prompts)) + n_new + 4)
    gen = quality.greedy_continuations(model, prompts, n_new)
    stats = quality.repetition(gen)
    return dict(stats, degenerate=quality.degenerate(stats), repetitive=quality.repetitive(stats, reference),
                examples=[tok.decode(g, skip_special_tokens=False) for g in gen[:2]])


def n_params(model) -> dict:
    main = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("mtp."))
    return dict(main=main, mtp=sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp.")))


def _train_one(job, shared: dict, log) -> tuple[str, dict]:
    """Train, evaluate, save and check one model of the run."""
    from roofline.checkpoints.convert import save_hf

    index, name, shape, weight, steps = job
    req, out, pairs, reference = shared["req"], shared["out"], shared["pairs"], shared["reference"]
    cfg = shape.config(name, shared["vocab"], shared["max_ctx"])
    t0 = time.perf_counter()
    model, history = train_model(cfg, shared["ids"], req, steps, weight, req.seed, name, log, position=index)
    train_s = time.perf_counter() - t0
    ev = heldout_loss(model, shared["windows"], req.batch)
    save_hf(model, out / name, dtype=req.save_dtype, tokenizer_dir=shared["tok_dir"], bos_id=shared["bos"],
            eos_id=shared["eos"])
    (out / name / "train_log.json").write_text(json.dumps(dict(history=history), indent=None) + "\n")
    check = greedy_check(out / name, shared["tok"], pairs, req.check_new, reference) if pairs else None
    result = dict(params=n_params(model), train_s=train_s, steps=steps, mtp_weight=weight,
                  heldout_loss=ev["main"], heldout_mtp_loss=ev["mtp"],
                  final_train_loss=history[-1][1], first_train_loss=history[0][1], config=asdict(shape),
                  greedy_check=check)
    log(f"{name}: {sum(result['params'].values()):,} parameters, {train_s:.0f} s, held-out main loss "
        f"{ev['main']:.4f} nats/token" + ("" if ev["mtp"] is None else f", MTP {ev['mtp']:.4f}"))
    if check:
        log(f"{name}: greedy on {check['continuations']} held-out prompts (set b, {req.check_new} tokens): "
            f"single-token runs {check['single_token_run']:.0%}, distinct {check['distinct']:.2f} "
            f"(references {reference['distinct']:.2f}), loops {check['loop']:.0%}"
            + (" << DEGENERATE: greedy text is a run of one token, acceptance on it measures nothing"
               if check["degenerate"] else " << REPETITIVE: greedy text often loops, greedy acceptance is "
               "inflated there" if check["repetitive"] else ""))
    return name, result


def _train_in_worker(job, shared: dict) -> tuple[str, dict, list[str]]:
    """_train_one in a worker process: one torch thread, its log lines returned to the parent."""
    torch.set_num_threads(shared["req"].threads)
    lines: list[str] = []
    name, result = _train_one(job, shared, lines.append)
    return name, result, lines


def run_training(req: TrainRequest, log=print) -> dict:
    """Corpus -> tokenizer -> target (with MTP) [+ its no-MTP-loss twin] -> draft; HF folders and a summary.
    The models train one after another (workers=1) or side by side, one process each (workers=N)."""
    torch.set_num_threads(req.threads)
    t_start = time.perf_counter()
    out = Path(req.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    corpus = corpus_mod.list_corpus(req.corpus_root, req.heldout_percent)
    chats = corpus_mod.training_chats(corpus, req.corpus_bytes)
    texts = [tok_mod.render_text(c) for c in chats]
    log(f"corpus {corpus.root}: {len(corpus.files['train'])} train / {len(corpus.files['a'])} + "
        f"{len(corpus.files['b'])} held-out files (fingerprint {corpus.fingerprint()}); training on {len(chats)} "
        f"files, {sum(map(len, texts)):,} characters")
    tok = tok_mod.train_bpe(texts, req.vocab)
    tok_dir = out / "tokenizer"
    tok_mod.save_tokenizer(tok, tok_dir, req.seq_len * 8)
    ids = _encode(tok, texts)
    held = [tok_mod.render_text(corpus_mod.as_chat(r, corpus_mod.read(corpus, r))) for r in corpus.files["a"]]
    held_ids = _encode(tok, held)
    g = torch.Generator().manual_seed(req.seed + 1)
    starts = torch.randint(0, len(held_ids) - req.seq_len - 2, (req.eval_windows,), generator=g).tolist()
    windows = torch.stack([held_ids[s:s + req.seq_len + 2] for s in starts])
    log(f"tokenizer: vocab {tok.get_vocab_size()}; {len(ids):,} train tokens, {len(held_ids):,} held-out tokens")
    prompts = {s: corpus_mod.write_prompts(corpus, s, out / f"prompts_{s}.jsonl", req.prompts_per_set)
               for s in ("a", "b")}
    bos, eos = tok.token_to_id(tok_mod.BOS), tok.token_to_id(tok_mod.EOS)
    pairs = check_prompts(tok, out / "prompts_b.jsonl", req.check_new) if req.check_new else []
    reference = quality.repetition([r for _, r in pairs]) if pairs else None
    max_ctx = max(1024, req.seq_len * 8)  # RoPE: prompts may run past the training window
    runs = [("target", req.target, req.mtp_weight, req.target_steps)]
    if req.control:
        runs.append(("target_no_mtp_loss", req.target, 0.0, req.target_steps))
    if req.draft_steps:
        runs.append(("draft", req.draft, 0.0, req.draft_steps))
    shared = dict(ids=ids, windows=windows, req=req, out=out, tok_dir=tok_dir, bos=bos, eos=eos, tok=tok,
                  pairs=pairs, reference=reference, vocab=tok.get_vocab_size(), max_ctx=max_ctx)
    jobs = [(i, name, shape, weight, steps) for i, (name, shape, weight, steps) in enumerate(runs)]
    models = {}
    if req.workers == 1 or len(jobs) == 1:
        for job in jobs:
            name, models[name] = _train_one(job, shared, log)
    else:  # one single-threaded process per model, req.workers at a time (no OpenMP threads to stall)
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(min(req.workers, len(jobs)), mp_context=multiprocessing.get_context("spawn")) as ex:
            for name, result, lines in ex.map(_train_in_worker, jobs, [shared] * len(jobs)):
                for line in lines:
                    log(line)
                models[name] = result
    summary = dict(spec={k: v for k, v in asdict(req).items() if k != "out_dir"}, corpus=dict(
        fingerprint=corpus.fingerprint(), train_files=len(corpus.files["train"]), heldout_files_a=len(corpus.files["a"]),
        heldout_files_b=len(corpus.files["b"]), files_used=len(chats), train_tokens=len(ids),
        heldout_tokens=len(held_ids)), prompts=prompts, greedy_check_reference=reference, models=models,
        total_s=time.perf_counter() - t_start, torch=torch.__version__, python=platform.python_version(), threads=req.threads)
    (out / "train_summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
