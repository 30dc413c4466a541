#!/usr/bin/env python3
"""Generate float64 reference losses and parameter gradients of DiffusionGemma's pre-training objectives.

Reference-data generation only: this script is not run by CI. It loads the tiny fixture model
test/fixtures/diffusion_gemma/all_experts into HuggingFace `DiffusionGemmaForBlockDiffusion` (as
make_training_fixtures.py does, with its float64 islands) and evaluates the two pre-training objectives of
docs/pretraining.md, "Objectives" on packed rows with HF's text stack: `model.model.encoder.language_model` (the text
stack the decoder shares) run with an explicit 4-D document mask per layer type, the tied head and the soft-cap,
differentiated by torch autograd in float64. It writes test/fixtures/diffusion_gemma_pretrain/all_experts/:

    autoregressive.input.safetensors    input_ids, position_ids, document_ids, labels [B, S] i64, loss_mask [B, S] f32
    masked-diffusion.input.safetensors  input_ids, position_ids, document_ids [B, S] i64, loss_mask [B, S] f32,
                                        noise_keys [B, 2] i64
    block-diffusion.input.safetensors   the same inputs as masked diffusion, with keys of their own
    <objective>.safetensors             loss [1] float64, grad/<checkpoint name> (float32, cast from float64);
                                        masked-diffusion also p_mask [B] f32, masked_positions [B, S] f32 and
                                        masked_input_ids [B, S] i64: the draws the plan must reproduce;
                                        block-diffusion also diffusion_t [B, S/L] f32 and noisy_canvas_ids [B, S] i64
    meta.json                           the batch layout, the mask token, the values and the checks

The packed batch: B = 3 rows of S = 24 tokens. Row 0 holds documents of 5, 11 and 8 tokens, row 1 of 14 and 6 tokens
and 4 of padding, row 2 of 3, 9 and 2 tokens and 10 of padding. The 11- and 14-token documents are longer than the
sliding window (6) and than the bidirectional window's 2 (6 // 2 + 1) + 1 = 9 positions, so the sliding layers'
windows cut inside them. Positions restart at 0 in every document;
padding is a document of its own (id -1) holding the pad id.

    autoregressive:    mask(i, j) = doc(j) == doc(i) and j <= i (sliding layers: i - j < W); every key valid
                       loss = sum loss_mask * CE(logits, labels) / max(sum loss_mask, 1)
    masked diffusion:  t_b = u(seed_b, 0, offset_b, 0), p_b = (1 - eps) t_b + eps (float32, as the plan computes)
                       masked = real and u(seed_b, 1, offset_b, s) < p_b; a row with a real token and none masked
                       masks the real token of the smallest uniform; masked tokens take the mask token's id
                       mask(i, j) = doc(j) == doc(i) and real(j) (sliding layers: |i - j| <= W // 2 + 1, HF's
                       bidirectional sliding window, masking_utils.sliding_window_bidirectional_overlay)
                       loss = sum masked * CE(logits, input_ids) / p_b / max(sum loss_mask, 1)
    block diffusion:   L = the config's canvas_length (8), S / L = 3 blocks per row;
                       t_bk = noise_min + (noise_max - noise_min) u(seed_b, 0, offset_b, k) (float32, as the plan);
                       token s of block k is replaced by r(seed_b, 2, offset_b, s) (docs/kernels.md's random_int
                       over V ids) when real and u(seed_b, 1, offset_b, s) < t_bk: the SFT corruption per block;
                       the encoder (HF's text stack, causal within each document, every key valid) runs over
                       the clean row and records every layer's K/V; block k runs HF's decoder
                       (model.model.decoder, no self-conditioning) over a DynamicCache holding the clean K/V
                       of positions [0, kL) (sliding layers keep the last W - 1, as the cache does), at the
                       block's position ids, with an explicit mask: key j visible to query i iff doc(j) ==
                       doc(i), over the prefix and the whole block;
                       l_bk = sum_block loss_mask * CE(logits, input_ids) / max(sum_block loss_mask, 1),
                       loss = sum l_bk / max(#blocks with a real token, 1) (row 2's last block is all padding)

u is docs/kernels.md's Philox4x32-10 uniform (runtime/core/Philox.h), written out below. Row 2's key is chosen so
that its draw masks no token: the fallback of the smallest uniform is exercised.

Usage (from anywhere):
    python3 tools/reference/make_pretraining_fixtures.py            # (re)write the fixtures
    python3 tools/reference/make_pretraining_fixtures.py --check    # regenerate in a temp dir, compare bytes
"""

