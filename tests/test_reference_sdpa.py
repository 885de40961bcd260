"""The float64 SDPA oracle against explicit loops (forward) and central differences (backward)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from numeric import numeric_grad

from opfacade._backends.reference import sdpa_backward, sdpa_forward, sdpa_mask

B, D, DV = 2, 3, 2

# Each case: head counts, padded lengths and the sdpa options that differ from the defaults.
# "bias" names the bias's shape with letters (B, H, S, K = batch, Hq, Sq, Skv; 1 = broadcast).
CASES = {
    "plain": dict(hq=3, hkv=3, sq=4, skv=5),
    "scale": dict(hq=2, hkv=2, sq=3, skv=3, scale=0.7),
    "causal_top_left": dict(hq=3, hkv=3, sq=5, skv=3, causal="top_left"),
    "causal_top_left_wide": dict(hq=2, hkv=2, sq=3, skv=5, causal="top_left"),
    "causal_bottom_right": dict(hq=3, hkv=3, sq=3, skv=5, causal="bottom_right"),
    "causal_bottom_right_tall": dict(hq=2, hkv=2, sq=5, skv=3, causal="bottom_right"),
    "window_left_only": dict(hq=2, hkv=2, sq=5, skv=5, window=(1, None)),
    "window_right_only": dict(hq=2, hkv=2, sq=4, skv=5, window=(None, 1)),
    "window_both": dict(hq=2, hkv=2, sq=5, skv=4, window=(1, 2)),
    "window_zero": dict(hq=2, hkv=2, sq=3, skv=4, window=(0, 0)),
    "window_bottom_right": dict(
        hq=2, hkv=2, sq=3, skv=5, window=(2, 0), alignment="bottom_right"
    ),
    "window_causal_top_left": dict(hq=2, hkv=2, sq=4, skv=5, causal="top_left", window=(1, 3)),
    "window_causal_bottom_right": dict(
        hq=2, hkv=2, sq=3, skv=5, causal="bottom_right", window=(1, None)
    ),
    "gqa": dict(hq=4, hkv=2, sq=4, skv=5),
    "mqa_causal": dict(hq=3, hkv=1, sq=4, skv=3, causal="bottom_right"),
    "bias_full": dict(hq=2, hkv=2, sq=3, skv=4, bias="BHSK"),
    "bias_heads": dict(hq=2, hkv=2, sq=3, skv=4, bias="1HSK"),
    "bias_batch": dict(hq=2, hkv=2, sq=3, skv=4, bias="B1SK"),
    "bias_shared": dict(hq=2, hkv=2, sq=3, skv=4, bias="11SK"),
    "bias_2d": dict(hq=2, hkv=2, sq=3, skv=4, bias="SK"),
    "bias_row": dict(hq=2, hkv=2, sq=3, skv=4, bias="B11K"),
    "alibi": dict(hq=3, hkv=3, sq=4, skv=5, alibi=True),
    "alibi_causal_gqa": dict(hq=4, hkv=2, sq=4, skv=4, alibi=True, causal="top_left"),
    "dropout": dict(hq=2, hkv=2, sq=4, skv=5, dropout_p=0.3),
    "dropout_gqa_causal": dict(hq=4, hkv=1, sq=3, skv=4, dropout_p=0.5, causal="bottom_right"),
    "padding": dict(hq=2, hkv=2, sq=4, skv=5, len_q=(3, 4), len_kv=(5, 2)),
    "padding_empty_query": dict(hq=2, hkv=2, sq=3, skv=4, len_q=(0, 2), len_kv=(4, 3)),
    "padding_empty_keys": dict(hq=2, hkv=2, sq=3, skv=4, len_q=(3, 2), len_kv=(2, 0)),
    "padding_causal_bottom_right": dict(
        hq=2, hkv=2, sq=4, skv=5, len_q=(2, 4), len_kv=(5, 3), causal="bottom_right"
    ),
    "padding_window_bottom_right": dict(
        hq=2, hkv=2, sq=4, skv=5, len_q=(3, 4), len_kv=(4, 5), window=(1, 1),
        alignment="bottom_right",
    ),
    "everything": dict(
        hq=4, hkv=2, sq=4, skv=5, causal="bottom_right", window=(2, None), bias="1HSK",
        alibi=True, dropout_p=0.25, len_q=(4, 3), len_kv=(5, 4), scale=0.9,
    ),
}


def make_inputs(case: dict, seed: int):
    """Random q, k, v, sdpa keyword options and an output weighting G for one case."""
    rng = np.random.default_rng(seed)
    hq, hkv, sq, skv = case["hq"], case["hkv"], case["sq"], case["skv"]
    q = rng.standard_normal((B, hq, sq, D))
    k = rng.standard_normal((B, hkv, skv, D))
    v = rng.standard_normal((B, hkv, skv, DV))
    passed = ("scale", "causal", "window", "alignment")
    options = {name: case[name] for name in passed if name in case}
    if "bias" in case:
        sizes = {"B": B, "H": hq, "S": sq, "K": skv, "1": 1}
        options["bias"] = rng.standard_normal(tuple(sizes[c] for c in case["bias"]))
    if case.get("alibi"):
        options["alibi_slopes"] = rng.uniform(-1.0, 1.0, hq)
    if "dropout_p" in case:
        options["dropout_p"] = case["dropout_p"]
        options["dropout_keep"] = rng.random((B, hq, sq, skv)) >= case["dropout_p"]
    if "len_q" in case:
        options["seq_len_q"] = np.array(case["len_q"])
        options["seq_len_kv"] = np.array(case["len_kv"])
    weights = rng.standard_normal((B, hq, sq, DV))
    return q, k, v, options, weights


def is_allowed(i: int, j: int, offset: int, causal, window) -> bool:
    """The brief's mask definition, written out for one (query, key) pair."""
    if causal is not None and j > i + offset:
        return False
    if window is not None:
        left, right = window
        if left is not None and j < i + offset - left:
            return False
        if right is not None and j > i + offset + right:
            return False
    return True


