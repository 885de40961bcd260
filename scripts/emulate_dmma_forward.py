"""CPU emulation of forward_dmma (native/flash_f32_dmma.cuh: sm_90's f32 forward where D = Dv),
transcribed per warp and lane, with mma.sync m16n8k16 f64 done through the PTX fragment layouts
that scripts/dmma_probe.py verified on an H100, and the kernel's operand permutations (which key
or d each fragment slot holds, which column each output tile's column is). Compares against a
float64 softmax attention; a change to the kernel's indexing should pass here before a GPU run.

    python3 scripts/emulate_dmma_forward.py
"""

import numpy as np

ROWS = 32  # query rows a CTA (the kernel's kDmmaRows)
KEYS = 64
GROUPS = ROWS // 16  # warps a half of the keys (and of Dv): 16 rows each
QK_PAD, VPAD, PPAD = 16, 4, 8
PV_QUARTERS_DV = (128,)  # dmma_pv_quarters: each warp's P V over all rows, a quarter of Dv


def ko(i):
    """The key a P V fragment slot t + 4i holds, past 2t."""
    return (i & 1) + 8 * (i >> 1)


def a_fragments(tile, row0, ld, kk, slot_column):
    """Each lane's A fragment of rows row0 + g and row0 + g + 8 of a row-major tile (row stride
    ld): slot t + 4i holds column kk + slot_column(t, i), in the PTX register order."""
    frags = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        base = (row0 + g) * ld + kk
        frags.append([float(tile[base + r * 8 * ld + slot_column(t, i)])
                      for i in range(4) for r in (0, 1)])
    return frags