from __future__ import annotations

import argparse
import collections
import filecmp
import json
import os
import struct
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_training_fixtures as mtf  # noqa: E402  (sets the environment before importing torch)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from safetensors.torch import save_file  # noqa: E402
from transformers import DynamicCache  # noqa: E402

DEFAULT_OUT = Path("test/fixtures/diffusion_gemma_pretrain")
GENERATOR = "tools/reference/make_pretraining_fixtures.py"
MODEL = "all_experts"
SEQUENCE = 24
DOCUMENTS = ([5, 11, 8], [14, 6], [3, 9, 2])  # per row; the rest of the row is padding
PADDING_DOCUMENT = -1
MASK_EPSILON = 1e-3
TOKEN_SEED = 4100
KEY_SEED = 4200
BLOCK_KEY_SEED = 4300
NOISE_MIN, NOISE_MAX = 1e-3, 1.0 - 1e-3

# ------------------------------------------------------------------------------------------------------------------
# Philox4x32-10 (runtime/core/Philox.h, docs/kernels.md "Random numbers")
# ------------------------------------------------------------------------------------------------------------------

M32 = 0xFFFFFFFF


def philox_block(seed: int, stream: int, offset: int, block: int) -> list[int]:
    key = [seed & M32, (seed >> 32) & M32]
    ctr = [block & M32, ((block >> 32) ^ stream) & M32, offset & M32, (offset >> 32) & M32]
    for rnd in range(10):
        if rnd > 0:
            key = [(key[0] + 0x9E3779B9) & M32, (key[1] + 0xBB67AE85) & M32]
        p0 = 0xD2511F53 * ctr[0]
        p1 = 0xCD9E8D57 * ctr[2]
        ctr = [((p1 >> 32) ^ ctr[1] ^ key[0]) & M32, p1 & M32, ((p0 >> 32) ^ ctr[3] ^ key[1]) & M32, p0 & M32]
    return ctr


