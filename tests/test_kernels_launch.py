"""kernels/launch.py's shape arithmetic, without a GPU: qmv's segments and its blocks an SM; which GPUs take
cuBLAS for prompt products; the Qwen launchers' limits."""
import pytest

import kernels.launch as K
import kernels.launch_qwen3_5 as KQ


def test_three_blocks_an_sm_only_where_they_save_a_wave():
    # H200 (132 SMs): the 27B's gate_up (272 blocks) fits one wave only at 3 an SM
    assert K.qmv_min_blocks(272, 132) == 3 and K.qmv_min_blocks(280, 132) == 3
    # 448 blocks (two waves either way), llama3-8b's down (224) and qkv (192): 2 an SM
    assert K.qmv_min_blocks(448, 132) == 2 and K.qmv_min_blocks(224, 132) == 2 and K.qmv_min_blocks(192, 132) == 2
    assert K.qmv_min_blocks(1, 48) == 2 and K.qmv_min_blocks(97, 48) == 3  # a GB10's 48 SMs


def test_segments_depend_on_the_shape_alone():
    assert K.qmv_split(34816, 5120) == (5120, 1)
    assert K.qmv_split(5120, 17408) == (3072, 6)  # the 27B's down: 240 blocks, one wave at 2 an SM
    assert K.qmv_split(28672, 4096) == (4096, 1)  # 224 row blocks: one segment, one wave
    assert K.qmv_split(4096, 14336) == (2048, 7) and K.qmv_split(4096, 4096) == (512, 8)
    for M, Kd in ((6144, 4096), (12352, 2048), (257, 2048), (9216, 2048)):
        KS, P = K.qmv_split(M, Kd)
        assert KS % K.QMV_BATCH == 0 and KS * P >= Kd > KS * (P - 1)
        assert -(-M // 128) * P <= K.QMV_BLOCKS or P == 1


def test_prompt_products_through_cublas_only_on_discrete_hopper_and_datacenter_blackwell():
    assert K.cublas_prompt_products("90", False) and K.cublas_prompt_products("100", False)
    assert not K.cublas_prompt_products("121", True)  # GB10: the fp16 copy at 273 GB/s costs more than it saves
    assert not K.cublas_prompt_products("120", False) and not K.cublas_prompt_products("89", False)
    assert not K.cublas_prompt_products("90", True)


def test_gated_rmsnorm_refuses_heads_wider_than_its_registers():
    """gated_rmsnorm keeps a lane's z, w and x in registers: a head past 32 x GN_PER_LANE is refused
    before anything launches."""
    with pytest.raises(ValueError, match="head dim 300 is beyond the kernel's 256"):
        KQ.gated_rmsnorm(None, None, 0, None, None, 300, 1e-6, 1, 1)


def test_the_scan_takes_the_gated_norm_a_head_a_block_where_it_has_a_build():
    """deltanet_scan's NORM build takes a whole head a block (all its Dv columns, rounded up to a
    build's) in at most SCAN_NORM_THREADS threads; the heads it has no build for are refused before
    anything launches (the backend then runs the scan and gated_rmsnorm apart)."""
    assert KQ.scan_norm_cols(128, 128) == 128  # Qwen3.5 / 3.6: 256 threads a head
    assert KQ.scan_norm_cols(16, 16) == 32 and KQ.scan_norm_cols(64, 48) == 64  # idle columns past Dv
    assert KQ.scan_norm_cols(256, 64) == 64
    assert KQ.scan_norm_cols(128, 256) is None and KQ.scan_norm_cols(256, 128) is None  # 512 threads
    assert KQ.scan_norm_cols(64, 300) is None  # past the norm warp's 32 x GN_PER_LANE values
    built = {n for f, n in KQ.variants() if n.startswith("deltanet_scan<")}
    for dk in KQ.SCAN_DK:
        for dv in range(8, 257, 8):
            cols = KQ.scan_norm_cols(dk, dv)
            assert cols is None or f"deltanet_scan<{dk}, {KQ.scan_split(dk)}, {cols}, 1>" in built
    for dk, dv in ((128, 256), (64, 300)):
        with pytest.raises(ValueError, match=f"no build with the gated norm for heads of {dk} x {dv}"):
            KQ.deltanet_scan(None, 0, None, 0, None, 0, None, None, None, None, 2, None, 1, 1, 0, 1, 1, dk, dv, 1.0,
                             norm=(None, 0, None, 1e-6))


def test_an_early_expert_product_refuses_a_staged_norm():
    """The early expert product (qmv's EX 2) is built for the down product's inputs only: a norm-staged
    one is refused before anything launches."""
    with pytest.raises(ValueError, match="not a staged norm"):
        KQ.qmv_experts(None, None, 1, 4, 64, 1024, 2048, 1024, None, 8, None, 2048, False, None, xm=2, early=True)


def test_products_sum_the_experts_combination_for_one_or_two_rows_of_a_small_grid():
    assert K.qmv_combines(1, 12352, 2048, 132) and K.qmv_combines(2, 6144, 2048, 132)
    assert not K.qmv_combines(3, 12352, 2048, 132)  # every block would load 3 x k expert rows
    assert not K.qmv_combines(1, 248320, 2048, 132)  # an lm_head's 1,940 blocks
    assert not K.qmv_combines(1, 12352, 2048, 48)  # a GB10 runs the in-projection's 194 blocks 3 an SM
    with pytest.raises(ValueError, match="cannot stage the experts' combination"):
        K.qmv(None, None, 1, 4, 64, 12352, 2048, None, 2048, None, 1, xm=0, combine=(None, 9))
