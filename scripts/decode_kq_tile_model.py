"""A lane-level NumPy model of the decode tile docs/DECODE.md proposes ("A design for the lead"):
K and V as mma.m16n8k16's A operand, Q and P as its B operand, so that every product row is a
key (scores) or a head dimension (output) and no row is padding. It checks the index mappings
only, in float64 (no rounding to the element type), against plain matrix products, for one
warp's 16 keys at D 128 and 4 or 8 query rows, and the scores of the R 4 tile that reads K in
whole 128-byte lines (scores_paired). The kernel is native/decode_kq.cuh.

    python3 scripts/decode_kq_tile_model.py

Fragments, as PTX's "Matrix fragments for mma.m16n8k16" lays them out (lane = 4 gid + tig):
A (16 x 16, row-major) a0 = A[gid][2 tig, +1], a1 = A[gid + 8][2 tig, +1], a2 = A[gid][2 tig + 8,
+9], a3 = A[gid + 8][2 tig + 8, +9]; B (16 x 8) b0 = B[2 tig, +1][gid], b1 = B[2 tig + 8, +9][gid];
C (16 x 8) c0, c1 = C[gid][2 tig, +1], c2, c3 = C[gid + 8][2 tig, +1]. A register's pair is
(low half, high half).
"""

from __future__ import annotations

import numpy as np

LANES, D, KEYS = 32, 128, 16
VEC = 8  # elements of T in a 16-byte vector


def mma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """D = A B + C from every lane's fragments: a [32, 4, 2], b [32, 2, 2], c [32, 4]."""
    big_a, big_b = np.zeros((16, 16)), np.zeros((16, 8))
    for lane in range(LANES):
        gid, tig = divmod(lane, 4)
        for reg, (row, col) in enumerate(((gid, 2 * tig), (gid + 8, 2 * tig),
                                          (gid, 2 * tig + 8), (gid + 8, 2 * tig + 8))):
            big_a[row, col:col + 2] = a[lane, reg]
        for reg, row in enumerate((2 * tig, 2 * tig + 8)):
            big_b[row:row + 2, gid] = b[lane, reg]
    product = big_a @ big_b
    out = c.copy()
    for lane in range(LANES):
        gid, tig = divmod(lane, 4)
        out[lane] += [product[gid, 2 * tig], product[gid, 2 * tig + 1],
                      product[gid + 8, 2 * tig], product[gid + 8, 2 * tig + 1]]
    return out