def loop_sdpa(q, k, v, *, scale=None, causal=None, window=None, alignment=None, bias=None,
              alibi_slopes=None, dropout_p=0.0, dropout_keep=None, seq_len_q=None,
              seq_len_kv=None):
    """Attention one query row at a time with Python scalars."""
    batch, heads, seq_q, dim = q.shape
    heads_kv, seq_kv = k.shape[1], k.shape[2]
    group = heads // heads_kv
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    out = np.zeros((batch, heads, seq_q, v.shape[3]))
    lse = np.full((batch, heads, seq_q), -np.inf)
    full_bias = None if bias is None else np.broadcast_to(bias, (batch, heads, seq_q, seq_kv))
    bottom_right = (causal or alignment) == "bottom_right"
    for b in range(batch):
        len_q = seq_q if seq_len_q is None else int(seq_len_q[b])
        len_kv = seq_kv if seq_len_kv is None else int(seq_len_kv[b])
        offset = len_kv - len_q if bottom_right else 0
        for h in range(heads):
            g = h // group
            for i in range(len_q):
                scores = {}
                for j in range(len_kv):
                    if not is_allowed(i, j, offset, causal, window):
                        continue
                    s = scale * sum(q[b, h, i, t] * k[b, g, j, t] for t in range(dim))
                    if full_bias is not None:
                        s += full_bias[b, h, i, j]
                    if alibi_slopes is not None:
                        s += alibi_slopes[h] * (j - i)
                    if s > -math.inf:
                        scores[j] = s
                if not scores:
                    continue
                top = max(scores.values())
                total = sum(math.exp(s - top) for s in scores.values())
                lse[b, h, i] = top + math.log(total)
                for j, s in scores.items():
                    p = math.exp(s - top) / total
                    if dropout_keep is not None:
                        p *= float(dropout_keep[b, h, i, j]) / (1.0 - dropout_p)
                    out[b, h, i] += p * v[b, g, j]
    return out, lse


