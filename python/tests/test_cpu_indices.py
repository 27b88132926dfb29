"""CPU tests of positions_to_indices (NumPy; PyTorch CPU when installed)."""

import numpy as np
import pytest

import hmla


def loop_reference(positions, block_table, page):
    out = np.full(positions.shape, -1, np.int32)
    for idx in np.ndindex(*positions.shape):
        b, p = idx[0], int(positions[idx])
        if p < 0 or p // page >= block_table.shape[1]:
            continue
        blk = int(block_table[b, p // page])
        if blk < 0:
            continue
        out[idx] = blk * page + p % page
    return out


@pytest.mark.parametrize("page", [1, 16, 64])
def test_matches_loop(page):
    rng = np.random.default_rng(page)
    batch, s_q, topk, max_blocks = 3, 2, 40, 6
    block_table = rng.permutation(batch * max_blocks).reshape(batch, max_blocks).astype(np.int32)
    block_table[1, 4] = -1  # an unset entry
    positions = rng.integers(-3, page * (max_blocks + 1), size=(batch, s_q, topk))
    got = hmla.positions_to_indices(positions, block_table, page)
    assert got.dtype == np.int32 and got.shape == positions.shape
    np.testing.assert_array_equal(got, loop_reference(positions, block_table, page))


def test_any_rank_and_int32_positions():
    block_table = np.array([[3, 1], [0, 2]], np.int32)
    pos = np.array([[0, 5, 9], [8, -1, 16]], np.int32)
    np.testing.assert_array_equal(hmla.positions_to_indices(pos, block_table, 8), [[24, 29, 9], [16, -1, -1]])


def test_errors():
    bt = np.zeros((2, 3), np.int32)
    with pytest.raises(ValueError, match="'page_block_size'"):
        hmla.positions_to_indices(np.zeros((2, 4), np.int32), bt, 0)
    with pytest.raises(ValueError, match="'block_table' has batch 2, but positions has batch 3"):
        hmla.positions_to_indices(np.zeros((3, 4), np.int32), bt, 16)
    with pytest.raises(ValueError, match="'block_table' has shape"):
        hmla.positions_to_indices(np.zeros((2, 4), np.int32), np.zeros(2, np.int32), 16)
    with pytest.raises(TypeError, match="'positions' has dtype float32"):
        hmla.positions_to_indices(np.zeros((2, 4), np.float32), bt, 16)
    with pytest.raises(TypeError, match="'positions' has type"):
        hmla.positions_to_indices([[1, 2]], bt, 16)


def test_torch_cpu():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    bt = rng.permutation(12).reshape(2, 6).astype(np.int32)
    pos = rng.integers(-2, 7 * 64, size=(2, 1, 50))
    got = hmla.positions_to_indices(torch.from_numpy(pos), torch.from_numpy(bt), 64)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int32
    np.testing.assert_array_equal(got.numpy(), loop_reference(pos, bt, 64))