def transposed(words: np.ndarray) -> np.ndarray:
    """movmatrix.sync.aligned.m8n8.trans.b16: lane (gid, tig) holds row gid, columns 2 tig and
    2 tig + 1 of an 8 x 8 matrix; afterwards the same of its transpose. words [32, 2]."""
    matrix = np.zeros((8, 8))
    for lane in range(LANES):
        gid, tig = divmod(lane, 4)
        matrix[gid, 2 * tig:2 * tig + 2] = words[lane]
    return np.array([matrix.T[lane // 4, 2 * (lane % 4):2 * (lane % 4) + 2]
                     for lane in range(LANES)])


def scores(k: np.ndarray, q: np.ndarray) -> np.ndarray:
    """S^T = K Q^T for 16 keys: c [32, 4] (keys gid, gid + 8; rows 2 tig, 2 tig + 1). Lane (gid,
    tig) loads vectors 4 p + tig of keys gid and gid + 8 (p = 0..3), and of query row gid; a
    vector's words 0, 1 feed k-step 2 p and words 2, 3 k-step 2 p + 1."""
    c = np.zeros((LANES, 4))
    for p in range(D // (4 * VEC)):
        for half in range(2):  # k-steps 2 p and 2 p + 1
            a, b = np.zeros((LANES, 4, 2)), np.zeros((LANES, 2, 2))
            for lane in range(LANES):
                gid, tig = divmod(lane, 4)
                base = (4 * p + tig) * VEC + 4 * half  # this k-step's 4 elements of the vector
                a[lane] = [k[gid, base:base + 2], k[gid + 8, base:base + 2],
                           k[gid, base + 2:base + 4], k[gid + 8, base + 2:base + 4]]
                b[lane] = [q[gid, base:base + 2], q[gid, base + 2:base + 4]]
            c = mma(a, b, c)
    return c


def shfl_xor(values: np.ndarray, mask: int) -> np.ndarray:
    """__shfl_xor_sync over a warp: lane i gets lane i ^ mask's value. values [32]."""
    return values[np.arange(LANES) ^ mask]


def paired_load(lane: int, block: int, h: int, p: int) -> tuple[int, int]:
    """The 4-row build's K load (block, h, p) of ``lane``: (key of the 16-key group, 16-byte
    vector of its row), the same vector index its query row's B words come from."""
    gid, tig = divmod(lane, 4)
    upper, row = divmod(gid, 4)
    return 8 * block + row + 4 * h, 4 * (2 * p + upper) + tig


def scores_paired(k: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The R 4 tile's scores (decode_kq.cuh, K in whole lines): the same c [32, 4] as scores()
    for rows 0-3 (lanes tig < 2; the others hold padding). Lane (gid, tig), a = gid // 4,
    b = gid % 4, loads for block bl and h the vectors 4 (2 p + a) + tig (p = 0, 1) of key
    8 bl + b + 4 h, and query row b's same vectors; each load instruction (bl, h, p) reads 4 keys,
    8 lanes a key, 128 contiguous bytes each. pair_scores adds the quarters across lanes."""
    out = np.zeros((LANES, 4))
    for block in range(2):
        c = np.zeros((LANES, 4))
        for p in range(2):
            for half in range(2):  # the vector's words 2 half, 2 half + 1
                a, b = np.zeros((LANES, 4, 2)), np.zeros((LANES, 2, 2))
                for lane in range(LANES):
                    (key0, vector), (key8, _) = (paired_load(lane, block, h, p) for h in (0, 1))
                    row = key0 - 8 * block  # the query row of this lane's B column, gid % 4
                    base = vector * VEC + 4 * half  # A rows gid (key0) and gid + 8 (key8)
                    a[lane] = [k[key0, base:base + 2], k[key8, base:base + 2],
                               k[key0, base + 2:base + 4], k[key8, base + 2:base + 4]]
                    b[lane] = [q[row, base:base + 2], q[row, base + 2:base + 4]]
                c = mma(a, b, c)
        total = c + np.stack([shfl_xor(c[:, e], 18) for e in range(4)], axis=1)
        high = np.stack([shfl_xor(total[:, 2 + e], 16) for e in range(2)], axis=1)
        upper = (np.arange(LANES) // 4 >= 4)[:, None]
        out[:, 2 * block:2 * block + 2] = np.where(upper, high, total[:, 0:2])
    return out


def output(v: np.ndarray, c: np.ndarray) -> np.ndarray:
    """O^T = V^T P^T with P = the scores c: accumulators [8 m-tiles, 32, 4]. P's B words are the
    transposes of (c0, c1) and (c2, c3); V's A words pair keys (2 tig, 2 tig + 1) and (2 tig + 8,
    2 tig + 9) at one d, from vectors gid and gid + 8 of those keys: m-tile mt's row r < 8 is
    d = 8 r + mt, row r + 8 is d = 64 + 8 r + mt."""
    b = np.stack([transposed(c[:, 0:2]), transposed(c[:, 2:4])], axis=1)  # [32, 2, 2]
    acc = np.zeros((D // 16, LANES, 4))
    for mt in range(D // 16):
        a = np.zeros((LANES, 4, 2))
        for lane in range(LANES):
            gid, tig = divmod(lane, 4)
            low, high = 8 * gid + mt, 64 + 8 * gid + mt  # the d of rows gid and gid + 8
            for reg, (d, key) in enumerate(((low, 2 * tig), (high, 2 * tig),
                                            (low, 2 * tig + 8), (high, 2 * tig + 8))):
                a[lane, reg] = v[key:key + 2, d]  # a PRMT of the two keys' words
        acc[mt] = mma(a, b, acc[mt])
    return acc


def check(rows: int, seed: int, paired: bool = False) -> None:
    rng = np.random.default_rng(seed)
    k, v = rng.standard_normal((KEYS, D)), rng.standard_normal((KEYS, D))
    q = np.zeros((8, D))
    q[:rows] = rng.standard_normal((rows, D))  # B's columns past the rows are zeros
    c = scores_paired(k, q) if paired else scores(k, q)
    want = k @ q.T  # [keys, rows]
    for lane in range(LANES):
        gid, tig = divmod(lane, 4)
        if paired and tig >= 2:  # padding rows 4-7: garbage, masked in the kernel
            c[lane] = [want[gid, 2 * tig], want[gid, 2 * tig + 1], want[gid + 8, 2 * tig],
                       want[gid + 8, 2 * tig + 1]]
        got = [c[lane, 0], c[lane, 1], c[lane, 2], c[lane, 3]]
        exp = [want[gid, 2 * tig], want[gid, 2 * tig + 1], want[gid + 8, 2 * tig],
               want[gid + 8, 2 * tig + 1]]
        np.testing.assert_allclose(got, exp, rtol=1e-12, atol=1e-12)
    acc = output(v, c)
    want_out = (v.T @ want)  # O^T [d, rows] with P = the raw scores (weights come later)
    for mt in range(D // 16):
        for lane in range(LANES):
            gid, tig = divmod(lane, 4)
            low, high = 8 * gid + mt, 64 + 8 * gid + mt
            exp = [want_out[low, 2 * tig], want_out[low, 2 * tig + 1],
                   want_out[high, 2 * tig], want_out[high, 2 * tig + 1]]
            np.testing.assert_allclose(acc[mt, lane], exp, rtol=1e-12, atol=1e-10)
    layout = "R 4, K in whole lines" if paired else "R 8"
    print(f"{layout}, rows {rows}, seed {seed}: scores and output fragments match K Q^T and "
          "V^T P^T")


if __name__ == "__main__":
    for rows, seed in ((4, 0), (8, 1), (1, 2)):
        check(rows, seed)
    for rows, seed in ((4, 3), (3, 4), (1, 5)):
        check(rows, seed, paired=True)
