"""kernels/launch.py's shape arithmetic, without a GPU: qmv's segments and its blocks an SM."""
import kernels.launch as K


def test_three_blocks_an_sm_only_where_they_save_a_wave():
    # H200 (132 SMs): the 27B's gate_up (272 blocks) and down (40 x 7) fit one wave only at 3 an SM
    assert K.qmv_min_blocks(272, 132) == 3 and K.qmv_min_blocks(280, 132) == 3
    # llama3-8b's gate_up (448: two waves either way), down (224), qkv (192): 2 an SM
    assert K.qmv_min_blocks(448, 132) == 2 and K.qmv_min_blocks(224, 132) == 2 and K.qmv_min_blocks(192, 132) == 2
    assert K.qmv_min_blocks(1, 48) == 2 and K.qmv_min_blocks(97, 48) == 3  # a GB10's 48 SMs


def test_segments_depend_on_the_shape_alone():
    assert K.qmv_split(34816, 5120) == (5120, 1)
    assert K.qmv_split(5120, 17408) == (2560, 7)
    KS, P = K.qmv_split(28672, 4096)
    assert KS % K.QMV_BATCH == 0 and KS * P >= 4096 > KS * (P - 1)
