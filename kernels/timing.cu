// A kernel that only waits: `KernelTimes.backlog` queues it before the launches it times.
#include "common.cuh"

extern "C" __global__ void spin(i64 ns) {
  u64 t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < (u64)ns);
}
