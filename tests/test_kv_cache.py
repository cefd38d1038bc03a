import pytest
import torch

from verispec.models.decoder.kv_cache import KVCache


def make(capacity=10):
    return KVCache(num_layers=2, num_kv_heads=1, head_dim=2, capacity=capacity)


def kv(values):  # [kv_heads=1, T, head_dim=2]
    t = torch.tensor(values, dtype=torch.float32)[None, :, None].expand(1, len(values), 2)
    return t.clone(), -t.clone()


def test_write_view_truncate_overwrite():
    c = make()
    k, v = kv([1, 2, 3, 4])
    c.write(0, 0, k, v)
    c.advance(4)
    c.truncate(2)  # O(1): only the length moves
    assert c.length == 2
    k2, v2 = kv([7, 8])
    c.write(0, 2, k2, v2)
    c.advance(2)
    keys, values = c.view(0, 0, c.length)
    assert keys[0, :, 0].tolist() == [1, 2, 7, 8]
    assert values[0, :, 0].tolist() == [-1, -2, -7, -8]
    assert c.keys[1].abs().sum() == 0  # other layers untouched


def test_only_the_cache_moves_its_length():
    c = make()
    with pytest.raises(AttributeError):
        c.length = 3  # no setter: advance and truncate are the verbs
    c.advance(10)  # the buffers hold all 10 positions of its capacity
    assert c.length == 10
    with pytest.raises(IndexError):
        c.advance(1)  # past the buffers
    with pytest.raises(IndexError):
        c.advance(-1)  # backwards is truncate's job


def test_errors():
    c = make(capacity=4)
    k, v = kv([1, 2, 3, 4, 5])
    with pytest.raises(IndexError):
        c.write(0, 0, k, v)
    with pytest.raises(ValueError):
        c.truncate(1)  # longer than the current length (0)
