"""sass.py TREE FILE NAME: the kernel's SASS (sm_90, NVRTC 13) to stdout."""
import os, subprocess, sys, tempfile
tree, file, name = sys.argv[1:4]
sys.path[:0] = [tree, os.path.join(tree, "tests")]
os.chdir(tree)
import kernels
import test_kernels_compile as T
c = T.nvrtc(sorted(T.WHEELS)[-1])
opts = [*kernels.OPTIONS, *kernels.file_options(file), *T.CUPY_OPTIONS, "-arch=sm_90"]
ok, log, cubin = c.compile(kernels.source(file), file, opts, [name])
f = tempfile.NamedTemporaryFile(suffix=".cubin", delete=False); f.write(cubin); f.close()
print(subprocess.run(["/tmp/nvd/x/nvidia/cu13/bin/nvdisasm", "-c", f.name], capture_output=True, text=True).stdout)
