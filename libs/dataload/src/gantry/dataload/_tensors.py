"""Turning an Arrow record batch into PyTorch tensors, without copying where Arrow allows.

Numeric columns without nulls become tensors that share the Arrow buffer when the buffer is
writable (a shuffled batch is freshly gathered, so it is); a batch sliced from a decoded shard
sits in read-only memory and is copied once (PyTorch has no read-only tensors). Everything else
follows the table below.

==============================  =================================================
Arrow type                      result
==============================  =================================================
int*, uint*, float*             tensor of the same dtype (nulls: float64 / NaN)
bool                            bool tensor (nulls: float32 with NaN)
date, time, timestamp, duration integer tensor of the stored unit (nulls: NaN)
fixed_size_list<numeric>        2-D tensor ``rows x list_size`` (embeddings)
dictionary                      decoded, then as its value type
string, binary, list, struct    a Python list
==============================  =================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.types as pat
import torch

ColumnData = torch.Tensor | list[Any]


def column_to_tensor(array: pa.Array | pa.ChunkedArray) -> ColumnData:
    """One column as a tensor (see the module table), or a list for non-numeric types."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    kind = array.type
    if pat.is_dictionary(kind):
        return column_to_tensor(array.dictionary_decode())
    if pat.is_integer(kind) or pat.is_floating(kind):
        return _numeric(array)
    if pat.is_boolean(kind):
        if array.null_count:
            return _numeric(array.cast(pa.float32()))
        return torch.from_numpy(array.to_numpy(zero_copy_only=False, writable=True))
    if pat.is_temporal(kind) and kind.bit_width in (32, 64):
        return _numeric(array.view(pa.int64() if kind.bit_width == 64 else pa.int32()))
    if pat.is_fixed_size_list(kind) and (
        pat.is_integer(kind.value_type) or pat.is_floating(kind.value_type)
    ):
        values = array.flatten()
        if array.null_count == 0 and values.null_count == 0:
            flat = _numeric(values)
            assert isinstance(flat, torch.Tensor)
            return flat.reshape(len(array), kind.list_size)
    as_list: list[Any] = array.to_pylist()
    return as_list


def _numeric(array: pa.Array) -> torch.Tensor:
    if array.null_count:
        return torch.from_numpy(array.to_numpy(zero_copy_only=False, writable=True))
    data = array.buffers()[1]
    if data is not None and data.is_mutable:
        dtype = np.dtype(array.type.to_pandas_dtype())
        shared = np.frombuffer(
            data, dtype=dtype, count=len(array), offset=array.offset * dtype.itemsize
        )
        return torch.from_numpy(shared)
    return torch.from_numpy(array.to_numpy(zero_copy_only=False, writable=True))


def to_tensors(batch: pa.RecordBatch) -> dict[str, ColumnData]:
    """Every column of ``batch`` by name, as :func:`column_to_tensor` converts it."""
    return {
        name: column_to_tensor(col)
        for name, col in zip(batch.schema.names, batch.columns, strict=True)
    }


class TensorTransform:
    """The default batch transform: a dict of feature tensors, or ``(features, label)``.

    With ``label`` set, the label column is left out of the dict and returned beside it, so a
    training loop reads ``for x, y in loader``. A module-level class so it pickles to workers.
    """

    def __init__(self, label: str | None = None) -> None:
        self.label = label

    def __call__(self, batch: pa.RecordBatch) -> Any:
        if self.label is None:
            return to_tensors(batch)
        features = {
            name: column_to_tensor(col)
            for name, col in zip(batch.schema.names, batch.columns, strict=True)
            if name != self.label
        }
        return features, column_to_tensor(batch.column(self.label))

    def __repr__(self) -> str:
        return f"TensorTransform(label={self.label!r})"


__all__ = ["ColumnData", "TensorTransform", "column_to_tensor", "to_tensors"]
