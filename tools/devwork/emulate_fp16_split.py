"""Numpy emulation of attn_decode's fp8 arithmetic (fp16 tiles, q and weights split into three fp16
parts after power-of-two scaling) against float64, over wide magnitudes: checks the scaling logic."""
import numpy as np
import ml_dtypes
rng = np.random.default_rng(1)
F8 = ml_dtypes.float8_e4m3fn

def pow2k(amax):
    if amax <= 0: return 0
    e = int(np.frexp(np.float32(amax))[1]) - 1  # amax in [2^e, 2^(e+1))
    return min(max(12 - e, -126), 126)

def split3(x):  # x float32 -> three float16 parts, residuals in fp32 like __fsub_rn
    h = x.astype(np.float16); r = (x - h.astype(np.float32)).astype(np.float32)
    m = r.astype(np.float16); l = (r - m.astype(np.float32)).astype(np.float16)
    return h, m, l

def mm(a16, b16):  # exact products, sum rounded to fp32 (the MMA's accumulation, idealised)
    return (a16.astype(np.float64) @ b16.astype(np.float64)).astype(np.float32)

worst = 0.0
for trial in range(300):
    D, N = 128, 64
    q = (rng.normal(0, 1, D) * 10.0 ** rng.uniform(-5, 0.5)).astype(np.float32)
    k = rng.normal(0, 1, (N, D)) * 10.0 ** rng.uniform(-3, 1, (N, 1))
    v = rng.normal(0, 1, (N, D)) * 10.0 ** rng.uniform(-6, 4, (N, 1))
    def enc(x):
        amax = np.abs(x).max(1, keepdims=True).astype(np.float32); sc = np.where(amax > 0, amax / np.float32(448), 1).astype(np.float32)
        return (x / sc).astype(np.float32).astype(F8), sc[:, 0]
    kc, ks = enc(k); vc, vs = enc(v)
    K = kc.astype(np.float32); V = vc.astype(np.float32)
    # reference in float64 from the same stored values
    s_ref = (K.astype(np.float64) @ q.astype(np.float64)) * ks * (D ** -0.5)
    p_ref = np.exp(s_ref - s_ref.max()); o_ref = (p_ref * vs) @ V.astype(np.float64) / p_ref.sum()
    # emulation
    kq = pow2k(np.abs(q).max()); qs = (q * np.float32(2.0 ** kq)).astype(np.float32)
    parts = split3(qs)
    sv = mm(K.astype(np.float16), parts[0]) + mm(K.astype(np.float16), parts[1])
    sv = (sv + mm(K.astype(np.float16), parts[2])).astype(np.float32)
    s = (sv * np.float32(2.0 ** -kq) * ks).astype(np.float32) * np.float32(D ** -0.5)
    p = np.exp(s - s.max()).astype(np.float32); l = p.sum(dtype=np.float32)
    w = (p * vs).astype(np.float32); kw = pow2k(w.max()); w = (w * np.float32(2.0 ** kw)).astype(np.float32)
    wp = split3(w)
    o = sum(mm(wp[i], V.astype(np.float16)) for i in range(3)).astype(np.float32) * np.float32(2.0 ** -kw) / l
    err = np.linalg.norm(o - o_ref) / max(np.linalg.norm(o_ref), 1e-300)
    worst = max(worst, err)
print("worst relative error over 300 sets:", worst)