def column(nt, n, c):
    """dmma_column<NT>(n, c): tile n's column c within the warp's half of Dv."""
    w = 4 if nt - n // 4 * 4 >= 4 else nt - n // 4 * 4
    return 32 * (n // 4) + w * c + n % 4
LOG2E, LN2 = 1.4426950408889634, 0.6931471805599453


def mma(c_frags, a_frags, b_frags):
    """c_frags[lane][4], a_frags[lane][8], b_frags[lane][4] -> new c_frags (D = A B + C)."""
    A = np.zeros((16, 16))
    B = np.zeros((16, 8))
    C = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        for i in range(4):
            A[g, t + 4 * i] = a_frags[lane][2 * i]
            A[g + 8, t + 4 * i] = a_frags[lane][2 * i + 1]
            B[t + 4 * i, g] = b_frags[lane][i]
        C[g, 2 * t], C[g, 2 * t + 1] = c_frags[lane][0], c_frags[lane][1]
        C[g + 8, 2 * t], C[g + 8, 2 * t + 1] = c_frags[lane][2], c_frags[lane][3]
    Dm = A @ B + C
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out.append([Dm[g, 2 * t], Dm[g, 2 * t + 1], Dm[g + 8, 2 * t], Dm[g + 8, 2 * t + 1]])
    return out


class Mask:
    def __init__(self, len_q, len_kv, causal, left, right):
        self.len_q, self.len_kv = len_q, len_kv
        self.diag = len_kv - len_q if causal == 2 else 0
        self.causal, self.left, self.right = causal != 0, left, right

    def lo(self, i):
        if self.left < 0:
            return 0
        return min(max(i + self.diag - self.left, 0), self.len_kv)

    def hi(self, i):
        if i >= self.len_q:
            return -1
        last = self.len_kv - 1
        if self.causal:
            last = min(last, i + self.diag)
        if self.right >= 0:
            last = min(last, i + self.diag + self.right)
        return max(last, -1)


def forward_cta(Q, K, V, i0, D, DV, scale, mask):
    """One CTA: Q [len_q, D], K [len_kv, D], V [len_kv, DV] (float32); rows i0..i0+63."""
    len_q, len_kv = Q.shape[0], K.shape[0]
    LQ, LV, LP = D + QK_PAD, DV + VPAD, KEYS + PPAD
    f32 = np.float32
    q_tile = np.zeros(ROWS * LQ, f32)
    k_tile = np.zeros(KEYS * LQ, f32)
    v_tile = np.zeros(KEYS * LV, f32)
    p_tile = np.zeros(ROWS * LP, f32)
    stats = np.zeros(2 * ROWS, f32)
    for r in range(ROWS):
        if i0 + r < len_q:
            q_tile[r * LQ : r * LQ + D] = Q[i0 + r]

    def load_kv(j0):
        k_tile[:] = 0
        v_tile[:] = 0
        for r in range(KEYS):
            if j0 + r < len_kv:
                k_tile[r * LQ : r * LQ + D] = K[j0 + r]
                v_tile[r * LV : r * LV + DV] = V[j0 + r]

    NT = DV // 16
    quarters = DV in PV_QUARTERS_DV
    # A warp's P V: MT tiles of 16 rows from pv_row0, NO output tiles of 8 columns from pv_col0.
    MT, NO = (2, DV // 32) if quarters else (1, NT)

    def pv_place(w):
        if quarters:
            return 0, w * (DV // 4)
        return (w % GROUPS) * 16, (w // GROUPS) * (DV // 2)

    alphas = np.zeros(ROWS, f32)
    sc = f32(scale * LOG2E)
    warps = range(2 * GROUPS)
    o = {(w, ln): np.zeros((MT, NO, 4)) for w in warps for ln in range(32)}
    m = {(w, ln): [f32(-np.inf)] * 2 for w in warps for ln in range(32)}
    lsum = {(w, ln): [f32(0)] * 2 for w in warps for ln in range(32)}
    i_last = min(i0 + ROWS, len_q) - 1
    j_lo, j_hi = mask.lo(i0), mask.hi(i_last)
    bx, by = j_lo // KEYS, (j_hi // KEYS if j_hi >= j_lo else j_lo // KEYS - 1)
    for kb in range(bx, by + 1):
        j0 = kb * KEYS
        load_kv(j0)
        whole = mask.lo(i_last) <= j0 and mask.hi(i0) >= j0 + KEYS - 1
        s_all = {}
        for w in warps:
            half, row0 = w // GROUPS, (w % GROUPS) * 16
            acc = [[[0.0] * 4 for _ in range(32)] for _ in range(4)]
            for kk in range(0, D, 16):
                a = a_fragments(q_tile, row0, LQ, kk, lambda t, i: 4 * t + i)
                for n in range(4):
                    bfr = []
                    for lane in range(32):
                        g, t = lane >> 2, lane & 3
                        kb_ = (half * 32 + g) * LQ + 4 * t
                        bfr.append([float(k_tile[kb_ + n * 8 * LQ + kk + i]) for i in range(4)])
                    acc[n] = mma(acc[n], a, bfr)
            bm = {}
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                i_a = i0 + row0 + g
                i_b = i_a + 8
                s = [[0] * 8, [0] * 8]
                bmax = [f32(-np.inf)] * 2
                for n in range(4):
                    for e in range(2):
                        j = j0 + half * 32 + 8 * n + 2 * t + e
                        sa = f32(f32(acc[n][lane][e]) * sc)
                        sb = f32(f32(acc[n][lane][2 + e]) * sc)
                        if not whole:
                            sa = sa if mask.lo(i_a) <= j <= mask.hi(i_a) else f32(-np.inf)
                            sb = sb if mask.lo(i_b) <= j <= mask.hi(i_b) else f32(-np.inf)
                        s[0][2 * n + e], s[1][2 * n + e] = sa, sb
                        bmax = [max(bmax[0], sa), max(bmax[1], sb)]
                s_all[(w, lane)] = s
                bm[lane] = bmax
            for lane in range(32):  # butterfly over t
                g, t = lane >> 2, lane & 3
                if t == 0:
                    red = [max(bm[4 * g + u][r] for u in range(4)) for r in range(2)]
                    stats[half * ROWS + row0 + g] = red[0]
                    stats[half * ROWS + row0 + g + 8] = red[1]
        # sync; softmax, P
        for w in warps:
            half, row0 = w // GROUPS, (w % GROUPS) * 16
            for lane in range(32):
                g, t = lane >> 2, lane & 3
                s = s_all[(w, lane)]
                alpha = [0.0, 0.0]
                for r in range(2):
                    row = row0 + g + 8 * r
                    m_new = max(m[(w, lane)][r], max(stats[row], stats[ROWS + row]))
                    base = f32(0) if m_new == -np.inf else m_new
                    alpha[r] = float(np.exp2(f32(m[(w, lane)][r] - base)))
                    tot = f32(0)
                    for c in range(8):
                        s[r][c] = f32(np.exp2(f32(s[r][c] - base)))
                        tot = f32(tot + s[r][c])
                    lsum[(w, lane)][r] = f32(lsum[(w, lane)][r] * f32(alpha[r]) + tot)
                    m[(w, lane)][r] = m_new
                if quarters:
                    if half == 0 and t == 0:
                        alphas[row0 + g], alphas[row0 + g + 8] = alpha
                else:
                    o[(w, lane)][0, :, 0:2] *= alpha[0]
                    o[(w, lane)][0, :, 2:4] *= alpha[1]
                for n in range(4):
                    col = half * 32 + 8 * n + 2 * t
                    p_tile[(row0 + g) * LP + col : (row0 + g) * LP + col + 2] = s[0][
                        2 * n : 2 * n + 2
                    ]
                    p_tile[(row0 + g + 8) * LP + col : (row0 + g + 8) * LP + col + 2] = s[1][
                        2 * n : 2 * n + 2
                    ]
        # sync; P V
        for w in warps:
            pv_row0, pv_col0 = pv_place(w)
            if quarters:
                for lane in range(32):
                    g = lane >> 2
                    for mt in range(MT):
                        o[(w, lane)][mt, :, 0:2] *= float(alphas[16 * mt + g])
                        o[(w, lane)][mt, :, 2:4] *= float(alphas[16 * mt + g + 8])
            for kk in range(0, KEYS, 16):
                for mt in range(MT):
                    a = a_fragments(p_tile, pv_row0 + 16 * mt, LP, kk, lambda t, i: 2 * t + ko(i))
                    for n in range(NO):
                        bfr = []
                        for lane in range(32):
                            g, t = lane >> 2, lane & 3
                            vb = 2 * t * LV + pv_col0 + column(NO, n, g)
                            bfr.append([float(v_tile[vb + (kk + ko(i)) * LV]) for i in range(4)])
                        cf = [list(o[(w, lane)][mt, n]) for lane in range(32)]
                        res = mma(cf, a, bfr)
                        for lane in range(32):
                            o[(w, lane)][mt, n] = res[lane]
    out = np.full((ROWS, DV), np.nan)
    lse = np.full(ROWS, np.nan)
    stats[:] = 0
    for w in warps:
        half, row0 = w // GROUPS, (w % GROUPS) * 16
        for g in range(8):
            for r in range(2):
                stats[half * ROWS + row0 + g + 8 * r] = sum(
                    lsum[(w, 4 * g + u)][r] for u in range(4)
                )
    for w in warps:
        half, row0 = w // GROUPS, (w % GROUPS) * 16
        pv_row0, pv_col0 = pv_place(w)
        for lane in range(32):
            g, t = lane >> 2, lane & 3
            for mt in range(MT):
                for r in range(2):
                    row = pv_row0 + 16 * mt + g + 8 * r
                    if i0 + row >= len_q:
                        continue
                    tot = stats[row] + stats[ROWS + row]
                    for n in range(NO):
                        for e in range(2):
                            out[row, pv_col0 + column(NO, n, 2 * t + e)] = (
                                o[(w, lane)][mt, n][2 * r + e] / tot if tot > 0 else 0.0
                            )
            for r in range(2):
                row = row0 + g + 8 * r
                if i0 + row >= len_q:
                    continue
                tot = stats[row] + stats[ROWS + row]
                if half == 0 and t == 0:
                    lse[row] = m[(w, lane)][r] * LN2 + np.log(tot) if tot > 0 else -np.inf
    return out, lse


def reference(Q, K, V, scale, mask):
    Qd, Kd, Vd = (x.astype(np.float64) for x in (Q, K, V))
    s = Qd @ Kd.T * scale
    for i in range(Q.shape[0]):
        for j in range(K.shape[0]):
            if not (mask.lo(i) <= j <= mask.hi(i)):
                s[i, j] = -np.inf
    mx = s.max(axis=1, keepdims=True, initial=-np.inf)
    ok = np.isfinite(mx[:, 0])
    p = np.where(np.isfinite(s), np.exp(s - np.where(np.isfinite(mx), mx, 0)), 0)
    den = p.sum(axis=1)
    out = np.where(den[:, None] > 0, (p @ Vd) / np.where(den > 0, den, 1)[:, None], 0)
    lse = np.where(
        ok & (den > 0), np.log(np.where(den > 0, den, 1)) + np.where(ok, mx[:, 0], 0), -np.inf
    )
    return out, lse


if __name__ == "__main__":
    rng = np.random.default_rng(0)
    for lq, lkv, D, DV, causal, left, right in [
        (70, 150, 32, 32, 2, -1, -1),
        (64, 64, 16, 64, 0, -1, -1),
        (70, 90, 32, 128, 2, -1, -1),  # Dv 128: P V in quarters of Dv
        (100, 130, 32, 96, 1, 20, -1),  # Dv 96: a chunk of 2 output tiles after one of 4
        (40, 100, 16, 32, 2, 30, 0),
        (100, 40, 16, 32, 2, -1, -1),  # bottom-right, taller than wide: rows without keys
        (64, 0, 16, 32, 0, -1, -1),  # no keys at all
    ]:
        Q = rng.uniform(-1, 1, (lq, D)).astype(np.float32)
        K = rng.uniform(-1, 1, (lkv, D)).astype(np.float32)
        V = rng.uniform(-1, 1, (lkv, DV)).astype(np.float32)
        mask = Mask(lq, lkv, causal, left, right)
        ref_out, ref_lse = reference(Q, K, V, D**-0.5, mask)
        worst = 0.0
        for i0 in range(0, lq, ROWS):
            out, lse = forward_cta(Q, K, V, i0, D, DV, D**-0.5, mask)
            n = min(ROWS, lq - i0)
            assert not np.isnan(out[:n]).any(), "an output element was not written"
            worst = max(worst, np.abs(out[:n] - ref_out[i0 : i0 + n]).max())
            fin = np.isfinite(ref_lse[i0 : i0 + n])
            assert np.array_equal(fin, np.isfinite(lse[:n])), (i0, lse[:n], ref_lse[i0 : i0 + n])
            worst = max(worst, np.abs(lse[:n][fin] - ref_lse[i0 : i0 + n][fin]).max(initial=0))
        print(lq, lkv, D, DV, causal, left, right, "worst", worst)
