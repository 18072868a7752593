"""Arrow batches to tensors: dtypes, zero copy where Arrow allows it, and no warnings."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import torch

from gantry.dataload import (
    TensorTransform,
    column_to_tensor,
    decode_shard,
    encode_shard,
    to_tensors,
)


def test_numeric_columns_keep_their_dtype() -> None:
    batch = pa.record_batch(
        {
            "i8": pa.array([1, 2], pa.int8()),
            "u16": pa.array([1, 2], pa.uint16()),
            "f32": pa.array([1.5, 2.5], pa.float32()),
            "f64": pa.array([1.5, 2.5], pa.float64()),
            "b": pa.array([True, False]),
        }
    )
    out = to_tensors(batch)
    assert [out[k].dtype for k in out] == [
        torch.int8, torch.uint16, torch.float32, torch.float64, torch.bool
    ]  # fmt: skip
    assert out["b"].tolist() == [True, False]


def test_gathered_batches_share_memory_with_arrow() -> None:
    batch = pa.record_batch({"x": np.arange(10, dtype=np.float32)}).take(pa.array([3, 1, 2]))
    tensor = column_to_tensor(batch.column(0))
    assert isinstance(tensor, torch.Tensor)
    assert tensor.data_ptr() == batch.column(0).buffers()[1].address


def test_read_only_shard_memory_is_copied_without_a_warning() -> None:
    # pytest turns warnings into errors: PyTorch warns on non-writable numpy arrays.
    table = decode_shard(encode_shard(pa.table({"x": np.arange(8, dtype=np.int64)})))
    tensor = column_to_tensor(table.column("x").chunk(0).slice(2, 3))
    assert isinstance(tensor, torch.Tensor) and tensor.tolist() == [2, 3, 4]
    tensor += 1  # writable, and the shard is untouched
    assert table.column("x").to_pylist()[2] == 2


def test_nulls_become_nan() -> None:
    ints = column_to_tensor(pa.array([1, None, 3], pa.int32()))
    bools = column_to_tensor(pa.array([True, None]))
    assert isinstance(ints, torch.Tensor) and torch.isnan(ints[1])
    assert (
        isinstance(bools, torch.Tensor) and bools.dtype == torch.float32 and torch.isnan(bools[1])
    )


def test_embeddings_become_a_matrix_and_dates_their_integers() -> None:
    values = pa.array(np.arange(12, dtype=np.float32))
    vectors = pa.FixedSizeListArray.from_arrays(values, 3).slice(1, 2)
    matrix = column_to_tensor(vectors)
    assert isinstance(matrix, torch.Tensor) and matrix.tolist() == [[3, 4, 5], [6, 7, 8]]
    days = column_to_tensor(pa.array([dt.date(1970, 1, 3)], pa.date32()))
    assert isinstance(days, torch.Tensor) and days.tolist() == [2]
    stamps = column_to_tensor(pa.array([1_000], pa.timestamp("ms")))
    assert isinstance(stamps, torch.Tensor) and stamps.dtype == torch.int64


def test_strings_and_dictionaries() -> None:
    assert column_to_tensor(pa.array(["a", None])) == ["a", None]
    codes = pa.array(["x", "y", "x"]).dictionary_encode()
    assert column_to_tensor(codes) == ["x", "y", "x"]


def test_transform_splits_off_the_label() -> None:
    batch = pa.record_batch({"x": [1.0, 2.0], "y": [0, 1]})
    features, label = TensorTransform("y")(batch)
    assert list(features) == ["x"] and label.tolist() == [0, 1]
    assert list(TensorTransform()(batch)) == ["x", "y"]
