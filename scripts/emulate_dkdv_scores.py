"""CPU emulation of scores_dmma (native/flash_f32_products.cuh): the backward's
S = Q K^T of one 32 x 64 tile on the FP64 tensor cores, per warp and lane, through the PTX
fragment layouts (emulate_dmma_forward.mma), then read back in dot_rows's layout (thread
(ty, tx): rows 4 ty.., keys tx + 16c). Checks the indexing against float64.

    python3 scripts/emulate_dkdv_scores.py
"""

import numpy as np
from emulate_dmma_forward import mma

PAD, ROWS, KEYS, R, C = 4, 32, 64, 4, 4


def scores(q_tile, k_tile, d):
    ld, ls = d + PAD, KEYS + PAD
    tile = np.full(ROWS * ls, np.nan, np.float32)
    for w in range(4):
        row0, key0 = (w % 2) * 16, (w // 2) * 32
        acc = [[[0.0] * 4 for _ in range(32)] for _ in range(4)]
        for kk in range(0, d, 16):
            a = []
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                qa = (row0 + g) * ld + t
                a.append([float(q_tile[qa + kk + 4 * i + (8 * ld if j else 0)])
                          for i in range(4) for j in (0, 1)])
            for n in range(4):
                b = []
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    kb = (key0 + g) * ld + t
                    b.append([float(k_tile[kb + n * 8 * ld + kk + 4 * i]) for i in range(4)])
                acc[n] = mma(acc[n], a, b)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for n in range(4):
                col = key0 + 8 * n + 2 * t
                tile[(row0 + g) * ls + col : (row0 + g) * ls + col + 2] = acc[n][lane][0:2]
                tile[(row0 + g + 8) * ls + col : (row0 + g + 8) * ls + col + 2] = acc[n][lane][2:4]
    s = np.zeros((128, R, C), np.float32)
    for thread in range(128):
        tx, ty = thread & 15, thread >> 4
        for r in range(R):
            for c in range(C):
                s[thread, r, c] = tile[(ty * R + r) * ls + tx + 16 * c]
    return s


if __name__ == "__main__":
    rng = np.random.default_rng(1)
    for d in (32, 64, 96, 128):
        q = rng.uniform(-1, 1, (ROWS, d)).astype(np.float32)
        k = rng.uniform(-1, 1, (KEYS, d)).astype(np.float32)
        q_tile, k_tile = np.zeros(ROWS * (d + PAD), np.float32), np.zeros(KEYS * (d + PAD),
                                                                        np.float32)
        for r in range(ROWS):
            q_tile[r * (d + PAD) : r * (d + PAD) + d] = q[r]
        for r in range(KEYS):
            k_tile[r * (d + PAD) : r * (d + PAD) + d] = k[r]
        s = scores(q_tile, k_tile, d)
        ref = q.astype(np.float64) @ k.astype(np.float64).T
        worst = max(abs(float(s[th, r, c]) - ref[(th >> 4) * R + r, (th & 15) + 16 * c])
                    for th in range(128) for r in range(R) for c in range(C))
        print(f"d{d}: worst |S - float64| {worst:.2e}")
        assert worst < 1e-5
