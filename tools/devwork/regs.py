"""regs.py TREE FILE NAME...: registers and spills (ptxas -v) of kernels for sm_90 under NVRTC 13."""
import os, sys
tree, file, names = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path[:0] = [tree, os.path.join(tree, "tests")]
os.chdir(tree)
import kernels
import test_kernels_compile as T
c = T.nvrtc(sorted(T.WHEELS)[-1])
opts = [*kernels.OPTIONS, *kernels.file_options(file), *T.CUPY_OPTIONS, "-arch=sm_90", "--ptxas-options=-v"]
for n in names:
    ok, log, _ = c.compile(kernels.source(file), file, opts, [n])
    lines = [l for l in log.splitlines() if "registers" in l or "spill" in l or "error" in l]
    print(n, ok, *lines[-3:], sep="\n  ")
