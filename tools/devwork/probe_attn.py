"""attn_decode alone, one row, in graphs of 20 launches over 4 caches cycled past L2.
env: DUMP=prefix saves outputs (.npy) for bit comparisons across trees; NCU=1 eager launches only."""
import os, sys
import numpy as np, cupy
sys.path.insert(0, os.getcwd())
from kernels import launch as KL

SHAPES = {"8b": (8, 4, 128), "27b": (4, 6, 256), "35b": (2, 8, 256)}
PT = 256
ncu = os.environ.get("NCU") == "1"
dump = os.environ.get("DUMP")
rng = np.random.default_rng(0)
for name, (KH, G, D) in SHAPES.items():
    for kv8 in (False, True):
        for L in (8191, 2047):
            width = -(-(L + 1) // PT)
            ncache = 1 if ncu else 4
            cs = []
            for c in range(ncache):
                if kv8:
                    k = cupy.asarray(rng.integers(0, 256, (width, PT, KH, D), dtype=np.uint8) & 0x77)
                    v = cupy.asarray(rng.integers(0, 256, (width, PT, KH, D), dtype=np.uint8) & 0x77)
                    ks = cupy.asarray(rng.uniform(0.001, 0.01, (width, PT, KH)).astype(np.float32))
                    vs = cupy.asarray(rng.uniform(0.001, 0.01, (width, PT, KH)).astype(np.float32))
                else:
                    k = cupy.asarray((rng.normal(0, 1, (width, PT, KH, D)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
                    v = cupy.asarray((rng.normal(0, 1, (width, PT, KH, D)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
                    ks = vs = None
                cs.append((k, v, ks, vs))
            tables = cupy.asarray(np.arange(width, dtype=np.int32)[None])
            pos = cupy.asarray(np.array([L], np.int32))
            q = cupy.asarray(rng.normal(0, 1, (1, KH * G, D)).astype(np.float32))
            out = cupy.empty((1, KH * G, D), cupy.float32)

            def launch(c):
                k, v, ks, vs = cs[c % ncache]
                KL.attn_decode(kv8, q, KH * G * D, D, None, 0.0, None, 0, None, 0, 0, None, 0.0, None, 0, 0,
                               pos, tables, PT, k, v, ks, vs, KH, G, D, 0.0625, out, 1)
            launch(0); cupy.cuda.Device().synchronize()
            tag = f"{name} {'fp8 ' if kv8 else 'bf16'} L={L + 1}"
            if dump:
                np.save(f"{dump}_{name}_{int(kv8)}_{L}.npy", cupy.asnumpy(out))
            if ncu:
                for i in range(3): launch(i)
                cupy.cuda.Device().synchronize()
                print(tag, "eager x3"); continue
            s = cupy.cuda.Stream(non_blocking=True)
            with s:
                for i in range(20): launch(i)
                s.synchronize()
                s.begin_capture()
                for i in range(20): launch(i)
                g = s.end_capture()
                g.launch(s); s.synchronize()
                best = 1e9
                for rep in range(7):
                    e0, e1 = cupy.cuda.Event(), cupy.cuda.Event()
                    e0.record(s); g.launch(s); e1.record(s); e1.synchronize()
                    best = min(best, cupy.cuda.get_elapsed_time(e0, e1) * 1000 / 20)
            print(f"{tag}: {best:.2f} us/launch", flush=True)