def philox_uniform(seed: int, stream: int, offset: int, index: int) -> float:
    """Element `index` of the uniform tensor: the word's top 24 bits times 2^-24 (exact in float32)."""
    word = philox_block(seed, stream, offset, index // 4)[index % 4]
    return (word >> 8) / 16777216.0


def philox_int(seed: int, stream: int, offset: int, index: int, high: int) -> int:
    """Element `index` of random_int over [0, high): low bits for a power of two, else Lemire with retries."""
    attempt = 0
    while True:
        word = philox_block(seed, stream, offset + attempt, index // 4)[index % 4]
        if high & (high - 1) == 0:
            return word & (high - 1)
        m = word * high
        if (m & M32) >= (1 << 32) % high:
            return m >> 32
        attempt += 1


def f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


# ------------------------------------------------------------------------------------------------------------------
# The packed batch
# ------------------------------------------------------------------------------------------------------------------


def packed_layout(vocab: int, pad: int, mask_token: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(TOKEN_SEED)
    B, S = len(DOCUMENTS), SEQUENCE
    ids = torch.full((B, S), pad, dtype=torch.int64)
    pos = torch.zeros((B, S), dtype=torch.int64)
    doc = torch.full((B, S), PADDING_DOCUMENT, dtype=torch.int64)
    real = torch.zeros((B, S), dtype=torch.float32)
    for b, lengths in enumerate(DOCUMENTS):
        start = 0
        for d, n in enumerate(lengths):
            # Real tokens avoid the pad id (no embedding gradient) and the mask token.
            tokens = torch.randint(1, vocab, (n,), generator=gen)
            tokens[tokens == mask_token] = 1
            ids[b, start : start + n] = tokens
            pos[b, start : start + n] = torch.arange(n)
            doc[b, start : start + n] = d
            real[b, start : start + n] = 1.0
            start += n
        pos[b, start:] = torch.arange(S - start)  # padding restarts too: a document of its own
    return dict(input_ids=ids, position_ids=pos, document_ids=doc, real=real)


def autoregressive_targets(layout) -> tuple[torch.Tensor, torch.Tensor]:
    ids, doc, real = layout["input_ids"], layout["document_ids"], layout["real"]
    labels = torch.zeros_like(ids)
    loss_mask = torch.zeros_like(real)
    labels[:, :-1] = ids[:, 1:]
    same = (doc[:, 1:] == doc[:, :-1]) & (real[:, 1:] > 0) & (real[:, :-1] > 0)
    loss_mask[:, :-1] = same.to(torch.float32)
    labels[loss_mask == 0] = 0  # any id in [0, V) where nothing is scored
    return labels, loss_mask


def masked_diffusion_draws(keys: torch.Tensor, real: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
    """p_mask [B] and masked [B, S] as the plan computes them in float32; whether each row took the fallback."""
    B, S = real.shape
    one_minus = f32(1.0 - MASK_EPSILON)
    eps = f32(MASK_EPSILON)
    p_mask = torch.zeros(B, dtype=torch.float32)
    masked = torch.zeros((B, S), dtype=torch.float32)
    fallback = []
    for b in range(B):
        seed, offset = int(keys[b, 0]) & ((1 << 64) - 1), int(keys[b, 1]) & ((1 << 64) - 1)
        t = philox_uniform(seed, 0, offset, 0)
        p = f32(f32(t * one_minus) + eps)
        p_mask[b] = p
        u = [philox_uniform(seed, 1, offset, s) for s in range(S)]
        drawn = [real[b, s] > 0 and u[s] < p for s in range(S)]
        fell_back = not any(drawn) and bool((real[b] > 0).any())
        if fell_back:
            smallest = min(u[s] for s in range(S) if real[b, s] > 0)
            drawn = [real[b, s] > 0 and u[s] == smallest for s in range(S)]
        masked[b] = torch.tensor(drawn, dtype=torch.float32)
        fallback.append(fell_back)
    return p_mask, masked, fallback


def choose_keys(real: torch.Tensor) -> torch.Tensor:
    """One key per row; row 2's offset is searched until its draw masks none of its real tokens."""
    gen = torch.Generator().manual_seed(KEY_SEED)
    keys = torch.randint(0, 2**62, (real.shape[0], 2), generator=gen, dtype=torch.int64)
    for offset in range(1, 100000):
        keys[2, 1] = offset
        _, _, fallback = masked_diffusion_draws(keys, real)
        if fallback[2] and not fallback[0] and not fallback[1]:
            return keys
    raise RuntimeError("no key found for the fallback row")


def block_diffusion_draws(keys: torch.Tensor, ids: torch.Tensor, real: torch.Tensor, block: int, vocab: int):
    """diffusion_t [B, S/L] and the noisy ids [B, S] as the plan computes them (float32 t, exact uniforms)."""
    B, S = ids.shape
    span = f32(NOISE_MAX - NOISE_MIN)
    low = f32(NOISE_MIN)
    t = torch.zeros((B, S // block), dtype=torch.float32)
    noisy = ids.clone()
    for b in range(B):
        seed, offset = int(keys[b, 0]) & ((1 << 64) - 1), int(keys[b, 1]) & ((1 << 64) - 1)
        for k in range(S // block):
            t[b, k] = f32(f32(philox_uniform(seed, 0, offset, k) * span) + low)
        for s in range(S):
            if real[b, s] > 0 and philox_uniform(seed, 1, offset, s) < float(t[b, s // block]):
                noisy[b, s] = philox_int(seed, 2, offset, s, vocab)
    return t, noisy


# ------------------------------------------------------------------------------------------------------------------
# The reference
# ------------------------------------------------------------------------------------------------------------------


def document_masks(doc, key_valid, window: int, bidirectional: bool, dtype) -> dict[str, torch.Tensor]:
    """HF's additive 4-D masks [B, 1, S, S] per layer type: 0 where visible, the dtype's minimum elsewhere."""
    S = doc.shape[1]
    i = torch.arange(S)[:, None]
    j = torch.arange(S)[None, :]
    same = doc[:, :, None] == doc[:, None, :]
    if bidirectional:
        base = same & key_valid[:, None, :]
        near = (i - j).abs() <= window // 2 + 1
    else:
        base = same & (j <= i)[None]
        near = (i - j) < window
    out = {}
    for layer_type, allowed in (("full_attention", base), ("sliding_attention", base & near[None])):
        additive = torch.zeros(allowed.shape, dtype=dtype)
        additive[~allowed] = torch.finfo(dtype).min  # a padding query with no visible key stays finite
        out[layer_type] = additive[:, None]
    return out


def logits(model, ids, positions, masks) -> torch.Tensor:
    text = model.model.encoder.language_model
    out = text(input_ids=ids, attention_mask=masks, position_ids=positions, cache=DynamicCache(config=text.config))
    return mtf.softcap(model.lm_head(out.last_hidden_state), model.final_logit_softcapping)


def token_ce(z: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return -torch.log_softmax(z, dim=-1).gather(-1, targets[..., None])[..., 0]


def block_diffusion_loss(model, ids, noisy, pos, doc, real, block: int) -> torch.Tensor:
    """The encoder over the clean row, then HF's decoder block by block over the clean prefix's K/V."""
    text = model.model.encoder.language_model
    tc = text.config
    W = tc.sliding_window
    B, S = ids.shape
    all_valid = torch.ones_like(ids, dtype=torch.bool)
    recorder = mtf.PrefixCache(config=tc)
    text(input_ids=ids, attention_mask=document_masks(doc, all_valid, W, False, torch.float64), position_ids=pos,
         cache=recorder)
    dtype = torch.float64
    total = torch.zeros((), dtype=dtype)
    scored_blocks = 0
    for k in range(S // block):
        start, end = k * block, (k + 1) * block
        cache = DynamicCache(config=tc)
        for layer in range(tc.num_hidden_layers):
            keys, values = recorder.produced[layer]
            cache.update(keys[:, :, :start], values[:, :, :start], layer)
        query_doc = doc[:, start:end]
        masks = {}
        for layer_type, kept in (("full_attention", start), ("sliding_attention", min(start, W - 1))):
            key_doc = torch.cat([doc[:, start - kept : start], query_doc], dim=1)
            allowed = query_doc[:, :, None] == key_doc[:, None, :]
            additive = torch.zeros(allowed.shape, dtype=dtype)
            additive[~allowed] = torch.finfo(dtype).min
            masks[layer_type] = additive[:, None]
        out = model.model.decoder(decoder_input_ids=noisy[:, start:end], cache=cache, decoder_attention_mask=masks,
                                  decoder_position_ids=pos[:, start:end])
        z = mtf.softcap(model.lm_head(out.last_hidden_state), model.final_logit_softcapping)
        m = real[:, start:end].double()
        count = m.sum(1)
        total = total + ((m * token_ce(z, ids[:, start:end])).sum(1) / torch.clamp(count, min=1.0)).sum()
        scored_blocks += int((count > 0).sum())
    return total / max(scored_blocks, 1)


def write(out_dir: Path, log) -> dict:
    model = mtf.load_model(MODEL, torch.float64)
    params = mtf.trainable_params(model, MODEL)
    tc = model.config.text_config
    V, pad, W = tc.vocab_size, tc.pad_token_id, tc.sliding_window
    mask_token = V - 1
    layout = packed_layout(V, pad, mask_token)
    real = layout["real"]
    assert max(max(d) for d in DOCUMENTS) > W, "a document must cross the sliding window"
    d = out_dir / MODEL
    d.mkdir(parents=True, exist_ok=True)
    counts: collections.Counter = collections.Counter()
    meta_cases = {}

    def run(name: str, inputs: dict, loss_fn, extra: dict):
        model.zero_grad(set_to_none=True)
        with mtf.float64_islands(counts):
            loss = loss_fn()
            loss.backward()
        grads = {ck: (p.grad if p.grad is not None else torch.zeros_like(p)).detach() for ck, p in params}
        model.zero_grad(set_to_none=True)
        save_file({k: v.contiguous() for k, v in inputs.items()}, str(d / f"{name}.input.safetensors"),
                  metadata={"format": "pt"})
        expected = dict(loss=loss.detach().reshape(1))
        expected.update(extra)
        expected.update({f"grad/{ck}": g.to(torch.float32).contiguous() for ck, g in grads.items()})
        save_file(expected, str(d / f"{name}.safetensors"), metadata={"format": "pt"})
        norm = sum(g.pow(2).sum().item() for g in grads.values()) ** 0.5
        assert norm > 0
        log(f"  {name}: loss {loss.item():.12g}, gradient norm {norm:.6g}")
        return dict(loss=loss.item(), grad_global_norm=norm)

    # Autoregressive.
    labels, ar_mask = autoregressive_targets(layout)
    ids, pos, doc = layout["input_ids"], layout["position_ids"], layout["document_ids"]
    all_valid = torch.ones_like(ids, dtype=torch.bool)

    def autoregressive_loss():
        z = logits(model, ids, pos, document_masks(doc, all_valid, W, False, torch.float64))
        m = ar_mask.double()
        return (m * token_ce(z, labels)).sum() / torch.clamp(m.sum(), min=1.0)

    ar_inputs = dict(input_ids=ids, position_ids=pos, document_ids=doc, labels=labels, loss_mask=ar_mask)
    meta_cases["autoregressive"] = dict(flags="--objective autoregressive",
                                        **run("autoregressive", ar_inputs, autoregressive_loss, {}))
    # The document mask matters to the loss: without it (one document per row) it moves far beyond
    # the test's 1e-6, so the parity test cannot pass with attention that crosses documents.
    with torch.no_grad(), mtf.float64_islands(counts):
        one_document = torch.zeros_like(doc)
        z = logits(model, ids, pos, document_masks(one_document, all_valid, W, False, torch.float64))
        crossing = ((ar_mask.double() * token_ce(z, labels)).sum() / ar_mask.double().sum()).item()
    gap = abs(crossing - meta_cases["autoregressive"]["loss"]) / meta_cases["autoregressive"]["loss"]
    assert gap > 1e-3, f"the document mask changes the loss by only {gap}"
    meta_cases["autoregressive"]["loss_if_attention_crossed_documents"] = crossing

    # Masked diffusion.
    keys = choose_keys(real)
    p_mask, masked, fallback = masked_diffusion_draws(keys, real)
    noisy = torch.where(masked > 0, torch.full_like(ids, mask_token), ids)

    def masked_diffusion_loss():
        z = logits(model, noisy, pos, document_masks(doc, real > 0, W, True, torch.float64))
        weights = masked.double() / p_mask.double()[:, None]
        return (weights * token_ce(z, ids)).sum() / torch.clamp(real.double().sum(), min=1.0)

    md_inputs = dict(input_ids=ids, position_ids=pos, document_ids=doc, loss_mask=real, noise_keys=keys)
    extra = dict(p_mask=p_mask, masked_positions=masked, masked_input_ids=noisy)
    with torch.no_grad(), mtf.float64_islands(counts):
        z = logits(model, noisy, pos, document_masks(torch.zeros_like(doc), real > 0, W, True, torch.float64))
        weights = masked.double() / p_mask.double()[:, None]
        md_crossing = ((weights * token_ce(z, ids)).sum() / real.double().sum()).item()
    meta_cases["masked-diffusion"] = dict(
        loss_if_attention_crossed_documents=md_crossing,
        flags=f"--objective masked-diffusion --mask-token-id {mask_token} --mask-epsilon {MASK_EPSILON:g}",
        masked_per_row=masked.sum(1).tolist(),
        fallback_rows=[b for b, f in enumerate(fallback) if f],
        p_mask=p_mask.tolist(),
        **run("masked-diffusion", md_inputs, masked_diffusion_loss, extra),
    )
    assert fallback == [False, False, True]
    md_gap = abs(md_crossing - meta_cases["masked-diffusion"]["loss"]) / meta_cases["masked-diffusion"]["loss"]
    assert md_gap > 1e-3, f"the document mask changes the masked-diffusion loss by only {md_gap}"

    # Block diffusion: the SFT recipe's uniform-state objective, every block of L a canvas.
    L = tc.canvas_length if hasattr(tc, "canvas_length") else model.config.canvas_length
    assert SEQUENCE % L == 0
    gen = torch.Generator().manual_seed(BLOCK_KEY_SEED)
    block_keys = torch.randint(0, 2**62, (real.shape[0], 2), generator=gen, dtype=torch.int64)
    diffusion_t, block_noisy = block_diffusion_draws(block_keys, ids, real, L, V)
    changed = int((block_noisy != ids).sum())
    assert changed > 0, "the draw must replace some tokens"

    def block_loss():
        return block_diffusion_loss(model, ids, block_noisy, pos, doc, real, L)

    bd_inputs = dict(input_ids=ids, position_ids=pos, document_ids=doc, loss_mask=real, noise_keys=block_keys)
    with torch.no_grad(), mtf.float64_islands(counts):
        bd_crossing = block_diffusion_loss(model, ids, block_noisy, pos, torch.zeros_like(doc), real, L).item()
    meta_cases["block-diffusion"] = dict(
        loss_if_attention_crossed_documents=bd_crossing,
        flags=f"--objective block-diffusion --canvas-len {L} --noise-min {NOISE_MIN:g} --noise-max {NOISE_MAX:g}",
        canvas_length=L,
        replaced_tokens=changed,
        diffusion_t=diffusion_t.tolist(),
        **run("block-diffusion", bd_inputs, block_loss, dict(diffusion_t=diffusion_t, noisy_canvas_ids=block_noisy)),
    )
    bd_gap = abs(bd_crossing - meta_cases["block-diffusion"]["loss"]) / meta_cases["block-diffusion"]["loss"]
    assert bd_gap > 1e-3, f"the document mask changes the block-diffusion loss by only {bd_gap}"

    meta = dict(
        generator=GENERATOR,
        model=f"test/fixtures/diffusion_gemma/{MODEL}",
        sequence_length=SEQUENCE,
        documents=DOCUMENTS,
        padding_document=PADDING_DOCUMENT,
        sliding_window=W,
        mask_token_id=mask_token,
        mask_epsilon=MASK_EPSILON,
        float64_island_calls=dict(counts),
        torch=torch.__version__,
        transformers=mtf.transformers.__version__,
        cases=meta_cases,
    )
    (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    return meta


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=DEFAULT_OUT, help="fixture root, relative to the repo root")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary directory and compare byte-for-byte with --out-dir")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args()
    mtf.mdg.set_determinism()
    log = (lambda *a: None) if args.quiet else (lambda *a: print(*a, flush=True))
    out_dir = args.out_dir if args.out_dir.is_absolute() else mtf.REPO_ROOT / args.out_dir
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            write(Path(tmp), log)
            produced, existing = Path(tmp) / MODEL, out_dir / MODEL
            files = sorted(os.listdir(produced))
            same = existing.is_dir() and files == sorted(os.listdir(existing))
            same &= all(filecmp.cmp(produced / f, existing / f, shallow=False) for f in files if (existing / f).exists())
        print("check: all fixture files bit-identical" if same else "check: FIXTURES DIFFER")
        return 0 if same else 1
    write(out_dir, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