def assert_grad_close(analytic: np.ndarray, numeric: np.ndarray) -> None:
    assert analytic.shape == numeric.shape
    np.testing.assert_allclose(analytic, numeric, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_loops(name):
    q, k, v, options, _ = make_inputs(CASES[name], seed=len(name))
    out, lse = sdpa_forward(q, k, v, **options)
    want_out, want_lse = loop_sdpa(q, k, v, **options)
    assert out.dtype == np.float64 and lse.dtype == np.float64
    assert out.shape == want_out.shape and lse.shape == want_lse.shape
    assert not np.isnan(out).any() and not np.isnan(lse).any()
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", list(CASES))
def test_backward_matches_finite_differences(name):
    q, k, v, options, weights = make_inputs(CASES[name], seed=100 + len(name))
    grads = sdpa_backward(q, k, v, weights, need_bias_grad=True, **options)
    tensors = {"q": q, "k": k, "v": v}
    if "bias" in options:
        tensors["bias"] = options.pop("bias")
    assert set(grads) == {"d" + key for key in tensors}

    for key, value in tensors.items():
        def loss(bumped, key=key):
            inputs = {**tensors, key: bumped}
            out, _ = sdpa_forward(inputs["q"], inputs["k"], inputs["v"],
                                  bias=inputs.get("bias"), **options)
            return float(np.sum(out * weights))

        assert_grad_close(grads["d" + key], numeric_grad(loss, value))


def test_fully_masked_rows_give_zero_output_and_no_gradient():
    q, k, v, options, weights = make_inputs(CASES["causal_bottom_right_tall"], seed=7)
    out, lse = sdpa_forward(q, k, v, **options)
    # Sq=5 over Skv=3 aligned bottom-right: rows 0 and 1 see no key.
    assert np.all(out[:, :, :2] == 0.0) and np.all(np.isneginf(lse[:, :, :2]))
    assert np.all(np.isfinite(lse[:, :, 2:]))
    grads = sdpa_backward(q, k, v, weights, **options)
    assert np.all(grads["dq"][:, :, :2] == 0.0)
    assert all(np.isfinite(g).all() for g in grads.values())


def test_padding_zeroes_padded_rows_and_their_gradients():
    q, k, v, options, weights = make_inputs(CASES["padding_empty_keys"], seed=11)
    out, lse = sdpa_forward(q, k, v, **options)
    # Batch 1 has 2 query rows and no key; batch 0 has 3 rows and 2 keys.
    assert np.all(out[1] == 0.0) and np.all(np.isneginf(lse[1]))
    assert np.all(np.isfinite(lse[0]))
    grads = sdpa_backward(q, k, v, weights, **options)
    assert np.all(grads["dk"][0, :, 2:] == 0.0) and np.all(grads["dv"][0, :, 2:] == 0.0)
    assert np.all(grads["dq"][1] == 0.0)


def test_minus_infinity_bias_masks_like_a_mask():
    q, k, v, options, _ = make_inputs(CASES["plain"], seed=3)
    bias = np.zeros((1, 1, 4, 5))
    bias[..., 0, :] = -np.inf  # query row 0 sees nothing
    bias[..., 1, 2:] = -np.inf  # query row 1 sees keys 0 and 1
    out, lse = sdpa_forward(q, k, v, bias=bias)
    want_out, want_lse = loop_sdpa(q, k, v, bias=bias)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    assert np.all(np.isneginf(lse[:, :, 0])) and np.all(out[:, :, 0] == 0.0)
    np.testing.assert_allclose(lse[:, :, 1:], want_lse[:, :, 1:], rtol=1e-12)


def test_inputs_of_any_float_dtype_are_computed_in_float64():
    q, k, v, _, _ = make_inputs(CASES["plain"], seed=5)
    out32, lse32 = sdpa_forward(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32))
    out64, _ = sdpa_forward(*(x.astype(np.float32).astype(np.float64) for x in (q, k, v)))
    assert out32.dtype == np.float64 and lse32.dtype == np.float64
    np.testing.assert_array_equal(out32, out64)


def test_mask_window_alignment_follows_causal():
    top = sdpa_mask(1, 3, 5, window=(1, 0))
    bottom = sdpa_mask(1, 3, 5, window=(1, 0), alignment="bottom_right")
    assert top[0].tolist() == [
        [True, False, False, False, False],
        [True, True, False, False, False],
        [False, True, True, False, False],
    ]
    assert bottom[0].tolist() == [
        [False, True, True, False, False],
        [False, False, True, True, False],
        [False, False, False, True, True],
    ]
    causal = sdpa_mask(1, 3, 5, causal="bottom_right", window=(1, None))
    np.testing.assert_array_equal(causal, bottom)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(causal="diagonal"), "causal must be one of"),
        (dict(causal="top_left", alignment="bottom_right"), "alignment must match causal"),
        (dict(window=(-1, 0)), "window left"),
        (dict(dropout_p=0.1), "dropout_keep is required"),
        (dict(bias=np.zeros((2, 4, 5))), "bias must broadcast"),
        (dict(alibi_slopes=np.ones(2)), "alibi_slopes must have shape"),
        (dict(seq_len_q=np.array([5, 1])), "seq_len_q must lie in"),
    ],
)
def test_invalid_options_raise_value_error(kwargs, message):
    q, k, v, _, _ = make_inputs(CASES["plain"], seed=1)
    with pytest.raises(ValueError, match=message):
        sdpa_forward(q, k, v, **kwargs)


def test_heads_must_group():
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((1, 3, 2, 2)), rng.standard_normal((1, 2, 2, 2))
    with pytest.raises(ValueError, match="multiple of Hkv"):
        sdpa_forward(q, k, k)
